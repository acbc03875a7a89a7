"""What the publishing modules share: reading a results or run file (:func:`read`), a run's
provenance (:func:`run_provenance`) and the text saying where figures were made (:func:`made`,
:func:`made_all`). Nothing here runs a model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from fourfold.errors import DataError


def read(path: Path) -> Any:
    """The JSON of ``path``, None when there is no such file; a file that is there but does not
    parse (cut short, edited by hand) is a DataError naming it, never taken for a missing one."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise DataError(f"{path}: not valid JSON ({e}); a cut or hand-edited file? restore it "
                        f"(git checkout -- {path}) or rerun `python -m fourfold.apps.publish collect`") from None


def run_provenance(run: Path) -> dict:
    """A run output's provenance.json (commit, machine, date, command), 'unknown' each where there is none."""
    return read(run / "provenance.json") or dict.fromkeys(("commit", "machine", "date", "command"), "unknown")


def made(p: Mapping) -> str:
    """'measured <date> on <machine>, commit <sha>'; a transcribed record says what it was
    transcribed from (and its date and machine where known)."""
    when = (f" {p['date']}" if p.get("date") not in (None, "unknown") else "") + f" on {p.get('machine')}"
    if p.get("transcribed"):
        return f"transcribed from {p['transcribed']}; measured{when}"
    return f"measured{when}, commit {p.get('commit')}"


def made_all(records: Sequence[tuple[str, Mapping]]) -> str:
    """One provenance text for runs made alike, else one per run (``(label, provenance)`` pairs)."""
    texts = [(label, made(p)) for label, p in records]
    if len({t for _, t in texts}) == 1:
        return texts[0][1]
    return "; ".join(f"{label}: {t}" for label, t in texts)
