"""The demo's one-slip pairs: held-out ones always (the RM's grammar blind spot, measured), training
ones only when asked, drawn from their own random streams."""
import dataclasses

import pytest

from fourfold.apps.demo import pipeline as demo
from fourfold.config import DemoConfig, load_config
from fourfold.errors import ConfigError
from fourfold.models.loading import load_causal_lm, load_tokenizer
from fourfold.tasks import ReviewTask


def _cfg(slip_pairs: int, slip_eval_pairs: int) -> DemoConfig:
    cfg = DemoConfig()
    cfg.pairs = dataclasses.replace(cfg.pairs, slip_pairs=slip_pairs, slip_eval_pairs=slip_eval_pairs)
    cfg.generation = dataclasses.replace(cfg.generation, max_new_tokens=8)
    return cfg


@pytest.fixture(scope="module")
def lm(tiny_lm):
    return load_causal_lm(str(tiny_lm / "sft")), load_tokenizer(str(tiny_lm / "sft"))


def test_slip_pairs_are_minimal_pairs_labelled_by_the_labelers(lm):
    model, tok = lm
    task = ReviewTask()
    train, held = demo._slip_pairs(task, model, tok, _cfg(12, 5), seed=0)
    assert 4 <= len(held) <= 5 and 10 <= len(train) <= 12  # empty samples are dropped
    for r in train + held:
        assert r["intact"] in (r["chosen"], r["rejected"]) and r["slip"] in ReviewTask.SLIPS
        other = r["rejected"] if r["chosen"] == r["intact"] else r["chosen"]
        assert other != r["intact"]
        g = task.gold_reward([r["prompt"]] * 2, [r["chosen"], r["rejected"]])
        assert (r["gold_chosen"], r["gold_rejected"]) == tuple(g)
    # the held-out ones do not depend on how many training ones are asked for (and vice versa)
    train0, held0 = demo._slip_pairs(task, model, tok, _cfg(0, 5), seed=0)
    assert train0 == [] and held0 == held
    assert demo._slip_pairs(task, model, tok, _cfg(12, 0), seed=0) == (train, [])
    assert demo._slip_pairs(task, model, tok, _cfg(0, 0), seed=0) == ([], [])


@pytest.mark.parametrize("override, key", [("pairs.slip_pairs=-1", "pairs.slip_pairs"),
                                           ("pairs.slip_eval_pairs=-2", "pairs.slip_eval_pairs"),
                                           ("reward.extra_layers=-1", "reward.extra_layers")])
def test_counts_are_validated_by_name(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config(DemoConfig, None, [override])
