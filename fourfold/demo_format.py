"""Number and HTML formatting shared by the demo's report pages (:mod:`fourfold.demo_report` and
its per-token credit view, :mod:`fourfold.demo_credit`). Missing or non-finite numbers read "n/a".
"""

from __future__ import annotations

import html
import math
from typing import Any, Sequence


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


def fmt(x: Any, digits: int = 3) -> str:
    """``x`` with ``digits`` decimals."""
    v = num(x)
    return "n/a" if v is None else f"{v:.{digits}f}"


def pct(x: Any, digits: int = 0) -> str:
    """A share as a percentage: 0.25 -> '25%'."""
    v = num(x)
    return "n/a" if v is None else f"{100 * v:.{digits}f}%"


def signed(x: Any, digits: int = 2) -> str:
    """``x`` with its sign: '+0.25'."""
    v = num(x)
    return "n/a" if v is None else f"{v:+.{digits}f}"


def mean(xs: Sequence[float]) -> float:
    """The mean (nan for none)."""
    return sum(xs) / len(xs) if xs else float("nan")


def std(xs: Sequence[float]) -> float:
    """The sample standard deviation (n - 1; nan for fewer than two)."""
    if len(xs) < 2:
        return float("nan")
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "", num_cols: Sequence[int] = ()) -> str:
    """A table of pre-rendered (already escaped) cells; the columns ``num_cols`` are numeric."""
    c = f' class="{cls}"' if cls else ""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = []
    for r in rows:
        cells = "".join(f'<td class="num">{v}</td>' if i in num_cols else f"<td>{v}</td>" for i, v in enumerate(r))
        body.append(f"<tr>{cells}</tr>")
    return f"<table{c}>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(body) + "\n</tbody>\n</table>"
