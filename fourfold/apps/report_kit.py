"""The numbers of the applications' reports, and how they read: used by the demo's report
(:mod:`fourfold.apps.demo.report`, :mod:`fourfold.apps.demo.credit`) and by ``fourfold experiments``
(its summaries, claims, ``summary.md`` and ``report.html``).

One rule for each: :func:`mean` and :func:`std` take the finite values of a sequence (None, nan
and inf are left out); the standard deviation is the sample one (n - 1), nan for fewer than two
values. Every format reads "n/a" for a missing or non-finite number, so a single seed's spread
shows as "n/a", never as a made-up 0.
"""

from __future__ import annotations

import html
import math
from typing import Any, Sequence

from fourfold.sinks import fmt_fixed


def esc(x: Any) -> str:
    """``str(x)``, HTML-escaped."""
    return html.escape(str(x))


def num(x: Any) -> float | None:
    """``x`` as a finite float, or None (None, booleans, non-numbers, nan and inf)."""
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def finite(xs: Sequence[Any]) -> list:
    """The values of ``xs`` that are neither None nor nan nor inf."""
    return [x for x in xs if x is not None and math.isfinite(x)]


def mean(xs: Sequence[float]) -> float:
    """The mean of the finite values (nan for none)."""
    xs = finite(xs)
    return sum(xs) / len(xs) if xs else math.nan


def std(xs: Sequence[float]) -> float:
    """The sample standard deviation (n - 1) of the finite values; nan for fewer than two."""
    xs = finite(xs)
    if len(xs) < 2:
        return math.nan
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def fmt(x: Any, digits: int = 3) -> str:
    """``x`` with ``digits`` decimals (a value that rounds to zero as ``0.00``, never ``-0.00``:
    :func:`fourfold.sinks.fmt_fixed`)."""
    v = num(x)
    return "n/a" if v is None else fmt_fixed(v, digits)


def pct(x: Any, digits: int = 0) -> str:
    """A share as a percentage: 0.25 -> '25%'."""
    v = num(x)
    return "n/a" if v is None else f"{100 * v:.{digits}f}%"


def signed(x: Any, digits: int = 2) -> str:
    """``x`` with its sign: '+0.25'."""
    v = num(x)
    return "n/a" if v is None else f"{v:+.{digits}f}"


def duration(s: float) -> str:
    """Seconds as '42s' or, from two minutes, '2.5min'."""
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.1f}min"


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "", num_cols: Sequence[int] = ()) -> str:
    """A table of pre-rendered (already escaped) cells; the columns ``num_cols`` are numeric."""
    c = f' class="{cls}"' if cls else ""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = []
    for r in rows:
        cells = "".join(f'<td class="num">{v}</td>' if i in num_cols else f"<td>{v}</td>" for i, v in enumerate(r))
        body.append(f"<tr>{cells}</tr>")
    return f"<table{c}>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(body) + "\n</tbody>\n</table>"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table (a ``|`` in a cell escaped, a newline a space)."""
    def cell(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
