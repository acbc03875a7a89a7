"""Results: each run's curves and training seconds, and the per-arm summary over seeds (mean and
sample standard deviation, :mod:`fourfold.apps.report_kit`'s rule: nan for a single seed)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from fourfold.apps.report_kit import mean, std

CURVE_KEYS = ("reward/gold_mean", "reward/score_mean", "kl/k1", "rollout/response_length",
              "value/explained_variance", "mismatch/token_abs_diff_mean", "policy/first_ratio_abs_dev",
              "mismatch/is_truncated_share", "policy/grad_snr", "policy/dual_clipfrac", "policy/grad_norm",
              "policy/entropy", "policy/approx_kl", "policy/clipfrac")
"""The per-iteration metrics a run's curves keep: the report's curves and the 'practice' claims'
(the critic's explained variance, the engine-trainer mismatch, the first ratio, the correction's
truncated share), and what the measurement arms' questions read (the gradient SNR, the dual-clip
share, grad-norm spikes, entropy collapse, the clip's per-update KL and clipped share); nan in the iterations, or runs, that do not
log them."""


def read_curves(run_dir: Path) -> dict[str, list[float]]:
    """Per-iteration series of CURVE_KEYS (plus 'iteration' and 'time/iteration_s') of one run."""
    from fourfold.reporting import read_metrics

    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "iteration" in r]
    by_it: dict[int, dict] = {}
    for r in rows:
        by_it[int(r["iteration"])] = r  # a resumed run may repeat an iteration: the last one counts
    its = sorted(by_it)
    out = {"iteration": [float(i) for i in its]}
    for k in CURVE_KEYS + ("time/iteration_s",):
        out[k] = [math.nan if by_it[i].get(k) is None else float(by_it[i][k]) for i in its]
    return out


def train_seconds(run_dir: Path) -> float:
    """Seconds of training in a run's ``metrics.jsonl``: the sum of ``time/iteration_s`` over its
    iterations (PPO, REINFORCE: generation, scoring and updates), or for a run logged by steps
    (DPO) each row's ``time/step_s`` times the steps since the previous row. Start-up (imports,
    loading models; DPO's reference log-probs) is not counted. nan when nothing was logged."""
    from fourfold.reporting import read_metrics

    path = run_dir / "metrics.jsonl"
    rows = read_metrics(path) if path.is_file() else []
    by_it = {int(r["iteration"]): r.get("time/iteration_s") for r in rows if "iteration" in r}
    if by_it:
        return mean([t for t in by_it.values() if t is not None]) * len(by_it)
    by_step = {int(r["step"]): r["time/step_s"] for r in rows if r.get("time/step_s") is not None}
    total, prev = 0.0, 0
    for step in sorted(by_step):  # a resumed run may repeat a row: the last one counts
        total, prev = total + by_step[step] * (step - prev), step
    return total if by_step else math.nan


def summarize_costs(costs: Sequence[Mapping]) -> dict:
    """Mean and sd over seeds of each run's cost: peak resident memory of its training subprocess
    (``peak_rss_mb``, MB) and training seconds (``train_s``); nan where a run has no record."""
    out: dict[str, Any] = {}
    for k in ("peak_rss_mb", "train_s"):
        vals = [c.get(k) for c in costs]
        vals = [float(v) for v in vals if v is not None]
        out[k], out[k + "_sd"] = mean(vals), std(vals)
    return out


def _sd_units(x: float, base: float, sd_: float) -> float:
    return (x - base) / sd_ if sd_ and sd_ > 0 else math.nan


def summarize_arm(finals: Sequence[Mapping], curves: Sequence[Mapping], sft: Mapping, proxy_sft: Mapping) -> dict:
    """Mean and sd over seeds of the final evaluation (raw and in SFT sd units), and the spread of
    gold across seeds (final evaluation) and across iterations (training batches, last quarter)."""
    out: dict[str, Any] = {"seeds": len(finals)}
    for k in ("proxy", "gold", "kl", "length", "well_formed", "repetition"):
        vals = [f[k] for f in finals]
        out[k], out[k + "_sd"] = mean(vals), std(vals)
    gold_u = [_sd_units(f["gold"], sft["gold"], sft["gold_std"]) for f in finals]
    proxy_u = [_sd_units(f["proxy"], proxy_sft["proxy"], proxy_sft["proxy_std"]) for f in finals]
    out["gold_delta_sd"], out["gold_delta_sd_sd"] = mean(gold_u), std(gold_u)
    out["proxy_delta_sd"], out["proxy_delta_sd_sd"] = mean(proxy_u), std(proxy_u)
    out["gold_spread_seeds_sd"] = std(gold_u)  # undefined (nan) for one seed
    within = []
    for c in curves:
        g = [x for x in c.get("reward/gold_mean", []) if math.isfinite(x)]
        tail = g[len(g) - max(2, len(g) // 4):] if len(g) >= 2 else []
        if tail:
            within.append(std(tail) / sft["gold_std"] if sft["gold_std"] else math.nan)
    out["gold_spread_iters_sd"] = mean(within)
    times = [t for c in curves for t in c.get("time/iteration_s", []) if math.isfinite(t)]
    out["s_per_iteration"] = mean(times)
    return out
