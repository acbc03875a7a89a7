"""The newer policy losses of ppo_policy_loss (dual-clip, GSPO's sequence ratio, CISPO, the
rollout correction's token weights) against values computed by hand, and one update's loss and
gradient against TRL's GRPOTrainer formula.

TRL is not a dependency: ``trl_grpo_loss`` below is a line-by-line transcription of
``GRPOTrainer._compute_loss`` (huggingface/trl at f2cd577, 2026-07-24, VERSION 1.10.0.dev0, the
snapshot the field notes read; grpo_trainer.py lines ~3040-3170 there: the importance weights
of ``importance_sampling_level``, ``loss_type`` grpo / bnpo / dapo / cispo, ``epsilon_high``, the
vLLM importance-sampling ratio multiplied into the per-token loss, and ``mask_truncated_completions``
as a zeroed completion mask), with beta = 0, no entropy terms, one process and no gradient
accumulation.
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.core import ppo_policy_loss, rollout_correction_weights


def _lp(*ratios):
    return torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)


def test_dual_clip_by_hand():
    """eps 0.2, c = 3. A < 0, r = 5: PPO's term min(-5, -1.2) = -5, dual-clip's max(-5, -3) = -3
    (gradient 0); r = 2: -2 > -3 unchanged (gradient d(-rA)/dlogp = 2); A > 0 untouched."""
    lp = _lp(5.0, 2.0, 5.0)
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    loss, stats = ppo_policy_loss(lp, torch.zeros(1, 3), adv, torch.ones(1, 3), 0.2, dual_clip=3.0)
    assert float(loss.detach()) == pytest.approx((3.0 + 2.0 - 1.2) / 3)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([0.0, 2.0 / 3, 0.0])
    assert float(stats["clipfrac"]) == pytest.approx(2 / 3)  # the dual bound and the upper clip
    plain, _ = ppo_policy_loss(lp.detach(), torch.zeros(1, 3), adv, torch.ones(1, 3), 0.2)
    assert float(plain) == pytest.approx((5.0 + 2.0 - 1.2) / 3)
    with pytest.raises(ValueError, match="> 1"):
        ppo_policy_loss(lp, torch.zeros(1, 3), adv, torch.ones(1, 3), dual_clip=1.0)


def test_gspo_sequence_ratio_is_the_geometric_mean():
    """Token ratios 2, 0.5, 4 (and a padded 4th token): s = 4^(1/3) = 1.587 on every token, not
    their product 4. A = +1: clipped at 1.2 (loss -1.2, gradient 0); A = -1: loss s, gradient s / 3."""
    s = 4 ** (1 / 3)
    lp = torch.tensor([[math.log(2), math.log(0.5), math.log(4), 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1, 1, 0]])
    loss, stats = ppo_policy_loss(lp, torch.zeros(1, 4), torch.ones(1, 4), mask, 0.2, ratio_level="sequence")
    assert float(loss.detach()) == pytest.approx(-1.2)
    assert float(stats["ratio_mean"]) == pytest.approx(s)
    loss.backward()
    assert lp.grad.abs().max() == 0
    lp.grad = None
    loss, _ = ppo_policy_loss(lp, torch.zeros(1, 4), -torch.ones(1, 4), mask, 0.2, ratio_level="sequence")
    assert float(loss.detach()) == pytest.approx(s)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([s / 3, s / 3, s / 3, 0.0])


def test_cispo_by_hand():
    """r = 2 and 0.5, A = 1, eps_high 0.28: weights sg(min(r, 1.28)) = 1.28 and 0.5 times A log pi;
    the clipped token keeps its gradient (-1.28 / 2), unlike PPO's."""
    lp = _lp(2.0, 0.5)
    loss, stats = ppo_policy_loss(lp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), 0.2,
                                  clip_eps_high=0.28, kind="cispo")
    assert float(loss.detach()) == pytest.approx(-(1.28 * math.log(2) + 0.5 * math.log(0.5)) / 2)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-1.28 / 2, -0.5 / 2])
    assert float(stats["clipfrac"]) == pytest.approx(0.5)


def test_token_weights_multiply_each_term():
    lp = _lp(1.1, 0.9)
    w = torch.tensor([[2.0, 0.0]])
    loss, _ = ppo_policy_loss(lp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), 0.2, token_weights=w)
    assert float(loss.detach()) == pytest.approx(-(2.0 * 1.1 + 0.0) / 2)


def test_default_options_leave_the_loss_unchanged():
    torch.manual_seed(0)
    lp, old, adv = torch.randn(3, 5), torch.randn(3, 5), torch.randn(3, 5)
    mask = (torch.rand(3, 5) > 0.3).float()
    a, _ = ppo_policy_loss(lp, old, adv, mask, 0.2)
    b, _ = ppo_policy_loss(lp, old, adv, mask, 0.2, dual_clip=None, ratio_level="token", kind="clip",
                           token_weights=None)
    assert torch.equal(a, b)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-2, 2), min_size=4, max_size=4), st.lists(st.floats(-2, 2), min_size=4, max_size=4),
       st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]))
def test_properties_of_the_newer_losses(log_ratios, advs, agg):
    """A one-token response's sequence ratio is its token ratio; dual-clip never makes the loss
    larger, and bounds each negative-advantage term by c |A|; CISPO's gradient is never 0 on a
    token with A != 0 and has the sign of -A."""
    lp = torch.tensor(log_ratios).reshape(4, 1)
    adv = torch.tensor(advs).reshape(4, 1)
    mask = torch.ones(4, 1)
    tok, _ = ppo_policy_loss(lp, torch.zeros(4, 1), adv, mask, 0.2, agg=agg)
    seq, _ = ppo_policy_loss(lp, torch.zeros(4, 1), adv, mask, 0.2, agg=agg, ratio_level="sequence")
    torch.testing.assert_close(seq, tok)
    dual, _ = ppo_policy_loss(lp, torch.zeros(4, 1), adv, mask, 0.2, dual_clip=3.0, agg="token-mean")
    plain, _ = ppo_policy_loss(lp, torch.zeros(4, 1), adv, mask, 0.2, agg="token-mean")
    assert float(dual) <= float(plain) + 1e-6
    assert float(dual) <= 3.0 * float(adv.abs().mean()) + 1e-6  # each token's loss <= c |A| (<= 0 where A > 0)
    x = lp.clone().requires_grad_(True)
    loss, _ = ppo_policy_loss(x, torch.zeros(4, 1), adv, mask, 0.2, kind="cispo")
    loss.backward()
    nonzero = adv != 0
    assert bool((torch.sign(x.grad[nonzero]) == -torch.sign(adv[nonzero])).all())


# ---- TRL's formula, transcribed ----------------------------------------------------------------

def trl_grpo_loss(per_token_logps, old_per_token_logps, advantages, completion_mask, *, loss_type, level,
                  epsilon_low, epsilon_high, importance_sampling_ratio=None, truncated=None):
    """TRL's GRPOTrainer._compute_loss (see the module docstring), beta = 0."""
    mask = completion_mask
    if truncated is not None:  # mask_truncated_completions: the completion mask zeroed for them
        mask = mask * (~truncated).unsqueeze(1).int()
    advantages = advantages.unsqueeze(1)
    log_ratio = per_token_logps - old_per_token_logps
    if level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_importance_weights = log_importance_weights.unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    if loss_type == "cispo":
        clamped_ratios = torch.clamp(coef_1, max=epsilon_high).detach()
        per_token_loss = -clamped_ratios * advantages * per_token_logps
    else:
        coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if importance_sampling_ratio is not None:
        per_token_loss = per_token_loss * importance_sampling_ratio
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    # dapo, cispo: normalizer = num_items_in_batch (the batch's valid tokens) / num_processes (1)
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 7
    lengths = torch.tensor([7, 3, 5, 1, 6, 4])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).int()
    old = -torch.rand(B, T, generator=g) * 3
    new = old + 0.3 * torch.randn(B, T, generator=g)
    engine = old + 0.05 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    truncated = torch.tensor([True, False, False, True, False, False])
    return new, old, engine, adv, mask, truncated


@pytest.mark.parametrize("loss_type, agg, level", [
    ("grpo", "seq-mean-token-mean", "token"), ("bnpo", "token-mean", "token"), ("dapo", "token-mean", "token"),
    ("dapo", "token-mean", "sequence"), ("grpo", "seq-mean-token-mean", "sequence"), ("cispo", "token-mean", "token"),
])
@pytest.mark.parametrize("with_is", [None, "token_tis", "seq_mis"])
def test_one_update_equals_trls_formula(loss_type, agg, level, with_is):
    """Loss and gradient of one update on a fixed batch, fourfold's against TRL's transcribed
    formula: clip-higher (0.2 / 0.28), truncated completions masked, and TRL's vLLM IS ratio
    (token_truncate / sequence_mask, cap 3) against fourfold's rollout_correction (token_tis /
    seq_mis). TRL's cispo clamps the ratio at epsilon_high itself: fourfold's 1 + clip_eps_high."""
    new, old, engine, adv, mask, truncated = _batch()
    cap = 3.0
    is_ratio = None
    if with_is == "token_tis":
        is_ratio = torch.clamp(torch.exp((old - engine) * mask), max=cap)
    elif with_is == "seq_mis":
        r = torch.exp(((old - engine) * mask).sum(-1, keepdim=True))
        is_ratio = r.masked_fill(r > cap, 0.0)
    eps_high = 0.28
    ours_lp = new.clone().requires_grad_(True)
    trl_lp = new.clone().requires_grad_(True)
    trl = trl_grpo_loss(trl_lp, old, adv, mask, loss_type=loss_type, level=level, epsilon_low=0.2,
                        epsilon_high=1 + eps_high if loss_type == "cispo" else eps_high,
                        importance_sampling_ratio=is_ratio, truncated=truncated)
    kept = mask.float() * (~truncated).float()[:, None]  # fourfold's ppo.mask_truncated
    weights = None
    if with_is is not None:
        weights, _ = rollout_correction_weights(old, engine, mask, with_is, cap)
    ours, _ = ppo_policy_loss(ours_lp, old, adv[:, None].expand_as(new), kept, 0.2, clip_eps_high=eps_high, agg=agg,
                              ratio_level=level, kind="cispo" if loss_type == "cispo" else "clip",
                              token_weights=weights)
    if loss_type == "grpo":
        # one difference, by design: TRL's grpo mean over sequences counts a masked (truncated)
        # completion as a 0 in its .mean() over all B rows; fourfold's seq-mean-token-mean averages
        # over the rows with a valid token (aggregate_loss), here 4 of 6
        ours = ours * float(kept.any(-1).sum()) / kept.shape[0]
    assert float(ours.detach()) == pytest.approx(float(trl.detach()), rel=1e-6, abs=1e-7)
    ours.backward()
    trl.backward()
    torch.testing.assert_close(ours_lp.grad, trl_lp.grad, rtol=1e-5, atol=1e-7)
