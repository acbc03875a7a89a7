"""The on-disk format that plain and sharded checkpoints share: the names (``checkpoints/``,
``step-XXXXXXXX``, ``COMPLETE``), the manifest (written last; read, checked and verified), finding
a run's checkpoints and pruning old ones, and the pickle-free encoding of everything that is not a
model's or optimizer's sharded state: JSON for structure, safetensors for tensors.

A component ``<name>`` is ``<name>.json`` (``{"tree": ..., "tensors_file": bool, "dropped": [...]}``)
and, when it holds tensors, ``<name>.safetensors``. Tuples, non-string dict keys, NaN/inf and numpy
arrays survive the round trip through small tagged JSON objects (see ``_Encoder``).

The manifest (``COMPLETE``, JSON) holds ``format``, ``version``, ``layout`` (sharded only),
``step``, ``world_size`` (sharded only), the names of the ``modules``, ``optimizers`` and
``schedulers``, and ``files``: the size and sha256 of every other file of the checkpoint.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from fourfold.atomic import fsync_dir
from fourfold.checkpoint.durable import TMP_PREFIX, fsync_file, remove, sha256, temp_name, write_bytes
from fourfold.errors import FourfoldError

__all__ = [
    "CHECKPOINTS_DIR",
    "COMPLETE",
    "FORMAT",
    "FORMAT_VERSION",
    "KINDS",
    "CheckpointError",
    "CorruptCheckpointError",
    "checkpoint_dirs",
    "checkpoint_step",
    "find_corruption",
    "latest_checkpoint",
    "list_checkpoints",
    "prune",
    "read_component",
    "read_manifest",
    "require_named",
    "step_dir",
    "write_component",
    "write_manifest",
]

FORMAT = "fourfold-checkpoint"
FORMAT_VERSION = 1
CHECKPOINTS_DIR = "checkpoints"
COMPLETE = "COMPLETE"
KINDS = ("modules", "optimizers", "schedulers")
"""The kinds of named objects a checkpoint holds (name -> object with ``state_dict()``)."""
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


class CheckpointError(FourfoldError, RuntimeError):
    """A checkpoint is missing, incomplete, or does not hold what the caller asked to load."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint directory is not whole: no valid manifest, or a file whose sha256 does not match
    it. Nothing was loaded from it; an older checkpoint may still be good."""


def step_dir(root: Path, step: int) -> Path:
    """``root/step-XXXXXXXX``: the final name of the checkpoint of ``step`` under ``root``
    (a run's ``checkpoints/`` directory)."""
    return root / f"step-{step:08d}"


# ---- pickle-free encoding: JSON for structure, safetensors for tensors ---------------------------

_DROP = object()  # marker for a value left out by a lenient _Encoder
_TAGS = frozenset({"__tensor__", "__tuple__", "__dict__", "__float__", "__ndarray__"})


class _Encoder:
    """Turns a nested structure into (JSON-able tree, {key: tensor}).

    Tags: ``{"__tensor__": key}`` (tensor in the safetensors file), ``{"__tuple__": [...]}``,
    ``{"__dict__": [[k, v], ...]}`` (dicts with non-str keys, e.g. optimizer state ``{0: ...}``),
    ``{"__float__": "nan" | "inf" | "-inf"}``, ``{"__ndarray__": {dtype, shape, hex}}``.
    Tensors that are the same view of the same memory (tied weights) are stored once.
    ``lenient`` (schedulers, whose state may hold callables): instead of raising, a value that
    cannot be stored is left out of its dict (so ``__dict__.update`` keeps the caller's rebuilt
    one) or becomes ``None`` in a list/tuple, and its path is listed in ``dropped``.
    """

    def __init__(self, what: str, *, lenient: bool = False):
        self.what = what
        self.lenient = lenient
        self.tensors: dict[str, torch.Tensor] = {}
        self.dropped: list[str] = []
        self._views: dict[tuple, str] = {}

    def _tensor_key(self, t: torch.Tensor, path: tuple[str, ...]) -> str:
        if t.is_sparse or t.layout != torch.strided:
            raise CheckpointError(f"{self.what}: {'/'.join(path)}: only dense tensors can be stored")
        view = (t.device, t.dtype, t.data_ptr(), tuple(t.shape), tuple(t.stride()))
        if view in self._views:
            return self._views[view]
        key = "/".join(path) or "tensor"
        base, n = key, 1
        while key in self.tensors:
            n += 1
            key = f"{base}#{n}"
        x = t.detach()
        if x.device.type != "cpu":
            x = x.to("cpu")  # already a copy
        else:
            x = x.clone()  # a snapshot that shares memory with nothing else (safetensors needs that)
        self.tensors[key] = x.contiguous()
        self._views[view] = key
        return key

    def encode(self, obj: Any, path: tuple[str, ...] = ()) -> Any:
        if isinstance(obj, torch.Tensor):
            return {"__tensor__": self._tensor_key(obj, path)}
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj) if math.isfinite(obj) else {"__float__": repr(float(obj))}
        if isinstance(obj, (tuple, list)):
            items = [self.encode(v, path + (str(i),)) for i, v in enumerate(obj)]
            items = [None if v is _DROP else v for v in items]
            return {"__tuple__": items} if isinstance(obj, tuple) else items
        if isinstance(obj, Mapping):
            pairs = [(k, self.encode(v, path + (str(k),))) for k, v in obj.items()]
            pairs = [(k, v) for k, v in pairs if v is not _DROP]
            if all(isinstance(k, str) and k not in _TAGS for k, _ in pairs):
                return dict(pairs)
            keys = [self.encode(k, path + ("key",)) for k, _ in pairs]
            if any(k is _DROP for k in keys):
                raise CheckpointError(f"{self.what}: {'/'.join(path)}: a dict key is not storable")
            return {"__dict__": [[k, v] for k, (_, v) in zip(keys, pairs)]}
        np = sys.modules.get("numpy")
        if np is not None:
            if isinstance(obj, np.ndarray) and obj.dtype != object:
                a = np.ascontiguousarray(obj)
                return {"__ndarray__": {"dtype": a.dtype.str, "shape": list(a.shape), "hex": a.tobytes().hex()}}
            if isinstance(obj, np.generic):
                return self.encode(obj.item(), path)
        if self.lenient:
            self.dropped.append("/".join(path))
            return _DROP
        raise CheckpointError(
            f"{self.what}: {'/'.join(path) or '<root>'}: a {type(obj).__name__} is neither a tensor nor "
            "JSON-able (checkpoints never pickle); store plain values instead"
        )


def _decode(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (tag, val), = obj.items()
        if tag == "__tensor__":
            return tensors[val]
        if tag == "__tuple__":
            return tuple(_decode(v, tensors) for v in val)
        if tag == "__dict__":
            return {_decode(k, tensors): _decode(v, tensors) for k, v in val}
        if tag == "__float__":
            return float(val)
        if tag == "__ndarray__":
            import numpy as np

            a = np.frombuffer(bytes.fromhex(val["hex"]), dtype=np.dtype(val["dtype"]))
            return a.reshape(val["shape"]).copy()
    return {k: _decode(v, tensors) for k, v in obj.items()}


def write_component(directory: Path, name: str, obj: Any, *, what: str, lenient: bool = False) -> None:
    """``directory/name.json`` (+ ``name.safetensors`` when there are tensors), each fsynced.
    ``what`` names ``obj`` in errors; ``lenient``: leave out what cannot be stored (see ``_Encoder``)."""
    directory.mkdir(parents=True, exist_ok=True)
    enc = _Encoder(what, lenient=lenient)
    tree = enc.encode(obj)
    tree = None if tree is _DROP else tree
    if enc.tensors:
        st_path = directory / f"{name}.safetensors"
        safetensors.torch.save_file(enc.tensors, str(st_path), metadata={"format": "pt"})
        fsync_file(st_path)
    doc = {"tree": tree, "tensors_file": bool(enc.tensors), "dropped": enc.dropped}
    write_bytes(directory / f"{name}.json", json.dumps(doc, allow_nan=False).encode())


def read_component(directory: Path, name: str, *, map_location: Any = "cpu") -> Any:
    """The object :func:`write_component` stored as ``directory/name``, its tensors on ``map_location``."""
    doc = json.loads((directory / f"{name}.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    if doc["tensors_file"]:
        device = str(torch.device(map_location)) if map_location is not None else "cpu"
        tensors = safetensors.torch.load_file(str(directory / f"{name}.safetensors"), device=device)
    return _decode(doc["tree"], tensors)


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


def prune(root: Path, keep: int | None) -> None:
    """In a run's ``checkpoints/`` directory ``root``: delete all but the newest ``keep`` complete
    checkpoints (``keep`` None or <= 0: keep all), each renamed to ``.tmp-del-*`` first, then every
    ``.tmp-*`` entry (stale saves of killed runs)."""
    if keep is not None and keep > 0:
        for old in list_checkpoints(root.parent)[:-keep]:
            doomed = root / temp_name(f"del-{old.name}")
            os.rename(old, doomed)  # atomic: a kill mid-delete leaves only a .tmp-* entry
            remove(doomed)
        fsync_dir(root)
    for p in root.iterdir():
        if p.name.startswith(TMP_PREFIX):
            remove(p)
