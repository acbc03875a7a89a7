"""Equivalence and non-inferiority verdicts with an explicit margin (issue 39; docs/experiments.md,
"Claim kinds and nulls"): pure functions of a difference, its standard error and the margin.

:func:`tost` is the two one-sided tests: the (1 - 2 alpha) confidence interval diff +- z se lies
inside (-margin, +margin). :func:`noninferior` is the one-sided half: the upper bound cost + z se is
below the margin. A difference exactly at the margin never passes either (the null they must reject),
and a larger standard error never helps a claim pass (unlike "within 2 SE", which a noisier run passes
more easily). The margin is tied to the effect (for example 20% of PPO's gold gain), never a fixed sd.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from fourfold.apps.report_kit import mean

Z_ONE_SIDED_5 = 1.6448536269514722
"""The one-sided 5% normal quantile: each of TOST's two tests at alpha = 0.05 (a 90% interval)."""
MARGIN_SHARE = 0.2
"""The margin of the equivalence and non-inferiority claims: 20% of the effect they are measured against."""


@dataclasses.dataclass(frozen=True)
class Bound:
    """A verdict with its confidence bounds: ``lower`` and ``upper`` (diff -+ z se), the ``margin``, ``holds``."""

    lower: float
    upper: float
    margin: float
    holds: bool


def _check(se: float, margin: float, z: float) -> None:
    if not (math.isfinite(se) and se >= 0):
        raise ValueError(f"standard error {se!r}: expected a finite number >= 0")
    if not (math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin {margin!r}: expected a finite number > 0")
    if not (math.isfinite(z) and z > 0):
        raise ValueError(f"z {z!r}: expected a finite number > 0")


def tost(diff: float, se: float, margin: float, z: float = Z_ONE_SIDED_5) -> Bound:
    """Equivalence by two one-sided tests: holds when -margin < diff - z se and diff + z se < margin."""
    _check(se, margin, z)
    lo, hi = diff - z * se, diff + z * se
    return Bound(lo, hi, margin, bool(-margin < lo and hi < margin))


def noninferior(cost: float, se: float, margin: float, z: float = Z_ONE_SIDED_5) -> Bound:
    """Non-inferiority: the cost's upper bound cost + z se is below ``margin`` (the lower bound is reported)."""
    _check(se, margin, z)
    lo, hi = cost - z * se, cost + z * se
    return Bound(lo, hi, margin, bool(hi < margin))


def seed_se(values: Sequence[float], eval_se_mean: float) -> float:
    """The SE of a mean over seeds: the larger of the evaluation's (``eval_se_mean``) and the seeds'
    spread (their sd / sqrt(n); n < 2: the evaluation's alone)."""
    n = len(values)
    if n < 2:
        return eval_se_mean
    m = sum(values) / n
    return max(eval_se_mean, math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1) / n))


def mean_se(d: Mapping[int, tuple[float, float]]) -> tuple[float, float]:
    """(mean over seeds, its SE: the larger of the seeds' spread and the evaluation's, :func:`seed_se`) of
    {seed: (x, its evaluation SE)}; (nan, nan) for none."""
    xs = [x for x, _ in d.values()]
    if not xs:
        return math.nan, math.nan
    return mean(xs), seed_se(xs, math.sqrt(sum(e * e for _, e in d.values())) / len(xs))


def margin_verdict(diff: float, se: float, effect: float, share: float = MARGIN_SHARE, two_sided: bool = False) -> Bound:
    """:func:`noninferior` (``two_sided``: :func:`tost`) with the margin ``share`` x ``effect``; an
    effect <= 0 leaves no margin, and the claim does not hold."""
    margin = share * effect
    if not (math.isfinite(margin) and margin > 0):
        return Bound(diff - Z_ONE_SIDED_5 * se, diff + Z_ONE_SIDED_5 * se, margin, False)
    return (tost if two_sided else noninferior)(diff, se, margin)


NULL_AT_MARGIN = ("no (by construction: a difference exactly at the margin with the same SE has its bound "
                  "beyond the margin)")
"""The null of a margin claim: the verdict on a difference at the margin, which a level-5% test rejects."""


def margin_threshold(b: Bound, share: float, effect: str, unit: str = "sd", two_sided: bool = False) -> str:
    """The threshold text of a margin claim (``effect``: what the margin is a share of)."""
    if two_sided:
        return f"90% interval inside +-{share:.0%} of {effect} (+-{b.margin:.3f} {unit}): equivalence (TOST)"
    return f"upper 95% bound < {share:.0%} of {effect} ({b.margin:.3f} {unit}): non-inferiority"


def interval_text(b: Bound, se: float, unit: str = "sd") -> str:
    """'SE x; 90% interval lo to hi unit'."""
    return f"SE {se:.3f}; 90% interval {b.lower:+.2f} to {b.upper:+.2f} {unit}"
