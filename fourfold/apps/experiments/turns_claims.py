"""The turns family's claims, computed from the final evaluations of every world
(:func:`compute_turns_claims`; unit-tested on hand-made numbers).

A *world* is one hops value of the lookup world (``h0``, ``h1``, ``h3``: 1, 2, 4 turns of perfect
play), its SFT model and the arms run on it. Gold is the share of the world's held-out rows
answered right by trajectories sampled at temperature 1 (``gold`` below; the greedy share is
reported beside it), an absolute share. Seeds are paired (same seed: same prompt order, same
initial state, same evaluation rows and sampling seed). An evaluation's standard error (SE) is the
binomial sqrt(p (1 - p) / n); a difference adds its SEs in quadrature.

The claims and their thresholds (``turns.claims``), fixed before the family's first run:

- ``knob``: the SFT policy's mean turns per held-out trajectory grows with the hops, each step by
  at least ``knob_min_step`` (stated by ``--quick`` too).
- ``learns``: every arm learns at every turn count: its gold minus the SFT policy's, at least
  ``learn_min_gain`` in every seed (one row per world).
- ``critic`` (the question, one row per arm b of ppo-no-critic, grpo, rloo run with ppo): ppo's gold
  gain over b *grows with the turns*: with g_h(s) = gold(ppo) - gold(b) at world h and seed s, the
  increase d(s) = g_most(s) - g_fewest(s) (the most turns minus the fewest) has mean over seeds at
  least ``grow_min`` and above ``noise_z`` x its standard error, that SE being the larger of the
  seeds' (sd of d over seeds / sqrt(seeds); none with one seed) and the evaluation's (the four
  gold SEs of d in quadrature, per seed, over seeds as a mean's).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from fourfold.apps.claim_kinds import annotate
from fourfold.apps.experiments.claims import WorldClaims, fmt_list, paired, seeds_txt
from fourfold.apps.experiments.config import TurnsClaimsConfig
from fourfold.apps.report_kit import fmt, mean, signed, std

TURNS_GROUPS = ("knob", "learns", "critic")
QUICK_TURNS_GROUPS = ("knob",)
"""What ``--quick`` states: the knob only (its budget settles no learning claim)."""
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


class _Table(WorldClaims):
    c: TurnsClaimsConfig

    def diffs(self, world: str, a: str, b: str) -> dict[int, tuple[float, float]]:
        """{seed: (gold of a minus gold of b, its SE)} at ``world``."""
        return self.gold_diffs(world, a, b, gold_se)


def _knob(t: _Table, hops: list[int]) -> None:
    worlds, turns, steps = t.knob([turns_label(h) for h in hops], "turns_mean", "worlds")
    if not worlds:
        return
    t.add("knob", "the turns knob works: the SFT policy's trajectories get longer with the hops",
          f"SFT mean turns {fmt_list(turns, 2, False)} at {', '.join(worlds)} (steps {fmt_list(steps)})",
          f"each step >= {t.c.knob_min_step:g} turns", all(s >= t.c.knob_min_step for s in steps))


def _learns(t: _Table, hops: list[int], arms: list[str]) -> None:
    for h in hops:
        w = turns_label(h)
        f = t.finals.get(w, {})
        missing = [a for a in arms if not f.get(a)]
        if w not in t.sft:
            t.notes.append(f"claims 'learns' not checked at {w}: no SFT evaluation")
            continue
        base = t.sft[w][GOLD]
        gains = {a: [r[GOLD] - base for r in f.get(a, [])] for a in arms}
        ok = [g >= t.c.learn_min_gain for a in arms for g in gains[a]]
        text = "; ".join(f"{a} {fmt_list(gains[a])}" if gains[a] else f"{a} not run" for a in arms)
        t.add("learns", f"every arm learns at {turns_of(h)} turn{'s' if h else ''} ({w})",
              f"gold minus SFT's ({fmt(base, 3)}), per seed: {text}",
              f">= +{t.c.learn_min_gain:g} for every arm in every seed", bool(ok) and all(ok) and not missing)


def _critic(t: _Table, hops: list[int], arm: str) -> None:
    short, long_ = turns_label(hops[0]), turns_label(hops[-1])
    have = [turns_label(h) for h in hops
            if all(t.finals.get(turns_label(h), {}).get(a) for a in ("ppo", arm))
            and paired(t.finals[turns_label(h)], "ppo", arm)]
    if short not in have or long_ not in have:
        t.notes.append(f"claims 'critic' not checked for {arm}: needs ppo and {arm} on a common seed at "
                       f"{short} and {long_}")
        return
    g = {w: t.diffs(w, "ppo", arm) for w in have}
    seeds, d, m, se = growth(g[long_], g[short])
    bar = t.c.noise_z * se
    per_world = ", ".join(f"{w} {signed(mean([x for x, _ in g[w].values()]))}" for w in have)
    t.add("critic", f"ppo's gold gain over {arm} grows with the turns ({turns_of(hops[0])} -> "
                    f"{turns_of(hops[-1])} turns)",
          f"ppo minus {arm}, mean over seeds: {per_world}; {long_} minus {short} per seed {fmt_list(d)}, "
          f"mean {signed(m)} (SE {fmt(se, 3)}, {seeds_txt([x > 0 for x in d])} positive)",
          f"mean >= +{t.c.grow_min:g} and > {t.c.noise_z:g} SE (> {fmt(bar, 3)})",
          bool(seeds) and m >= t.c.grow_min and m > bar)


def compute_turns_claims(finals: Mapping[str, Mapping[str, Sequence[Mapping]]], sft: Mapping[str, Mapping],
                         c: TurnsClaimsConfig, *, hops: Sequence[int], arms: Sequence[str],
                         quick: bool = False) -> tuple[list[dict], list[str]]:
    """The claims table of the turns family.

    finals: {world: {arm: [per-seed row]}} (keys seed, n, gold, gold_greedy); sft: {world: the SFT
    policy's row on the same held-out rows (n, gold, gold_greedy, turns_mean)}; hops: the worlds'
    hops; arms: the arms run. Returns (rows, notes): rows of {group, claim, measured, threshold,
    holds}; with ``quick`` only the 'knob' claim, the others noted as needing the full family."""
    t = _Table(finals, sft, c, quick)
    hs = sorted(hops)
    _knob(t, hs)
    if quick:
        t.notes += [f"needs the full family: claims '{g}'" for g in TURNS_GROUPS if g not in QUICK_TURNS_GROUPS]
        return annotate("turns", t.rows), t.notes
    _learns(t, hs, list(arms))
    if "ppo" in arms and len(hs) >= 2:
        for arm in [a for a in ("ppo-no-critic", "grpo", "rloo") if a in arms]:
            _critic(t, hs, arm)
    return annotate("turns", t.rows), t.notes
