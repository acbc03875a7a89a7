"""The claims of issue 39's measurement arms (:data:`fourfold.apps.experiments.arms.MEASURE_ARMS`):
REINFORCE's gradient variance by baseline at PPO's steps, the critic's, dual-clip where the
ratios get large, the clip (PPO with and without it at three strengths of the update: gold, KL,
the per-update KL, entropy) and the baseline (the critic against a batch baseline, a batch
baseline against none, on gold); each a *finding* (it could go either way), each with its null.

They read the runs' curves ({arm: {seed: per-iteration series}}, ``results.read_curves``) and
final evaluations ({arm: [per-seed row]}), by seed. The thresholds (:data:`MEASURE`) are written
here before any run. Each ratio claim's verdict function also runs on a null comparison whose
answer must be "no": the numerator arm against itself over seeds, its most favourable pair (its
best seed over its worst), so a threshold the run-to-run spread alone reaches says "yes" there and
the row is not a finding that holds. Each gold claim ("a beats b beyond gold_noise_z evaluation
standard errors in every seed") runs on a against itself with seeds rotated (seed s against s+1).
:func:`~fourfold.apps.experiments.claims.compute_claims` calls :func:`measure_claims` for the
group 'measure'; docs/experiments.md, "The update's measurements".
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
    "clip_min_kl_ratio": 1.5,
    "clip_min_step_kl_ratio": 1.5,
    "clip_max_entropy_ratio": 0.8,
    "entropy_tail_share": 0.25,
    "gold_noise_z": 2.0,
}
"""The thresholds, fixed before the first run of the measurement arms (a threshold moved after seeing
results is no test): a baseline raises REINFORCE's mean policy/grad_snr by >= 1.2x (mean vs none);
leave-one-out by >= 1.05x over the batch mean; PPO's GAE >= 1.2x REINFORCE's better baseline; under
ppo-stress dual-clip's bound acts on >= 0.1% of tokens (mean policy/dual_clipfrac) and its largest
policy/grad_norm is <= 0.8x ppo-stress's. The clip (added before any run of its arms), for each
pair of :data:`CLIP_PAIRS`: the clipped arm beats the unclipped one on gold by more than
gold_noise_z = 2 evaluation standard errors of the difference; the unclipped arm's final KL to the
reference is >= 1.5x the clipped one's; its mean policy/approx_kl (the KL of each update, pi_old
to the updated policy) >= 1.5x; its policy/entropy over the last quarter of the iterations
<= 0.8x (entropy collapse). The baseline: ppo-snr (the critic) beats ppo-no-critic (whitened
returns: a batch baseline) on gold, ppo-no-critic beats ppo-no-baseline (A = R), and
reinforce-steps-mean beats reinforce-steps-none at PPO's steps, each beyond 2 standard errors; and
PPO (ppo-snr) beats reinforce-steps-mean on gold at the same 16 steps per batch and lr (added while
the first run was under way, before any of its results was read).
Each in every seed."""

CLIP_PAIRS = (("ppo-no-clip", "ppo-snr", "at the demo's 4 epochs and lr", "4ep"),
              ("ppo-lr3x-no-clip", "ppo-lr3x", "at 3x the lr", "lr3x"),
              ("ppo-stress-no-clip", "ppo-stress", "at 12 epochs and 3x the lr", "stress"))
"""(unclipped arm, clipped arm, where, key suffix): the clip claims' comparisons."""
GOLD_PAIRS = (("critic-gold", "the critic helps beyond a batch baseline", "ppo-snr", "ppo-no-critic"),
              ("baseline-gold-ppo", "a batch baseline helps critic-free PPO (whitened returns against A = R)",
               "ppo-no-critic", "ppo-no-baseline"),
              ("baseline-gold-reinforce", "a batch-mean baseline helps REINFORCE at PPO's steps",
               "reinforce-steps-mean", "reinforce-steps-none"),
              ("ppo-gold-reinforce", "PPO beats REINFORCE with a batch-mean baseline at the same steps and lr",
               "ppo-snr", "reinforce-steps-mean"))
"""(key, claim, better arm, worse arm): the baseline claims on gold."""

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


def run_tail(curves: Curves, arm: str, seed: int, key: str, share: float) -> float:
    """The mean of ``key``'s finite values over the last ``share`` of the run's logged iterations
    (at least one; nan: none)."""
    xs = [x for x in curves.get(arm, {}).get(seed, {}).get(key, []) if math.isfinite(x)]
    return run_mean({arm: {seed: {key: xs[-max(1, round(share * len(xs))):]}}}, arm, seed, key) if xs else math.nan


Finals = Mapping[str, Sequence[Mapping]]


def _final(finals: Finals, arm: str) -> dict[int, Mapping]:
    return {int(r.get("seed", i)): r for i, r in enumerate(finals.get(arm) or [])}


def gold_se(row: Mapping) -> float:
    """The standard error of a final evaluation's mean gold (gold_std / sqrt(n))."""
    return float(row.get("gold_std", 0.0)) / math.sqrt(max(int(row.get("n", 1)), 1))


def beats_verdict(a: Sequence[Mapping], b: Sequence[Mapping], gsd: float, z: float) -> tuple[list[float], list[float], bool]:
    """Per pair of rows: the gold difference a - b in units ``gsd``, z standard errors of it in the
    same unit, and whether every difference is beyond its z SE (no pair: False)."""
    d = [(ra["gold"] - rb["gold"]) / gsd for ra, rb in zip(a, b)]
    t = [z * math.hypot(gold_se(ra), gold_se(rb)) / gsd for ra, rb in zip(a, b)]
    return d, t, bool(d) and all(math.isfinite(x) and x > y for x, y in zip(d, t))


def _beats_claim(rows: list, finals: Finals, gsd: float, z: float, key: str, claim: str, a: str, b: str) -> None:
    fa, fb = _final(finals, a), _final(finals, b)
    s = sorted(set(fa) & set(fb))
    if not s:
        return
    d, t, holds = beats_verdict([fa[i] for i in s], [fb[i] for i in s], gsd, z)
    _, _, null = beats_verdict([fa[i] for i in s], [fa[i] for i in s[1:] + s[:1]], gsd, z)
    rows.append({**claim_row("measure", f"{claim} ({a} beats {b} on gold)",
                             f"gold difference {', '.join(fmt(x, 2) for x in d)} sd (seeds {', '.join(map(str, s))})",
                             f"> {z:g} evaluation standard errors ({', '.join(fmt(x, 2) for x in t)} sd) in every seed",
                             holds),
                 "key": key, "kind": "finding", "null": "yes" if null else "no",
                 "null_what": f"{a} against itself, seed s against seed s+1"})


def _clip_claims(rows: list, curves: Curves, finals: Finals, p: Mapping[str, float], gsd: float) -> None:
    """Four claims per pair of :data:`CLIP_PAIRS` whose arms ran: gold, final KL, per-update KL, entropy."""
    for free, clipped, where, tag in CLIP_PAIRS:
        _beats_claim(rows, finals, gsd, p["gold_noise_z"], f"clip-gold-{tag}", f"the clip protects gold {where}",
                     clipped, free)
        ff, fc = _final(finals, free), _final(finals, clipped)
        s = sorted(set(ff) & set(fc))
        if s:
            _ratio_claim(rows, f"clip-kl-{tag}", f"without the clip the policy drifts further from the reference {where} "
                         f"({free} vs {clipped})", free, [fc[i]["kl"] for i in s], [ff[i]["kl"] for i in s], s,
                         "final KL to the reference, unclipped / clipped", p["clip_min_kl_ratio"], True)
        s = _seeds(curves, free, clipped)
        if not s:
            continue
        cf = ", ".join(fmt(run_mean(curves, clipped, i, "policy/clipfrac"), 3) for i in s)
        step = "policy/approx_kl"
        _ratio_claim(rows, f"clip-step-{tag}", f"without the clip each update moves the policy further {where} "
                     f"({free} vs {clipped})", free, [run_mean(curves, clipped, i, step) for i in s],
                     [run_mean(curves, free, i, step) for i in s], s,
                     f"mean policy/approx_kl, unclipped / clipped (the clipped arm's mean policy/clipfrac {cf})",
                     p["clip_min_step_kl_ratio"], True)
        tail, ent = p["entropy_tail_share"], "policy/entropy"
        _ratio_claim(rows, f"clip-entropy-{tag}", f"without the clip the policy's entropy collapses {where} "
                     f"({free} vs {clipped})", free, [run_tail(curves, clipped, i, ent, tail) for i in s],
                     [run_tail(curves, free, i, ent, tail) for i in s], s,
                     f"policy/entropy over the last {tail:.0%} of iterations, unclipped / clipped",
                     p["clip_max_entropy_ratio"], False)


def _seeds(curves: Curves, *arms: str) -> list[int]:
    sets = [set(curves.get(a, {})) for a in arms]
    return sorted(set.intersection(*sets)) if sets and all(sets) else []


def measure_claims(curves: Curves, p: Mapping[str, float] = MEASURE, *, finals: Finals | None = None,
                   gold_sd: float = math.nan) -> list[dict]:
    """The measurement arms' claims from their curves and final evaluations (``finals``, gold in
    units of ``gold_sd``: the SFT model's per-sample sd), each row with ``kind`` 'finding' and its
    ``null`` verdict; a claim whose arms did not run (or share no seed) is left out."""
    rows: list[dict] = []
    _snr_claims(rows, curves, p)
    _dual_clip_claims(rows, curves, p)
    _clip_claims(rows, curves, finals or {}, p, gold_sd)
    for key, claim, a, b in GOLD_PAIRS:
        _beats_claim(rows, finals or {}, gold_sd, p["gold_noise_z"], key, claim, a, b)
    return rows


def _snr_claims(rows: list, curves: Curves, p: Mapping[str, float]) -> None:
    """The gradient SNR claims: a baseline, leave-one-out, PPO's GAE."""
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


def _dual_clip_claims(rows: list, curves: Curves, p: Mapping[str, float]) -> None:
    """Dual-clip under ppo-stress: its bound acts, and it lowers the grad-norm spikes."""
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
