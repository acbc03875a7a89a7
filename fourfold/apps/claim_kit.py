"""A claims table, the one shape every experiment family and the published docs share.

A family's claims are rows of :data:`CLAIM_KEYS` (``holds`` is ``"yes"`` or ``"no"``), built by
:func:`claim_row`; a family's checks fill a :class:`ClaimTable` (its rows, and notes on what could
not be checked); :func:`claims_md` is the markdown table of every ``summary.md`` and of the docs'
blocks, :func:`claims_held` the count the headlines and logs say. A new column of the claims (a
kind, a null result) is one edit here: the row, the table, the count.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from fourfold.apps.report_kit import md_table

CLAIM_KEYS = ("group", "claim", "measured", "threshold", "holds")
"""The keys of a claim row."""
CLAIM_COLUMNS = ("claim", "measured", "threshold", "holds")
"""The columns of the claims table a report or a doc shows (the group is not one)."""


def claim_row(group: str, claim: str, measured: str, threshold: str, holds: bool) -> dict:
    """One claim: what it says, what was measured, the threshold fixed before the run, whether it holds."""
    return {"group": group, "claim": claim, "measured": measured, "threshold": threshold,
            "holds": "yes" if holds else "no"}


def claims_held(claims: Sequence[Mapping]) -> int:
    """How many of ``claims`` hold."""
    return sum(c["holds"] == "yes" for c in claims)


def claims_md(claims: Sequence[Mapping]) -> str:
    """The claims as a markdown table (:data:`CLAIM_COLUMNS`)."""
    return md_table(CLAIM_COLUMNS, [[c[k] for k in CLAIM_COLUMNS] for c in claims])


def headline_row(what: str, claims: Sequence[Mapping], detail: str, command: str, details: str,
                 held: str = "claims hold") -> str:
    """A family's row of the README headline table: what it measures, 'N of M claims hold (``detail``)',
    the command that runs it, where its details are."""
    return f"| {what} | {claims_held(claims)} of {len(claims)} {held} ({detail}) | `{command}` | {details} |"


class ClaimTable:
    """The table a family's checks fill: ``rows`` (:func:`claim_row`) and ``notes`` (what was not
    checked, and why). ``quick_groups``: under ``--quick`` the groups stated; a claim of any other
    group becomes the note 'needs the full sweep: <claim>' (None: every group is stated)."""

    def __init__(self, quick_groups: Optional[Sequence[str]] = None):
        self.rows: list[dict] = []
        self.notes: list[str] = []
        self.quick_groups = quick_groups

    def add(self, group: str, claim: str, measured: str, threshold: str, holds: bool) -> None:
        if self.quick_groups is not None and group not in self.quick_groups:
            self.notes.append(f"needs the full sweep: {claim}")
            return
        self.rows.append(claim_row(group, claim, measured, threshold, holds))
