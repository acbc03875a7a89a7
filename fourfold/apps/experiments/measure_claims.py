"""The claims of issue 39's measurement arms (:data:`fourfold.apps.experiments.arms.MEASURE_ARMS`):
REINFORCE's gradient variance by baseline at PPO's steps, the critic's, and dual-clip where the
ratios get large; each a *finding* (it could go either way), each with its null.

They read the runs' curves ({arm: {seed: per-iteration series}}, ``results.read_curves``), by seed.
The thresholds (:data:`MEASURE`) are written here before any run. Each ratio claim's verdict
function also runs on a null comparison whose answer must be "no": the numerator arm against itself
over seeds, its most favourable pair (its best seed over its worst), so a threshold the run-to-run
spread alone reaches says "yes" there and the row is not a finding that holds. Not yet wired into
:func:`~fourfold.apps.experiments.claims.compute_claims` (group 'measure'); docs/experiments.md,
"The update's measurements".
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

from fourfold.apps.claim_kit import claim_row
from fourfold.apps.report_kit import fmt

MEASURE = {
    "baseline_min_snr_ratio": 1.2,
    "loo_min_snr_ratio": 1.05,
    "critic_min_snr_ratio": 1.2,
    "dual_clip_min_share": 1e-3,
    "dual_clip_max_spike_ratio": 0.8,
}
"""The thresholds, fixed before the first run of the measurement arms (a threshold moved after seeing
results is no test): a baseline raises REINFORCE's mean policy/grad_snr by >= 1.2x (mean vs none);
leave-one-out by >= 1.05x over the batch mean; PPO's GAE >= 1.2x REINFORCE's better baseline; under
ppo-stress dual-clip's bound acts on >= 0.1% of tokens (mean policy/dual_clipfrac) and its largest
policy/grad_norm is <= 0.8x ppo-stress's. Each in every seed."""

Curves = Mapping[str, Mapping[int, Mapping[str, Sequence[float]]]]


def run_mean(curves: Curves, arm: str, seed: int, key: str) -> float:
    """The mean over iterations of ``key``'s finite values in ``arm``'s run of ``seed`` (nan: none)."""
    xs = [x for x in curves.get(arm, {}).get(seed, {}).get(key, []) if math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def run_max(curves: Curves, arm: str, seed: int, key: str) -> float:
    """The largest finite value of ``key`` in ``arm``'s run of ``seed`` (nan: none)."""
    xs = [x for x in curves.get(arm, {}).get(seed, {}).get(key, []) if math.isfinite(x)]
    return max(xs) if xs else math.nan


def ratio_verdict(num: Sequence[float], den: Sequence[float], ok: Callable[[float], bool]) -> tuple[list[float], bool]:
    """Per-seed ratios num / den and whether ``ok`` holds for every one (nan or no seed: False)."""
    r = [a / b if b > 0 else math.nan for a, b in zip(num, den)]
    return r, bool(r) and all(math.isfinite(x) and ok(x) for x in r)


def spread_pair(xs: Sequence[float], above: bool) -> tuple[list[float], list[float]]:
    """The null's comparison of an arm with itself over seeds: ([its largest], [its smallest]) of
    the finite ``xs`` (``above`` False: the other way round), the pair most likely to pass a ratio
    threshold; ([], []) without a finite value."""
    f = [x for x in xs if math.isfinite(x)]
    if not f:
        return [], []
    return ([max(f)], [min(f)]) if above else ([min(f)], [max(f)])


def _ratio_claim(rows: list, key: str, claim: str, num_arm: str, den: Sequence[float], num: Sequence[float],
                 seeds: Sequence[int], what: str, threshold: float, above: bool) -> None:
    ok = (lambda x: x >= threshold) if above else (lambda x: x <= threshold)
    r, holds = ratio_verdict(num, den, ok)
    _, null = ratio_verdict(*spread_pair(num, above), ok)
    measured = f"{what}: ratio {', '.join(fmt(x, 2) for x in r)} (seeds {', '.join(map(str, seeds))})"
    sign = ">=" if above else "<="
    rows.append({**claim_row("measure", claim, measured, f"{sign} {threshold:g}x in every seed", holds),
                 "key": key, "kind": "finding", "null": "yes" if null else "no",
                 "null_what": f"{num_arm} against itself: its {'best' if above else 'lowest'} seed over its "
                              f"{'worst' if above else 'highest'}"})


def _seeds(curves: Curves, *arms: str) -> list[int]:
    sets = [set(curves.get(a, {})) for a in arms]
    return sorted(set.intersection(*sets)) if sets and all(sets) else []


def measure_claims(curves: Curves, p: Mapping[str, float] = MEASURE) -> list[dict]:
    """The measurement arms' claims from their curves, each row with ``kind`` 'finding' and its
    ``null`` verdict; a claim whose arms did not run (or share no seed) is left out."""
    rows: list[dict] = []
    snr = "policy/grad_snr"
    s = _seeds(curves, "reinforce-steps-mean", "reinforce-steps-none")
    if s:
        mean_ = [run_mean(curves, "reinforce-steps-mean", i, snr) for i in s]
        none_ = [run_mean(curves, "reinforce-steps-none", i, snr) for i in s]
        _ratio_claim(rows, "baseline-snr", "a batch-mean baseline raises REINFORCE's gradient SNR at PPO's steps "
                     "(reinforce-steps-mean vs reinforce-steps-none)", "reinforce-steps-mean", none_, mean_, s,
                     "mean policy/grad_snr, mean / none", p["baseline_min_snr_ratio"], True)
    s = _seeds(curves, "reinforce-steps-loo", "reinforce-steps-mean")
    if s:
        loo = [run_mean(curves, "reinforce-steps-loo", i, snr) for i in s]
        mean_ = [run_mean(curves, "reinforce-steps-mean", i, snr) for i in s]
        _ratio_claim(rows, "loo-snr", "leave-one-out raises the gradient SNR over the batch mean "
                     "(reinforce-steps-loo vs reinforce-steps-mean)", "reinforce-steps-loo", mean_, loo, s,
                     "mean policy/grad_snr, loo / mean", p["loo_min_snr_ratio"], True)
    s = _seeds(curves, "ppo-snr", "reinforce-steps-mean", "reinforce-steps-loo")
    if s:
        gae = [run_mean(curves, "ppo-snr", i, snr) for i in s]
        best = [max(run_mean(curves, "reinforce-steps-mean", i, snr), run_mean(curves, "reinforce-steps-loo", i, snr))
                for i in s]
        _ratio_claim(rows, "critic-snr", "PPO's GAE gives a higher gradient SNR than REINFORCE's better baseline at "
                     "the same steps (ppo-snr vs reinforce-steps-mean/loo)", "ppo-snr", best, gae, s,
                     "mean policy/grad_snr, ppo / max(mean, loo)", p["critic_min_snr_ratio"], True)
    s = _seeds(curves, "ppo-stress-dual-clip", "ppo-stress")
    if s:
        share = [run_mean(curves, "ppo-stress-dual-clip", i, "policy/dual_clipfrac") for i in s]
        off = [run_mean(curves, "ppo-stress", i, "policy/dual_clipfrac") for i in s]
        thr = p["dual_clip_min_share"]
        holds = bool(share) and all(math.isfinite(x) and x >= thr for x in share)
        null = bool(off) and all(math.isfinite(x) and x >= thr for x in off)
        rows.append({**claim_row("measure", "under large ratios dual-clip's bound acts (ppo-stress-dual-clip)",
                                 f"mean policy/dual_clipfrac {', '.join(fmt(x, 4) for x in share)}; ppo-stress's "
                                 f"{', '.join(fmt(x, 4) for x in off)} (seeds {', '.join(map(str, s))})",
                                 f">= {thr:g} in every seed", holds),
                     "key": "dual-clip-acts", "kind": "finding", "null": "yes" if null else "no",
                     "null_what": "ppo-stress (no dual-clip) under the same verdict"})
        spikes = [run_max(curves, "ppo-stress-dual-clip", i, "policy/grad_norm") for i in s]
        base = [run_max(curves, "ppo-stress", i, "policy/grad_norm") for i in s]
        _ratio_claim(rows, "dual-clip-spikes", "dual-clip lowers the grad-norm spikes of large ratios "
                     "(ppo-stress-dual-clip vs ppo-stress)", "ppo-stress-dual-clip", base, spikes, s,
                     "largest policy/grad_norm, dual-clip / none", p["dual_clip_max_spike_ratio"], False)
    return rows
