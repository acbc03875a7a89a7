"""The on-disk layout that plain and sharded checkpoints share: the names (``checkpoints/``,
``step-XXXXXXXX``, ``COMPLETE``), the manifest (written last; read, checked and verified), finding
a run's checkpoints, and putting a finished one in place (pruning the old ones).

The manifest (``COMPLETE``, JSON) holds ``format``, ``version``, ``layout`` (sharded only),
``step``, ``world_size`` (sharded only), the names of the ``modules``, ``optimizers`` and
``schedulers``, and ``files``: the size and sha256 of every other file of the checkpoint. The files
themselves are components (:mod:`fourfold.checkpoint.encoding`) or, in a sharded checkpoint, DCP's.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fourfold.atomic import fsync_dir
from fourfold.checkpoint.durable import TMP_PREFIX, remove, sha256, swap_into_place, temp_name, write_bytes
from fourfold.checkpoint.errors import CheckpointError

__all__ = [
    "CHECKPOINTS_DIR",
    "COMPLETE",
    "FORMAT",
    "FORMAT_VERSION",
    "checkpoint_dirs",
    "checkpoint_step",
    "find_corruption",
    "latest_checkpoint",
    "list_checkpoints",
    "commit_checkpoint",
    "read_manifest",
    "require_named",
    "step_dir",
    "write_manifest",
]

FORMAT = "fourfold-checkpoint"
FORMAT_VERSION = 1
CHECKPOINTS_DIR = "checkpoints"
COMPLETE = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


def step_dir(run_dir: str | os.PathLike, step: int) -> Path:
    """``run_dir/checkpoints/step-XXXXXXXX``: the final name of the checkpoint of ``step``."""
    return Path(run_dir) / CHECKPOINTS_DIR / f"step-{step:08d}"


# ---- the manifest --------------------------------------------------------------------------------


def write_manifest(tmp: Path, step: int, groups: Mapping[str, Mapping], *, layout: str | None = None,
                   world_size: int | None = None) -> None:
    """Write the ``COMPLETE`` manifest of the finished checkpoint directory ``tmp`` (size and sha256
    of every file in it; the names in ``groups``, kind -> {name: object}), then fsync its
    subdirectories and itself. ``layout`` and ``world_size``: a sharded checkpoint's (a plain one
    has neither)."""
    files = {}
    for p in sorted(tmp.rglob("*")):
        if p.is_file():
            files[p.relative_to(tmp).as_posix()] = {"bytes": p.stat().st_size, "sha256": sha256(p)}
    manifest: dict[str, Any] = {"format": FORMAT, "version": FORMAT_VERSION}
    if layout is not None:
        manifest["layout"] = layout
    manifest["step"] = step
    if world_size is not None:
        manifest["world_size"] = world_size
    manifest.update({kind: sorted(objs) for kind, objs in groups.items()})
    manifest["files"] = files
    write_bytes(tmp / COMPLETE, json.dumps(manifest, indent=1).encode())
    for sub in sorted(p for p in tmp.iterdir() if p.is_dir()):
        fsync_dir(sub)
    fsync_dir(tmp)


def read_manifest(path: Path) -> dict | None:
    """The manifest of a complete checkpoint directory, or None when it is not one: no COMPLETE,
    unparseable COMPLETE, a step that disagrees with a ``step-N`` name, or a listed file missing
    or of the wrong size."""
    try:
        manifest = json.loads((path / COMPLETE).read_text())
        if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
            return None
        m = _STEP_DIR.match(path.name)  # a copy under another name ("best/") still loads
        if not isinstance(manifest.get("step"), int) or (m is not None and int(m.group(1)) != manifest["step"]):
            return None
        for rel, info in manifest["files"].items():
            if (path / rel).stat().st_size != info["bytes"]:
                return None
        return manifest
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def find_corruption(path: Path, manifest: dict | None, *, verify: bool) -> str | None:
    """What makes the checkpoint at ``path`` (whose :func:`read_manifest` is ``manifest``) unfit to
    load, in one line, or None: no valid manifest, or (``verify``) the first file whose sha256 does
    not match it."""
    if manifest is None:
        return f"{path}: not a complete checkpoint (no valid {COMPLETE} manifest)"
    if verify:
        for rel, info in manifest["files"].items():
            if sha256(path / rel) != info["sha256"]:
                return f"{path / rel}: sha256 does not match the manifest (corrupted)"
    return None


def require_named(path: Path, manifest: dict, **kinds: Mapping) -> None:
    """Every object to load has its name among the checkpoint's of that kind (modules, optimizers,
    schedulers); else a CheckpointError naming the missing ones and what the checkpoint has."""
    for kind, objs in kinds.items():
        missing = sorted(set(objs) - set(manifest.get(kind, [])))
        if missing:
            raise CheckpointError(f"{path}: no {kind} named {missing} (it has {manifest.get(kind, [])})")


# ---- a run's checkpoints -------------------------------------------------------------------------


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """All complete checkpoints of a run, oldest (lowest step) first."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and read_manifest(p) is not None:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def checkpoint_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """Every ``step-N`` directory of a run, whole or not, newest (highest step) first: what a
    resume tries in turn (``.tmp-*`` directories of interrupted saves are not among them)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found, reverse=True)]


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest (highest step) complete checkpoint in ``run_dir/checkpoints``, or None.
    ``.tmp-*`` directories and directories without a valid ``COMPLETE`` manifest are ignored."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def checkpoint_step(path: str | os.PathLike) -> int:
    """The step a complete checkpoint was saved at."""
    manifest = read_manifest(Path(path))
    if manifest is None:
        raise CheckpointError(f"{path}: not a complete checkpoint")
    return int(manifest["step"])


def commit_checkpoint(tmp: Path, final: Path, keep: int | None) -> None:
    """Rename the finished checkpoint directory ``tmp`` to ``final`` (:func:`step_dir`), replacing
    one of the same step, then prune the run's ``checkpoints/``: all but the newest ``keep`` complete
    checkpoints (``keep`` None or <= 0: keep all) are renamed to ``.tmp-del-*`` and deleted, and
    every other ``.tmp-*`` entry (stale saves of killed runs) is deleted."""
    swap_into_place(tmp, final)
    _prune(final.parent, keep)


def _prune(root: Path, keep: int | None) -> None:
    if keep is not None and keep > 0:
        for old in list_checkpoints(root.parent)[:-keep]:
            doomed = root / temp_name(f"del-{old.name}")
            os.rename(old, doomed)  # atomic: a kill mid-delete leaves only a .tmp-* entry
            remove(doomed)
        fsync_dir(root)
    for p in root.iterdir():
        if p.name.startswith(TMP_PREFIX):
            remove(p)
