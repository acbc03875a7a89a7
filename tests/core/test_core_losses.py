"""fourfold.core.losses: hand-computed losses, stats and gradients; PPO clipping property."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.core import bradley_terry_loss, ppo_policy_loss, reinforce_loss, sft_loss, value_loss

F64 = torch.float64


def close(a, b, **kw):
    torch.testing.assert_close(torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64), **kw)


# PPO case, eps = 0.2. Ratios are exact in float64 (exp(log r) == r for these r).
#   tok  ratio  A    r*A    clip(r)*A   min    clipped branch active?
#   0    1.0    +1   1.0    1.0         1.0    no
#   1    1.2    +1   1.2    1.2         1.2    no  (exactly on the boundary: equal, not smaller)
#   2    1.5    +1   1.5    1.2         1.2    yes (A > 0, r > 1.2)
#   3    0.8    -1   -0.8   -0.8        -0.8   no  (exactly on the boundary)
#   4    0.5    -1   -0.5   -0.8        -0.8   yes (A < 0, r < 0.8)
#   5    1.5    -2   -3.0   -2.4        -3.0   no  (pessimistic unclipped term)
#   6    0.5    +2   1.0    1.6         1.0    no  (pessimistic unclipped term)
#   7    masked: ratio e^50, A = 1e6 -> ignored
RATIOS = [[1.0, 1.2, 1.5, 0.8], [0.5, 1.5, 0.5, math.exp(50.0)]]
ADV = [[1.0, 1.0, 1.0, -1.0], [-1.0, -2.0, 2.0, 1e6]]
MASK = [[1, 1, 1, 1], [1, 1, 1, 0]]


def ppo_inputs():
    # old log-probs 0, so log r - 0 is exactly log r and exp(log r) == r bit for bit (checked below)
    old = torch.zeros(2, 4, dtype=F64)
    logprobs = torch.log(torch.tensor(RATIOS, dtype=F64)).requires_grad_()
    assert torch.equal(torch.exp(logprobs.detach() - old)[:, :3], torch.tensor(RATIOS, dtype=F64)[:, :3])
    return logprobs, old, torch.tensor(ADV, dtype=F64), torch.tensor(MASK, dtype=F64)


def test_ppo_policy_loss_hand():
    logprobs, old, adv, mask = ppo_inputs()
    loss, stats = ppo_policy_loss(logprobs, old, adv, mask, clip_eps=0.2)
    # sum of mins = 1 + 1.2 + 1.2 - 0.8 - 0.8 - 3 + 1 = -0.2 over 7 valid tokens
    close(loss, 0.2 / 7)
    close(stats["clipfrac"], 2 / 7)  # tokens 2 and 4
    close(stats["ratio_mean"], (1.0 + 1.2 + 1.5 + 0.8 + 0.5 + 1.5 + 0.5) / 7)  # = 1.0
    close(stats["ratio_max"], 1.5)
    k3 = lambda r: (r - 1) - math.log(r)  # noqa: E731
    close(stats["approx_kl"], (k3(1.0) + k3(1.2) + 2 * k3(1.5) + k3(0.8) + 2 * k3(0.5)) / 7)
    assert all(v.dim() == 0 and not v.requires_grad for v in stats.values())
    loss.backward()
    # d loss / d logprob_t = -(1/7) * d min / d logprob_t = -(r_t A_t)/7 where unclipped, 0 where clipped;
    # on the boundary both branches are equal and each carries the gradient r A (split, total r A).
    close(logprobs.grad, [[-1.0 / 7, -1.2 / 7, 0.0, 0.8 / 7], [0.0, 3.0 / 7, -1.0 / 7, 0.0]])


def test_ppo_policy_loss_no_valid_token_and_flat_shapes():
    lp = torch.randn(5, dtype=F64, requires_grad=True)
    loss, stats = ppo_policy_loss(lp, torch.zeros(5, dtype=F64), torch.ones(5, dtype=F64), torch.zeros(5))
    assert loss.item() == 0.0 and stats["clipfrac"].item() == 0.0 and stats["ratio_max"].item() == 0.0
    loss.backward()
    assert torch.all(lp.grad == 0)
    # flattened [N] env steps: r = 1 everywhere -> loss = -mean(A) = -(1 + 2 + 3)/3 = -2
    loss, _ = ppo_policy_loss(torch.zeros(3), torch.zeros(3), torch.tensor([1.0, 2.0, 3.0]), torch.ones(3))
    close(loss, -2.0)


@settings(max_examples=80, deadline=None)
@given(b=st.integers(1, 3), t=st.integers(1, 6), seed=st.integers(0, 2**31 - 1),
       eps=st.sampled_from([0.1, 0.2, 0.3]))
def test_ppo_gradient_zero_exactly_when_clipped_on_the_pushed_side(b, t, seed, eps):
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(b, t, generator=g, dtype=F64)
    logprobs = (old + torch.randn(b, t, generator=g, dtype=F64) * 0.5).requires_grad_()
    adv = torch.randn(b, t, generator=g, dtype=F64)
    adv = torch.where(adv == 0, torch.ones_like(adv), adv)
    mask = torch.rand(b, t, generator=g) < 0.8
    loss, _ = ppo_policy_loss(logprobs, old, adv, mask, clip_eps=eps)
    (grad,) = torch.autograd.grad(loss, logprobs)
    r = torch.exp(logprobs.detach() - old)
    n = max(int(mask.sum()), 1)
    clipped = ((adv > 0) & (r > 1 + eps)) | ((adv < 0) & (r < 1 - eps))
    assert torch.all(grad[mask & clipped] == 0)
    free = mask & ~clipped
    assert torch.all(grad[free] != 0)
    close(grad[free], (-r * adv / n)[free], rtol=1e-12, atol=0)
    assert torch.all(grad[~mask] == 0)


# value loss, eps = 0.2, token 3 masked
#   tok  V    V_old  R    (V-R)^2   V_clip = V_old + clip(V-V_old)   (V_clip-R)^2   max     clipped larger?
#   0    1.0  1.5    2.0  1.0       1.5 - 0.2 = 1.3                  0.49           1.0     no
#   1    2.0  1.5    2.0  0.0       1.5 + 0.2 = 1.7                  0.09           0.09    yes
#   2    3.0  2.0    2.0  1.0       2.0 + 0.2 = 2.2                  0.04           1.0     no
def value_inputs():
    v = torch.tensor([1.0, 2.0, 3.0, 50.0], dtype=F64, requires_grad=True)
    old = torch.tensor([1.5, 1.5, 2.0, -50.0], dtype=F64)
    R = torch.tensor([2.0, 2.0, 2.0, 1e3], dtype=F64)
    return v, old, R, torch.tensor([1, 1, 1, 0])


def test_value_loss_clipped_hand():
    v, old, R, mask = value_inputs()
    loss, stats = value_loss(v, old, R, mask, clip_eps=0.2)
    close(loss, 0.5 * (1.0 + 0.09 + 1.0) / 3)  # = 0.348333...
    close(stats["clipfrac"], 1 / 3)
    close(stats["mse"], (1.0 + 0.0 + 1.0) / 3)
    loss.backward()
    # d/dV of 0.5 * mean: (V - R)/3 where the unclipped term is the max; 0 at token 1 (V_clip is constant in V)
    close(v.grad, [-1 / 3, 0.0, 1 / 3, 0.0])


def test_value_loss_unclipped_hand():
    v, old, R, mask = value_inputs()
    loss, stats = value_loss(v, old, R, mask)
    close(loss, 0.5 * (1.0 + 0.0 + 1.0) / 3)
    close(stats["clipfrac"], 0.0)
    close(stats["mse"], 2 / 3)
    loss.backward()
    close(v.grad, [-1 / 3, 0.0, 1 / 3, 0.0])


def test_reinforce_loss_hand():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, 9.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    returns = torch.tensor([2.0, -1.0], dtype=F64)  # per sequence [B]
    loss, stats = reinforce_loss(logprobs, returns, mask, baseline=0.5)
    # A = [1.5, -1.5]; products: 1.5*[-1, -2, -3] = [-1.5, -3, -4.5], -1.5*[-0.5, -1.5] = [0.75, 2.25]
    # sum = -6 over 5 valid tokens -> loss = -(-6/5) = 1.2
    close(loss, 1.2)
    close(stats["advantage_mean"], (3 * 1.5 - 2 * 1.5) / 5)  # = 0.3
    loss.backward()
    close(logprobs.grad, [[-0.3, -0.3, -0.3], [0.3, 0.3, 0.0]])  # -A/5
    # baseline [B] = [1, 1]: A = [1, -2]: products -1, -2, -3, 1, 3 -> sum -2 -> loss 0.4
    close(reinforce_loss(logprobs, returns, mask, baseline=torch.tensor([1.0, 1.0], dtype=F64))[0], 0.4)
    # no baseline: A = [2, -1]: -2, -4, -6, 0.5, 1.5 -> sum -10 -> loss 2
    close(reinforce_loss(logprobs, returns, mask)[0], 2.0)
    # returns and baseline [B, T]
    rt = returns[:, None].expand(2, 3)
    close(reinforce_loss(logprobs, rt, mask, baseline=torch.full((2, 3), 0.5, dtype=F64))[0], 1.2)


def test_reinforce_loss_flat_and_baseline_gets_no_gradient():
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    base = torch.tensor([0.5, 0.5], requires_grad=True)
    loss, _ = reinforce_loss(lp, torch.tensor([1.0, 3.0]), torch.ones(2), baseline=base)
    # A = [0.5, 2.5]: -(-0.5 - 5.0)/2 = 2.75
    close(loss, 2.75)
    loss.backward()
    assert base.grad is None


def test_bradley_terry_loss_hand():
    chosen = torch.tensor([2.0, 0.0, 1.0], dtype=F64, requires_grad=True)
    rejected = torch.tensor([0.0, 0.0, 3.0], dtype=F64)
    loss, stats = bradley_terry_loss(chosen, rejected)
    # diff = [2, 0, -2]; -logsigmoid(d) = log(1 + e^-d)
    close(loss, (math.log(1 + math.exp(-2)) + math.log(2) + math.log(1 + math.exp(2))) / 3)
    close(stats["accuracy"], 1 / 3)  # only the first pair; a tie does not count
    close(stats["margin_mean"], 0.0)
    loss.backward()
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    close(chosen.grad, [-(1 - sig(d)) / 3 for d in (2.0, 0.0, -2.0)])
    # margin 1: log(1 + e^-(d - 1)) with d - 1 = [1, -1, -3]; stats still use d
    loss_m, stats_m = bradley_terry_loss(chosen, rejected, margin=1.0)
    close(loss_m, sum(math.log(1 + math.exp(-x)) for x in (1.0, -1.0, -3.0)) / 3)
    close(stats_m["margin_mean"], 0.0)
    per_pair = torch.tensor([1.0, 0.0, 0.0], dtype=F64)
    close(bradley_terry_loss(chosen, rejected, margin=per_pair)[0],
          sum(math.log(1 + math.exp(-x)) for x in (1.0, 0.0, -2.0)) / 3)


def test_sft_loss_hand():
    ln3 = math.log(3.0)
    logits = torch.tensor([[[0.0, ln3], [ln3, 0.0], [5.0, -5.0]]], dtype=F64, requires_grad=True)
    labels = torch.tensor([[1, 1, -100]])  # the masked label may be any value
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = sft_loss(logits, labels, mask)
    # p(label) = 3/4 and 1/4: nll = ln(4/3) and ln 4 -> mean = ln(16/3)/2
    close(loss, math.log(16 / 3) / 2)
    close(stats["ppl"], math.sqrt(16 / 3))
    close(stats["token_accuracy"], 0.5)  # argmax 1 == 1 right; argmax 0 != 1 wrong
    loss.backward()
    # d nll / d logits = (softmax - onehot) / 2 tokens: [1/4, 3/4] - [0, 1] and [3/4, 1/4] - [0, 1]
    close(logits.grad, [[[0.25 / 2, -0.25 / 2], [0.75 / 2, -0.75 / 2], [0.0, 0.0]]])


def test_sft_loss_bf16_logits_float32_loss():
    logits = torch.zeros(2, 3, 4, dtype=torch.bfloat16)
    loss, _ = sft_loss(logits, torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3))
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(math.log(4), rel=1e-6)  # uniform over 4


def test_value_loss_rounding_is_no_clipping():
    """Within the clip range V_clip is V itself: old + (V - old) rounds away from V in float32 for
    many values, which must not count as clipping (it made value/clipfrac depend on the batching)."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(4096, generator=g) * 3
    old = v + (torch.rand(4096, generator=g) - 0.5) * 0.3  # |V - old| < 0.15 < eps
    R = torch.randn(4096, generator=g) * 3
    assert bool((old + (v - old) != v).any())  # the rounding the loss must not see
    loss, stats = value_loss(v, old, R, torch.ones(4096), clip_eps=0.2)
    assert float(stats["clipfrac"]) == 0.0
    close(loss, 0.5 * ((v - R) ** 2).mean())
