"""Each finding's null, computed where it can be without a rerun (issue 39; docs/experiments.md,
"Claim kinds and nulls"): the same verdict on a comparison where the answer must be "no".

Three sources, each named in the null's text:

- *by construction* (:data:`~fourfold.apps.claim_kinds.BY_CONSTRUCTION`, set at every run): a rule
  "the difference beats a positive bar in every seed" (or its mean does) run on an arm against
  itself with its seeds rotated (seed s against s+1) says no, as the rotated differences sum to 0
  (a ratio rule's ratios multiply to 1); a gain over SFT run on SFT against itself is 0;
- *the stored means*: "x in every seed" is false when the mean over seeds of a control arm already
  fails it (some seed is no better than the mean);
- *synthetic curves* (overoptimization): the family's own verdict (:func:`summarize_curves`,
  :func:`compute_overopt_claims`) on seeded noisy curves without the effect; the null says yes when
  the rule passes on more than :data:`NULL_RATE` of :data:`DRAWS` draws.

:func:`stored_null` gives a row's null from its results record, or None (the rule's text stays).
"""

from __future__ import annotations

import math
import random
import re
from typing import Callable, Mapping, Optional

from fourfold.apps.experiments.config import OveroptimizationClaimsConfig
from fourfold.apps.experiments.overopt_claims import compute_overopt_claims, summarize_curves
from fourfold.core.overoptimization import bon_kl

NULL_RATE = 0.05
"""A synthetic null 'says yes' when its rule passes on more than this share of the draws."""
DRAWS = 200
"""Seeded draws of each synthetic null."""
SIZES = (500, 1500, 4000)
"""The reward-model sizes of the synthetic overoptimization nulls (the family's)."""



def _mean_fails(record: Mapping, arm: str, key: str, ok: Callable[[float], bool], what: str) -> str:
    s = record["summaries"][arm]
    m = s[key]
    verdict = "yes" if ok(m) else "no"
    return f"{verdict} (stored mean: {arm}'s {what} {m:.3g} over {s.get('seeds', '?')} seeds" + (
        ", so some seed fails the rule)" if verdict == "no" else "; the mean alone does not settle every seed)")


def _ppo_gold_null(record: Mapping, row: Mapping) -> str:
    return _mean_fails(record, "ppo-beta-high", "gold_delta_sd", lambda m: m >= 0.3, "gold gain (sd)")


def _wf_null(record: Mapping, row: Mapping) -> str:
    sft = record["sft"]["well_formed"]
    return _mean_fails(record, "ppo-beta0", "well_formed", lambda m: m / sft >= 0.9, f"well-formed share (SFT {sft:.3g})")


def _beta_high_kl_null(record: Mapping, row: Mapping) -> str:
    return _mean_fails(record, "ppo", "kl", lambda m: m < 0.2, "KL (nats)")


def _curve(d: list[float], gain: Callable[[float], float], rng: random.Random, noise: float) -> dict:
    g = [0.0] + [gain(x) + rng.gauss(0.0, noise) for x in d[1:]]
    return {"d": d, "gold": g, "proxy": list(d)}


BON_D = [math.sqrt(max(bon_kl(n), 0.0)) for n in range(1, 65)]
PPO_D = [3.5 * i / 20 for i in range(21)]
NULL_CURVES = {
    "bon": ("a saturating best-of-n curve without a peak, 0.55 (1 - exp(-d / 0.9)), noise sd 0.02",
            BON_D, lambda d: 0.55 * (1 - math.exp(-d / 0.9)), 0.02),
    "ppo": ("a PPO curve flat to d = 1 then falling 0.5 sd per unit d, no rise, noise sd 0.0625 (1/sqrt(256))",
            PPO_D, lambda d: -0.5 * max(d - 1.0, 0.0), 0.0625),
}
"""{method: (what, d grid, gold gain without the effect, per-point noise sd)}: the synthetic nulls."""


def synthetic_rate(method: str, group: str, draws: int = DRAWS, seed: int = 0) -> float:
    """The share of ``draws`` seeded null draws (3 seeds, the same curve at every size) on which the
    overoptimization rule of ``group`` for ``method`` says yes."""
    _, d, gain, noise = NULL_CURVES[method]
    rng, cc, yes = random.Random(seed), OveroptimizationClaimsConfig(), 0
    for _ in range(draws):
        summ = {method: {p: summarize_curves([_curve(d, gain, rng, noise) for _ in range(3)], method, 1.0)
                         for p in SIZES}}
        rows, _ = compute_overopt_claims(summ, {}, cc, expected_sizes=SIZES)
        yes += any(r["group"] == group and r["holds"] == "yes" for r in rows)
    return yes / draws


def _overopt_null(record: Mapping, row: Mapping) -> Optional[str]:
    method = "bon" if row["claim"].startswith("best-of-n") else "ppo"
    if row["group"] not in ("peak", "size-peak", "size-beta"):
        return None
    rate = synthetic_rate(method, row["group"])
    what = NULL_CURVES[method][0] + (", the same at every size" if row["group"] != "peak" else "")
    return f"{'yes' if rate > NULL_RATE else 'no'} (synthetic: the rule passes on {rate:.0%} of {DRAWS} draws of {what})"


NULLS: dict[str, list[tuple[str, str, Callable[[Mapping, Mapping], Optional[str]]]]] = {
    "experiments": [
        ("ppo", r"raises gold", _ppo_gold_null),
        ("ppo", r"well formed", _wf_null),
        ("beta-high", r"\(KL\)", _beta_high_kl_null),
    ],
    "overopt": [("peak", r"", _overopt_null), ("size-peak", r"", _overopt_null), ("size-beta", r"", _overopt_null)],
}
"""{family: [(group, claim regex, null(record, row))]}: the nulls the stored results give (first match);
the by-construction ones are :data:`fourfold.apps.claim_kinds.BY_CONSTRUCTION`, which every run gets."""


def stored_null(family: str, record: Mapping, row: Mapping) -> Optional[str]:
    """``row``'s null from its family's ``record`` (results/*.json), or None when the stored values cannot give it."""
    for group, pattern, fn in NULLS.get(family, []):
        if row["group"] == group and re.search(pattern, row["claim"]):
            return fn(record, row)
    return None
