"""The rollout-engine seam: ``collect(..., engine=...)`` generates with the engine it is given (the
place a vLLM backend would go); the eager engine is :func:`fourfold.rollout.eager.sample`."""
import torch

from fourfold.config import GenerationConfig, PPOConfig, load_config


def _collect(tiny_lm, engine=None):
    """A 4-row collect with ``engine`` (None: the default eager engine over the policy itself)."""
    from fourfold.models.build import build_roles
    from fourfold.models.plan import plan_roles
    from fourfold.rollout.eager import EagerEngine
    from fourfold.rollout.noise import RowNoise
    from fourfold.trainers.rollouts import collect

    over = {"model.policy": tiny_lm / "sft", "model.reward": tiny_lm / "rm", "data.prompts": tiny_lm / "prompts.jsonl"}
    cfg = load_config(PPOConfig, None, [f"{k}={v}" for k, v in over.items()])
    roles = build_roles(plan_roles("ppo", cfg).without("critic"), torch.device("cpu"))
    ids = torch.tensor([[1, 5, 9], [0, 1, 4], [1, 8, 8], [0, 0, 1]])
    return collect(roles, ["p"] * 4, ids, (ids != 0).long(), GenerationConfig(max_new_tokens=6),
                   kl_coef=0.1, noise=RowNoise(0, 1), engine=engine or EagerEngine())


def test_collect_generates_with_the_engine_it_is_given(tiny_lm):
    from fourfold.rollout.eager import sample

    calls = []

    def engine(model, prompt_ids, prompt_mask, **kw):
        calls.append((tuple(prompt_ids.shape), sorted(kw)))
        return sample(model, prompt_ids, prompt_mask, **kw)

    default = _collect(tiny_lm)
    given = _collect(tiny_lm, engine)
    assert calls == [((4, 3), ["eos_token_id", "max_new_tokens", "noise", "pad_token_id", "sync_stop", "temperature"])]
    assert torch.equal(given.rollout.actions, default.rollout.actions)
    torch.testing.assert_close(given.rollout.logprobs, default.rollout.logprobs)


def test_a_different_engine_changes_the_rollout(tiny_lm):
    from fourfold.rollout.eager import sample

    def greedy(model, prompt_ids, prompt_mask, *, noise, **kw):  # ignores the noise: argmax tokens
        return sample(model, prompt_ids, prompt_mask, greedy=True, **kw)

    a, b = _collect(tiny_lm, greedy), _collect(tiny_lm, greedy)
    assert torch.equal(a.rollout.actions, b.rollout.actions)  # deterministic whatever the noise
    assert not torch.equal(a.rollout.actions, _collect(tiny_lm).rollout.actions)


def test_collect_with_the_static_engine_gives_the_eager_rollout(tiny_lm):
    """The static engine through the seam: the same responses, rewards within float tolerance."""
    from fourfold.rollout.static import StaticEngine

    default = _collect(tiny_lm)
    static = _collect(tiny_lm, StaticEngine(check_every=2))
    assert torch.equal(static.rollout.actions, default.rollout.actions)
    assert torch.equal(static.rollout.mask, default.rollout.mask)
    for key in ("logprobs", "ref_logprobs", "rewards"):
        torch.testing.assert_close(getattr(static.rollout, key), getattr(default.rollout, key), rtol=0, atol=1e-5)
