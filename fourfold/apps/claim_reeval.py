"""Re-evaluate the published claims from results/*.json alone: each claim's kind and reason, and its
null where the stored record can give one (issue 39; docs/experiments.md, "Claim kinds and nulls").

    python -m fourfold.apps.claim_reeval            # rewrite results/*.json's claims in place
    python -m fourfold.apps.publish render          # then the README and docs tables from them

No family is rerun: a null the stored values cannot give says "not run (needs rerun: ...)"
(:mod:`fourfold.apps.claim_kinds`); :func:`reevaluate` is the one function that recomputes a record.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

from fourfold.apps.claim_kinds import FINDING, RESULT_FAMILY, annotate
from fourfold.apps.claim_nulls import stored_null
from fourfold.apps.claim_repose import repose
from fourfold.atomic import write_text_atomic

REPO = Path(__file__).resolve().parents[2]


def annotate_record(name: str, record: Mapping) -> dict:
    """results/``name``'s ``record`` with its claims annotated (:func:`~fourfold.apps.claim_kinds.annotate`),
    each finding whose null was not run given the null the record can give
    (:func:`~fourfold.apps.claim_nulls.stored_null`); a file of no family unchanged."""
    if name not in RESULT_FAMILY or "claims" not in record:
        return dict(record)
    family = RESULT_FAMILY[name]
    rows = annotate(family, record["claims"])
    for row in rows:
        if row["kind"] == FINDING and row["null"].startswith("not run"):
            row["null"] = stored_null(family, record, row) or row["null"]
    return {**record, "claims": rows}


def reevaluate(name: str, record: Mapping) -> dict:
    """``record`` (results/``name``) with its claims re-annotated from scratch (kind, why, null), the
    old-form margin claims re-posed first (:func:`~fourfold.apps.claim_repose.repose`, which sets their null)."""
    family = RESULT_FAMILY[name]
    fresh = [repose(family, record, {k: v for k, v in c.items() if k not in ("kind", "why", "null") or _run_computed(c, k)})
             for c in record["claims"]]
    return annotate_record(name, {**record, "claims": fresh})


def _run_computed(claim: Mapping, key: str) -> bool:
    """Whether ``claim``'s ``key`` is a null its family's run computed ('no (computed: ...)': the turns
    rerun's claims compute theirs), which the stored values could not give again: kept as it is."""
    return key == "null" and "(computed" in str(claim.get("null", ""))


def rewrite(root: Path) -> list[str]:
    """Rewrite every results/*.json of :data:`RESULT_FAMILY` under ``root`` that exists; returns the files changed."""
    changed = []
    for name in sorted(RESULT_FAMILY):
        path = root / "results" / name
        if not path.is_file():
            continue
        old = path.read_text(encoding="utf-8")
        new = json.dumps(reevaluate(name, json.loads(old)), indent=1, sort_keys=True) + "\n"
        if new != old:
            write_text_atomic(path, new)
            changed.append(str(path))
    return changed


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fourfold.apps.claim_reeval", description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(REPO), help="the checkout whose results/*.json are rewritten")
    args = p.parse_args(argv)
    root = Path(args.root)
    if not (root / "results").is_dir():
        print(f"{p.prog}: error: --root {root}: no results/ directory", file=sys.stderr)
        return 2
    changed = rewrite(root)
    print(f"rewrote {', '.join(changed) or 'nothing (already up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
