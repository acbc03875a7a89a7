"""Each claim's kind, the reason for it, and its null, for every family (issue 39; docs/experiments.md).

A claim is a *finding* (an outcome that could go either way) or a *check* (true by construction: a
precision fact, a unit-level identity, a sanity bound, or a duplicate of another row). :data:`RULES`
holds one rule per claim of each family ({family: [(group, claim regex, kind, why, null)]}, the first
match wins); :func:`annotate` gives every row of a family its ``kind``, ``why`` and, where the row has
none yet, ``null``: the same verdict run on a comparison where the answer must be "no". A null the
stored results cannot give reads "not run (needs rerun: ...)"; a check's null is "n/a (check)".
A claim no rule matches raises ValueError, so a new claim cannot be published without a kind.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from fourfold.apps.claim_stats import NULL_AT_MARGIN

FINDING, CHECK = "finding", "check"
KINDS = (FINDING, CHECK)
"""The two kinds of claim."""
CHECK_NULL = "n/a (check)"
"""The null of a check (true by construction: there is no comparison where it must say no)."""

_SEEDS = "not run (needs rerun: "
_FIT = "not run (needs rerun with its curves kept: "
_CURVES = "not run (needs rerun with its per-iteration curves: "


def _n(what: str, base: str = _SEEDS) -> str:
    return base + what + ")"


_SELF = _n("the same rule on the comparator arm against itself, seed s against seed s+1")
_QUALITY = ("no (by construction: L levels in a random order are strictly ordered with chance 1/L!, 1/24 at the "
            "4 levels the rule needs)")
_TOST = NULL_AT_MARGIN

RULES: dict[str, list[tuple[str, str, str, str, str]]] = {
    "experiments": [
        (
            "ppo",
            r"raises gold",
            FINDING,
            "PPO on a biased proxy could fail to raise gold",
            _n("the rule on ppo-beta-high, which stays at SFT"),
        ),
        (
            "ppo",
            r"KL .* bounded by the penalty",
            CHECK,
            "a sanity bound: PPO not losing on its own regularised objective (the bound is 8x loose)",
            CHECK_NULL,
        ),
        (
            "ppo",
            r"well formed",
            FINDING,
            "the share could fall below 0.9 x SFT's (it is 0.92-0.94)",
            _n("the rule on ppo-beta0, which degenerates"),
        ),
        ("beta0", r"hacks", FINDING, "without a penalty gold need not fall below SFT's", _SELF),
        ("beta0", r"drifts", CHECK, "a sanity bound: with no penalty the KL is not held, 5x ppo's is near certain", CHECK_NULL),
        ("beta0", r"degenerates", FINDING, "the hacked policy could stay well formed", _SELF),
        ("beta0", r"RM is fooled", CHECK, "a sanity bound: beta = 0 maximises the proxy with nothing against it", CHECK_NULL),
        ("beta-high", r"\(KL\)", FINDING, "a high beta could still drift by update noise", _n("the rule on ppo, whose KL is 4 nats")),
        ("beta-high", r"\((gold|length)\)", FINDING, "an equivalence: the policy could move", _TOST),
        ("epochs", r"epochs per batch beat", FINDING, "more epochs could overfit a batch", _SELF),
        ("reinforce", r"", FINDING, "naive REINFORCE could match PPO", _SELF),
        ("critic", r"", FINDING, "the critic could help or not", _SELF),
        ("length", r"", FINDING, "the RM's length bias need not reach the policy", _SELF),
        (
            "critic-free",
            r"\(reinforce-pp\)|^reinforce-pp",
            CHECK,
            "a duplicate: reinforce-pp is ppo-no-critic by construction (identical numbers)",
            CHECK_NULL,
        ),
        ("critic-free", r"costs PPO less", FINDING, "a non-inferiority: removing the critic could cost more", _TOST),
        ("critic-free", r"raises gold", FINDING, "a critic-free arm could fail to learn", _SELF),
        ("baseline", r"", FINDING, "a group baseline need not beat REINFORCE (confounded with clipped epochs)", _SELF),
        ("dpo", r"raises gold", FINDING, "DPO on biased labels could fail to raise gold", _SELF),
        ("dpo", r"length bias", FINDING, "DPO need not lengthen responses", _SELF),
        (
            "practice",
            r"starts badly",
            CHECK,
            "a unit identity: a zero value head predicts a constant, explained variance exactly 0",
            CHECK_NULL,
        ),
        (
            "practice",
            r"warm-up",
            FINDING,
            "warm-up could fail to reach the bar",
            _n("the rule on the critic without warm-up, whose EV is 0", _CURVES),
        ),
        (
            "practice",
            r"dual-clip",
            FINDING,
            "dual-clip could change beta = 0's drift",
            _n("the rule on ppo-beta0 against itself, seed s against seed s+1"),
        ),
        (
            "practice",
            r"bf16 copy's log-probs",
            CHECK,
            "a precision fact: bf16's 8-bit mantissa guarantees a mismatch above 1e-4",
            CHECK_NULL,
        ),
        ("practice", r"recomputing pi_old", CHECK, "a unit identity: the same forward pass gives a first ratio of exactly 1", CHECK_NULL),
        (
            "practice",
            r"token TIS",
            CHECK,
            "a sanity bound: at a 4e-3 per-token mismatch the IS weights are near 1, cap 2 cannot truncate",
            CHECK_NULL,
        ),
        (
            "measure",
            r"",
            FINDING,
            "a measured effect of the update (the clip, a baseline, the critic, dual-clip) that could go either way",
            _n("the rule on the better arm against itself over seeds"),
        ),
    ],
    "horizon": [
        ("knob", r"", CHECK, "a sanity bound: the SFT data are written with more sentences per horizon", CHECK_NULL),
        (
            "critic",
            r"",
            FINDING,
            "the critic's value could stay flat with the horizon",
            _n("the rule on ppo-no-critic against itself, seed s against seed s+1"),
        ),
        ("match", r"", FINDING, "an equivalence: a group baseline could fall behind the critic", _TOST),
        ("noisy", r"", FINDING, "an equivalence: noise could widen the critic's lead", _TOST),
        ("group-size", r"", FINDING, "K = 8 need not beat K = 2", _SELF),
    ],
    "overopt": [
        (
            "peak",
            r"^best-of-n",
            FINDING,
            "best-of-n gold could keep rising",
            _n("the rule on a synthetic saturating curve without a peak", _FIT),
        ),
        (
            "peak",
            r"^PPO",
            FINDING,
            "PPO's gold could fall from the start (the rule's 'peak index > 0' passes on noise; review 1.3)",
            _n("the rule on a synthetic flat-then-falling curve with noise", _FIT),
        ),
        (
            "fit",
            r"",
            CHECK,
            "a sanity bound: a peak-free saturating or linear curve fits at R^2 >= 0.97 (review 2.3), so it cannot fail",
            CHECK_NULL,
        ),
        (
            "size-peak",
            r"",
            FINDING,
            "the peaks could order either way (a strict 3-point order passes by chance 1/6)",
            _n("the rule on 3 RMs with permuted sizes", _FIT),
        ),
        (
            "size-beta",
            r"",
            FINDING,
            "the fitted betas could order either way (a strict 3-point order passes by chance 1/6)",
            _n("the rule on 3 RMs with permuted sizes", _FIT),
        ),
        ("default-kl", r"", FINDING, "the default KL could stop PPO before its peak", _n("the rule on a beta = 0 run", _FIT)),
    ],
    "goodhart": [  # issue 41's re-posed overoptimization family (runner built, not yet run)
        ("peak", r"", FINDING, "gold could saturate without turning over (regressional error only shrinks the gain)",
         _n("the rule on a peak-free curve matched to the data", _FIT)),
        ("form", r"", FINDING, "a peak-free form could extrapolate as well as the law",
         _n("the rule on a peak-free curve matched to the data", _FIT)),
        ("quality-axis", r"", FINDING,
         "more pairs need not give higher gold accuracy (the sizes design's RMs: 0.693 / 0.672 / 0.696)", _QUALITY),
        ("quality", r"", FINDING, "the peaks and betas could order either way with RM quality", _QUALITY),
        ("kl-stop", r"", FINDING, "a KL coefficient could stop PPO past the unpenalised peak",
         _n("the rule on the unpenalised run's own last point", _FIT)),
        ("kl-frontier", r"", FINDING, "an equivalence: the penalty could change the path, not only where it stops", _TOST),
        ("efficiency", r"", FINDING, "PPO could be as KL-efficient as best-of-n (the sizes design saw the opposite)",
         _n("the rule on best-of-n's prompts in two halves", _FIT)),
    ],
    "turns": [
        ("knob", r"", CHECK, "a sanity bound: more hops make longer SFT trajectories by construction of the world", CHECK_NULL),
        (
            "critic-learns",
            r"",
            CHECK,
            "a precondition of the design, not a result: the critic's lr and warm-up were chosen on the pilot to "
            "make its explained variance rise; it says the critic arm has a trained critic, not what the critic buys",
            CHECK_NULL,
        ),
        (
            "critic",
            r" rows x ",
            FINDING,
            "at matched rows x K with a trained critic, the critic's gain could grow with the turns or not",
            _n("the rule on the critic-free arm against itself, seed s against seed s+1"),
        ),
        ("match", r"", FINDING, "a non-inferiority: a critic-free arm could fall behind the critic", _TOST),
        ("rows", r"", FINDING, "more distinct rows need not beat K trajectories of fewer rows at the same samples",
         _n("the rule on the 256 x 1 arm against itself, seed s against seed s+1")),
        ("learns", r"", FINDING, "an arm could fail to learn at a turn count", _n("the rule on the SFT policy against itself")),
        (
            "critic",
            r"",
            FINDING,
            "the critic's gain could grow or not (untrained critic: review 1.4)",
            _n("the rule on ppo against itself, seed s against seed s+1"),
        ),
    ],
    "staleness": [
        ("lag", r"", CHECK, "a unit identity: the sampler's lag is fixed by construction (version max(0, i - 1 - k))", CHECK_NULL),
        ("ratio", r"same ratio", CHECK,
         "a precision fact: at k = 0 in fp32 the sampler's and the trainer's log-probs agree to ~5e-7", CHECK_NULL),
        ("ratio", r"opens a gap", CHECK,
         "a sanity bound: top-p drops the tail's mass wherever the top tokens hold less than p", CHECK_NULL),
        ("ratio", r"removes", CHECK,
         "a unit identity: recompute's first ratio is exactly 1, and Z_t <= 1 never reaches the cap 2", CHECK_NULL),
        ("agree", r"", FINDING, "an equivalence: rounding differences could grow into different policies", _TOST),
        ("stale-cost", r"", FINDING, "staleness could cost nothing at these lags", _SELF),
        ("decoupled", r"", FINDING, "an equivalence: the correction could fall short of the synchronous run", _TOST),
        ("top-p", r"", FINDING, "the truncation's bias could be too small to matter on gold", _SELF),
        ("stability", r"", FINDING, "stale samples could crash gold, spike the gradient or collapse entropy",
         _n("the rule on the arm's own curves with a gold drop inserted", _CURVES)),
    ],
    "warmup": [
        ("ceiling", r"", CHECK,
         "a precondition of the design, not a result: the ceiling arm's critic is trained critic-only for long on the "
         "SFT policy's samples; it says the ceiling is a converged critic's, not what warm-up buys", CHECK_NULL),
        ("same-start", r"", CHECK,
         "a unit identity: a seed samples the same first batch for the same starting critic, and a zero value head "
         "predicts a constant (explained variance exactly 0)", CHECK_NULL),
        ("rm-start", r"", FINDING, "the reward model's values could already explain the return (its score is the return's end)",
         _n("the rule on the ceiling arm's last warm-up iteration")),
        ("closes", r"", FINDING, "a few critic-only iterations could leave the critic short of a converged one",
         _n("the rule on the arm without warm-up at its first policy iteration")),
        ("early-ev", r"", FINDING, "the critic without warm-up could catch up within the first policy iterations",
         _n("the rule on the arm without warm-up against itself, seed s against seed s+1")),
        ("warmup-gold", r"", FINDING, "a better critic early need not raise gold",
         _n("the rule on the arm without warm-up against itself, seed s against seed s+1")),
        ("warmup-keeps", r"", FINDING,
         "a non-inferiority: warm-up could cost gold (a critic fitted to the SFT policy's returns)", _TOST),
        ("critic-pays", r"", FINDING, "the critic need not matter at this budget",
         _n("the rule on ppo-no-critic against itself, seed s against seed s+1")),
    ],
}
"""{family: [(group, claim regex, kind, why, null)]}: the first rule whose group is the row's and whose
regex matches its claim (re.search) gives the row's kind, its one-line reason and its stored null."""

ROTATED = ("no (by construction: {who} against itself with seeds rotated, seed s against s+1; the rotated "
           "{what} {how}, so one seed fails the rule)")


def rotated(who: str, ratio: bool = False) -> str:
    return ROTATED.format(who=who, what="ratios" if ratio else "differences",
                          how="multiply to 1" if ratio else "sum to 0")


SFT_SELF = "no (by construction: the SFT model against itself gains exactly 0, below the rule's positive bar)"

BY_CONSTRUCTION = {
    ("experiments", "beta0", "hacks"): rotated("ppo-beta0"),
    ("experiments", "epochs", ""): rotated("ppo-1epoch"),
    ("experiments", "reinforce", ""): rotated("the REINFORCE arm"),
    ("experiments", "critic", ""): rotated("ppo-no-critic"),
    ("experiments", "length", ""): rotated("ppo-unbiased-rm"),
    ("experiments", "critic-free", "raises gold"): SFT_SELF,
    ("experiments", "baseline", ""): rotated("the REINFORCE arm"),
    ("experiments", "dpo", ""): SFT_SELF,
    ("experiments", "practice", "dual-clip"): rotated("ppo-beta0", ratio=True),
    ("horizon", "critic", ""): rotated("ppo-no-critic"),
    ("horizon", "group-size", ""): rotated("the K = 2 arm"),
    ("turns", "learns", ""): SFT_SELF,
    ("turns", "critic", ""): rotated("ppo"),
    ("staleness", "stale-cost", ""): rotated("the smallest lag's arm"),
    ("staleness", "top-p", ""): rotated("the corrected arm"),
}
"""{(family, group, claim regex): null}: the nulls a rule's form settles without data (the first
matching key replaces the rule's null in :func:`annotate`)."""


RESULT_FAMILY = {
    "experiments.json": "experiments",
    "practice.json": "experiments",
    "horizon.json": "horizon",
    "overoptimization.json": "overopt",
    "turns.json": "turns",
}
"""Which family's rules each results/*.json's claims follow."""


def rule_for(family: str, row: Mapping) -> tuple[str, str, str, str, str]:
    """The rule of ``family`` that ``row`` follows (ValueError naming the claim when none does)."""
    for rule in RULES[family]:
        if rule[0] == row["group"] and re.search(rule[1], row["claim"]):
            return rule
    raise ValueError(
        f"claim {row['claim']!r} (group {row['group']!r}) of family {family!r} has no kind: add a rule to fourfold.apps.claim_kinds.RULES"
    )


def annotate(family: str, rows: Sequence[Mapping]) -> list[dict]:
    """``rows`` with ``kind`` and ``why`` from :data:`RULES`; ``null`` kept where a row has one (a
    null the run computed), else the rule's (a check: :data:`CHECK_NULL`)."""
    out = []
    for row in rows:
        _, _, kind, why, null = rule_for(family, row)
        null = next((v for (f, g, pat), v in BY_CONSTRUCTION.items()
                     if f == family and g == row["group"] and re.search(pat, row["claim"])), null)
        new = {**row, "kind": kind, "why": why}
        new["null"] = CHECK_NULL if kind == CHECK else (row.get("null") or null)
        out.append(new)
    return out
