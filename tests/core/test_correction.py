"""The mismatch statistics, the rollout correction's weights, DAPO's overlong punishment and the
zero-spread groups (fourfold.core.correction), against values computed by hand; the three traps
of docs/correction.md."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.core import (
    CORRECTION_MODES,
    frac_zero_std,
    group_keep,
    mismatch_stats,
    overlong_penalty,
    reinforce_loss,
    rollout_correction_weights,
    zero_std_groups,
)

# d_t = train - engine: row 0 token ratios 2, 0.5, 4 (sequence ratio 4, geometric 4^(1/3));
# row 1 one valid token of ratio 1.5 (then padding, whose values must not count)
TRAIN = torch.tensor([[math.log(2), math.log(0.5), math.log(4)], [math.log(1.5), 7.0, -3.0]])
ENGINE = torch.zeros(2, 3)
MASK = torch.tensor([[1.0, 1, 1], [1, 0, 0]])
GEO0 = 4 ** (1 / 3)


def test_mismatch_stats_by_hand():
    s = {k: float(v) for k, v in mismatch_stats(TRAIN, ENGINE, MASK).items()}
    assert s["token_abs_diff_mean"] == pytest.approx((2 * math.log(2) + math.log(4) + math.log(1.5)) / 4)
    assert s["token_abs_diff_max"] == pytest.approx(math.log(4))
    # the sequence ratio is the product of the token ratios (a sum of log-ratios), not their mean
    assert (s["seq_ratio_mean"], s["seq_ratio_min"], s["seq_ratio_max"]) == pytest.approx((2.75, 1.5, 4.0))
    assert (s["geo_ratio_mean"], s["geo_ratio_min"], s["geo_ratio_max"]) == pytest.approx(((GEO0 + 1.5) / 2, 1.5, GEO0))


def test_mismatch_stats_of_equal_logprobs_are_zero_and_one():
    lp = torch.randn(3, 5)
    s = mismatch_stats(lp, lp.clone(), torch.ones(3, 5))
    assert float(s["token_abs_diff_max"]) == 0.0
    assert all(float(s[f"{n}_{k}"]) == 1.0 for n in ("seq_ratio", "geo_ratio") for k in ("mean", "min", "max"))


@pytest.mark.parametrize("mode, cap, row0, row1, stats", [
    ("none", 3.0, [1, 1, 1], 1.0, (1.0, 0.0, 0.0)),
    ("token_tis", 3.0, [2, 0.5, 3], 1.5, (7.0 / 4, 0.0, 1 / 4)),
    ("token_mis", 3.0, [2, 0.5, 0], 1.5, (1.0, 1 / 4, 0.0)),
    ("seq_tis", 3.0, [3, 3, 3], 1.5, (10.5 / 4, 0.0, 3 / 4)),
    ("seq_mis", 3.0, [0, 0, 0], 1.5, (1.5 / 4, 3 / 4, 0.0)),
    ("seq_mis", 5.0, [4, 4, 4], 1.5, (13.5 / 4, 0.0, 0.0)),
    ("geo_mis", 1.6, [1, 1, 1], 1.0, (1.0, 0.0, 0.0)),  # 4^(1/3) = 1.587 <= 1.6
    ("geo_mis", 1.55, [0, 0, 0], 1.0, (1 / 4, 3 / 4, 0.0)),  # 1.587 > 1.55: the whole response out
])
def test_rollout_correction_weights_by_hand(mode, cap, row0, row1, stats):
    w, s = rollout_correction_weights(TRAIN, ENGINE, MASK, mode, cap)
    assert w[0].tolist() == pytest.approx(row0)
    assert w[1].tolist() == pytest.approx([row1, 0.0, 0.0])  # 0 outside the mask
    assert (float(s["weight_mean"]), float(s["masked_share"]), float(s["truncated_share"])) == pytest.approx(stats)


def test_geo_mis_is_two_sided():
    w, _ = rollout_correction_weights(torch.tensor([[math.log(0.5)]]), torch.zeros(1, 1), torch.ones(1, 1), "geo_mis", 1.6)
    assert float(w) == 0.0  # 0.5 < 1 / 1.6


def test_sum_not_mean_trap_for_long_agreeing_responses():
    """trl#5814: 100 tokens each off by 0.01 nats. The sequence ratio is exp(1) (the product), the
    geometric one exp(0.01); each mode uses its own definition."""
    d = torch.full((1, 100), 0.01)
    s = mismatch_stats(d, torch.zeros(1, 100), torch.ones(1, 100))
    assert float(s["seq_ratio_mean"]) == pytest.approx(math.e)
    assert float(s["geo_ratio_mean"]) == pytest.approx(math.exp(0.01))
    w_seq, _ = rollout_correction_weights(d, torch.zeros(1, 100), torch.ones(1, 100), "seq_tis", 2.0)
    assert float(w_seq[0, 0]) == pytest.approx(2.0)  # e > 2: truncated
    w_geo, _ = rollout_correction_weights(d, torch.zeros(1, 100), torch.ones(1, 100), "geo_mis", 1.011)
    assert float(w_geo.min()) == 1.0


def test_rollout_correction_refuses_unknown_mode_and_small_cap():
    with pytest.raises(ValueError, match="token_tis"):
        rollout_correction_weights(TRAIN, ENGINE, MASK, "tis")
    with pytest.raises(ValueError, match="> 1"):
        rollout_correction_weights(TRAIN, ENGINE, MASK, "token_tis", 1.0)


def test_correction_modes_match_the_config():
    from fourfold.config.ppo import CORRECTION_CAPS, PPOAlgoConfig

    assert set(CORRECTION_CAPS) == set(CORRECTION_MODES) - {"none"}
    import typing

    from fourfold.config.reinforce import ReinforceAlgoConfig

    for cls in (PPOAlgoConfig, ReinforceAlgoConfig):
        assert typing.get_args(typing.get_type_hints(cls)["rollout_correction"]) == CORRECTION_MODES


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=6, max_size=6), st.sampled_from(CORRECTION_MODES[1:]),
       st.floats(1.01, 5))
def test_weights_are_bounded_and_zero_outside_the_mask(ds, mode, cap):
    d = torch.tensor(ds).reshape(2, 3)
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0]])
    w, _ = rollout_correction_weights(d, torch.zeros(2, 3), mask, mode, cap)
    assert float(w.min()) >= 0 and float(w.max()) <= cap + 1e-6
    assert float(w[mask == 0].abs().sum()) == 0.0


def test_reinforce_loss_with_weights_by_hand():
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    w = torch.tensor([[0.5, 2.0]])
    loss, _ = reinforce_loss(lp, torch.tensor([[3.0, 1.0]]), torch.ones(1, 2), weights=w)
    assert float(loss.detach()) == pytest.approx(-(0.5 * -1.0 * 3.0 + 2.0 * -2.0 * 1.0) / 2)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-0.75, -1.0])


def test_overlong_penalty_by_hand():
    """L = 10, buffer 4: free up to 6 tokens, then linear down to -1 at 10, -1 beyond."""
    got = overlong_penalty(torch.tensor([5, 6, 8, 10, 12]), 10, 4)
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
    assert overlong_penalty(torch.tensor([9]), 10, 4, factor=2.0).tolist() == pytest.approx([-1.5])
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([1]), 10, 11)


def test_zero_std_groups_and_group_keep():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0])
    assert zero_std_groups(scores, 2).tolist() == [True, False, True]
    assert frac_zero_std(scores, 2) == pytest.approx(2 / 3)
    assert group_keep(scores, 2).tolist() == [False, False, True, True, False, False]
    assert group_keep(torch.tensor([0.0, 1, 2, 3, 4, 5]), 2, need=2).tolist() == [True] * 4 + [False] * 2
    with pytest.raises(ValueError, match="groups of 4"):
        zero_std_groups(scores, 4)


def test_effective_sample_size_by_hand():
    """Weights 2, 0.5, 4 and 1.5 (the padding left out): (8)^2 / (4 * (4 + 0.25 + 16 + 2.25)) =
    64 / 90; equal weights give 1; one valid token gives 1; no valid token gives 1."""
    from fourfold.core import effective_sample_size

    assert float(effective_sample_size(TRAIN, MASK)) == pytest.approx(64 / 90, rel=1e-6)  # TRAIN is float32
    assert float(effective_sample_size(torch.full((2, 3), 0.7), MASK)) == 1.0
    assert float(effective_sample_size(TRAIN, torch.tensor([[0.0, 0, 1], [0, 0, 0]]))) == 1.0
    assert float(effective_sample_size(TRAIN, torch.zeros(2, 3))) == 1.0
    # a huge lag does not overflow: weights e^800 and 1 give (e^800 + 1)^2 / (2 (e^1600 + 1)) ~ 1/2
    assert float(effective_sample_size(torch.tensor([[800.0, 0.0]]), torch.ones(1, 2))) == pytest.approx(0.5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-6, 6), min_size=1, max_size=12), st.floats(-3, 3))
def test_effective_sample_size_is_in_0_1_and_1_iff_equal(steps, shift):
    """In (0, 1] for any weights; exactly 1 when all are equal (any common value), < 1 as soon as
    two differ (log-ratios on a grid of 0.25, so two different weights differ by a factor >= e^0.25)."""
    from fourfold.core import effective_sample_size

    d = torch.tensor([[shift + 0.25 * s for s in steps]], dtype=torch.float64)
    ess = float(effective_sample_size(d, torch.ones_like(d)))
    assert 0 < ess <= 1
    assert (ess == 1.0) == (len(set(steps)) == 1)
    assert ess >= 1 / len(steps) - 1e-12
