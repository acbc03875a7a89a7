"""The warm-up family's per-run statistics and claims (:func:`run_stats`, :func:`compute_warmup_claims`;
unit-tested on hand-built curves and numbers; docs/experiments.md, "The critic's warm-up, where the
critic pays").

One world: the horizon family's longest horizon. The arms (:data:`ARMS`): ``rm`` (PPO, the critic
from the reward model: the default), ``rm-warmup`` (the same after W critic-only iterations),
``policy`` / ``policy-warmup`` (the critic from the policy, a zero value head), ``ceiling`` (the
reward-model start trained critic-only for long on the SFT policy's samples) and ``ppo-no-critic``.
Every arm but the ceiling takes the same policy updates; a warm-up's iterations come first.

Explained variance (EV) is :data:`EV_KEY`, ``value/explained_variance_mc``: of the Monte Carlo return
(the discounted reward-to-go, a target the values do not enter; the logged ``value/explained_variance``
is of the GAE(0.95) targets, which bootstrap from V itself), on each batch *before* the critic's
update. A warm-up iteration samples from the unchanged SFT policy, so the ceiling arm's EV over its
last ``plateau_iterations`` warm-up iterations is a converged critic's EV on fresh samples of the SFT
policy: the *ceiling* (mean over its seeds), with which each arm's first policy iteration (also
sampled from the SFT policy) is compared. Gold differences are in the world's SFT sd, seeds paired;
the SE of a mean over seeds is :func:`fourfold.apps.claim_stats.mean_se` (the larger of the seeds'
spread and the evaluation's). The thresholds (``warmup.claims``) were fixed before the first run:

- ``ceiling`` (check): the ceiling critic learns and converges: its plateau EV >= ``ceiling_min_ev``
  in every seed, the plateau minus the window before it <= ``ceiling_max_drift`` (mean over seeds).
- ``same-start`` (check): on a seed the reward-model arms' EV at iteration 1 agree (the same batch and
  critic) and the policy arms' is 0 (a constant), within ``same_start_tol``.
- ``rm-start``: the reward-model start is bad: rm's EV at iteration 1 <= ``start_max_share`` x the
  ceiling in every seed; null: the rule on the ceiling arm's last warm-up iteration.
- ``closes`` (per start): the warm-up arm's EV at its first policy iteration >= ``close_min_share`` x
  the ceiling in every seed; null: the rule on the no-warm-up arm's first policy iteration.
- ``early-ev`` (per start): the EV over the first ``early_iterations`` policy iterations, warm-up
  minus none: mean >= ``early_min_gain`` and > ``noise_z`` SE; null: none against itself, seeds rotated.
- ``warmup-gold`` (per start): warm-up's gold minus none's >= ``gold_min_gain_sd`` and > ``noise_z`` SE;
  null: none against itself, seeds rotated.
- ``warmup-keeps`` (per start): warm-up costs less gold than ``margin_share`` of PPO's gold gain (rm's
  over SFT): non-inferiority; null: a cost exactly at the margin with the same SE.
- ``critic-pays``: rm's gold minus ppo-no-critic's >= ``critic_min_gain_sd`` and > ``noise_z`` SE;
  null: ppo-no-critic against itself, seeds rotated.

Every finding's null is computed here by the same verdict function, kept in the row's ``null``.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from fourfold.apps.claim_kinds import annotate
from fourfold.apps.claim_kit import ClaimTable
from fourfold.apps.claim_stats import margin_threshold, margin_verdict, mean_se, seed_se
from fourfold.apps.experiments.claims import eval_se, fmt_list
from fourfold.apps.experiments.turns_claims import beyond, rotate, verdict_text
from fourfold.apps.experiments.warmup_config import WarmupClaimsConfig
from fourfold.apps.report_kit import fmt, mean, signed

RM, RM_WARMUP, POLICY, POLICY_WARMUP, CEILING, NO_CRITIC = ("rm", "rm-warmup", "policy", "policy-warmup", "ceiling",
                                                           "ppo-no-critic")
ARMS = (RM, RM_WARMUP, POLICY, POLICY_WARMUP, CEILING, NO_CRITIC)
"""The family's arms, in the order they run and are reported."""
PAIRS = ((RM_WARMUP, RM), (POLICY_WARMUP, POLICY))
"""(warm-up arm, the same start without warm-up)."""
RM_STARTS, POLICY_STARTS = (RM, RM_WARMUP, CEILING), (POLICY, POLICY_WARMUP)
"""The arms whose critic starts from the reward model / from the policy (a zero value head)."""
EV_KEY = "value/explained_variance_mc"
"""The explained variance the claims read (of the Monte Carlo return)."""
EV_LAM_KEY = "value/explained_variance"
"""The logged explained variance of the GAE(lam) targets (reported beside it)."""
CURVE_METRICS = (EV_KEY, EV_LAM_KEY, "reward/gold_mean", "kl/k1", "value/error")
"""The metrics a run's statistics read from its metrics.jsonl."""
WARMUP_GROUPS = ("ceiling", "same-start", "rm-start", "closes", "early-ev", "warmup-gold", "warmup-keeps", "critic-pays")
QUICK_WARMUP_GROUPS = ("same-start",)
"""What ``--quick`` states: the identity of the starts (its budget settles no EV or gold claim)."""


def _finite(xs: Sequence[float]) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(float(x))]


def window_mean(by_it: Mapping[int, float], first: int, last: int) -> float:
    """The mean of ``by_it`` over iterations first..last (nan unless every one of them is logged and finite)."""
    xs = [by_it.get(i, math.nan) for i in range(first, last + 1)]
    return mean(xs) if xs and all(math.isfinite(x) for x in xs) else math.nan


def run_stats(curves: Mapping[str, Sequence[float]], warmup: int, c: WarmupClaimsConfig) -> dict:
    """One run's statistics from its per-iteration ``curves`` ({metric: [per iteration]} and
    'iteration'), ``warmup`` its critic-only iterations: the EV (:data:`EV_KEY`) at iteration 1, at the
    first policy iteration (warmup + 1), its mean over the first ``early_iterations`` policy
    iterations, at the last warm-up iteration, over the last ``plateau_iterations`` warm-up iterations
    and the window before (``drift`` = plateau minus before), over the run's last 10 iterations; the
    lam-target EV at the same first points; the per-iteration EVs (``ev``, ``ev_lam``)."""
    its = [int(i) for i in curves.get("iteration", [])]

    def series(key: str) -> dict[int, float]:
        vals = list(curves.get(key, []))
        return {i: (math.nan if v is None else float(v)) for i, v in zip(its, vals)}

    ev, lam = series(EV_KEY), series(EV_LAM_KEY)
    w, p, e = warmup, c.plateau_iterations, c.early_iterations
    plateau = window_mean(ev, w - p + 1, w) if w >= p else math.nan
    before = window_mean(ev, w - 2 * p + 1, w - p) if w >= 2 * p else math.nan
    last = its[-1] if its else 0
    return {"warmup": w, "ev_iter1": ev.get(1, math.nan), "ev_first": ev.get(w + 1, math.nan),
            "ev_early": window_mean(ev, w + 1, w + e), "ev_last_warmup": ev.get(w, math.nan) if w else math.nan,
            "ev_plateau": plateau, "ev_before": before, "drift": plateau - before,
            "ev_tail": window_mean(ev, max(1, last - 9), last) if its else math.nan,
            "ev_lam_iter1": lam.get(1, math.nan), "ev_lam_first": lam.get(w + 1, math.nan),
            "ev": [ev[i] for i in its], "ev_lam": [lam[i] for i in its]}


def share_verdict(evs: Sequence[float], ceiling: float, share: float, above: bool) -> bool:
    """Every EV of ``evs`` at least (``above``) or at most ``share`` x ``ceiling`` (nan, none, or a ceiling <= 0: no)."""
    if not evs or not (math.isfinite(ceiling) and ceiling > 0) or not all(math.isfinite(x) for x in evs):
        return False
    bar = share * ceiling
    return all(x >= bar for x in evs) if above else all(x <= bar for x in evs)


def gain_verdict(d: Sequence[float], at_least: float, z: float, eval_se_mean: float = 0.0) -> tuple[float, float, bool]:
    """(mean of the per-seed differences ``d``, its SE, holds): the mean at least ``at_least`` and > z SE
    (SE: :func:`~fourfold.apps.claim_stats.seed_se`, the seeds' spread or ``eval_se_mean``)."""
    d = _finite(d)
    if not d:
        return math.nan, math.nan, False
    m, se = mean(d), seed_se(d, eval_se_mean)
    return m, se, beyond(m, se, at_least, z)


class _Table(ClaimTable):
    """The claims being built: ``finals`` {arm: [per-seed row]}, ``sft`` the SFT row, ``stats`` {arm: {seed: run_stats}}."""

    def __init__(self, finals, sft, stats, c: WarmupClaimsConfig, quick: bool):
        super().__init__(QUICK_WARMUP_GROUPS if quick else None)
        self.finals, self.sft, self.stats, self.c = finals, sft, stats, c

    @property
    def sd(self) -> float:
        s = self.sft.get("gold_std")
        return s if s else math.nan

    def runs(self, arm: str) -> dict[int, dict]:
        return {int(s): r for s, r in self.stats.get(arm, {}).items()}

    def stat(self, arm: str, key: str) -> dict[int, float]:
        """{seed: ``key``} of ``arm``'s runs."""
        return {s: r[key] for s, r in sorted(self.runs(arm).items())}

    def gold(self, arm: str) -> dict[int, Mapping]:
        return {int(r["seed"]): r for r in self.finals.get(arm) or []}

    def gold_diffs(self, a: Mapping[int, Mapping], b: Mapping[int, Mapping]) -> dict[int, tuple[float, float]]:
        """{seed: (gold of a minus b in SFT sd, its SE)} over the common seeds ({seed: row} each)."""
        return {s: ((a[s]["gold"] - b[s]["gold"]) / self.sd, math.hypot(eval_se(a[s], "gold"), eval_se(b[s], "gold")) / self.sd)
                for s in sorted(set(a) & set(b))}

    def ppo_gain(self) -> float:
        """PPO's gold gain over SFT (the rm arm, mean over seeds, sd): what the margin is a share of."""
        rows = self.finals.get(RM) or []
        return mean([(r["gold"] - self.sft["gold"]) / self.sd for r in rows]) if rows and self.sft else math.nan

    def ceiling(self) -> tuple[float, float, list[float]]:
        """(the ceiling: mean over seeds of the ceiling arm's plateau EV, its SE, the per-seed plateaus)."""
        vals = list(self.stat(CEILING, "ev_plateau").values())
        f = _finite(vals)
        return (mean(f) if f else math.nan), seed_se(f, 0.0) if f else math.nan, vals


def _ceiling(t: _Table) -> None:
    if not t.runs(CEILING):
        t.notes.append("claims 'ceiling' not checked: the ceiling arm has no run")
        return
    ceil, se, plateaus = t.ceiling()
    drift = list(t.stat(CEILING, "drift").values())
    md = mean(_finite(drift)) if _finite(drift) else math.nan
    ok = bool(plateaus) and all(math.isfinite(x) and x >= t.c.ceiling_min_ev for x in plateaus)
    p = t.c.plateau_iterations
    t.add("ceiling", "the ceiling critic learns the return and converges on the SFT policy's samples (ceiling)",
          f"{EV_KEY}, mean over its last {p} warm-up iterations, per seed {fmt_list(plateaus, 3, False)} (ceiling "
          f"{fmt(ceil, 3)}, SE {fmt(se, 3)}); minus the {p} before, per seed {fmt_list(drift, 3)} (mean {signed(md, 3)})",
          f">= {t.c.ceiling_min_ev:g} in every seed, and mean drift <= {t.c.ceiling_max_drift:g}",
          ok and math.isfinite(md) and md <= t.c.ceiling_max_drift)


def _same_start(t: _Table) -> None:
    rm = {a: t.stat(a, "ev_iter1") for a in RM_STARTS if t.runs(a)}
    pol = {a: t.stat(a, "ev_iter1") for a in POLICY_STARTS if t.runs(a)}
    if not rm and not pol:
        return
    tol = t.c.same_start_tol
    seeds = sorted({s for d in list(rm.values()) + list(pol.values()) for s in d})
    spread = [max(d[s] for d in rm.values() if s in d) - min(d[s] for d in rm.values() if s in d)
              for s in seeds if sum(s in d for d in rm.values()) >= 2]
    zero = [abs(x) for d in pol.values() for x in d.values()]
    ok = all(math.isfinite(x) and x <= tol for x in spread + zero) and (len(rm) >= 2 or pol)
    t.add("same-start", "on a seed the arms start from the same critic on the same first batch (same-start)",
          f"{EV_KEY} at iteration 1: {', '.join(rm)} per seed {fmt_list(next(iter(rm.values())).values(), 3) if rm else 'n/a'}"
          f" (largest spread across them {max(spread) if spread else math.nan:.1e}); {', '.join(pol) or 'no policy arm'}: "
          f"largest |EV| {max(zero) if zero else math.nan:.1e}",
          f"the reward-model arms agree and the zero head's EV is 0, within {tol:g}", bool(ok))


def _rm_start(t: _Table) -> None:
    if not t.runs(RM) or not t.runs(CEILING):
        t.notes.append("claims 'rm-start' not checked: needs the rm and ceiling arms")
        return
    ceil, se, _ = t.ceiling()
    evs = list(t.stat(RM, "ev_iter1").values())
    share = t.c.start_max_share
    holds = share_verdict(evs, ceil, share, above=False)
    last = list(t.stat(CEILING, "ev_last_warmup").values())
    null = share_verdict(last, ceil, share, above=False)
    rel = [x / ceil for x in evs] if ceil else []
    t.add("rm-start", "the reward-model-initialised critic starts far below a converged critic (rm)",
          f"{EV_KEY} at iteration 1 per seed {fmt_list(evs, 3)} ({fmt_list(rel, 2, False)} of the ceiling "
          f"{fmt(ceil, 3)}, SE {fmt(se, 3)}); the logged {EV_LAM_KEY} {fmt_list(t.stat(RM, 'ev_lam_iter1').values(), 3)}",
          f"<= {share:g} x the ceiling (<= {fmt(share * ceil, 3)}) in every seed", holds,
          null=verdict_text(null, f"the ceiling arm's last warm-up iteration, {fmt_list(last, 3)}"))


def _closes(t: _Table, warm: str, none: str) -> None:
    if not t.runs(warm) or not t.runs(CEILING):
        t.notes.append(f"claims 'closes' not checked for {warm}: needs {warm} and the ceiling arm")
        return
    ceil, se, _ = t.ceiling()
    share, w = t.c.close_min_share, next(iter(t.runs(warm).values()))["warmup"]
    evs = list(t.stat(warm, "ev_first").values())
    base = list(t.stat(none, "ev_first").values())
    t.add("closes", f"{w} critic-only warm-up iterations bring the critic near the ceiling ({warm})",
          f"{EV_KEY} at iteration {w + 1} (the first policy iteration) per seed {fmt_list(evs, 3)} "
          f"({fmt_list([x / ceil for x in evs] if ceil else [], 2, False)} of the ceiling {fmt(ceil, 3)}, SE {fmt(se, 3)}); "
          f"{none} at its first, {fmt_list(base, 3)}",
          f">= {share:g} x the ceiling (>= {fmt(share * ceil, 3)}) in every seed", share_verdict(evs, ceil, share, True),
          null=verdict_text(share_verdict(base, ceil, share, True), f"{none}'s first policy iteration"))


def _early(t: _Table, warm: str, none: str) -> None:
    a, b = t.stat(warm, "ev_early"), t.stat(none, "ev_early")
    seeds = sorted(set(a) & set(b))
    if not seeds:
        t.notes.append(f"claims 'early-ev' not checked for {warm}: needs {warm} and {none} on a common seed")
        return
    d = [a[s] - b[s] for s in seeds]
    m, se, holds = gain_verdict(d, t.c.early_min_gain, t.c.noise_z)
    rot = rotate({s: {"x": b[s]} for s in seeds})
    null = gain_verdict([b[s] - rot[s]["x"] for s in seeds], t.c.early_min_gain, t.c.noise_z)[-1]
    e = t.c.early_iterations
    t.add("early-ev", f"warm-up's critic explains more of the return over the first {e} policy iterations ({warm} vs {none})",
          f"mean {EV_KEY} over policy iterations 1-{e}: {warm} {fmt_list([a[s] for s in seeds], 3, False)}, {none} "
          f"{fmt_list([b[s] for s in seeds], 3, False)}; difference per seed {fmt_list(d, 3)}, mean {signed(m, 3)} (SE {fmt(se, 3)})",
          f"mean >= +{t.c.early_min_gain:g} and > {t.c.noise_z:g} SE", holds,
          null=verdict_text(null, f"{none} against itself, seed s against seed s+1"))


def _gold_rows(t: _Table, warm: str, none: str) -> None:
    a, b = t.gold(warm), t.gold(none)
    if not set(a) & set(b) or not t.sft:
        t.notes.append(f"claims 'warmup-gold', 'warmup-keeps' not checked for {warm}: needs {warm} and {none} on a common seed")
        return
    pairs = t.gold_diffs(a, b)
    d = [x for x, _ in pairs.values()]
    m, se = mean_se(pairs)
    ev_se = math.sqrt(sum(e * e for _, e in pairs.values())) / len(pairs)
    holds = beyond(m, se, t.c.gold_min_gain_sd, t.c.noise_z)
    rp = t.gold_diffs(b, rotate(b))
    null = beyond(*mean_se(rp), t.c.gold_min_gain_sd, t.c.noise_z)
    t.add("warmup-gold", f"warm-up raises gold ({warm} vs {none})",
          f"gold minus {none}'s per seed {fmt_list(d)} sd, mean {signed(m)} (SE {fmt(se, 3)}, evaluation's {fmt(ev_se, 3)})",
          f"mean >= +{t.c.gold_min_gain_sd:g} sd and > {t.c.noise_z:g} SE (> {fmt(t.c.noise_z * se, 3)})", holds,
          null=verdict_text(null, f"{none} against itself, seed s against seed s+1"))
    gain, share = t.ppo_gain(), t.c.margin_share
    cost = {s: (-x, e) for s, (x, e) in pairs.items()}
    cm, cse = mean_se(cost)
    bound = margin_verdict(cm, cse if math.isfinite(cse) else 0.0, gain, share)
    null = bound.margin > 0 and margin_verdict(bound.margin, cse, gain, share).holds
    t.add("warmup-keeps", f"warm-up costs less than {share:.0%} of PPO's gold gain ({warm} vs {none})",
          f"{none}'s gold minus {warm}'s: mean {signed(cm)} sd (SE {fmt(cse, 3)}; upper 95% bound {signed(bound.upper)}; "
          f"PPO's gain {signed(gain)} sd)", margin_threshold(bound, share, "PPO's (rm's) gold gain"), bound.holds,
          null=verdict_text(bool(null), "a cost exactly at the margin with the same SE"))


def _critic_pays(t: _Table) -> None:
    a, b = t.gold(RM), t.gold(NO_CRITIC)
    if not set(a) & set(b) or not t.sft:
        t.notes.append("claims 'critic-pays' not checked: needs rm and ppo-no-critic on a common seed")
        return
    pairs = t.gold_diffs(a, b)
    m, se = mean_se(pairs)
    null = beyond(*mean_se(t.gold_diffs(b, rotate(b))), t.c.critic_min_gain_sd, t.c.noise_z)
    t.add("critic-pays", "the critic pays in this world (rm vs ppo-no-critic)",
          f"gold minus ppo-no-critic's per seed {fmt_list([x for x, _ in pairs.values()])} sd, mean {signed(m)} (SE {fmt(se, 3)})",
          f"mean >= +{t.c.critic_min_gain_sd:g} sd and > {t.c.noise_z:g} SE (> {fmt(t.c.noise_z * se, 3)})",
          beyond(m, se, t.c.critic_min_gain_sd, t.c.noise_z),
          null=verdict_text(null, "ppo-no-critic against itself, seed s against seed s+1"))


def compute_warmup_claims(finals: Mapping[str, Sequence[Mapping]], sft: Mapping,
                          stats: Mapping[str, Mapping[int, Mapping]], c: WarmupClaimsConfig, *,
                          quick: bool = False) -> tuple[list[dict], list[str]]:
    """The claims table of the warm-up family.

    finals: {arm: [per-seed summary]} (keys seed, n, gold, gold_std); sft: the SFT model's summary
    (gold, gold_std); stats: {arm: {seed: :func:`run_stats`}}. Returns (rows, notes); with ``quick``
    only 'same-start', the rest noted as needing the full family."""
    t = _Table(finals, sft, stats, c, quick)
    _same_start(t)
    if quick:
        t.notes += [f"needs the full family: claims '{g}'" for g in WARMUP_GROUPS if g not in QUICK_WARMUP_GROUPS]
        return annotate("warmup", t.rows), t.notes
    _ceiling(t)
    _rm_start(t)
    for warm, none in PAIRS:
        _closes(t, warm, none)
    for warm, none in PAIRS:
        _early(t, warm, none)
    for warm, none in PAIRS:
        _gold_rows(t, warm, none)
    _critic_pays(t)
    return annotate("warmup", t.rows), t.notes
