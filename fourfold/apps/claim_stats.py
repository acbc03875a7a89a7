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
