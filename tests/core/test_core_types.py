"""fourfold.core.types.Rollout: row selection, device moves, shape checks."""

import pytest
import torch

from fourfold.core import Rollout


def make(B=4, T=3, **extra):
    ar = torch.arange(B * T, dtype=torch.float32).view(B, T)
    kwargs = dict(
        actions=torch.arange(B * T).view(B, T),
        mask=torch.ones(B, T),
        logprobs=-ar,
        values=ar * 2,
        rewards=ar * 3,
        context={"input_ids": torch.arange(B * 5).view(B, 5), "attention_mask": torch.ones(B, 5, dtype=torch.long)},
    )
    kwargs.update(extra)
    return Rollout(**kwargs)


def test_batch_size_and_defaults():
    r = make()
    assert r.batch_size == 4
    assert r.ref_logprobs is None and r.scores is None and r.advantages is None and r.returns is None
    assert Rollout(torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1), torch.zeros(2, 1), torch.zeros(2, 1),
                   torch.zeros(2, 1)).context == {}


@pytest.mark.parametrize("idx", [torch.tensor([2, 0]), torch.tensor([False, False, True, True]), slice(1, 3)])
def test_select_rows_of_every_field(idx):
    r = make(scores=torch.tensor([10.0, 11.0, 12.0, 13.0]), advantages=torch.ones(4, 3))
    s = r.select(idx)
    rows = torch.arange(4)[idx]
    assert s.batch_size == len(rows)
    for name in ("actions", "mask", "logprobs", "values", "rewards", "advantages", "scores"):
        assert torch.equal(getattr(s, name), getattr(r, name)[rows]), name
    assert s.ref_logprobs is None and s.returns is None
    assert torch.equal(s.context["input_ids"], r.context["input_ids"][rows])
    assert torch.equal(s.context["attention_mask"], r.context["attention_mask"][rows])
    assert r.batch_size == 4  # original untouched


def test_to_keeps_everything():
    r = make(ref_logprobs=torch.zeros(4, 3))
    s = r.to("cpu")
    assert s.ref_logprobs is not None and s.scores is None
    assert torch.equal(s.values, r.values) and set(s.context) == set(r.context)


def test_map_steps_rows_and_context_separately():
    """map(fn, steps=, context=): per-step fields and actions take ``steps``, per-row ones (scores)
    ``fn``, context entries ``context``: PPO's trim of padding columns is one map."""
    r = make(scores=torch.tensor([10.0, 11.0, 12.0, 13.0]), returns=torch.full((4, 3), 5.0))
    s = r.map(lambda x: x * 0 + 7, steps=lambda x: x[:, :2], context=lambda x: x[:, 1:4])
    for name in ("actions", "mask", "logprobs", "values", "rewards", "returns"):
        assert torch.equal(getattr(s, name), getattr(r, name)[:, :2]), name
    assert torch.equal(s.scores, torch.full((4,), 7.0))
    assert s.ref_logprobs is None and s.advantages is None
    assert torch.equal(s.context["input_ids"], r.context["input_ids"][:, 1:4])
    assert torch.equal(s.context["attention_mask"], torch.ones(4, 3, dtype=torch.long))
    assert r.mask.shape == (4, 3)  # original untouched
    assert torch.equal(r.map(lambda x: x + 1).values, r.values + 1)  # without steps/context: fn everywhere
    with pytest.raises(ValueError, match="Rollout.scores has shape"):  # the result is checked as any Rollout
        r.map(lambda x: x[:2] if x.dim() == 1 else x)


def test_continuous_actions_allowed():
    r = make(actions=torch.zeros(4, 3, 2))
    assert r.select(torch.tensor([1])).actions.shape == (1, 3, 2)


@pytest.mark.parametrize(
    "extra, name",
    [
        ({"values": torch.zeros(4, 2)}, "values"),
        ({"scores": torch.zeros(3)}, "scores"),
        ({"actions": torch.zeros(4, 2, dtype=torch.long)}, "actions"),
        ({"context": {"input_ids": torch.zeros(5, 2)}}, "input_ids"),
    ],
)
def test_shape_errors_name_the_field(extra, name):
    with pytest.raises(ValueError, match=name):
        make(**extra)
