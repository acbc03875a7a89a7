"""Loss aggregation modes, PPO's asymmetric clip and aggregation options (defaults identical to the
original loss), and the KL loss term, by hand and as properties."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.core import (
    LOSS_AGG_MODES,
    aggregate_loss,
    aggregation_units,
    kl_estimate,
    kl_loss,
    masked_mean,
    ppo_policy_loss,
)

F64 = torch.float64


def close(a, b, **kw):
    torch.testing.assert_close(torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64), **kw)


# row 0: 3 valid tokens [1, 2, 3]; row 1: 1 valid token [4]; row 2: none (does not count)
LOSS = [[1.0, 2.0, 3.0], [4.0, 100.0, -7.0], [5.0, 6.0, 7.0]]
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize("mode, value, grad", [
    # (1 + 2 + 3 + 4) / 4 tokens = 2.5; each valid token weighs 1/4
    ("token-mean", 2.5, [[0.25, 0.25, 0.25], [0.25, 0, 0], [0, 0, 0]]),
    # ((1 + 2 + 3)/3 + 4/1) / 2 rows = (2 + 4)/2 = 3; a token weighs 1/(2 * n_i): 1/6 in row 0, 1/2 in row 1
    ("seq-mean-token-mean", 3.0, [[1 / 6, 1 / 6, 1 / 6], [0.5, 0, 0], [0, 0, 0]]),
    # (6 + 4) / 2 rows = 5; each token weighs 1/2
    ("seq-mean-token-sum", 5.0, [[0.5, 0.5, 0.5], [0.5, 0, 0], [0, 0, 0]]),
])
def test_aggregate_loss_hand(mode, value, grad):
    x = torch.tensor(LOSS, dtype=F64, requires_grad=True)
    out = aggregate_loss(x, MASK, mode)
    close(out, value)
    out.backward()
    close(x.grad, grad)


def test_aggregation_units_hand_and_edge_cases():
    assert aggregation_units(MASK, "token-mean").item() == 4.0  # valid tokens
    assert aggregation_units(MASK, "seq-mean-token-mean").item() == 2.0  # rows with a valid token
    assert aggregation_units(MASK, "seq-mean-token-sum").item() == 2.0
    for mode in LOSS_AGG_MODES:
        assert aggregate_loss(torch.ones(2, 3), torch.zeros(2, 3), mode).item() == 0.0  # nothing valid: 0
        assert aggregation_units(torch.zeros(2, 3), mode).item() == 0.0
    # a 1-d input is one sequence: [1, 2, 3] with the last masked -> token-mean 1.5, sum 3
    x, m = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1, 1, 0])
    assert aggregate_loss(x, m, "seq-mean-token-mean").item() == 1.5
    assert aggregate_loss(x, m, "seq-mean-token-sum").item() == 3.0


def test_unknown_mode_names_the_modes():
    for fn in (lambda: aggregate_loss(torch.ones(1, 2), torch.ones(1, 2), "sum"),
               lambda: aggregation_units(torch.ones(1, 2), "sum"),
               lambda: ppo_policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), agg="sum"),
               lambda: kl_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), agg="sum")):
        with pytest.raises(ValueError) as e:
            fn()
        assert all(mode in str(e.value) for mode in LOSS_AGG_MODES)


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 6), t=st.integers(1, 5), seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(LOSS_AGG_MODES),
       cuts=st.lists(st.integers(0, 6), max_size=3))
def test_micro_batches_weighted_by_units_add_up_to_the_batch(b, t, seed, mode, cuts):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, generator=g, dtype=F64)
    mask = torch.rand(b, t, generator=g) < 0.6
    bounds = sorted({0, b, *[min(c, b) for c in cuts]})
    total = aggregation_units(mask, mode)
    parts = sum(aggregate_loss(x[i:j], mask[i:j], mode) * aggregation_units(mask[i:j], mode) / total.clamp(min=1)
                for i, j in zip(bounds, bounds[1:]))
    close(parts, aggregate_loss(x, mask, mode), rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 4), n=st.integers(1, 5), pad=st.integers(0, 3), seed=st.integers(0, 2**31 - 1))
def test_modes_agree_up_to_length_when_every_row_has_the_same_length(b, n, pad, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n + pad, generator=g, dtype=F64)
    mask = torch.cat([torch.ones(b, n), torch.zeros(b, pad)], 1)
    tm = aggregate_loss(x, mask, "token-mean")
    close(tm, masked_mean(x, mask))
    close(aggregate_loss(x, mask, "seq-mean-token-mean"), tm, rtol=1e-12, atol=1e-12)
    close(aggregate_loss(x, mask, "seq-mean-token-sum"), n * tm, rtol=1e-12, atol=1e-12)


# ---- ppo_policy_loss: aggregation and asymmetric clipping ----


def ppo_legacy(logprobs, old_logprobs, advantages, mask, clip_eps):
    """ppo_policy_loss's loss as it was before the agg / clip_eps_low / clip_eps_high options."""
    m = mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype)
    ratio = torch.exp(torch.where(m, logprobs - old_logprobs.detach(), zero))
    adv = torch.where(m, advantages.detach().to(ratio.dtype), zero)
    surr, surr_clipped = ratio * adv, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    return -masked_mean(torch.minimum(surr, surr_clipped), m)


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 4), t=st.integers(1, 6), seed=st.integers(0, 2**31 - 1), eps=st.sampled_from([0.1, 0.2]),
       f32=st.booleans())
def test_ppo_defaults_are_bitwise_the_original_loss(b, t, seed, eps, f32):
    g = torch.Generator().manual_seed(seed)
    dtype = torch.float32 if f32 else F64
    old = torch.randn(b, t, generator=g, dtype=dtype)
    lp = old + torch.randn(b, t, generator=g, dtype=dtype) * 0.5
    adv = torch.randn(b, t, generator=g, dtype=dtype)
    mask = (torch.rand(b, t, generator=g) < 0.8).to(dtype)
    outs = []
    for kwargs in ({}, {"agg": "token-mean"}, {"clip_eps_low": eps, "clip_eps_high": eps}):
        x = lp.clone().requires_grad_()
        loss, stats = ppo_policy_loss(x, old, adv, mask, eps, **kwargs)
        outs.append((loss, torch.autograd.grad(loss, x)[0], stats))
    x = lp.clone().requires_grad_()
    legacy = ppo_legacy(x, old, adv, mask, eps)
    legacy_grad = torch.autograd.grad(legacy, x)[0]
    for loss, grad, stats in outs:
        assert torch.equal(loss, legacy) and torch.equal(grad, legacy_grad)
        assert all(torch.equal(stats[k], outs[0][2][k]) for k in stats)


def test_ppo_asymmetric_clip_hand():
    # eps_low = 0.1, eps_high = 0.3: clip range [0.9, 1.3]
    #   tok  ratio  A    r*A    clip(r)*A   min    clipped?
    #   0    1.25   +1   1.25   1.25        1.25   no  (symmetric 0.2 would clip it to 1.2)
    #   1    1.5    +1   1.5    1.3         1.3    yes
    #   2    0.85   -1   -0.85  -0.9        -0.9   yes (symmetric 0.2 would not)
    #   3    1.5    -1   -1.5   -1.3        -1.5   no  (pessimistic unclipped term)
    lp = torch.log(torch.tensor([[1.25, 1.5, 0.85, 1.5]], dtype=F64)).requires_grad_()
    old, adv, mask = torch.zeros(1, 4, dtype=F64), torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=F64), torch.ones(1, 4)
    loss, stats = ppo_policy_loss(lp, old, adv, mask, clip_eps_low=0.1, clip_eps_high=0.3)
    close(loss, -(1.25 + 1.3 - 0.9 - 1.5) / 4)  # = -0.0375
    close(stats["clipfrac"], 2 / 4)
    loss.backward()
    close(lp.grad, [[-1.25 / 4, 0.0, 0.0, 1.5 / 4]])  # -(r A)/4 where unclipped
    # only clip_eps_high given: eps_low = clip_eps = 0.2 -> range [0.8, 1.3]: token 2 (0.85) no longer clipped
    loss, stats = ppo_policy_loss(lp, old, adv, mask, 0.2, clip_eps_high=0.3)
    close(loss, -(1.25 + 1.3 - 0.85 - 1.5) / 4)  # = -0.05
    close(stats["clipfrac"], 1 / 4)


def test_ppo_seq_aggregation_hand():
    # ratio 1 everywhere (logprobs == old): min(...) = A, loss = -agg(A)
    # A = [[1, 2, 3], [4, -, -]]: token-mean 10/4 = 2.5, seq-mean-token-mean (2 + 4)/2 = 3, seq-sum (6 + 4)/2 = 5
    adv = torch.tensor([[1.0, 2.0, 3.0], [4.0, 1e6, 1e6]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    z = torch.zeros(2, 3, dtype=F64)
    for mode, value in (("token-mean", -2.5), ("seq-mean-token-mean", -3.0), ("seq-mean-token-sum", -5.0)):
        loss, stats = ppo_policy_loss(z, z, adv, mask, agg=mode)
        close(loss, value)
        close(stats["ratio_mean"], 1.0)


# ---- kl_loss ----


def test_kl_loss_k3_hand():
    ln2 = math.log(2.0)
    # d = logprobs - ref = [ln 2, 0, -ln 2] valid, the 4th masked (huge values: must not overflow into NaN)
    lp = torch.tensor([[ln2, 0.0, -ln2, -1e4]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[0.0, 0.0, 0.0, 1e4]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = kl_loss(lp, ref, mask)
    # k3 = exp(-d) - 1 + d: [1/2 - 1 + ln 2, 0, 2 - 1 - ln 2]; sum = 1/2 -> mean over 3 = 1/6
    close(loss, 1 / 6)
    close(stats["kl"], 1 / 6)
    loss.backward()
    # d k3 / d logprobs = 1 - exp(-d), / 3 tokens: [(1 - 1/2)/3, 0, (1 - 2)/3, 0]
    close(lp.grad, [[1 / 6, 0.0, -1 / 3, 0.0]])
    assert ref.grad is None  # the reference is a constant


def test_kl_loss_kinds_and_aggregation():
    lp = torch.tensor([[0.5, -1.0, 0.0], [2.0, 9.0, 9.0]], dtype=F64)
    ref = torch.zeros(2, 3, dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # k2 = d^2/2: row 0 [0.125, 0.5, 0], row 1 [2]; token-mean 2.625/4, seq-mean-token-mean (0.625/3 + 2)/2
    close(kl_loss(lp, ref, mask, "k2")[0], 2.625 / 4)
    loss, stats = kl_loss(lp, ref, mask, "k2", "seq-mean-token-mean")
    close(loss, (0.625 / 3 + 2.0) / 2)
    close(stats["kl"], 2.625 / 4)  # the stat stays a token mean
    for kind in ("k1", "k3", "abs"):
        close(kl_loss(lp, ref, mask, kind)[0], masked_mean(kl_estimate(lp, ref, kind), mask))
