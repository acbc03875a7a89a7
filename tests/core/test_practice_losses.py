"""The newer policy losses of ppo_policy_loss (dual-clip, GSPO's sequence ratio, CISPO, the
rollout correction's token weights) against values computed by hand, and one update's loss and
gradient against TRL's GRPOTrainer formula.

TRL is not a dependency: the ``trl_*`` functions below are a line-by-line transcription of TRL
1.12.0 (the wheel trl-1.12.0-py3-none-any.whl from PyPI), trl/trainer/grpo_trainer.py:
``GRPOTrainer._compute_loss`` (lines 3109-3379: the importance weights of
``importance_sampling_level``, ``loss_type`` grpo / bnpo / dr_grpo / dapo / cispo, ``epsilon_high``,
the two-sided clip ``delta``, the vLLM importance-sampling ratio multiplied into the per-token loss,
the normalizers) and the two blocks of ``_generate_and_score_completions`` that feed it
(lines 2505-2516: ``mask_truncated_completions`` zeroes the completion mask, ``num_items_in_batch``;
lines 2677-2725: the vLLM IS ratio of ``vllm_importance_sampling_mode``), with beta = 0, no
entropy terms, one process and no gradient accumulation (steps_per_generation 1).
tools/trl_grpo_check.py runs TRL 1.12.0's own code on this file's batch and cases (not in the suite).
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


def test_dual_clipfrac_by_hand():
    """eps 0.2, c = 3, 2 x 4 tokens, the last of row 1 padded (7 valid). The bound acts where A < 0
    and r > 3: (r 5, A -1) and (r 3.5, A -2) do; (r 2, A -1) has the PPO term -2 > -3; (r 5, A +1)
    is clipped above, not dual-clipped; (r 0.5, A -1) clipped below; the padded (r 9, A -1) never
    counts. dual_clipfrac = 2/7, exactly the tokens whose gradient the bound zeroes beyond PPO's;
    clipfrac counts them with the other clipped ones (4/7: r 5 A +1, r 0.5 A -1 and the two).
    Without dual_clip, and under cispo, it is exactly 0."""
    lp = _lp(5.0, 2.0, 5.0, 0.5, 3.5, 1.0, 1.0, 9.0).reshape(2, 4).detach().requires_grad_()
    adv = torch.tensor([[-1.0, -1.0, 1.0, -1.0], [-2.0, 1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
    loss, stats = ppo_policy_loss(lp, torch.zeros(2, 4), adv, mask, 0.2, dual_clip=3.0)
    assert float(stats["dual_clipfrac"]) == pytest.approx(2 / 7, abs=1e-7)
    assert float(stats["clipfrac"]) == pytest.approx(4 / 7, abs=1e-7)
    plain_grad = torch.autograd.grad(ppo_policy_loss(lp, torch.zeros(2, 4), adv, mask, 0.2)[0], lp)[0]
    dual_grad = torch.autograd.grad(loss, lp)[0]
    zeroed = (dual_grad == 0) & (plain_grad != 0)
    assert zeroed.tolist() == [[True, False, False, False], [True, False, False, False]]
    for kw in ({}, {"kind": "cispo"}):
        _, off = ppo_policy_loss(lp.detach(), torch.zeros(2, 4), adv, mask, 0.2, **kw)
        assert float(off["dual_clipfrac"]) == 0.0


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
# advantages without float32 subnormals: CISPO's gradient A w / 4 of A = 1.4e-45 underflows to 0
@given(st.lists(st.floats(-2, 2), min_size=4, max_size=4),
       st.lists(st.floats(-2, 2, width=32, allow_subnormal=False), min_size=4, max_size=4),
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


# ---- TRL 1.12.0's formula, transcribed --------------------------------------------------------

def trl_loss_mask(completion_mask, truncated):
    """_generate_and_score_completions with mask_truncated_completions: the completion mask zeroed
    for truncated completions, and num_items_in_batch (gathered over 1 process)."""
    completion_mask = completion_mask * (~truncated).unsqueeze(1).int()
    return completion_mask, completion_mask.sum()


def trl_importance_sampling_ratio(old_per_token_logps, sampling_per_token_logps, mask, mode, clip_max, clip_min=None):
    """_generate_and_score_completions: the vLLM IS ratio, [B, T] (token_*) or [B, 1] (sequence_*)."""
    per_token_logps_diff = torch.nan_to_num((old_per_token_logps - sampling_per_token_logps) * mask, nan=0.0)
    if mode in ["sequence_mask", "sequence_truncate"]:
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    min_val = clip_min if clip_min is not None else -math.inf
    max_val = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)


def trl_grpo_loss(per_token_logps, old_per_token_logps, advantages, mask, *, loss_type, level, epsilon_low,
                  epsilon_high, delta=None, importance_sampling_ratio=None, num_items_in_batch=None,
                  max_completion_length=None, gradient_accumulation_steps=1, steps_per_generation=1, num_processes=1):
    """GRPOTrainer._compute_loss (see the module docstring), beta = 0, in train mode; ``mask`` is
    the completion mask after trl_loss_mask."""
    if advantages.dim() == 1:
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
    else:  # grpo, bnpo, dr_grpo, dapo
        coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
        if delta is not None:  # two-sided clipping
            coef_1 = torch.clamp(coef_1, max=delta)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if importance_sampling_ratio is not None:  # use_vllm and vllm_importance_sampling_correction
        per_token_loss = per_token_loss * importance_sampling_ratio
    if loss_type == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
        return loss / gradient_accumulation_steps
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0) / gradient_accumulation_steps
    if loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
        return loss / gradient_accumulation_steps
    # dapo, cispo: num_items_in_batch spans the generation batch, rescaled to one accumulation window
    normalizer = num_items_in_batch.clamp(min=1.0) / num_processes
    normalizer = normalizer * gradient_accumulation_steps / steps_per_generation
    return (per_token_loss * mask).sum() / normalizer


# ---- the fixed batch and the cases ---------------------------------------------------------------

CAP = 1.5  # the IS cap (TRL's vllm_importance_sampling_clip_max), low enough to bind on this batch
EPS_LOW, EPS_HIGH, DELTA = 0.2, 0.28, 1.5
# (TRL loss_type, fourfold agg, importance_sampling_level / ratio_level, TRL delta / fourfold dual_clip)
CASES = [
    ("grpo", "seq-mean-token-mean", "token", None), ("bnpo", "token-mean", "token", None),
    ("dr_grpo", "seq-mean-token-sum", "token", None), ("dapo", "token-mean", "token", None),
    ("dapo", "token-mean", "sequence", None), ("grpo", "seq-mean-token-mean", "sequence", None),
    ("cispo", "token-mean", "token", None), ("dapo", "token-mean", "token", DELTA),
]
# fourfold's rollout_correction mode -> TRL's vllm_importance_sampling_mode
IS_MODES = {None: None, "token_tis": "token_truncate", "token_mis": "token_mask", "seq_tis": "sequence_truncate",
            "seq_mis": "sequence_mask"}


def fixed_batch(seed=14):
    """6 responses of lengths 7, 3, 5, 1, 6, 4 (the 1st and 4th truncated): new, old and engine
    (sampler) log-probs [6, 7], advantages [6], the completion mask [6, 7] (int) and truncated [6].
    Seed 14: the first whose batch reaches every bound (test_the_fixed_batch_reaches_every_bound)."""
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 7
    lengths = torch.tensor([7, 3, 5, 1, 6, 4])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).int()
    old = -torch.rand(B, T, generator=g) * 3
    new = old + 0.3 * torch.randn(B, T, generator=g)
    engine = old + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    truncated = torch.tensor([True, False, False, True, False, False])
    return new, old, engine, adv, mask, truncated


def fourfold_update(loss_type, agg, level, delta, with_is, batch=None):
    """fourfold's loss on the fixed batch with the two rescalings that map it onto TRL's (the grpo
    and dr_grpo denominators, see test_one_update_equals_trls_formula), and d loss / d new."""
    new, old, engine, adv, mask, truncated = fixed_batch() if batch is None else batch
    lp = new.clone().requires_grad_(True)
    kept = mask.float() * (~truncated).float()[:, None]  # fourfold's ppo.mask_truncated
    weights = None if with_is is None else rollout_correction_weights(old, engine, mask, with_is, CAP)[0]
    loss, _ = ppo_policy_loss(lp, old, adv[:, None].expand_as(new), kept, EPS_LOW, clip_eps_high=EPS_HIGH, agg=agg,
                              ratio_level=level, kind="cispo" if loss_type == "cispo" else "clip",
                              token_weights=weights, dual_clip=delta)
    rows = float(kept.any(-1).sum())
    if loss_type == "grpo":  # TRL: .mean() over all B rows, a masked (truncated) row a 0
        loss = loss * rows / kept.shape[0]
    elif loss_type == "dr_grpo":  # TRL: / (B * max_completion_length); fourfold's seq-mean-token-sum: / rows
        loss = loss * rows / (kept.shape[0] * kept.shape[1])
    loss.backward()
    return loss.detach(), lp.grad


def trl_formula_update(loss_type, agg, level, delta, with_is, batch=None):
    """The transcription's loss on the fixed batch and d loss / d new. TRL's cispo clamps the ratio
    at epsilon_high itself: fourfold's 1 + clip_eps_high."""
    new, old, engine, adv, mask, truncated = fixed_batch() if batch is None else batch
    lp = new.clone().requires_grad_(True)
    loss_mask, num_items = trl_loss_mask(mask, truncated)
    is_ratio = None
    if with_is is not None:
        is_ratio = trl_importance_sampling_ratio(old, engine, loss_mask, IS_MODES[with_is], CAP)
    loss = trl_grpo_loss(lp, old, adv, loss_mask, loss_type=loss_type, level=level, epsilon_low=EPS_LOW,
                         epsilon_high=1 + EPS_HIGH if loss_type == "cispo" else EPS_HIGH, delta=delta,
                         importance_sampling_ratio=is_ratio, num_items_in_batch=num_items,
                         max_completion_length=mask.shape[1])
    loss.backward()
    return loss.detach(), lp.grad


def test_the_fixed_batch_reaches_every_bound():
    """Not vacuous: the kept tokens have advantages of both signs, some ratio passes each clip bound
    and delta with A < 0, and the IS cap binds per token and per response (not on every one)."""
    new, old, engine, adv, mask, truncated = fixed_batch()
    kept = mask.bool() & ~truncated[:, None]
    r = torch.exp(new - old)[kept]
    a = adv[:, None].expand_as(new)[kept]
    assert bool((a > 0).any()) and bool((a < 0).any())
    assert bool((r > 1 + EPS_HIGH).any()) and bool((r < 1 - EPS_LOW).any())
    assert bool(((r > DELTA) & (a < 0)).any())
    assert bool((torch.exp(old - engine)[kept] > CAP).any())
    seq = torch.exp(((old - engine) * kept).sum(-1))[kept.any(-1)]
    assert bool((seq > CAP).any()) and bool((seq <= CAP).any())


@pytest.mark.parametrize("loss_type, agg, level, delta", CASES)
@pytest.mark.parametrize("with_is", list(IS_MODES))
def test_one_update_equals_trls_formula(loss_type, agg, level, delta, with_is):
    """Loss and gradient of one update on the fixed batch, fourfold's against TRL 1.12.0's
    transcribed formula: clip-higher (0.2 / 0.28), truncated completions masked, TRL's two-sided
    clip delta as fourfold's dual_clip, and TRL's vLLM IS ratio (token_truncate / token_mask /
    sequence_truncate / sequence_mask, cap 1.5) against fourfold's rollout_correction (token_tis /
    token_mis / seq_tis / seq_mis).

    Two denominators differ, by design, and fourfold_update rescales them: TRL's grpo mean over
    sequences counts a masked (truncated) completion as a 0 in its .mean() over all B rows, where
    fourfold's seq-mean-token-mean averages over the rows with a valid token (aggregate_loss), here
    4 of 6; TRL's dr_grpo divides the token sum by B * max_completion_length (6 * 7), fourfold's
    seq-mean-token-sum by those 4 rows."""
    ours, ours_grad = fourfold_update(loss_type, agg, level, delta, with_is)
    trl, trl_grad = trl_formula_update(loss_type, agg, level, delta, with_is)
    assert float(ours) == pytest.approx(float(trl), rel=1e-6, abs=1e-7)
    torch.testing.assert_close(ours_grad, trl_grad, rtol=1e-5, atol=1e-7)
