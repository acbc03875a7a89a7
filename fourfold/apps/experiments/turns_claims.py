"""The turns family's claims, computed from the final evaluations of every world
(:func:`compute_turns_claims`; unit-tested on hand-made numbers).

A *world* is one hops value of the lookup world (``h0``, ``h1``, ``h3``: 1, 2, 4 turns of perfect
play), its SFT model and the arms run on it. Gold is the share of the world's held-out rows
answered right by trajectories sampled at temperature 1 (``gold`` below; the greedy share is
reported beside it), an absolute share. Seeds are paired (same seed: same prompt order, same
initial state, same evaluation rows and sampling seed). An evaluation's standard error (SE) is the
binomial sqrt(p (1 - p) / n); a difference adds its SEs in quadrature. An arm's *shape* is its
rows x K per iteration ('32x8', '256x1'); estimators are compared only at the same shape.

The claims and their thresholds (``turns.claims``), registered before the rerun of issue 39 (they
replace the first run's ``learns`` and ``critic``, whose critic was untrained):

- ``knob`` (check): the SFT policy's mean turns per held-out trajectory grows with the hops, each
  step by at least ``knob_min_step`` (stated by ``--quick`` too).
- ``critic-learns`` (check, one row per critic arm): value/explained_variance, the mean over the
  last ``ev_tail_share`` of the run's iterations, at least ``ev_min`` in every seed at every turn
  count: the precondition that the critic arm has a trained critic (stated by ``--quick`` too).
- ``learns`` (finding, one row per world): every arm's gold minus the SFT policy's at least
  ``learn_min_gain`` and above ``noise_z`` SE, in every seed; null: SFT against itself.
- ``critic`` (finding, the question; one row per critic-free arm b at ppo's shape): ppo's gold gain
  over b *grows with the turns*: with g_h(s) = gold(ppo) - gold(b) at world h and seed s, the
  increase d(s) = g_most(s) - g_fewest(s) has mean over seeds at least ``grow_min`` and above
  ``noise_z`` x its SE, the larger of the seeds' (sd of d / sqrt(seeds)) and the evaluation's;
  null: the same rule on b against itself with seeds rotated (seed s against s+1).
- ``match`` (finding, one row per critic-free arm b at ppo's shape): b costs ppo less than
  ``match_margin_share`` of ppo's gold gain at every turn count: non-inferiority, the upper 95%
  bound of the mean cost (:func:`~fourfold.apps.claim_stats.margin_verdict`) below the margin;
  null: a cost exactly at the margin with the same SE.
- ``rows`` (finding, one row per world and pair X-256x1 / X run): at the same trajectories, X at
  one trajectory a row beats X at rows x K: the mean over seeds of the gold difference at least
  ``rows_min_gain`` and above ``noise_z`` SE; null: X-256x1 against itself with seeds rotated.

Every finding's null is computed here with the same verdict function, kept in the row's ``null``
("yes"/"no" and the comparison).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from fourfold.apps.claim_kinds import annotate
from fourfold.apps.claim_stats import Bound, margin_verdict, mean_se
from fourfold.apps.experiments.claims import WorldClaims, fmt_list, seeds_txt
from fourfold.apps.experiments.config import TURNS_CRITIC_ARMS, TurnsClaimsConfig
from fourfold.apps.report_kit import fmt, mean, signed, std

TURNS_GROUPS = ("knob", "critic-learns", "learns", "critic", "match", "rows")
QUICK_TURNS_GROUPS = ("knob", "critic-learns")
"""What ``--quick`` states: the knob and whether the critic learns (its budget settles no gold claim)."""
CRITIC_FREE = ("ppo-no-critic", "grpo", "rloo", "ppo-no-critic-256x1")
"""The arms compared with a critic arm of the same shape."""
WIDE = "-256x1"
"""The suffix of the arms at one trajectory a row."""
GOLD = "gold"
"""The key of a row's gold (sampled at T = 1); ``gold_greedy`` is beside it."""


def turns_label(hops: int) -> str:
    """A world's label: ``h0``, ``h1``, ``h3``."""
    return f"h{hops}"


def turns_of(hops: int) -> int:
    """Turns of perfect play: hops lookups and the answer."""
    return hops + 1


def gold_se(row: Mapping, key: str = GOLD) -> float:
    p, n = float(row[key]), max(int(row.get("n", 1)), 1)
    return math.sqrt(max(p * (1 - p), 0.0) / n)


def growth(gains: Mapping[int, tuple[float, float]], fewest: Mapping[int, tuple[float, float]],
           ) -> tuple[list[int], list[float], float, float]:
    """(seeds, per-seed increase d(s), mean of d, its SE) from {seed: (gain, SE)} at the most and
    the fewest turns: the SE is the larger of the seeds' spread (sd / sqrt(n), n >= 2) and the
    evaluation's (sqrt(sum of the per-seed SEs squared) / n)."""
    seeds = sorted(set(gains) & set(fewest))
    d = [gains[s][0] - fewest[s][0] for s in seeds]
    if not seeds:
        return seeds, d, math.nan, math.nan
    ev = math.sqrt(sum(gains[s][1] ** 2 + fewest[s][1] ** 2 for s in seeds)) / len(seeds)
    spread = std(d) / math.sqrt(len(d)) if len(d) >= 2 else 0.0
    return seeds, d, mean(d), max(ev, spread)


def tail_mean(xs, share: float) -> float:
    """The mean of the last ``share`` of ``xs`` (at least one value; nan when empty)."""
    xs = [float(x) for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return mean(xs[-max(1, round(share * len(xs))):]) if xs else math.nan


def rotate(d: Mapping[int, Mapping]) -> dict[int, Mapping]:
    """{seed s: the row of the next seed (the last takes the first's)}: an arm against itself, seeds rotated."""
    seeds = sorted(d)
    return {s: d[seeds[(i + 1) % len(seeds)]] for i, s in enumerate(seeds)}


def by_seed(rows: Sequence[Mapping]) -> dict[int, Mapping]:
    return {int(r["seed"]): r for r in rows}


def seed_diffs(a: Mapping[int, Mapping], b: Mapping[int, Mapping]) -> dict[int, tuple[float, float]]:
    """{seed: (gold of a minus gold of b, its SE)} over the seeds of both ({seed: row} each)."""
    return {s: (a[s][GOLD] - b[s][GOLD], math.hypot(gold_se(a[s]), gold_se(b[s]))) for s in sorted(set(a) & set(b))}


def beyond(m: float, se: float, at_least: float, z: float) -> bool:
    """The rule of a positive effect: mean at least ``at_least`` and above z SE (nan: no)."""
    return math.isfinite(m) and math.isfinite(se) and m >= at_least and m > z * se


def verdict_text(holds: bool, what: str) -> str:
    return f"{'yes' if holds else 'no'} (computed: {what})"


class _Table(WorldClaims):
    c: TurnsClaimsConfig

    def rows_of(self, world: str, arm: str) -> dict[int, Mapping]:
        return by_seed(self.finals.get(world, {}).get(arm) or [])


def _knob(t: _Table, hops: list[int]) -> None:
    worlds, turns, steps = t.knob([turns_label(h) for h in hops], "turns_mean", "worlds")
    if not worlds:
        return
    t.add("knob", "the turns knob works: the SFT policy's trajectories get longer with the hops",
          f"SFT mean turns {fmt_list(turns, 2, False)} at {', '.join(worlds)} (steps {fmt_list(steps)})",
          f"each step >= {t.c.knob_min_step:g} turns", all(s >= t.c.knob_min_step for s in steps))


def _critic_learns(t: _Table, hops: list[int], arm: str, shape: str) -> None:
    worlds = [turns_label(h) for h in hops]
    got = {w: t.rows_of(w, arm) for w in worlds}
    missing = [w for w in worlds if not got[w]]
    if len(missing) == len(worlds):
        return
    c = t.c
    tails = {w: [r.get("ev_tail", math.nan) for r in got[w].values()] for w in worlds}
    first = [r["ev"][0] for w in worlds for r in got[w].values() if r.get("ev")]
    text = "; ".join(f"{w} {fmt_list(tails[w], 3, False)}" for w in worlds if got[w])
    ok = [math.isfinite(x) and x >= c.ev_min for w in worlds for x in tails[w]]
    t.add("critic-learns", f"the critic learns ({arm}, {shape.replace('x', ' rows x ')})",
          f"value/explained_variance, mean over the last {c.ev_tail_share:.0%} of iterations, per seed: {text}"
          + (f" (first iteration, the zero head's: {fmt(max(first), 3)} at most)" if first else "")
          + (f"; not run at {', '.join(missing)}" if missing else ""),
          f">= {c.ev_min:g} in every seed at every turn count", bool(ok) and all(ok) and not missing)


def learn_verdict(arm: Mapping[int, Mapping], sft: Mapping, c: TurnsClaimsConfig) -> tuple[list[float], bool]:
    """Per seed the gold gain over SFT, and whether every one is >= learn_min_gain and > noise_z SE."""
    gains = [(r[GOLD] - sft[GOLD], math.hypot(gold_se(r), gold_se(sft))) for r in arm.values()]
    return [g for g, _ in gains], bool(gains) and all(g >= c.learn_min_gain and g > c.noise_z * e for g, e in gains)


def _learns(t: _Table, hops: list[int], arms: list[str]) -> None:
    for h in hops:
        w = turns_label(h)
        if w not in t.sft:
            t.notes.append(f"claims 'learns' not checked at {w}: no SFT evaluation")
            continue
        got = {a: t.rows_of(w, a) for a in arms}
        verdicts = {a: learn_verdict(got[a], t.sft[w], t.c) for a in arms}
        text = "; ".join(f"{a} {fmt_list(verdicts[a][0])}" if got[a] else f"{a} not run" for a in arms)
        holds = all(got[a] and verdicts[a][1] for a in arms)
        _, null = learn_verdict({0: t.sft[w]}, t.sft[w], t.c)
        t.add("learns", f"every arm learns at {turns_of(h)} turn{'s' if h else ''} ({w})",
              f"gold minus SFT's ({fmt(t.sft[w][GOLD], 3)}), per seed: {text}",
              f">= +{t.c.learn_min_gain:g} and > {t.c.noise_z:g} SE for every arm in every seed", holds,
              null=verdict_text(null, "the SFT policy against itself gains 0"))


def growth_verdict(near: Mapping[int, tuple[float, float]], far: Mapping[int, tuple[float, float]],
                   c: TurnsClaimsConfig) -> tuple[list[int], list[float], float, float, bool]:
    """The 'grows with the turns' rule on {seed: (gain, SE)} at the fewest (``near``) and the most
    (``far``) turns: (seeds, d per seed, mean, SE, holds)."""
    seeds, d, m, se = growth(far, near)
    return seeds, d, m, se, bool(seeds) and beyond(m, se, c.grow_min, c.noise_z)


def _critic(t: _Table, hops: list[int], critic: str, arm: str, shape: str) -> None:
    short, long_ = turns_label(hops[0]), turns_label(hops[-1])
    worlds = [turns_label(h) for h in hops]
    have = [w for w in worlds if set(t.rows_of(w, critic)) & set(t.rows_of(w, arm))]
    if short not in have or long_ not in have:
        t.notes.append(f"claims 'critic' not checked for {arm}: needs {critic} and {arm} on a common seed at "
                       f"{short} and {long_}")
        return
    g = {w: seed_diffs(t.rows_of(w, critic), t.rows_of(w, arm)) for w in have}
    seeds, d, m, se, holds = growth_verdict(g[short], g[long_], t.c)
    rot = {w: seed_diffs(t.rows_of(w, arm), rotate(t.rows_of(w, arm))) for w in (short, long_)}
    null = growth_verdict(rot[short], rot[long_], t.c)[-1]
    per_world = ", ".join(f"{w} {signed(mean([x for x, _ in g[w].values()]))}" for w in have)
    t.add("critic", f"{critic}'s gold gain over {arm} at {shape.replace('x', ' rows x ')} grows with the turns "
                    f"({turns_of(hops[0])} -> {turns_of(hops[-1])} turns)",
          f"{critic} minus {arm}, mean over seeds: {per_world}; {long_} minus {short} per seed {fmt_list(d)}, "
          f"mean {signed(m)} (SE {fmt(se, 3)}, {seeds_txt([x > 0 for x in d])} positive)",
          f"mean >= +{t.c.grow_min:g} and > {t.c.noise_z:g} SE (> {fmt(t.c.noise_z * se, 3)})", holds,
          null=verdict_text(null, f"{arm} against itself, seed s against seed s+1"))


def match_verdict(cost: Mapping[int, tuple[float, float]], gain: float, c: TurnsClaimsConfig) -> tuple[float, float, Bound]:
    """(mean cost, its SE, the non-inferiority verdict at match_margin_share x ``gain``)."""
    m, se = mean_se(cost)
    return m, se, margin_verdict(m, se if math.isfinite(se) else 0.0, gain, c.match_margin_share)


def _match(t: _Table, hops: list[int], critic: str, arm: str, shape: str) -> None:
    worlds = [turns_label(h) for h in hops if turns_label(h) in t.sft]
    have = [w for w in worlds if set(t.rows_of(w, critic)) & set(t.rows_of(w, arm))]
    if not have:
        return
    parts, oks, nulls = [], [], []
    for w in have:
        gain = mean([r[GOLD] - t.sft[w][GOLD] for r in t.rows_of(w, critic).values()])
        m, se, b = match_verdict(seed_diffs(t.rows_of(w, critic), t.rows_of(w, arm)), gain, t.c)
        oks.append(b.holds)
        nulls.append(margin_verdict(b.margin, se, gain, t.c.match_margin_share).holds if b.margin > 0 else False)
        parts.append(f"{w} {signed(m)} (bound {signed(b.upper)} / margin {fmt(b.margin, 3)})")
    missing = [w for w in worlds if w not in have]
    t.add("match", f"{arm} costs {critic} less than {t.c.match_margin_share:.0%} of its gold gain at every turn "
                   f"count ({shape.replace('x', ' rows x ')})",
          f"{critic}'s gold minus {arm}'s, mean over seeds (upper 95% bound / margin): " + "; ".join(parts)
          + (f"; not run: {', '.join(missing)}" if missing else ""),
          f"upper 95% bound < {t.c.match_margin_share:.0%} of {critic}'s gold gain at that turn count: "
          "non-inferiority, at every one", not missing and all(oks),
          null=verdict_text(any(nulls), "a cost exactly at the margin with the same SE"))


def rows_verdict(d: Mapping[int, tuple[float, float]], c: TurnsClaimsConfig) -> tuple[float, float, bool]:
    """(mean over seeds, its SE, holds): the rows claim's rule on {seed: (difference, SE)}."""
    m, se = mean_se(d)
    return m, se, beyond(m, se, c.rows_min_gain, c.noise_z)


def _rows(t: _Table, hops: list[int], wide: str, narrow: str, shapes: Mapping[str, str]) -> None:
    for h in hops:
        w = turns_label(h)
        a, b = t.rows_of(w, wide), t.rows_of(w, narrow)
        if not set(a) & set(b):
            t.notes.append(f"claims 'rows' not checked at {w}: needs {wide} and {narrow} on a common seed")
            continue
        d = seed_diffs(a, b)
        m, se, holds = rows_verdict(d, t.c)
        null = rows_verdict(seed_diffs(a, rotate(a)), t.c)[-1]
        t.add("rows", f"at the same trajectories, {shapes[wide].replace('x', ' rows x ')} beat "
                      f"{shapes[narrow].replace('x', ' rows x ')} ({wide} vs {narrow}) at {turns_of(h)} "
                      f"turn{'s' if h else ''} ({w})",
              f"gold difference per seed {fmt_list([x for x, _ in d.values()])}, mean {signed(m)} (SE {fmt(se, 3)})",
              f"mean >= +{t.c.rows_min_gain:g} and > {t.c.noise_z:g} SE (> {fmt(t.c.noise_z * se, 3)})", holds,
              null=verdict_text(null, f"{wide} against itself, seed s against seed s+1"))


def compute_turns_claims(finals: Mapping[str, Mapping[str, Sequence[Mapping]]], sft: Mapping[str, Mapping],
                         c: TurnsClaimsConfig, *, hops: Sequence[int], arms: Sequence[str],
                         shapes: Mapping[str, str] | None = None, quick: bool = False) -> tuple[list[dict], list[str]]:
    """The claims table of the turns family.

    finals: {world: {arm: [per-seed row]}} (keys seed, n, gold, gold_greedy; a critic arm's also
    ev_tail and ev, its explained variance per iteration); sft: {world: the SFT policy's row on the
    same held-out rows (n, gold, gold_greedy, turns_mean)}; hops: the worlds' hops; arms: the arms
    run; shapes: {arm: 'rows x K'} ('32x8'; None: every arm at one shape but the -256x1 ones).
    Returns (rows, notes): rows of {group, claim, measured, threshold, holds, null} annotated with
    kind and why; with ``quick`` only the knob and critic-learns claims, the others noted."""
    shapes = dict(shapes or {a: "256x1" if a.endswith(WIDE) else "32x8" for a in arms})
    t = _Table(finals, sft, c, quick)
    hs = sorted(hops)
    _knob(t, hs)
    critics = [a for a in TURNS_CRITIC_ARMS if a in arms]
    for a in critics:
        _critic_learns(t, hs, a, shapes[a])
    if quick:
        t.notes += [f"needs the full family: claims '{g}'" for g in TURNS_GROUPS if g not in QUICK_TURNS_GROUPS]
        return annotate("turns", t.rows), t.notes
    _learns(t, hs, list(arms))
    pairs = [(k, b) for k in critics for b in CRITIC_FREE if b in arms and shapes[b] == shapes[k]]
    if len(hs) >= 2:
        for k, b in pairs:
            _critic(t, hs, k, b, shapes[k])
    for k, b in pairs:
        _match(t, hs, k, b, shapes[k])
    for wide in [a for a in arms if a.endswith(WIDE)]:
        if wide[:-len(WIDE)] in arms:
            _rows(t, hs, wide, wide[:-len(WIDE)], shapes)
    return annotate("turns", t.rows), t.notes
