"""A claims table, the one shape every experiment family and the published docs share.

A family's claims are rows of :data:`CLAIM_KEYS` (``holds`` is ``"yes"`` or ``"no"``; ``kind``
"finding" or "check", ``why`` the reason, ``null`` the verdict on a comparison where it must say no:
:mod:`fourfold.apps.claim_kinds`), built by :func:`claim_row`; a family's checks fill a
:class:`ClaimTable` (its rows, and notes on what could not be checked); :func:`claims_md` is the
markdown table of every ``summary.md`` and of the docs' blocks, :func:`claims_held` the count the
headlines and logs say (findings that hold and whose null does not say yes), :func:`counts_text`
the headline's words ("N of M findings hold; K of L checks pass").
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from fourfold.apps.report_kit import md_table

CLAIM_KEYS = ("group", "claim", "measured", "threshold", "holds", "kind", "why", "null")
"""The keys of a claim row."""
CLAIM_COLUMNS = ("claim", "kind", "measured", "threshold", "holds", "null")
"""The columns of the claims table a report or a doc shows (the group is not one)."""


def claim_row(group: str, claim: str, measured: str, threshold: str, holds: bool, null: str = "") -> dict:
    """One claim: what it says, what was measured, the threshold fixed before the run, whether it
    holds, and (when the run computed it) the same verdict on its null comparison ("yes"/"no" and
    what it compared); kind and why come from :func:`fourfold.apps.claim_kinds.annotate`."""
    row = {"group": group, "claim": claim, "measured": measured, "threshold": threshold,
           "holds": "yes" if holds else "no"}
    return {**row, "null": null} if null else row


def is_finding(c: Mapping) -> bool:
    """Whether claim ``c`` is a finding (a claim without a kind counts as one)."""
    return c.get("kind", "finding") == "finding"


def null_says_yes(c: Mapping) -> bool:
    """Whether ``c``'s null comparison passed its verdict too (then it is flagged, not a finding that holds)."""
    return str(c.get("null", "")).startswith("yes")


def claims_held(claims: Sequence[Mapping]) -> int:
    """How many findings of ``claims`` hold with a null that does not say yes."""
    return sum(is_finding(c) and c["holds"] == "yes" and not null_says_yes(c) for c in claims)


def counts(claims: Sequence[Mapping]) -> dict:
    """{findings, held, checks, passed, flagged}: the findings, those that hold, the checks, those
    that pass, and the findings that hold but whose null says yes."""
    f = [c for c in claims if is_finding(c)]
    k = [c for c in claims if not is_finding(c)]
    return {"findings": len(f), "held": claims_held(claims), "checks": len(k),
            "passed": sum(c["holds"] == "yes" for c in k),
            "flagged": sum(c["holds"] == "yes" and null_says_yes(c) for c in f)}


def counts_text(claims: Sequence[Mapping]) -> str:
    """'N of M findings hold; K of L checks pass' (and how many holding findings are flagged by their null)."""
    n = counts(claims)
    text = f"{n['held']} of {n['findings']} findings hold; {n['passed']} of {n['checks']} checks pass"
    return text + (f"; {n['flagged']} flagged (null says yes)" if n["flagged"] else "")


def claims_md(claims: Sequence[Mapping]) -> str:
    """The claims as a markdown table (:data:`CLAIM_COLUMNS`)."""
    return md_table(CLAIM_COLUMNS, [[c.get(k, "") for k in CLAIM_COLUMNS] for c in claims])


def headline_row(what: str, claims: Sequence[Mapping], detail: str, command: str, details: str) -> str:
    """A family's row of the README headline table: what it measures, ':func:`counts_text` (``detail``)',
    the command that runs it, where its details are."""
    return f"| {what} | {counts_text(claims)} ({detail}) | `{command}` | {details} |"


class ClaimTable:
    """The table a family's checks fill: ``rows`` (:func:`claim_row`) and ``notes`` (what was not
    checked, and why). ``quick_groups``: under ``--quick`` the groups stated; a claim of any other
    group becomes the note 'needs the full sweep: <claim>' (None: every group is stated)."""

    def __init__(self, quick_groups: Optional[Sequence[str]] = None):
        self.rows: list[dict] = []
        self.notes: list[str] = []
        self.quick_groups = quick_groups

    def add(self, group: str, claim: str, measured: str, threshold: str, holds: bool, null: str = "") -> None:
        if self.quick_groups is not None and group not in self.quick_groups:
            self.notes.append(f"needs the full sweep: {claim}")
            return
        self.rows.append(claim_row(group, claim, measured, threshold, holds, null))
