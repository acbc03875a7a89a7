"""Several rewards, weighted: the score is the weighted sum of the parts, each part kept by name,
columns reaching the parts that read text."""

import pytest
import torch

from fourfold.models.factory import llama_config, random_scalar_model
from fourfold.models.reward_fn import column_plan
from fourfold.models.roles import FunctionReward, ModelReward, ScalarModel, WeightedReward


def length(prompts, responses):
    return [float(len(r.split())) for r in responses]


def correct(prompts, responses, answer):
    return [float(r.endswith(a)) for r, a in zip(responses, answer)]


def test_the_score_is_the_weighted_sum_of_the_parts():
    ids = torch.zeros(3, 4, dtype=torch.long)
    plan = column_plan(correct, "correct", ("answer",), "p.jsonl")
    w = WeightedReward([("length", FunctionReward(length), -0.5), ("correct", FunctionReward(correct, plan=plan), 2.0)])
    assert w.needs_text
    score = w(ids, None, ["p"] * 3, ["a b 7", "7", "a b c d"], columns={"answer": ["7", "8", "d"]})
    assert w.last_parts["length"].tolist() == [3.0, 1.0, 4.0]
    assert w.last_parts["correct"].tolist() == [1.0, 0.0, 1.0]
    assert score.tolist() == [-1.5 + 2.0, -0.5, -2.0 + 2.0]  # hand-computed
    assert torch.equal(score, -0.5 * w.last_parts["length"] + 2.0 * w.last_parts["correct"])


def test_a_reward_model_beside_a_rule():
    cfg = llama_config(20, hidden=16, layers=1, heads=2, pad_token_id=0)
    rm = ModelReward(ScalarModel(random_scalar_model(cfg, seed=0)))
    ids = torch.tensor([[0, 3, 4, 5], [6, 7, 8, 9]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    w = WeightedReward([("rm", rm, 1.0), ("length", FunctionReward(length), 0.25)])
    score = w(ids, mask, ["p", "q"], ["x y", "z"])
    assert torch.equal(w.last_parts["rm"], rm(ids, mask))
    assert torch.allclose(score, rm(ids, mask) + torch.tensor([0.5, 0.25]), atol=0, rtol=0)


def test_parts_need_distinct_names():
    with pytest.raises(ValueError, match="distinct names"):
        WeightedReward([("a", FunctionReward(length), 1.0), ("a", FunctionReward(length), 1.0)])
    with pytest.raises(ValueError, match="distinct names"):
        WeightedReward([])
