"""The staleness family's per-run statistics and claims (:func:`run_stats`, :func:`compute_staleness_claims`;
unit-tested on hand-built curves and numbers; docs/experiments.md, "Running ahead").

A *world* is ``demo`` (the demo's review task) or ``h<k>`` (the horizon family's longest horizon).
Its arms: ``k<k>-<objective>`` (rollout.max_staleness k; objective engine, recompute or decoupled:
:data:`~fourfold.apps.experiments.staleness_config.STALENESS_OBJECTIVES`) and ``topp-<objective>``
(k = 0, generation.top_p). Gold differences are in the world's SFT sd, seeds paired; a mean over seeds
has the SE of :func:`fourfold.apps.claim_stats.seed_se` (the larger of the seeds' spread and the
evaluation's). The thresholds (``staleness.claims``) were fixed before the family's first run:

- ``lag`` (check): every stale run's rollout/version_lag is min(i - 1, k) at every iteration i.
- ``ratio`` (checks, one row per world and question): at k = 0 the three objectives see the same
  ratio (first-ratio deviation, token mismatch, |TIS weight - 1| below ``agree_max_ratio_dev``); top-p
  opens a gap the uncorrected objectives see (the engine's first ratio, recompute's mismatch >=
  ``topp_min_gap``); the correction removes it from the ratio (first ratio <= ``topp_max_corrected_dev``,
  weights below 1, none truncated).
- ``agree``: at k = 0 recompute's and decoupled's gold equal the engine objective's within
  ``margin_share`` of PPO's gold gain (TOST).
- ``stale-cost``: the engine's (and recompute's) cost in gold grows with k: gold at the smallest
  k >= 1 minus at the largest, >= ``cost_min_growth_sd`` and > ``noise_z`` SE.
- ``decoupled``: recompute + TIS keeps gold within the margin of its k = 0 run at each k <= ``decoupled_max_k`` (TOST).
- ``top-p``: under top-p the correction pays: decoupled's gold above each uncorrected objective's by > ``noise_z`` SE.
- ``stability``: each objective at the largest k has no gold crash, grad-norm spike or entropy
  collapse in any seed (:func:`run_stats`); its null is the same rule on its own curves with a drop inserted.
"""

from __future__ import annotations

import math
import statistics
from typing import Mapping, Sequence

from fourfold.apps.claim_kinds import annotate
from fourfold.apps.claim_stats import Bound, margin_threshold, margin_verdict, mean_se
from fourfold.apps.experiments.claims import WorldClaims, eval_se, fmt_list
from fourfold.apps.experiments.staleness_config import StalenessClaimsConfig, StalenessConfig
from fourfold.apps.report_kit import fmt, mean, signed

STALENESS_GROUPS = ("lag", "ratio", "agree", "stale-cost", "decoupled", "top-p", "stability")
QUICK_STALENESS_GROUPS = ("lag", "ratio")
"""What ``--quick`` states: the checks (its budget settles no gold claim)."""
MEAN_STATS = {"first_ratio_dev": "policy/first_ratio_abs_dev", "token_diff": "mismatch/token_abs_diff_mean",
              "is_ess": "rollout/is_ess", "is_weight": "mismatch/is_weight_mean",
              "truncated_share": "mismatch/is_truncated_share", "log_kept_mass": "rollout/log_kept_mass",
              "clipfrac": "policy/clipfrac", "approx_kl": "policy/approx_kl", "kl": "kl/k1"}
"""Per-run means over iterations (nan where a run does not log it): {stat: metric}."""
CURVE_METRICS = tuple(MEAN_STATS.values()) + ("reward/gold_mean", "policy/grad_norm", "policy/entropy",
                                               "rollout/version_lag")
"""The metrics a run's statistics read from its metrics.jsonl."""


def arm_name(objective: str, k: int) -> str:
    """A staleness arm: ``k2-decoupled``."""
    return f"k{k}-{objective}"


def topp_name(objective: str) -> str:
    """A truncated-sampling arm (k = 0): ``topp-engine``."""
    return f"topp-{objective}"


def _finite(xs: Sequence[float]) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(float(x))]


def _nanmean(xs: Sequence[float]) -> float:
    f = _finite(xs)
    return mean(f) if f else math.nan


def _worst(xs: Sequence[float]) -> float:
    """The largest of ``xs``; nan if one is not finite (an unlogged metric never passes a check)."""
    return max(xs) if xs and all(math.isfinite(x) for x in xs) else math.nan


def _least(xs: Sequence[float]) -> float:
    """The smallest of ``xs``; nan if one is not finite."""
    return min(xs) if xs and all(math.isfinite(x) for x in xs) else math.nan


def gold_crash(gold: Sequence[float], window: int) -> float:
    """The largest fall of the moving mean (over ``window`` iterations) of ``gold`` below its running
    peak (0 when it never falls; nan values skipped)."""
    g = _finite(gold)
    smooth = [mean(g[i - window + 1: i + 1]) for i in range(window - 1, len(g))]
    peak, drop = -math.inf, 0.0
    for x in smooth:
        peak = max(peak, x)
        drop = max(drop, peak - x)
    return drop


def grad_spikes(norms: Sequence[float], ratio: float) -> tuple[int, float]:
    """(iterations whose grad norm exceeds ``ratio`` x the run's median, the largest norm / median)."""
    n = _finite(norms)
    med = statistics.median(n) if n else math.nan
    if not n or not med > 0:
        return 0, math.nan
    return sum(x > ratio * med for x in n), max(n) / med


def entropy_ratio(entropy: Sequence[float]) -> float:
    """The last quarter's mean entropy over the first quarter's (nan with fewer than 4 values)."""
    e = _finite(entropy)
    q = len(e) // 4
    if q < 1 or not mean(e[:q]) > 0:
        return math.nan
    return mean(e[-q:]) / mean(e[:q])


def lag_matches(iterations: Sequence[float], lags: Sequence[float], k: int) -> bool:
    """Whether rollout/version_lag is min(i - 1, k) at every iteration i (unlogged counts as 0: k = 0)."""
    got = [0.0 if x is None or not math.isfinite(float(x)) else float(x) for x in lags]
    return bool(iterations) and all(g == min(int(i) - 1, k) for i, g in zip(iterations, got))


def run_stats(curves: Mapping[str, Sequence[float]], k: int, gold_sd: float, c: StalenessClaimsConfig) -> dict:
    """One run's statistics from its per-iteration ``curves`` ({metric: [per iteration]} and
    'iteration'): the means of :data:`MEAN_STATS`, the IS ESS's minimum, the lag check, and the
    stability counts (gold crash in SFT sd ``gold_sd``, grad-norm spikes, entropy ratio); ``crash_null``:
    whether the crash rule flags the same gold curve with a drop of 2 x crash_drop_sd inserted from mid-run."""
    out = {s: _nanmean(curves.get(m, [])) for s, m in MEAN_STATS.items()}
    ess = _finite(curves.get("rollout/is_ess", []))
    out["is_ess_min"] = min(ess) if ess else math.nan
    out["lag_ok"] = lag_matches(curves.get("iteration", []), curves.get("rollout/version_lag", []), k)
    gold = _finite(curves.get("reward/gold_mean", []))
    sd = gold_sd if gold_sd and gold_sd > 0 else math.nan
    out["crash_drop_sd"] = gold_crash(gold, c.crash_window) / sd
    out["crash"] = bool(out["crash_drop_sd"] > c.crash_drop_sd)
    dropped = [g - (2 * c.crash_drop_sd * sd if i >= len(gold) // 2 else 0.0) for i, g in enumerate(gold)]
    out["crash_null"] = bool(gold_crash(dropped, c.crash_window) / sd > c.crash_drop_sd)
    out["spikes"], out["spike_max"] = grad_spikes(curves.get("policy/grad_norm", []), c.spike_ratio)
    out["entropy_ratio"] = entropy_ratio(curves.get("policy/entropy", []))
    out["collapse"] = bool(out["entropy_ratio"] < c.entropy_collapse_share)
    return out


class _Table(WorldClaims):
    """The claims being built; ``stats`` {world: {arm: {seed: run_stats}}}."""

    c: StalenessClaimsConfig

    def __init__(self, finals, sft, stats, sc: StalenessConfig, quick: bool):
        super().__init__(finals, sft, sc.claims, quick, QUICK_STALENESS_GROUPS if quick else None)
        self.stats, self.sc = stats, sc

    def sd(self, world: str) -> float:
        s = self.sft.get(world, {}).get("gold_std")
        return s if s else math.nan

    def has(self, world: str, *arms: str) -> bool:
        f = self.finals.get(world, {})
        return world in self.sft and all(f.get(a) for a in arms)

    def stat(self, world: str, arm: str, key: str) -> list[float]:
        """``key`` of every seed's run of ``arm`` (seed order)."""
        runs = self.stats.get(world, {}).get(arm, {})
        return [runs[s][key] for s in sorted(runs)]

    def mean_diff(self, world: str, a: str, b: str) -> tuple[list[float], float, float]:
        """(per-seed gold of a minus b in sd, their mean, its SE)."""
        pairs = self.gold_diffs(world, a, b, lambda r: eval_se(r, "gold"), self.sd(world))
        return [x for x, _ in pairs.values()], *mean_se(pairs)

    def ppo_gain(self, world: str) -> float:
        """PPO's gold gain over SFT (k0-engine, mean over seeds, sd): what the margins are a share of."""
        rows = self.finals[world].get(arm_name("engine", 0), [])
        return mean([(r["gold"] - self.sft[world]["gold"]) / self.sd(world) for r in rows]) if rows else math.nan

    def tost(self, world: str, a: str, b: str) -> tuple[Bound, list[float], float, float]:
        d, m, se = self.mean_diff(world, a, b)
        se = se if math.isfinite(se) else 0.0
        return margin_verdict(m, se, self.ppo_gain(world), self.c.margin_share, two_sided=True), d, m, se


def _lag(t: _Table, worlds: Sequence[str]) -> None:
    runs = [(w, a, ok) for w in worlds for a in t.stats.get(w, {}) if a.startswith("k") and not a.startswith("k0-")
            for ok in t.stat(w, a, "lag_ok")]
    if not runs:
        t.notes.append("claims 'lag' not checked: no run with rollout.max_staleness >= 1 has results")
        return
    bad = sorted({f"{w}/{a}" for w, a, ok in runs if not ok})
    t.add("lag", "the sampler's lag is what was asked (rollout/version_lag = min(i - 1, k) at every iteration)",
          f"{len(runs) - len(bad)}/{len(runs)} stale runs" + (f"; off: {', '.join(bad)}" if bad else ""),
          "every run, every iteration", not bad)


def _ratio(t: _Table, world: str) -> None:
    c, objs = t.c, t.sc.objectives
    k0 = [o for o in objs if t.has(world, arm_name(o, 0))]
    if k0:
        dev = {o: _worst(t.stat(world, arm_name(o, 0), "first_ratio_dev") + t.stat(world, arm_name(o, 0), "token_diff"))
               for o in k0}
        if "decoupled" in k0:
            dev["decoupled"] = _worst([dev["decoupled"]] + [abs(w - 1) for w in t.stat(world, arm_name("decoupled", 0), "is_weight")])
        t.add("ratio", f"at k = 0 the objectives see the same ratio ({world})",
              "largest first-ratio |r - 1|, token mismatch (and |TIS weight - 1|) over seeds: "
              + ", ".join(f"{o} {dev[o]:.1e}" for o in k0),
              f"each < {c.agree_max_ratio_dev:g}", all(v < c.agree_max_ratio_dev for v in dev.values()))
    if t.sc.top_p >= 1:
        return
    seen = {"engine": "first_ratio_dev", "recompute": "token_diff"}
    unc = [o for o in ("engine", "recompute") if o in objs and t.has(world, topp_name(o))]
    if unc:
        vals = {o: _least(t.stat(world, topp_name(o), seen[o])) for o in unc}
        t.add("ratio", f"top-p {t.sc.top_p:g} opens a gap the uncorrected objectives see ({world})",
              "smallest over seeds: " + ", ".join(f"{topp_name(o)} {seen[o]} {vals[o]:.2e}" for o in unc),
              f">= {c.topp_min_gap:g} nats per token", all(v >= c.topp_min_gap for v in vals.values()))
    arm = topp_name("decoupled")
    if "decoupled" in objs and t.has(world, arm):
        dev, w, tr = (t.stat(world, arm, k) for k in ("first_ratio_dev", "is_weight", "truncated_share"))
        t.add("ratio", f"token TIS removes top-p's gap from the ratio ({world})",
              f"first-ratio |r - 1| {fmt_list(dev, 7, False)}, weight mean {fmt_list(w, 4, False)}, truncated "
              f"share {fmt_list(tr, 3, False)} (per seed)",
              f"|r - 1| <= {c.topp_max_corrected_dev:g}, weight mean < 1, none truncated",
              all(x <= c.topp_max_corrected_dev for x in dev) and all(x < 1 for x in w) and all(x == 0 for x in tr))


def _tost_row(t: _Table, group: str, world: str, a: str, b: str, claim: str) -> None:
    bound, d, m, se = t.tost(world, a, b)
    t.add(group, claim, f"{a} minus {b}: {signed(m)} sd (seeds {fmt_list(d)}; SE {fmt(se, 3)}; 90% interval "
                        f"{signed(bound.lower)} to {signed(bound.upper)})",
          margin_threshold(bound, t.c.margin_share, "ppo's gold gain", two_sided=True), bound.holds)


def _agree(t: _Table, world: str) -> None:
    ref = arm_name("engine", 0)
    for o in [o for o in ("recompute", "decoupled") if o in t.sc.objectives]:
        if t.has(world, ref, arm_name(o, 0)):
            _tost_row(t, "agree", world, arm_name(o, 0), ref, f"at k = 0 {o} reaches the engine objective's gold ({world})")


def _decoupled(t: _Table, world: str) -> None:
    ref = arm_name("decoupled", 0)
    for k in sorted(k for k in t.sc.ks if 1 <= k <= t.c.decoupled_max_k):
        if t.has(world, ref, arm_name("decoupled", k)):
            _tost_row(t, "decoupled", world, arm_name("decoupled", k), ref,
                      f"recompute + token TIS keeps gold at k = {k} ({world})")


def _stale_cost(t: _Table, world: str, objective: str) -> None:
    stale = sorted(k for k in t.sc.ks if k >= 1)
    if not stale:
        return
    lo, hi = (stale[0] if len(stale) >= 2 else 0), stale[-1]
    ks = [k for k in sorted(t.sc.ks) if t.has(world, arm_name(objective, k))]
    if lo not in ks or hi not in ks or 0 not in ks:
        t.notes.append(f"claims 'stale-cost' not checked for {objective} at {world}: needs k = 0, {lo} and {hi}")
        return
    costs = [t.mean_diff(world, arm_name(objective, 0), arm_name(objective, k))[1] for k in ks]
    d, m, se = t.mean_diff(world, arm_name(objective, lo), arm_name(objective, hi))
    bar = t.c.noise_z * se
    t.add("stale-cost", f"the {objective} objective's cost in gold grows with k ({world})",
          f"cost (k = 0 gold minus k's) at k = {', '.join(map(str, ks))}: {fmt_list(costs)} sd; cost at k = {hi} minus at "
          f"k = {lo} (gold at k = {lo} minus at k = {hi}) per seed {fmt_list(d)}, mean {signed(m)} (SE {fmt(se, 3)})",
          f"mean >= +{t.c.cost_min_growth_sd:g} sd and > {t.c.noise_z:g} SE (> {fmt(bar, 3)})",
          bool(d) and m >= t.c.cost_min_growth_sd and m > bar)


def _topp(t: _Table, world: str) -> None:
    corrected = topp_name("decoupled")
    for o in [o for o in ("engine", "recompute") if o in t.sc.objectives]:
        if not t.has(world, corrected, topp_name(o)):
            continue
        d, m, se = t.mean_diff(world, corrected, topp_name(o))
        bar = t.c.noise_z * se
        t.add("top-p", f"under top-p {t.sc.top_p:g} the correction pays: {corrected}'s gold above {topp_name(o)}'s ({world})",
              f"per seed {fmt_list(d)} sd, mean {signed(m)} (SE {fmt(se, 3)})", f"mean > {t.c.noise_z:g} SE (> {fmt(bar, 3)})",
              bool(d) and m > bar)


def _stability(t: _Table, world: str) -> None:
    k = max(t.sc.ks)
    for o in t.sc.objectives:
        arm = arm_name(o, k)
        if not t.stats.get(world, {}).get(arm):
            continue
        crash, spikes, collapse, null = (t.stat(world, arm, s) for s in ("crash", "spikes", "collapse", "crash_null"))
        n = len(crash)
        t.add("stability", f"the {o} objective stays stable at k = {k} ({world})",
              f"seeds with a gold crash {sum(crash)}/{n} (largest fall {fmt(max(t.stat(world, arm, 'crash_drop_sd')), 2)} sd), "
              f"a grad-norm spike {sum(s > 0 for s in spikes)}/{n}, an entropy collapse {sum(collapse)}/{n}",
              f"none in any seed (crash: smoothed gold {t.c.crash_drop_sd:g} sd below its peak; spike: > "
              f"{t.c.spike_ratio:g}x the median grad norm; collapse: entropy < {t.c.entropy_collapse_share:g}x its start)",
              not any(crash) and not any(spikes) and not any(collapse),
              null=("no" if all(null) else "yes") + f" (the rule on its own gold curves with a {2 * t.c.crash_drop_sd:g} sd "
                   f"drop inserted from mid-run: crash found in {sum(null)}/{n} seeds)")


def compute_staleness_claims(finals: Mapping[str, Mapping[str, Sequence[Mapping]]], sft: Mapping[str, Mapping],
                             stats: Mapping[str, Mapping[str, Mapping[int, Mapping]]], sc: StalenessConfig, *,
                             quick: bool = False) -> tuple[list[dict], list[str]]:
    """The claims table of the staleness family.

    finals: {world: {arm: [per-seed summary]}} (keys seed, n, gold, gold_std); sft: {world: the SFT
    model's summary (gold, gold_std)}; stats: {world: {arm: {seed: :func:`run_stats`}}}. Returns
    (rows, notes); with ``quick`` only the checks ('lag', 'ratio'), the rest noted as needing the full family."""
    t = _Table(finals, sft, stats, sc, quick)
    worlds = [w for w in finals if w in sft]
    _lag(t, worlds)
    for w in worlds:
        _ratio(t, w)
    if quick:
        t.notes += [f"needs the full family: claims '{g}'" for g in STALENESS_GROUPS if g not in QUICK_STALENESS_GROUPS]
        return annotate("staleness", t.rows), t.notes
    for w in worlds:
        _agree(t, w)
        for o in [o for o in ("engine", "recompute") if o in sc.objectives]:
            _stale_cost(t, w, o)
        _decoupled(t, w)
        if sc.top_p < 1:
            _topp(t, w)
        _stability(t, w)
    return annotate("staleness", t.rows), t.notes
