"""Where a result was made: the commit, the machine, the date and the command, recorded beside the
outputs of ``fourfold demo`` and ``fourfold experiments`` (``provenance.json``) so that a published
figure can say on which commit and machine it was measured (:mod:`fourfold.apps.publish`).

Standard library only; nothing here is read by the code that computes a result.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from fourfold.atomic import write_text_atomic

PROVENANCE_FILE = "provenance.json"


CHECKOUT = Path(__file__).resolve().parents[2]
"""The directory holding the package (fourfold/apps/provenance.py -> the checkout's root)."""


def _git(*args: str) -> str | None:
    repo = CHECKOUT
    if not (repo / ".git").exists():
        return None
    try:
        p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def git_commit() -> str:
    """The checkout's commit (12 hex digits), '+dirty' when tracked files differ from it; 'unknown'
    outside a git checkout."""
    sha = _git("rev-parse", "--short=12", "HEAD")
    if not sha:
        return "unknown"
    return sha + ("+dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def cpu_kernels() -> str | None:
    """The instruction set torch's CPU kernels run with on this machine ('AVX2', 'AVX512', ...;
    ``ATEN_CPU_CAPABILITY`` can lower it), None when torch is not imported yet. Float results of
    the same run differ in their last bits between kernels (docs/demo.md, "On another machine")."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return torch.backends.cpu.get_cpu_capability()


def machine() -> str:
    """The CPU model, cores and the kernels torch runs on it, memory, OS and architecture (and the
    CUDA device, when torch is already imported and sees one): 'AMD EPYC 7B13 (2 cores, AVX2
    kernels), 8 GiB, Linux x86_64'."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")).split()[1])
        mem = f", {kib / 2 ** 20:.0f} GiB"
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    kernels = cpu_kernels()
    cores = f"{os.cpu_count()} cores" + (f", {kernels} kernels" if kernels else "")
    text = f"{cpu} ({cores}){mem}, {platform.system()} {platform.machine()}"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text


def provenance(command: str | None = None) -> dict:
    """{commit, machine, date (UTC, YYYY-MM-DD), command (default: this process's argv, with
    ``fourfold`` for the CLI however it was started)}. Take it when a run starts: the commit is the
    checkout's at that moment."""
    first = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    cli = first.name in ("cli.py", "fourfold") or (first.name == "__main__.py" and first.parent.name == "fourfold")
    argv = ["fourfold" if cli else first.name] + sys.argv[1:]  # __main__.py of fourfold: `python -m fourfold`
    return {"commit": git_commit(), "machine": machine(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "command": command or " ".join(argv)}


def write_provenance(out: Path, record: dict | None = None, command: str | None = None) -> dict:
    """Write ``out/provenance.json``: ``record`` (taken when the run started), else :func:`provenance`
    now; return it."""
    record = record or provenance(command)
    write_text_atomic(Path(out) / PROVENANCE_FILE, json.dumps(record, indent=1, sort_keys=True))
    return record
