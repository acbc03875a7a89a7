"""The claims, computed from the final evaluations (:func:`compute_claims`), with their statistics:
per-seed pairing of arms, standard errors of an evaluation mean, differences in SFT sd units. The
'practice' group also reads the runs' per-iteration metrics (their curves, by seed).

Each claim group (``claims.groups``) has its own function; a group whose arms did not run (or share
no seed) is not checked and says why in the notes.

With ``claims.quick`` (``fourfold experiments --quick``) only the claims of :data:`QUICK_CLAIMS` are
stated, each against ``noise_z`` standard errors of its own evaluation instead of a fixed sd, ratio or
share; every other claim (and every group left out of ``claims.groups``) is listed in the notes as
needing the full sweep.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from fourfold.apps.claim_kinds import annotate
from fourfold.apps.claim_kit import ClaimTable, claim_row
from fourfold.apps.claim_stats import MARGIN_SHARE, NULL_AT_MARGIN, interval_text, margin_threshold, margin_verdict, seed_se
from fourfold.apps.experiments.config import DEFAULT_CLAIM_GROUPS, GROUP_ARMS, ExperimentsClaimsConfig
from fourfold.apps.experiments.measure_claims import measure_claims
from fourfold.apps.report_kit import fmt, mean, signed, std

QUICK_CLAIMS = ("beta0.hack", "beta0.drift", "beta0.degeneration", "dpo.length")
"""The claims ``--quick`` states (``group.key``): those whose effect at its budget is many times its
evaluation's error (beta = 0's hack, drift and degeneration were 1-2 sd, 5-6x the KL and 0.6 of the
well-formed share in the quick runs; the labels DPO fits prefer the longer response 70% of the
time). Magnitude claims (fixed sd, ratio or nats), 'within noise' claims (which a small sample
passes too easily) and claims on small effects (ppo's and grpo's gold, the critic's cost) need the
full sweep."""

GROUP_CLAIMS = {
    "ppo": "ppo raises gold; its KL stays bounded by the penalty; its responses stay well formed",
    "beta0": "beta = 0 hacks the reward model, drifts, degenerates, fools the RM",
    "beta-high": "a very high beta keeps the policy at the SFT model (KL, gold, length)",
    "epochs": "several PPO epochs per batch beat one",
    "reinforce": "ppo beats naive REINFORCE (clearly at the same learning rate; at its best learning rate)",
    "critic": "the critic's baseline helps (ppo vs ppo-no-critic)",
    "length": "the labelers' length bias makes ppo verbose (ppo vs ppo-unbiased-rm)",
    "critic-free": "removing the critic costs PPO less than critic_free_margin_share of its gold gain; grpo, rloo and "
                   "reinforce-pp raise gold",
    "baseline": "a group baseline (grpo, rloo) beats naive REINFORCE on gold at the same samples",
    "dpo": "DPO raises gold over SFT; DPO inherits the labelers' length bias",
    "practice": "a critic from the policy starts badly and warm-up fixes it; dual-clip under beta = 0; the bf16 "
                "copy's mismatch, recompute and token TIS",
    "measure": "the clip, a baseline, the critic and dual-clip measured on gold, KL, ratios, entropy and the gradient "
               "SNR (issue 39's measurement arms)",
}
"""What each claim group says, for the notes of the groups a sweep leaves out."""

CRITIC_FREE_ARMS = ("grpo", "rloo", "reinforce-pp")
"""The PPO arms without a critic the 'critic-free' claims compare with ppo."""
GROUP_BASELINE_ARMS = GROUP_ARMS
"""The arms whose baseline is the group of K samples of a prompt ('baseline' claims)."""

PRACTICE = {
    "bad_start_max_ev": 0.1,
    "warmup_min_ev": 0.3,
    "warmup_gold_margin_sd": 0.1,
    "dual_clip_max_kl_ratio": 0.8,
    "bf16_min_token_diff": 1e-4,
    "recompute_gold_margin_sd": 0.1,
    "tis_gold_margin_sd": 0.05,
    "tis_max_truncated_share": 0.01,
}
"""The 'practice' claims' thresholds, as docs/correction.md ("Sweep arms, written before any run")
fixed them before the first run: not settings (a threshold moved after seeing results is no test)."""


def _by_seed(rows: Sequence[Mapping]) -> dict[int, Mapping]:
    return {int(r.get("seed", i)): r for i, r in enumerate(rows)}


def paired(finals: Mapping[str, Sequence[Mapping]], *arms: str) -> list[tuple[int, tuple[Mapping, ...]]]:
    """Seeds present in every named arm, with each arm's row for that seed."""
    maps = [_by_seed(finals[a]) for a in arms]
    seeds = sorted(set.intersection(*(set(m) for m in maps)))
    return [(s, tuple(m[s] for m in maps)) for s in seeds]


def eval_se(row: Mapping, key: str) -> float:
    """Standard error of an evaluation mean (per-sample sd / sqrt(n); a share uses p(1-p))."""
    n = max(int(row.get("n", 1)), 1)
    if key in ("well_formed", "repetition"):
        p = float(row[key])
        return math.sqrt(max(p * (1 - p), 0.0) / n)
    return float(row.get(f"{key}_std", 0.0)) / math.sqrt(n)


def seeds_txt(ok: Sequence[bool]) -> str:
    return f"{sum(ok)}/{len(ok)} seeds"


def fmt_list(xs: Sequence[float], digits: int = 2, signed_: bool = True) -> str:
    return ", ".join(signed(x, digits) if signed_ else fmt(x, digits) for x in xs)


class WorldClaims(ClaimTable):
    """The claims table of a family of worlds (horizon, turns): ``finals`` {world: {arm: [per-seed
    row]}}, ``sft`` {world: the SFT model's row}, ``c`` the thresholds, ``quick`` whether --quick."""

    def __init__(self, finals: Mapping[str, Mapping[str, Sequence[Mapping]]], sft: Mapping[str, Mapping], c,
                 quick: bool, quick_groups: Sequence[str] | None = None):
        super().__init__(quick_groups)
        self.finals, self.sft, self.c, self.quick = finals, sft, c, quick

    def knob(self, worlds: Sequence[str], key: str, what: str) -> tuple[list[str], list[float], list[float]]:
        """The worlds of ``worlds`` with an SFT evaluation, the SFT rows' ``key`` there and its steps
        world to world; none (and a note: fewer than two ``what`` have one) with fewer than two."""
        have = [w for w in worlds if w in self.sft]
        if len(have) < 2:
            self.notes.append(f"claims 'knob' not checked: fewer than two {what} have an SFT evaluation")
            return [], [], []
        vals = [self.sft[w][key] for w in have]
        return have, vals, [b - a for a, b in zip(vals, vals[1:])]

    def gold_diffs(self, world: str, a: str, b: str, se, scale: float = 1.0) -> dict[int, tuple[float, float]]:
        """{seed: (gold of a minus gold of b, the SE of that difference)} at ``world``, both / ``scale``;
        ``se(row)``: a row's gold SE."""
        return {s: ((ra["gold"] - rb["gold"]) / scale, math.hypot(se(ra), se(rb)) / scale)
                for s, (ra, rb) in paired(self.finals[world], a, b)}


def _lr_of(arm: str) -> float:
    try:
        return float(arm[len("reinforce-lr"):].rstrip("x"))
    except ValueError:
        return math.nan


@dataclasses.dataclass
class _Table:
    """The claims table being built, and what every group's check needs."""

    finals: Mapping[str, Sequence[Mapping]]
    sft: Mapping
    c: ExperimentsClaimsConfig
    proxy_sft: Mapping[str, Mapping]
    kl_coef: float
    ppo_epochs: int
    rows: list[dict] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    full_only: list[str] = dataclasses.field(default_factory=list)
    """Claims of a checked group that claims.quick leaves to the full sweep."""
    curves: Mapping[str, Mapping[int, Mapping]] = dataclasses.field(default_factory=dict)
    """{arm: {seed: per-iteration series}} (the 'practice' claims)."""
    critic_warmup: int = 0
    """ppo-critic-warmup's warm-up iterations (its first policy iteration is this + 1)."""

    @property
    def gsd(self) -> float:
        """One SFT sd of gold (the unit of every gold difference)."""
        return self.sft["gold_std"] if self.sft.get("gold_std") else math.nan

    def need(self, group: str, *arms: str) -> bool:
        """Whether ``group`` is asked for and its arms have results on a common seed (a note if not)."""
        if group not in self.c.groups:
            return False
        missing = [a for a in arms if not self.finals.get(a)]
        if missing:
            self.notes.append(f"claims '{group}' not checked: arm {', '.join(missing)} did not run or has no results")
            return False
        if not paired(self.finals, *arms):
            self.notes.append(f"claims '{group}' not checked: arms {', '.join(arms)} share no seed")
            return False
        return True

    def add(self, group: str, claim: str, measured: str, threshold: str, holds: bool, key: str = "",
            null: str = "") -> None:
        """A row of the table; under claims.quick only a claim of QUICK_CLAIMS (``group.key``)."""
        if self.c.quick and f"{group}.{key}" not in QUICK_CLAIMS:
            self.full_only.append(claim)
            return
        self.rows.append(claim_row(group, claim, measured, threshold, holds, null))

    def ppo_effect(self, key: str) -> float:
        """ppo's mean change over SFT's: gold in sd, length in words (the effect a margin is a share of)."""
        rows = self.finals.get("ppo") or []
        if not rows:
            return math.nan
        return mean([(r[key] - self.sft[key]) / (self.gsd if key == "gold" else 1.0) for r in rows])

    def noise(self, a: Mapping, b: Mapping, key: str) -> float:
        """noise_z standard errors of the evaluation of the difference a - b of ``key`` (raw units)."""
        return self.c.noise_z * math.hypot(eval_se(a, key), eval_se(b, key))

    def gain(self, arm: str, key: str) -> tuple[list[float], list[float], list[bool]]:
        """Per seed: ``arm``'s ``key`` minus the SFT model's (gold in sd, length in words), its noise
        threshold in the same unit, and whether the gain is beyond it."""
        scale = self.gsd if key == "gold" else 1.0
        rows = sorted(self.finals[arm], key=lambda r: r.get("seed", 0))
        d = [(r[key] - self.sft[key]) / scale for r in rows]
        thr = [self.noise(r, self.sft, key) / scale for r in rows]
        return d, thr, [x > y for x, y in zip(d, thr)]

    def gold_u(self, row: Mapping) -> float:
        return (row["gold"] - self.sft["gold"]) / self.gsd

    def beats(self, a: str, b: str) -> tuple[list[float], list[float], list[bool]]:
        """Per seed: gold difference a - b (sd), its noise threshold (sd), and whether it is beyond."""
        diffs, thr, ok = [], [], []
        for _, (ra, rb) in paired(self.finals, a, b):
            d = (ra["gold"] - rb["gold"]) / self.gsd
            t = self.c.noise_z * math.hypot(eval_se(ra, "gold"), eval_se(rb, "gold")) / self.gsd
            diffs.append(d), thr.append(t), ok.append(d > t)
        return diffs, thr, ok

    def spread(self, arm: str) -> str:
        g = [self.gold_u(r) for r in self.finals[arm]]
        return f"{arm} {signed(mean(g))} +- {fmt(std(g), 2)} sd"

    def add_beats(self, group: str, claim: str, a: str, b: str, spread_label: str = "") -> None:
        """A claim that ``a`` beats ``b`` on gold beyond the evaluation's noise, in every seed."""
        d, t, ok = self.beats(a, b)
        self.add(group, claim,
                 f"gold difference {fmt_list(d)} sd ({seeds_txt(ok)}); {spread_label}{self.spread(a)}, {self.spread(b)}",
                 f"> {self.c.noise_z:g} evaluation standard errors ({fmt_list(t, 2, False)} sd) in every seed", all(ok))


def _ppo_claims(t: _Table) -> None:
    c, sft = t.c, t.sft
    ppo = sorted(t.finals["ppo"], key=lambda r: r.get("seed", 0))
    gains = [t.gold_u(r) for r in ppo]
    t.add("ppo", "ppo raises gold reward above the SFT model's",
          f"gold gain {fmt_list(gains)} sd ({seeds_txt([g >= c.ppo_min_gold_gain_sd for g in gains])})",
          f">= {c.ppo_min_gold_gain_sd:g} sd in every seed", all(g >= c.ppo_min_gold_gain_sd for g in gains))
    psft = t.proxy_sft.get("ppo", sft)
    bounds = [(r["proxy"] - psft["proxy"]) / t.kl_coef if t.kl_coef > 0 else math.inf for r in ppo]
    kls = [r["kl"] for r in ppo]
    ok = [k <= b for k, b in zip(kls, bounds)]
    t.add("ppo", "ppo's KL to the reference stays bounded by the penalty (its KL-regularised objective "
                 "proxy - beta*KL is not below the SFT model's)",
          f"KL {fmt_list(kls, 1, False)} nats; proxy gain / beta {fmt_list(bounds, 1, False)} nats ({seeds_txt(ok)})",
          "KL <= proxy gain / beta in every seed", all(ok))
    ratios = [r["well_formed"] / sft["well_formed"] if sft["well_formed"] > 0 else math.inf for r in ppo]
    t.add("ppo", "ppo keeps responses well formed",
          f"well-formed {fmt_list([r['well_formed'] for r in ppo], 2, False)} vs SFT {fmt(sft['well_formed'], 2)} "
          f"(ratio {fmt_list(ratios, 2, False)})",
          f">= {c.ppo_min_well_formed_ratio:g} x SFT's in every seed",
          all(x >= c.ppo_min_well_formed_ratio for x in ratios))


def _beta0_hack_drift(t: _Table, pairs: list) -> None:
    """beta0's gold below SFT's and ppo's, and its KL above ppo's: by fixed margins (sd, ratio), or
    under claims.quick beyond the evaluation's noise."""
    c, q = t.c, t.c.quick
    below_sft = [-t.gold_u(b) for _, (b, p) in pairs]
    below_ppo = [(p["gold"] - b["gold"]) / t.gsd for _, (b, p) in pairs]
    bar_sft = [t.noise(b, t.sft, "gold") / t.gsd if q else c.beta0_min_gold_drop_sd for _, (b, p) in pairs]
    bar_ppo = [t.noise(b, p, "gold") / t.gsd if q else c.beta0_min_gold_drop_sd for _, (b, p) in pairs]
    ok = [s >= bs and x >= bp for s, x, bs, bp in zip(below_sft, below_ppo, bar_sft, bar_ppo)]
    t.add("beta0", "beta = 0 hacks the reward model: gold falls below the SFT model's and ppo's",
          f"below SFT by {fmt_list(below_sft)} sd, below ppo by {fmt_list(below_ppo)} sd ({seeds_txt(ok)})",
          f"> {c.noise_z:g} evaluation standard errors below both ({fmt_list(bar_sft, 2, False)} and "
          f"{fmt_list(bar_ppo, 2, False)} sd) in every seed" if q else
          f">= {c.beta0_min_gold_drop_sd:g} sd below both in every seed", all(ok), key="hack")
    kl_b0, kl_ppo = [b["kl"] for _, (b, p) in pairs], [p["kl"] for _, (b, p) in pairs]
    if q:
        bars = [t.noise(b, p, "kl") for _, (b, p) in pairs]
        ok = [b - p > bar for b, p, bar in zip(kl_b0, kl_ppo, bars)]
        t.add("beta0", "beta = 0 drifts further from the reference than ppo",
              f"KL {fmt_list(kl_b0, 1, False)} vs ppo {fmt_list(kl_ppo, 1, False)} nats ({seeds_txt(ok)})",
              f"higher by > {c.noise_z:g} evaluation standard errors ({fmt_list(bars, 1, False)} nats) in every seed",
              all(ok), key="drift")
        return
    ratios = [b["kl"] / p["kl"] if p["kl"] > 0 else math.inf for _, (b, p) in pairs]
    t.add("beta0", "beta = 0 drifts far from the reference",
          f"KL {fmt_list(kl_b0, 1, False)} vs ppo {fmt_list(kl_ppo, 1, False)} nats (ratio {fmt_list(ratios, 1, False)})",
          f">= {c.beta0_min_kl_ratio:g} x ppo's in every seed", all(r >= c.beta0_min_kl_ratio for r in ratios),
          key="drift")


def _beta0_claims(t: _Table) -> None:
    c, q = t.c, t.c.quick
    pairs = paired(t.finals, "ppo-beta0", "ppo")
    _beta0_hack_drift(t, pairs)
    wf = [p["well_formed"] - b["well_formed"] for _, (b, p) in pairs]
    rep = [b["repetition"] - p["repetition"] for _, (b, p) in pairs]
    bar_wf = [t.noise(b, p, "well_formed") if q else c.beta0_min_degeneration for _, (b, p) in pairs]
    bar_rep = [t.noise(b, p, "repetition") if q else c.beta0_min_degeneration for _, (b, p) in pairs]
    ok = [w > bw or r > br if q else max(w, r) >= bw for w, r, bw, br in zip(wf, rep, bar_wf, bar_rep)]
    t.add("beta0", "beta = 0 degenerates (well-formed share or repetition clearly worse than ppo's)",
          f"well-formed lower by {fmt_list(wf)}, repetition higher by {fmt_list(rep)} ({seeds_txt(ok)})",
          f"either by > {c.noise_z:g} evaluation standard errors ({fmt_list(bar_wf, 2, False)} and "
          f"{fmt_list(bar_rep, 2, False)}) in every seed" if q else
          f"either >= {c.beta0_min_degeneration:g} in every seed", all(ok), key="degeneration")
    psft = t.proxy_sft.get("ppo", t.sft)
    psd = psft.get("proxy_std") or math.nan
    dp = [(b["proxy"] - p["proxy"]) / psd for _, (b, p) in pairs]
    t.add("beta0", "beta = 0 still scores as high on the proxy (the RM is fooled)",
          f"proxy minus ppo's {fmt_list(dp)} sd ({seeds_txt([d >= -c.beta0_proxy_margin_sd for d in dp])})",
          f">= -{c.beta0_proxy_margin_sd:g} sd in every seed", all(d >= -c.beta0_proxy_margin_sd for d in dp))


def _beta_high_claims(t: _Table) -> None:
    c, sft = t.c, t.sft
    hi = sorted(t.finals["ppo-beta-high"], key=lambda r: r.get("seed", 0))
    kls = [r["kl"] for r in hi]
    t.add("beta-high", "a very high beta keeps the policy at the SFT model (KL)",
          f"KL {fmt_list(kls, 3, False)} nats per response",
          f"< {c.beta_high_max_kl:g} nats in every seed", all(k < c.beta_high_max_kl for k in kls))
    for key, unit, effect in (("gold", "sd", "ppo's gold gain"), ("length", "words", "ppo's length drift")):
        scale = t.gsd if key == "gold" else 1.0
        n_all = sum(int(r.get("n", 1)) for r in hi)
        var = mean([float(r.get(f"{key}_std", 0.0)) ** 2 for r in hi])
        eval_se_ = math.hypot(math.sqrt(var / max(n_all, 1)), eval_se(sft, key)) / scale
        diffs = [(r[key] - sft[key]) / scale for r in hi]
        se = seed_se(diffs, eval_se_)
        b = margin_verdict(mean(diffs), se, t.ppo_effect(key), MARGIN_SHARE, two_sided=True)
        t.add("beta-high", f"a very high beta keeps the policy at the SFT model ({key})",
              f"{key} {signed(mean(diffs))} {unit} from SFT's (mean over {len(hi)} seeds; {interval_text(b, se, unit)})",
              margin_threshold(b, MARGIN_SHARE, effect, unit, two_sided=True), b.holds, null=NULL_AT_MARGIN)


def _reinforce_claims(t: _Table, rf: list[str]) -> None:
    c, finals = t.c, t.finals
    same = [a for a in rf if _lr_of(a) == 1.0]
    if same:
        a = same[0]
        diffs = [(p["gold"] - r["gold"]) / t.gsd for _, (p, r) in paired(finals, "ppo", a)]
        ok = [x >= c.clear_margin_sd for x in diffs]
        t.add("reinforce", "ppo clearly beats naive REINFORCE at the same learning rate",
              f"gold difference {fmt_list(diffs)} sd ({seeds_txt(ok)}); {t.spread('ppo')}, {t.spread(a)}",
              f">= {c.clear_margin_sd:g} sd in every seed", all(ok))
    else:
        t.notes.append("claim 'ppo clearly beats REINFORCE at the same learning rate' not checked: "
                       "reinforce_lr_multipliers has no 1.0")
    best = _best_reinforce(t, rf)
    t.add_beats("reinforce", f"ppo beats REINFORCE at its best learning rate tried ({best}, of {', '.join(rf)})",
                "ppo", best, spread_label="spread over seeds: ")


def _best_reinforce(t: _Table, rf: Sequence[str]) -> str:
    """The REINFORCE arm with the highest mean gold (the tuned naive baseline)."""
    return max(rf, key=lambda a: mean([r["gold"] for r in t.finals[a]]))


def _critic_free_claims(t: _Table, arm: str) -> None:
    """What removing the critic costs PPO on gold (mean over seeds against a fixed bar, the cost
    measured either way), and whether the critic-free ``arm`` still raises gold above SFT's."""
    c = t.c
    pairs = paired(t.finals, "ppo", arm)
    costs = [(p["gold"] - a["gold"]) / t.gsd for _, (p, a) in pairs]
    se_mean = math.sqrt(sum(eval_se(p, "gold") ** 2 + eval_se(a, "gold") ** 2 for _, (p, a) in pairs)) / len(pairs) / t.gsd
    cost, se, share = mean(costs), seed_se(costs, se_mean), c.critic_free_margin_share
    b = margin_verdict(cost, se, t.ppo_effect("gold"), share)
    t.add("critic-free", f"removing the critic costs PPO less than {share:.0%} of its gold gain ({arm})",
          f"ppo's gold minus {arm}'s {fmt_list(costs)} sd, mean {signed(cost)} sd ({interval_text(b, se)}); "
          f"{t.spread('ppo')}, {t.spread(arm)}",
          margin_threshold(b, share, "ppo's mean gold gain"), b.holds, key="cost", null=NULL_AT_MARGIN)
    d, thr, ok = t.gain(arm, "gold")
    t.add("critic-free", f"{arm} raises gold above the SFT model's", f"gold gain {fmt_list(d)} sd ({seeds_txt(ok)})",
          f"> {c.noise_z:g} evaluation standard errors ({fmt_list(thr, 2, False)} sd) in every seed", all(ok), key="gain")


def _dpo_claims(t: _Table) -> None:
    """DPO against the SFT model it starts from: gold up, and length up (the labels it fits prefer
    the longer response), each beyond the evaluation's noise in every seed."""
    z = t.c.noise_z
    d, thr, ok = t.gain("dpo", "gold")
    t.add("dpo", "DPO raises gold above the SFT model's", f"gold gain {fmt_list(d)} sd ({seeds_txt(ok)})",
          f"> {z:g} evaluation standard errors ({fmt_list(thr, 2, False)} sd) in every seed", all(ok), key="gold")
    d, thr, ok = t.gain("dpo", "length")
    t.add("dpo", "DPO inherits the labelers' length bias: its responses are longer than the SFT model's",
          f"length {fmt_list(d, 1)} words vs SFT's {fmt(t.sft['length'], 1)} ({seeds_txt(ok)})",
          f"> {z:g} evaluation standard errors ({fmt_list(thr, 1, False)} words) in every seed", all(ok), key="length")


def _length_claims(t: _Table) -> None:
    c, sft = t.c, t.sft
    pairs = paired(t.finals, "ppo", "ppo-unbiased-rm")
    drift_b = [p["length"] - sft["length"] for _, (p, u) in pairs]
    drift_u = [u["length"] - sft["length"] for _, (p, u) in pairs]
    thr = [c.noise_z * math.hypot(eval_se(p, "length"), eval_se(u, "length")) for _, (p, u) in pairs]
    ok = [b - u > th for b, u, th in zip(drift_b, drift_u, thr)]
    t.add("length", "the labelers' length bias makes ppo verbose: its length drift exceeds "
                    "ppo-unbiased-rm's",
          f"length drift vs SFT: ppo {fmt_list(drift_b, 1)}, unbiased RM {fmt_list(drift_u, 1)} words ({seeds_txt(ok)})",
          f"difference > {c.noise_z:g} evaluation standard errors ({fmt_list(thr, 1, False)} words) in every seed",
          all(ok))


def _series(t: _Table, arm: str, seed: int, key: str) -> list[float]:
    """``arm``'s per-iteration ``key`` in ``seed``'s run (empty when it has no curves)."""
    return list(t.curves.get(arm, {}).get(seed, {}).get(key, []))


def _at_iteration(t: _Table, arm: str, seed: int, key: str, it: int) -> float:
    """``key`` of iteration ``it`` in ``arm``'s run of ``seed`` (nan when not logged)."""
    c = t.curves.get(arm, {}).get(seed, {})
    for i, v in zip(c.get("iteration", []), c.get(key, [])):
        if int(i) == it:
            return float(v)
    return math.nan


def _sci(xs: Sequence[float]) -> str:
    return ", ".join(f"{x:.2e}" if math.isfinite(x) else "n/a" for x in xs)


def _seeds(t: _Table, *arms: str) -> list[int]:
    return [s for s, _ in paired(t.finals, *arms)]


def _every_iteration(xs: Sequence[float], ok) -> bool:
    """``ok(x)`` for every iteration's value, at least one logged (nan fails)."""
    return bool(xs) and all(math.isfinite(x) and ok(x) for x in xs)


def _practice_claims(t: _Table) -> None:
    """The practice arms' six claims (docs/correction.md, "Sweep arms"): one row per arm, each over
    every seed the arms share, the per-iteration ones from the runs' curves."""
    p, g = PRACTICE, "practice"
    if t.need(g, "ppo-critic-policy-init"):
        seeds = _seeds(t, "ppo-critic-policy-init")
        ev = [_at_iteration(t, "ppo-critic-policy-init", s, "value/explained_variance", 1) for s in seeds]
        ok = [x < p["bad_start_max_ev"] for x in ev]
        t.add(g, "a critic started from the policy (a fresh zero value head) starts badly (ppo-critic-policy-init)",
              f"value/explained_variance at iteration 1 {fmt_list(ev)} ({seeds_txt(ok)})",
              f"< {p['bad_start_max_ev']:g} in every seed", all(ok), key="bad-start")
    if t.need(g, "ppo-critic-warmup", "ppo"):
        pairs, first = paired(t.finals, "ppo-critic-warmup", "ppo"), t.critic_warmup + 1
        ev = [_at_iteration(t, "ppo-critic-warmup", s, "value/explained_variance", first) for s, _ in pairs]
        d = [(w["gold"] - r["gold"]) / t.gsd for _, (w, r) in pairs]
        ok = [x >= p["warmup_min_ev"] and y >= -p["warmup_gold_margin_sd"] for x, y in zip(ev, d)]
        t.add(g, f"{t.critic_warmup} critic-only warm-up iterations fix the bad start (ppo-critic-warmup)",
              f"value/explained_variance at iteration {first} (the first policy iteration) {fmt_list(ev)}; "
              f"gold minus ppo's {fmt_list(d)} sd ({seeds_txt(ok)})",
              f"explained variance >= {p['warmup_min_ev']:g} and gold >= ppo's - {p['warmup_gold_margin_sd']:g} sd, "
              "in every seed", all(ok), key="warmup")
    if t.need(g, "ppo-beta0-dual-clip", "ppo-beta0"):
        pairs = paired(t.finals, "ppo-beta0-dual-clip", "ppo-beta0")
        r = [a["kl"] / b["kl"] if b["kl"] > 0 else math.inf for _, (a, b) in pairs]
        ok = [x <= p["dual_clip_max_kl_ratio"] for x in r]
        t.add(g, "dual-clip tames beta = 0's drift (ppo-beta0-dual-clip vs ppo-beta0)",
              f"KL {fmt_list([a['kl'] for _, (a, b) in pairs], 1, False)} vs ppo-beta0 "
              f"{fmt_list([b['kl'] for _, (a, b) in pairs], 1, False)} nats (ratio {fmt_list(r, 2, False)}; "
              f"{seeds_txt(ok)})", f"<= {p['dual_clip_max_kl_ratio']:g} x ppo-beta0's in every seed", all(ok),
              key="dual-clip")
    if t.need(g, "ppo-bf16-copy"):
        seeds = _seeds(t, "ppo-bf16-copy")
        xs = [_series(t, "ppo-bf16-copy", s, "mismatch/token_abs_diff_mean") for s in seeds]
        ok = [_every_iteration(x, lambda v: v > p["bf16_min_token_diff"]) for x in xs]
        t.add(g, "the bf16 copy's log-probs are not the trainer's (ppo-bf16-copy)",
              f"mismatch/token_abs_diff_mean smallest over iterations {_sci([min(x, default=math.nan) for x in xs])}"
              f", over {fmt_list([len(x) for x in xs], 0, False)} iterations ({seeds_txt(ok)})",
              f"> {p['bf16_min_token_diff']:g} every iteration, in every seed", all(ok), key="bf16-mismatch")
    if t.need(g, "ppo-bf16-copy-recompute", "ppo-bf16-copy"):
        pairs = paired(t.finals, "ppo-bf16-copy-recompute", "ppo-bf16-copy")
        xs = [_series(t, "ppo-bf16-copy-recompute", s, "policy/first_ratio_abs_dev") for s, _ in pairs]
        d = [(a["gold"] - b["gold"]) / t.gsd for _, (a, b) in pairs]
        ok = [_every_iteration(x, lambda v: v == 0) and y >= -p["recompute_gold_margin_sd"] for x, y in zip(xs, d)]
        t.add(g, "recomputing pi_old makes the first ratio exactly 1 and costs no gold (ppo-bf16-copy-recompute)",
              f"policy/first_ratio_abs_dev largest over iterations {_sci([max(x, default=math.nan) for x in xs])}; "
              f"gold minus ppo-bf16-copy's {fmt_list(d)} sd ({seeds_txt(ok)})",
              f"first ratio deviation == 0 every iteration and gold >= ppo-bf16-copy's - "
              f"{p['recompute_gold_margin_sd']:g} sd, in every seed", all(ok), key="recompute")
    if t.need(g, "ppo-bf16-copy-tis", "ppo-bf16-copy"):
        pairs = paired(t.finals, "ppo-bf16-copy-tis", "ppo-bf16-copy")
        xs = [_series(t, "ppo-bf16-copy-tis", s, "mismatch/is_truncated_share") for s, _ in pairs]
        share = [mean(x) if x and all(math.isfinite(v) for v in x) else math.nan for x in xs]
        d = [(a["gold"] - b["gold"]) / t.gsd for _, (a, b) in pairs]
        ok = [y >= -p["tis_gold_margin_sd"] and sh < p["tis_max_truncated_share"] for y, sh in zip(d, share)]
        t.add(g, "token TIS costs no gold and rarely truncates (ppo-bf16-copy-tis vs ppo-bf16-copy)",
              f"gold minus ppo-bf16-copy's {fmt_list(d)} sd; mismatch/is_truncated_share, mean over iterations, "
              f"{fmt_list(share, 4, False)} ({seeds_txt(ok)})",
              f"gold >= ppo-bf16-copy's - {p['tis_gold_margin_sd']:g} sd and truncated share "
              f"< {p['tis_max_truncated_share']:.0%}, in every seed", all(ok), key="tis")


def compute_claims(finals: Mapping[str, Sequence[Mapping]], sft: Mapping, claims: ExperimentsClaimsConfig, *,
                   kl_coef: float, ppo_epochs: int = 4,
                   proxy_sft: Mapping[str, Mapping] | None = None,
                   curves: Mapping[str, Mapping[int, Mapping]] | None = None,
                   critic_warmup: int = 0) -> tuple[list[dict], list[str]]:
    """The claims table from the final evaluations.

    finals: {arm: [per-seed summary]} with keys seed, n, proxy, gold, kl, length, well_formed,
    repetition, gold_std, length_std; sft: the SFT model's summary on the same prompts (plus
    proxy_std); proxy_sft: {arm: SFT summary under that arm's RM} (default: sft) for proxy units;
    kl_coef, ppo_epochs: ppo's beta and epochs; curves: {arm: {seed: per-iteration series}}
    (:func:`~fourfold.apps.experiments.results.read_curves`), which the 'practice' claims read;
    critic_warmup: ppo-critic-warmup's warm-up iterations. Returns (rows, notes): rows have claim, measured,
    threshold, holds ('yes' or 'no') and group; notes say which claim groups could not be checked
    and why, and under claims.quick which claims need the full sweep.
    """
    t = _Table(finals, sft, claims, proxy_sft or {}, kl_coef, ppo_epochs, curves=curves or {},
               critic_warmup=critic_warmup)
    if t.need("ppo", "ppo"):
        _ppo_claims(t)
    if t.need("beta0", "ppo", "ppo-beta0"):
        _beta0_claims(t)
    if t.need("beta-high", "ppo-beta-high"):
        _beta_high_claims(t)
    if t.need("epochs", "ppo", "ppo-1epoch"):
        t.add_beats("epochs", f"{ppo_epochs} epochs per batch beat 1 epoch on gold at equal samples",
                    "ppo", "ppo-1epoch")
    rf = sorted((a for a in finals if a.startswith("reinforce-lr") and finals[a]), key=_lr_of)
    if "reinforce" in claims.groups:
        if not rf:
            t.notes.append("claims 'reinforce' not checked: no reinforce arm has results")
        elif t.need("reinforce", "ppo", *rf):
            _reinforce_claims(t, rf)
    if t.need("critic", "ppo", "ppo-no-critic"):
        t.add_beats("critic", "the critic's baseline helps: ppo beats ppo-no-critic on gold", "ppo", "ppo-no-critic")
    if t.need("length", "ppo", "ppo-unbiased-rm"):
        _length_claims(t)
    for arm in CRITIC_FREE_ARMS:
        if t.need("critic-free", "ppo", arm):
            _critic_free_claims(t, arm)
    if "baseline" in claims.groups and not rf:
        t.notes.append("claims 'baseline' not checked: no reinforce arm has results")
    for arm in GROUP_BASELINE_ARMS:
        if rf and t.need("baseline", arm, *rf):
            best = _best_reinforce(t, rf)
            t.add_beats("baseline", f"a group baseline ({arm}) beats naive REINFORCE on gold at the same samples "
                                    f"(REINFORCE at its best learning rate tried, {best})", arm, best)
    if t.need("dpo", "dpo"):
        _dpo_claims(t)
    _practice_claims(t)
    _measure_group(t)
    if claims.quick:
        _quick_notes(t)
    return annotate("experiments", t.rows), t.notes


def _measure_group(t: _Table) -> None:
    """The 'measure' claims (:func:`~fourfold.apps.experiments.measure_claims.measure_claims`): their
    rows as computed, each with its null; a note when no arm of theirs ran, or under claims.quick."""
    if "measure" not in t.c.groups:
        return
    if t.c.quick:
        t.notes.append(f"needs the full sweep: claims 'measure' ({GROUP_CLAIMS['measure']})")
        return
    rows = measure_claims(t.curves, finals=t.finals, gold_sd=t.gsd)
    if not rows:
        t.notes.append("claims 'measure' not checked: none of the measurement arms' comparisons has results")
    t.rows += rows


def _quick_notes(t: _Table) -> None:
    """claims.quick: the claims left to the full sweep, by group (those left out of claims.groups)
    and one by one (those of a checked group that QUICK_CLAIMS does not list)."""
    for group in DEFAULT_CLAIM_GROUPS:
        if group not in t.c.groups:
            t.notes.append(f"needs the full sweep: claims '{group}' ({GROUP_CLAIMS[group]})")
    t.notes += [f"needs the full sweep: {claim}" for claim in t.full_only]
