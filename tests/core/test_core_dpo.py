"""fourfold.core: DPO / IPO loss by hand (values, stats, gradients; IPO on per-token mean
log-ratios and on sums), sequence log-probs, and properties: swapping chosen and rejected with
flipped labels, the gradient's sign, invariance to what h does not see, IPO's indifference to a
response's length."""

import math

import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from fourfold.core import DPO_LOSSES, dpo_loss, sequence_logprobs

F64 = torch.float64


def close(a, b, **kw):
    torch.testing.assert_close(torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64), **kw)


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))  # -log sigmoid(-x)


# Two pairs, beta = 0.5:
#   pair  pc   pr   rc    rr    pc-rc  pr-rr  h     beta*h   r_c    r_r
#   0     -1   -2   -1.5  -1.5  0.5    -0.5   1.0   0.5      0.25   -0.25
#   1     -3   -1   -2    -2    -1.0   1.0    -2.0  -1.0     -0.5   0.5
PC, PR, RC, RR = [-1.0, -3.0], [-2.0, -1.0], [-1.5, -2.0], [-1.5, -2.0]


def inputs():
    pc = torch.tensor(PC, dtype=F64, requires_grad=True)
    pr = torch.tensor(PR, dtype=F64, requires_grad=True)
    return pc, pr, torch.tensor(RC, dtype=F64), torch.tensor(RR, dtype=F64)


def test_sigmoid_loss_stats_and_gradients_by_hand():
    pc, pr, rc, rr = inputs()
    loss, stats = dpo_loss(pc, pr, rc, rr, beta=0.5)
    # -log sigmoid(z) = log(1 + e^-z): z = 0.5 and z = -1
    close(loss, (softplus(-0.5) + softplus(1.0)) / 2)
    close(stats["reward_margin"], (0.5 - 1.0) / 2)
    close(stats["accuracy"], 0.5)
    close(stats["chosen_reward"], (0.25 - 0.5) / 2)
    close(stats["rejected_reward"], (-0.25 + 0.5) / 2)
    assert all(v.dim() == 0 and not v.requires_grad for v in stats.values())
    loss.backward()
    # dL/dpc_i = -beta * sigmoid(-beta h_i) / B; dL/dpr_i = -dL/dpc_i
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = [-0.5 * sig(-0.5) / 2, -0.5 * sig(1.0) / 2]
    close(pc.grad, expected)
    close(pr.grad, [-g for g in expected])


def test_label_smoothing_by_hand():
    pc, pr, rc, rr = inputs()
    loss, _ = dpo_loss(pc, pr, rc, rr, beta=0.5, label_smoothing=0.2)
    # (1 - eps) * -log sigmoid(z) + eps * -log sigmoid(-z)
    per_pair = [0.8 * softplus(-z) + 0.2 * softplus(z) for z in (0.5, -1.0)]
    close(loss, sum(per_pair) / 2)
    loss.backward()
    # dL/dz = -(1 - eps) sigmoid(-z) + eps sigmoid(z)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    close(pc.grad, [0.5 * (-0.8 * sig(-z) + 0.2 * sig(z)) / 2 for z in (0.5, -1.0)])


# Token counts of the same two pairs (chosen, rejected): (2, 5) and (4, 1)
#   pair  pc-rc  pr-rr  nc  nr  (pc-rc)/nc  (pr-rr)/nr  h_mean
#   0     0.5    -0.5   2   5   0.25        -0.1        0.35
#   1     -1.0   1.0    4   1   -0.25       1.0         -1.25
NC, NR = [2, 4], [5, 1]


def test_ipo_loss_takes_per_token_means_by_hand():
    pc, pr, rc, rr = inputs()
    loss, stats = dpo_loss(pc, pr, rc, rr, beta=0.5, kind="ipo", chosen_tokens=torch.tensor(NC),
                           rejected_tokens=torch.tensor(NR))
    # target 1 / (2 beta) = 1: (0.35 - 1)^2 = 0.4225 and (-1.25 - 1)^2 = 5.0625
    close(loss, (0.4225 + 5.0625) / 2)
    close(stats["reward_margin"], -0.25)  # the implicit rewards are DPO's, on the sums, whatever the kind
    close(stats["accuracy"], 0.5)
    loss.backward()
    # dL/dpc_i = 2 (h_i - 1) / nc_i / B, dL/dpr_i = -2 (h_i - 1) / nr_i / B
    close(pc.grad, [2 * (-0.65) / 2 / 2, 2 * (-2.25) / 4 / 2])
    close(pr.grad, [2 * 0.65 / 5 / 2, 2 * 2.25 / 1 / 2])


def test_ipo_sum_loss_by_hand():
    pc, pr, rc, rr = inputs()
    loss, stats = dpo_loss(pc, pr, rc, rr, beta=0.5, kind="ipo_sum", chosen_tokens=torch.tensor(NC),
                           rejected_tokens=torch.tensor(NR))  # counts are ignored
    # target 1 / (2 beta) = 1: (1 - 1)^2 and (-2 - 1)^2
    close(loss, (0.0 + 9.0) / 2)
    close(stats["reward_margin"], -0.25)
    loss.backward()
    close(pc.grad, [0.0, 2 * (-3.0) / 2])
    close(pr.grad, [0.0, 3.0])
    # one token per response: the per-token mean is the sum
    one = torch.ones(2, dtype=torch.long)
    close(dpo_loss(*inputs(), beta=0.5, kind="ipo", chosen_tokens=one, rejected_tokens=one)[0], 4.5)
    # a count of 0 (no response token) is taken as 1, never a division by zero
    zero = torch.zeros(2, dtype=torch.long)
    close(dpo_loss(*inputs(), beta=0.5, kind="ipo", chosen_tokens=zero, rejected_tokens=zero)[0], 4.5)


def test_at_the_reference_the_loss_is_log_2():
    lp = torch.tensor([-4.0, -7.5, -0.3], dtype=F64)
    loss, stats = dpo_loss(lp, lp - 1, lp, lp - 1, beta=0.1)
    close(loss, math.log(2.0))
    close(stats["reward_margin"], 0.0)
    close(stats["accuracy"], 0.0)  # a tie is not a win


def test_reference_gets_no_gradient_and_bad_arguments_raise():
    pc, pr, rc, rr = inputs()
    rc.requires_grad_()
    rr.requires_grad_()
    loss, _ = dpo_loss(pc, pr, rc, rr)
    loss.backward()
    assert rc.grad is None and rr.grad is None
    with pytest.raises(ValueError, match="unknown DPO loss 'hinge'; expected one of sigmoid, ipo"):
        dpo_loss(pc, pr, rc, rr, kind="hinge")
    with pytest.raises(ValueError, match="beta must be > 0"):
        dpo_loss(pc, pr, rc, rr, beta=0.0)
    for kind in ("ipo", "ipo_sum"):
        with pytest.raises(ValueError, match=f"label_smoothing applies to the sigmoid loss only; {kind} has none"):
            dpo_loss(pc, pr, rc, rr, label_smoothing=0.1, kind=kind, chosen_tokens=torch.ones(2),
                     rejected_tokens=torch.ones(2))
    with pytest.raises(ValueError, match="the ipo loss averages over each response's tokens: pass chosen_tokens"):
        dpo_loss(pc, pr, rc, rr, kind="ipo")
    assert DPO_LOSSES == ("sigmoid", "ipo", "ipo_sum")


def test_sequence_logprobs_sums_the_valid_tokens_only():
    lp = torch.tensor([[-1.0, -2.0, -float("inf")], [-0.5, -0.25, -0.125], [-3.0, -3.0, -3.0]],
                      dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    seq = sequence_logprobs(lp, mask)
    close(seq, [-3.0, -0.875, 0.0])
    seq.sum().backward()
    close(lp.grad, mask.to(F64))  # exactly 0 on padding, even at -inf


# ---- properties ------------------------------------------------------------------------------------

_lp = st.floats(-20.0, 0.0, allow_nan=False)


@st.composite
def pairs(draw):
    """pc, pr, rc, rr (float64) and the responses' token counts nc, nr (long), n pairs."""
    n = draw(st.integers(1, 5))
    cols = [torch.tensor(draw(st.lists(_lp, min_size=n, max_size=n)), dtype=F64) for _ in range(4)]
    counts = [torch.tensor(draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))) for _ in range(2)]
    return cols + counts


def margin(kind, pc, pr, rc, rr, nc, nr):
    """The margin each kind regresses or classifies: h, or for 'ipo' the per-token mean h_mean."""
    if kind == "ipo":
        return (pc - rc) / nc - (pr - rr) / nr
    return (pc - rc) - (pr - rr)


_DENORMAL = [torch.zeros(1, dtype=F64)] * 3 + [torch.tensor([-5e-324], dtype=F64), torch.ones(1, dtype=torch.long),
             torch.ones(1, dtype=torch.long)]


@settings(max_examples=60, deadline=None)
@given(pairs(), st.floats(0.01, 5.0), st.floats(0.0, 0.49))
@example(_DENORMAL, 0.5, 0.0)  # margins 0 and 5e-324 differ, their rewards (x 0.5) are both 0: a tie
def test_swapping_chosen_and_rejected_with_flipped_labels_is_the_same_loss(cols, beta, eps):
    pc, pr, rc, rr, _, _ = cols
    loss, stats = dpo_loss(pc, pr, rc, rr, beta, eps)
    swapped, s_stats = dpo_loss(pr, pc, rr, rc, beta, 1.0 - eps)
    close(swapped, loss, rtol=1e-9, atol=1e-9)
    close(s_stats["reward_margin"], -stats["reward_margin"], rtol=1e-9, atol=1e-9)
    close(s_stats["chosen_reward"], stats["rejected_reward"])
    ties = float((beta * (pc - rc) == beta * (pr - rr)).to(F64).mean())  # ties of the rewards (beta x a denormal is 0)
    close(s_stats["accuracy"] + stats["accuracy"], 1.0 - ties)


@settings(max_examples=60, deadline=None)
@given(pairs(), st.floats(0.01, 5.0), st.floats(0.0, 0.49), st.sampled_from(DPO_LOSSES))
def test_gradient_sign(cols, beta, eps, kind):
    """Sigmoid: the chosen log-prob is pushed up exactly while beta * h < log((1 - eps) / eps)
    (always for eps = 0; conservative DPO pulls back past that point). IPO: up while its margin
    (h_mean for 'ipo', h for 'ipo_sum') < 1/(2 beta). The rejected log-prob always gets the opposite
    gradient (for 'ipo' scaled by the other response's count: nc * dL/dpc = -nr * dL/dpr)."""
    pc, pr, rc, rr, nc, nr = cols
    eps = eps if kind == "sigmoid" else 0.0
    pc, pr = pc.clone().requires_grad_(), pr.clone().requires_grad_()
    h = margin(kind, pc, pr, rc, rr, nc, nr)
    turn = (math.log((1 - eps) / eps) / beta) if eps > 0 else math.inf
    turn = turn if kind == "sigmoid" else 1.0 / (2.0 * beta)
    assume(bool(((h.detach() - turn).abs() > 1e-3).all()))
    loss, _ = dpo_loss(pc, pr, rc, rr, beta, eps, kind, nc, nr)
    loss.backward()
    up = h.detach() < turn
    assert torch.equal(pc.grad < 0, up) and torch.equal(pc.grad > 0, ~up)
    if kind == "ipo":
        close(pr.grad * nr, -pc.grad * nc)
    else:
        close(pr.grad, -pc.grad)


@settings(max_examples=40, deadline=None)
@given(pairs(), st.lists(st.floats(-10.0, 10.0), min_size=5, max_size=5), st.floats(0.01, 5.0),
       st.sampled_from(DPO_LOSSES))
def test_loss_sees_only_the_log_ratio_margin(cols, shifts, beta, kind):
    """A per-pair constant added to the policy's chosen and rejected log-probs (a prompt-only
    term; per token for 'ipo', which averages), or to a response's policy and reference log-probs
    alike, changes nothing."""
    pc, pr, rc, rr, nc, nr = cols
    c = torch.tensor(shifts[: pc.shape[0]], dtype=F64)
    loss, _ = dpo_loss(pc, pr, rc, rr, beta, 0.0, kind, nc, nr)
    cc, cr = (c * nc, c * nr) if kind == "ipo" else (c, c)
    close(dpo_loss(pc + cc, pr + cr, rc, rr, beta, 0.0, kind, nc, nr)[0], loss, rtol=1e-9, atol=1e-9)
    close(dpo_loss(pc + c, pr, rc + c, rr, beta, 0.0, kind, nc, nr)[0], loss, rtol=1e-9, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(pairs(), st.integers(2, 6), st.floats(0.01, 5.0))
def test_ipo_is_indifferent_to_length_ipo_sum_is_not(cols, k, beta):
    """A response k times as long with the same per-token log-ratios (its sums and its count times
    k): 'ipo''s loss is unchanged, 'ipo_sum''s margin grows k-fold; with every count n, 'ipo' is
    'ipo_sum' on the log-probs divided by n."""
    pc, pr, rc, rr, nc, nr = cols
    loss, _ = dpo_loss(pc, pr, rc, rr, beta, 0.0, "ipo", nc, nr)
    close(dpo_loss(k * pc, pr, k * rc, rr, beta, 0.0, "ipo", k * nc, nr)[0], loss, rtol=1e-9, atol=1e-9)
    close(dpo_loss(pc, k * pr, rc, k * rr, beta, 0.0, "ipo", nc, k * nr)[0], loss, rtol=1e-9, atol=1e-9)
    n = nc[:1].expand_as(nc)
    close(dpo_loss(pc, pr, rc, rr, beta, 0.0, "ipo", n, n)[0],
          dpo_loss(pc / n, pr / n, rc / n, rr / n, beta, 0.0, "ipo_sum")[0], rtol=1e-9, atol=1e-9)
    h = (pc - rc) - (pr - rr)
    summed = dpo_loss(k * pc, k * pr, k * rc, k * rr, beta, 0.0, "ipo_sum")[0]
    close(summed, ((k * h - 1 / (2 * beta)) ** 2).mean(), rtol=1e-9, atol=1e-9)
