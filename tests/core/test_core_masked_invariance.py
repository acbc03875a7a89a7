"""Nothing outside the mask ever influences any result: for every masked function, replace every
masked-out entry of every input with large random values and check the outputs (and gradients)
are bit-for-bit unchanged, and gradients at masked entries are exactly 0."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.core import (
    ADVANTAGE_ESTIMATORS,
    LOSS_AGG_MODES,
    AdvantageInputs,
    aggregate_loss,
    discounted_returns,
    explained_variance,
    gae,
    kl_loss,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    ppo_policy_loss,
    reinforce_loss,
    sft_loss,
    token_rewards,
    value_loss,
)

F64 = torch.float64
V = 5  # vocabulary of the sft case


def _grads(loss, inputs):
    return list(torch.autograd.grad(loss, inputs))


def _stats(pair):
    loss, stats = pair
    return [loss] + [stats[k] for k in sorted(stats)]


# Each case: fn(d, mask) -> list of output tensors (or floats). ``d`` holds float64 [B, T] tensors
# "x", "y", "z" (per step), "row", "row2" [B], "last" [B] (V_T), "dones" [B, T] long, "logits" [B, T, V], "labels".
def _loss_with_grad(fn, key):
    def run(d, m):
        x = d[key].clone().requires_grad_()
        out = fn(x, d, m)
        return _stats(out) + _grads(out[0], [x])
    return run


CASES = {
    "masked_sum": lambda d, m: [masked_sum(d["x"], m), masked_sum(d["x"], m, dim=-1)],
    "masked_mean": lambda d, m: [masked_mean(d["x"], m), masked_mean(d["x"], m, dim=-1)],
    "masked_var": lambda d, m: [masked_var(d["x"], m), masked_var(d["x"], m, unbiased=False),
                                masked_var(d["x"], m, dim=-1)],
    "masked_whiten": lambda d, m: [masked_whiten(d["x"], m), masked_whiten(d["x"], m, shift_mean=False)],
    "token_rewards": lambda d, m: [t for kind in ("k1", "k2", "k3", "abs")
                                   for t in token_rewards(d["row"], d["x"], d["y"], m, 0.1, kind)],
    "gae": lambda d, m: [*gae(d["x"], d["y"], m, 0.9, 0.95), *gae(d["x"], d["y"], m, 1.0, 1.0),
                         *gae(d["x"], d["y"], m, 0.99, 0.9, dones=d["dones"], last_values=d["last"])],
    "discounted_returns": lambda d, m: [discounted_returns(d["x"], m, 0.9),
                                        discounted_returns(d["x"], m, 0.9, dones=d["dones"])],
    "explained_variance": lambda d, m: [explained_variance(d["x"], d["y"], m)],
    "ppo_policy_loss": _loss_with_grad(lambda x, d, m: ppo_policy_loss(x, d["y"], d["z"], m, 0.2), "x"),
    "value_loss": _loss_with_grad(lambda x, d, m: value_loss(x, d["y"], d["z"], m), "x"),
    "value_loss_clipped": _loss_with_grad(lambda x, d, m: value_loss(x, d["y"], d["z"], m, clip_eps=0.2), "x"),
    "reinforce_loss": _loss_with_grad(lambda x, d, m: reinforce_loss(x, d["y"], m, baseline=d["z"]), "x"),
    "reinforce_loss_rows": _loss_with_grad(lambda x, d, m: reinforce_loss(x, d["row"], m, baseline=d["row2"]), "x"),
    "sft_loss": _loss_with_grad(lambda x, d, m: sft_loss(x, d["labels"], m), "logits"),
    "ppo_policy_loss_asym_agg": _loss_with_grad(lambda x, d, m: ppo_policy_loss(
        x, d["y"], d["z"], m, clip_eps_low=0.1, clip_eps_high=0.3, agg="seq-mean-token-mean"), "x"),
    "kl_loss": _loss_with_grad(lambda x, d, m: kl_loss(x, d["y"], m), "x"),
    "kl_loss_seq_sum": _loss_with_grad(lambda x, d, m: kl_loss(x, d["y"], m, "k2", "seq-mean-token-sum"), "x"),
    "aggregate_loss": lambda d, m: [aggregate_loss(d["x"], m, mode) for mode in LOSS_AGG_MODES],
    # every registered estimator, one group (K = B) and K = 1; sequence rewards come from per-step inputs
    "advantage_estimators": lambda d, m: [
        out for name in sorted(ADVANTAGE_ESTIMATORS) for k in (1, d["x"].shape[0])
        for out in ADVANTAGE_ESTIMATORS[name](AdvantageInputs(d["x"], m, d["y"], k, 0.9, 0.95))],
}


def _inputs(g, b, t):
    return {
        "x": torch.randn(b, t, generator=g, dtype=F64),
        "y": torch.randn(b, t, generator=g, dtype=F64),
        "z": torch.randn(b, t, generator=g, dtype=F64),
        "row": torch.randn(b, generator=g, dtype=F64),
        "row2": torch.randn(b, generator=g, dtype=F64),
        "last": torch.randn(b, generator=g, dtype=F64),
        "dones": (torch.rand(b, t, generator=g) < 0.3).long(),
        "logits": torch.randn(b, t, V, generator=g, dtype=F64),
        "labels": torch.randint(0, V, (b, t), generator=g),
    }


def _perturb(g, d, m):
    """Every masked-out entry replaced by a large random value (finite, NaN-free)."""
    out = {}
    rows_empty = ~m.any(-1)
    last_masked = ~m[:, -1]
    for k, v in d.items():
        if k == "dones":
            out[k] = torch.where(m, v, (torch.rand(v.shape, generator=g) < 0.5).long())
        elif k == "labels":
            out[k] = torch.where(m, v, torch.randint(-100, 100, v.shape, generator=g))
        elif k == "logits":
            out[k] = torch.where(m[..., None], v, torch.randn(v.shape, generator=g, dtype=F64) * 1e3)
        elif k in ("row", "row2"):  # a per-row input of a row without valid entries
            out[k] = torch.where(rows_empty, torch.randn(v.shape, generator=g, dtype=F64) * 1e3, v)
        elif k == "last":  # V_T only bootstraps rows whose last step is valid
            out[k] = torch.where(last_masked, torch.randn(v.shape, generator=g, dtype=F64) * 1e3, v)
        else:
            out[k] = torch.where(m, v, torch.randn(v.shape, generator=g, dtype=F64) * 1e3)
    return out


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 4), t=st.integers(1, 6), seed=st.integers(0, 2**31 - 1),
       as_bool=st.booleans())
def test_masked_entries_never_influence_results(b, t, seed, as_bool):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) < 0.6
    mask[0, 0] = True
    if b > 1:
        mask[-1] = False  # always one empty row
    m = mask if as_bool else mask.double()
    d = _inputs(g, b, t)
    p = _perturb(g, d, mask)
    for name, fn in CASES.items():
        base, pert = fn(d, m), fn(p, m)
        assert len(base) == len(pert)
        for i, (u, v) in enumerate(zip(base, pert)):
            u, v = torch.as_tensor(u), torch.as_tensor(v)
            assert torch.isfinite(u).all(), (name, i)
            assert torch.equal(u, v), (name, i, u, v)
            if u.shape[:2] == mask.shape and u.dim() >= 2:  # per-step outputs and gradients: 0 when masked
                assert torch.all(u[~mask] == 0), (name, i)
