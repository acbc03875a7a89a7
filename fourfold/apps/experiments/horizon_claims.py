"""The horizon family's claims, computed from the final evaluations of every world
(:func:`compute_horizon_claims`; unit-tested on hand-made numbers).

A *world* is one horizon's demo stages and the arms run on them: ``h<k>`` (gold wants k sentences),
``h<k>-noisy`` (the longest horizon with noisier labelers) and ``h<k>-k<K>`` (the longest horizon's
group arm with K samples per prompt). Gold differences are in units of that world's SFT model's
per-sample sd of gold (each horizon has its own SFT model and gold); seeds are paired as in the claims
family (same seed: same prompt order and initial state). An evaluation standard error (SE) is the
per-sample sd over sqrt(prompts); a difference adds its SEs in quadrature.

The claims and their thresholds (``horizon.claims``), fixed before the family's first run:

- ``knob``: the SFT model's responses grow with the horizon (each horizon's mean length above the
  previous one's by more than ``noise_z`` SE): the knob does what it says (stated by ``--quick`` too).
- ``critic``: the critic's baseline helps more as the horizon grows: ppo's gold minus ppo-no-critic's
  at the longest horizon, minus the same at the shortest, is at least ``critic_min_increase_sd``
  (mean over seeds) and above ``noise_z`` SE in every seed.
- ``match``: a group baseline (grpo, rloo) matches the critic at every horizon tried: ppo's gold minus
  the arm's, mean over seeds, non-inferior at ``match_margin_share`` of ppo's gold gain at every horizon (one row per arm).
- ``noisy``: the same under noisier labels (the noisy world; one row per group arm run there).
- ``group-size``: a group of the largest K beats one of the smallest K on gold (the longest horizon's
  group arm; same responses per iteration), by more than ``noise_z`` SE in every seed.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from fourfold.apps.claim_kinds import annotate
from fourfold.apps.claim_stats import NULL_AT_MARGIN, Bound, margin_verdict, seed_se
from fourfold.apps.experiments.claims import WorldClaims, eval_se, fmt_list, paired, seeds_txt
from fourfold.apps.experiments.config import GROUP_ARMS, HorizonConfig
from fourfold.apps.report_kit import fmt, mean, signed

HORIZON_GROUPS = ("knob", "critic", "match", "noisy", "group-size")
"""The claim groups of the horizon family; ``--quick`` states ``knob`` only."""
QUICK_HORIZON_GROUPS = ("knob",)


def world_label(k: int, variant: str = "") -> str:
    """A world's label: ``h6``, ``h6-noisy``, ``h6-k8``."""
    return f"h{k}" + (f"-{variant}" if variant else "")


def group_sizes_run(hc: HorizonConfig, group_size: int) -> list[int]:
    """The group sizes of the group arm at the longest horizon: the main one and horizon.group_sizes."""
    return sorted({group_size, *hc.group_sizes})


def size_world(hc: HorizonConfig, k_size: int, group_size: int) -> str:
    """The world holding the longest horizon's group arm at group size ``k_size``."""
    k = max(hc.horizons)
    return world_label(k) if k_size == group_size else world_label(k, f"k{k_size}")


class _Claims(WorldClaims):
    """The table being built and what every claim needs (``--quick``: the knob's claims only)."""

    def __init__(self, finals: Mapping[str, Mapping[str, Sequence[Mapping]]], sft: Mapping[str, Mapping],
                 hc: HorizonConfig, quick: bool):
        super().__init__(finals, sft, hc.claims, quick, QUICK_HORIZON_GROUPS if quick else None)
        self.hc = hc

    def sd(self, world: str) -> float:
        s = self.sft.get(world, {}).get("gold_std")
        return s if s else math.nan

    def have(self, group: str, world: str, *arms: str) -> bool:
        """Whether ``world`` has results of every arm on a common seed (a note if not)."""
        f = self.finals.get(world, {})
        missing = [a for a in arms if not f.get(a)]
        if world not in self.sft or missing:
            self.notes.append(f"claims '{group}' not checked at {world}: "
                              + (f"arm {', '.join(missing)} has no results" if missing else "no SFT evaluation"))
            return False
        if not paired(f, *arms):
            self.notes.append(f"claims '{group}' not checked at {world}: arms {', '.join(arms)} share no seed")
            return False
        return True

    def seed_diffs(self, world: str, a: str, b: str) -> dict[int, tuple[float, float]]:
        """{seed: (gold of a minus gold of b, the SE of that difference)}, in the world's sd."""
        return self.gold_diffs(world, a, b, lambda r: eval_se(r, "gold"), self.sd(world))

    def cost_verdict(self, world: str, arm: str) -> tuple[Bound, str]:
        """ppo's gold minus ``arm``'s in ``world`` (sd): its non-inferiority verdict at match_margin_share
        of ppo's gold gain there, and its text (mean, upper bound, margin, seeds)."""
        d, se = zip(*self.seed_diffs(world, "ppo", arm).values())
        m = mean(d)
        s = seed_se(d, math.sqrt(sum(x * x for x in se)) / len(se))
        gain = mean([(r["gold"] - self.sft[world]["gold"]) / self.sd(world) for r in self.finals[world]["ppo"]])
        b = margin_verdict(m, s, gain, self.c.match_margin_share)
        return b, f"{world} {signed(m)} (bound {signed(b.upper)} / margin {fmt(b.margin, 3)}; seeds {fmt_list(d)})"


def _knob(t: _Claims, ks: list[int]) -> None:
    worlds, lengths, steps = t.knob([world_label(k) for k in ks], "length", "horizons")
    if not worlds:
        return
    bars = [t.c.noise_z * math.hypot(eval_se(t.sft[a], "length"), eval_se(t.sft[b], "length"))
            for a, b in zip(worlds, worlds[1:])]
    sentences = [t.sft[w].get("sentences") for w in worlds]
    t.add("knob", "the horizon knob works: the SFT model's responses grow with the horizon",
          f"SFT length {fmt_list(lengths, 1, False)} words, sentences {fmt_list(sentences, 2, False)} at "
          f"{', '.join(worlds)}",
          f"each longer than the previous horizon's by > {t.c.noise_z:g} evaluation standard errors "
          f"({fmt_list(bars, 2, False)} words)", all(s > b for s, b in zip(steps, bars)))


def _critic(t: _Claims, ks: list[int]) -> None:
    worlds = [world_label(k) for k in ks if t.have("critic", world_label(k), "ppo", "ppo-no-critic")]
    if len(worlds) < 2 or worlds[0] != world_label(ks[0]) or worlds[-1] != world_label(ks[-1]):
        t.notes.append("claims 'critic' not checked: needs ppo and ppo-no-critic at the shortest and the "
                       "longest horizon")
        return
    g = {w: t.seed_diffs(w, "ppo", "ppo-no-critic") for w in worlds}
    short, long_ = worlds[0], worlds[-1]
    seeds = sorted(set(g[short]) & set(g[long_]))
    inc = [g[long_][s][0] - g[short][s][0] for s in seeds]
    bars = [t.c.noise_z * math.hypot(g[long_][s][1], g[short][s][1]) for s in seeds]
    ok = [x > b for x, b in zip(inc, bars)]
    c = t.c
    t.add("critic", "the critic's baseline helps more as the horizon grows (ppo's gold minus ppo-no-critic's)",
          f"gain {', '.join(f'{w} {signed(mean([x for x, _ in g[w].values()]))}' for w in worlds)} sd (mean over "
          f"seeds); "
          f"{long_} minus {short}: {fmt_list(inc)} sd ({seeds_txt(ok)} beyond noise), mean {signed(mean(inc))} sd",
          f"mean increase >= {c.critic_min_increase_sd:g} sd, and > {c.noise_z:g} evaluation standard errors "
          f"({fmt_list(bars, 2, False)} sd) in every seed",
          bool(seeds) and all(ok) and mean(inc) >= c.critic_min_increase_sd)


def _match(t: _Claims, group: str, worlds: list[str], arm: str, what: str) -> None:
    ok_worlds = [w for w in worlds if t.have(group, w, "ppo", arm)]
    if not ok_worlds:
        return
    share, verdicts = t.c.match_margin_share, [t.cost_verdict(w, arm) for w in ok_worlds]
    t.add(group, f"a group baseline ({arm}) matches the critic {what}",
          f"ppo's gold minus {arm}'s, mean over seeds, upper 95% bound / margin: "
          + "; ".join(text for _, text in verdicts) + " sd"
          + ("" if len(ok_worlds) == len(worlds) else f"; not run: {', '.join(w for w in worlds if w not in ok_worlds)}"),
          f"upper 95% bound < {share:.0%} of ppo's gold gain at that horizon: non-inferiority, at every one",
          len(ok_worlds) == len(worlds) and all(b.holds for b, _ in verdicts), null=NULL_AT_MARGIN)


def _group_size(t: _Claims, hc: HorizonConfig, group_size: int) -> None:
    sizes = group_sizes_run(hc, group_size)
    if len(sizes) < 2:
        return
    arm, k = hc.group_arm, max(hc.horizons)
    runs = {K: t.finals.get(size_world(hc, K, group_size), {}).get(arm) for K in sizes}
    lo, hi = sizes[0], sizes[-1]
    if not runs[lo] or not runs[hi]:
        t.notes.append(f"claims 'group-size' not checked: {arm} at K = {lo} or K = {hi} has no results")
        return
    world = world_label(k)
    sd = t.sd(world)
    gains = {K: [(r["gold"] - t.sft[world]["gold"]) / sd for r in runs[K]] for K in sizes if runs[K]}
    pairs = paired({"hi": runs[hi], "lo": runs[lo]}, "hi", "lo")
    d = [(a["gold"] - b["gold"]) / sd for _, (a, b) in pairs]
    bars = [t.c.noise_z * math.hypot(eval_se(a, "gold"), eval_se(b, "gold")) / sd for _, (a, b) in pairs]
    ok = [x > b for x, b in zip(d, bars)]
    t.add("group-size", f"a group of {hi} beats a group of {lo} ({arm} at {world}, the same responses per iteration)",
          f"gold - SFT {', '.join(f'K={K} {signed(mean(g))}' for K, g in gains.items())} sd (mean over seeds); "
          f"K={hi} minus K={lo}: {fmt_list(d)} sd ({seeds_txt(ok)})",
          f"> {t.c.noise_z:g} evaluation standard errors ({fmt_list(bars, 2, False)} sd) in every seed",
          bool(ok) and all(ok))


def compute_horizon_claims(finals: Mapping[str, Mapping[str, Sequence[Mapping]]], sft: Mapping[str, Mapping],
                           hc: HorizonConfig, *, group_size: int, quick: bool = False) -> tuple[list[dict], list[str]]:
    """The claims table of the horizon family.

    finals: {world: {arm: [per-seed summary]}} (keys seed, n, gold, gold_std, ...); sft: {world: the
    SFT model's summary on the same prompts (length, length_std, gold, gold_std, sentences)};
    group_size: the K of the group arms at every horizon. Returns (rows, notes) as
    :func:`fourfold.apps.experiments.compute_claims` does; with ``quick`` only the 'knob' claims are rows,
    every other claim a 'needs the full sweep' note."""
    t = _Claims(finals, sft, hc, quick)
    ks = sorted(hc.horizons)
    _knob(t, ks)
    if quick:
        t.notes += [f"needs the full sweep: claims '{g}'" for g in HORIZON_GROUPS if g not in QUICK_HORIZON_GROUPS]
        return annotate("horizon", t.rows), t.notes
    if "ppo-no-critic" in hc.arms and "ppo" in hc.arms:
        _critic(t, ks)
    for arm in [a for a in GROUP_ARMS if a in hc.arms and "ppo" in hc.arms]:
        _match(t, "match", [world_label(k) for k in ks], arm, "at every horizon tried")
    if hc.noisy_task_options and "ppo" in hc.noisy_arms:
        noise = ", ".join(f"{k} {v}" for k, v in hc.noisy_task_options.items())
        for arm in [a for a in GROUP_ARMS if a in hc.noisy_arms]:
            _match(t, "noisy", [world_label(ks[-1], "noisy")], arm, f"under noisier labels ({noise})")
    _group_size(t, hc, group_size)
    return annotate("horizon", t.rows), t.notes
