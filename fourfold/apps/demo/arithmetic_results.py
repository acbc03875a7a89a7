"""The published figures of `fourfold demo --task arithmetic` (fourfold.apps.publish): ``collect``
reads each seed's ``result.json`` and ``provenance.json`` into ``results/arithmetic.json``, and
the blocks render docs/arithmetic.md's seed table and the README's line from it. Standard
library only; no model runs here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Optional, Sequence

RUNS = ("runs/demo-arithmetic-s0", "runs/demo-arithmetic-s1", "runs/demo-arithmetic-s2")
"""The run directories ``make results`` writes (one per seed)."""
NOT_YET = "not measured yet (`make results` runs it)"


def collect_arithmetic(runs: Sequence[Path]) -> Optional[dict]:
    """results/arithmetic.json, ``{"runs": {seed: {before, after, seconds, heldout, provenance}}}``,
    from the runs that finished (None when none did)."""
    out = {}
    for run in runs:
        path = Path(run) / "result.json"
        if not path.is_file():
            continue
        r = json.loads(path.read_text(encoding="utf-8"))
        prov = Path(run) / "provenance.json"
        out[str(r["seed"])] = {"before": r["before"], "after": r["after"], "seconds": r["seconds"],
                               "heldout": r["heldout"], "quick": r["quick"],
                               "provenance": json.loads(prov.read_text(encoding="utf-8")) if prov.is_file() else {}}
    return {"runs": out} if out else None


def _seeds(res: Mapping) -> list[str]:
    return sorted(res["runs"], key=int)


def _made(runs: Mapping, seeds: list[str]) -> str:
    made = {(p.get("date"), p.get("machine"), p.get("commit")) for p in (runs[s]["provenance"] for s in seeds)}
    if len(made) == 1:
        date, machine, commit = made.pop()
        return f"measured {date} on {machine}, commit {commit}"
    return "; ".join(f"seed {s}: measured {runs[s]['provenance'].get('date')} on {runs[s]['provenance'].get('machine')}, "
                     f"commit {runs[s]['provenance'].get('commit')}" for s in seeds)


def arithmetic_table(res: Mapping) -> str:
    """docs/arithmetic.md's block: one row per seed, then where and when."""
    rec = res.get("arithmetic")
    if not rec:
        return NOT_YET
    runs, seeds = rec["runs"], _seeds(rec)
    lines = ["| seed | greedy accuracy SFT -> GRPO | sampled SFT -> GRPO | greedy dropped carry | SFT s | GRPO s | all s |",
             "|---|---|---|---|---|---|---|"]
    for s in seeds:
        r = runs[s]
        b, a, sec = r["before"], r["after"], r["seconds"]
        lines.append(f"| {s} | {b['greedy']['accuracy']:.3f} -> {a['greedy']['accuracy']:.3f} | "
                     f"{b['sampled']['accuracy']:.3f} -> {a['sampled']['accuracy']:.3f} | "
                     f"{b['greedy']['dropped_carry']:.3f} -> {a['greedy']['dropped_carry']:.3f} | "
                     f"{sec['sft']:.0f} | {sec['grpo']:.0f} | {sec['total']:.0f} |")
    heldout = {runs[s]["heldout"] for s in seeds}
    lines += ["", f"({'/'.join(map(str, sorted(heldout)))} held-out problems; {_made(runs, seeds)}.)"]
    return "\n".join(lines)


def arithmetic_line(res: Mapping) -> str:
    """The README's inline figure: greedy held-out accuracy before -> after per seed, and the time."""
    rec = res.get("arithmetic")
    if not rec:
        return NOT_YET
    runs, seeds = rec["runs"], _seeds(rec)
    acc = " / ".join(f"{runs[s]['before']['greedy']['accuracy']:.2f} -> {runs[s]['after']['greedy']['accuracy']:.2f}"
                     for s in seeds)
    slowest = max(runs[s]["seconds"]["total"] for s in seeds)
    return (f"greedy held-out accuracy {acc} on seeds {' / '.join(seeds)}, each run at most {slowest / 60:.1f} minutes "
            f"({_made(runs, seeds)})")
