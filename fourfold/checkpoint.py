"""Atomic, resumable checkpoints without pickle.

A run may be killed (SIGKILL, OOM, pre-emption) at any instruction, including in the middle of a
write. The rules that make a resumed run continue bit-for-bit:

1. Everything goes into ``checkpoints/.tmp-step-XXXXXXXX-<pid>-<hex>/`` first; every file is
   fsynced; a ``COMPLETE`` file holding the manifest (name, size and sha256 of every file) is
   written last; the directory is fsynced, renamed to ``checkpoints/step-XXXXXXXX`` in one
   ``os.rename`` and the parent directory is fsynced. A checkpoint under its final name is
   therefore always whole; anything else is a ``.tmp-*`` directory, which readers ignore and the
   next save deletes.
2. Old checkpoints are removed by renaming them to ``.tmp-del-*`` first and deleting afterwards, so
   a kill during a delete never leaves a half-deleted directory under a final name.
3. No pickle anywhere: tensors go to ``.safetensors`` files, everything else (param groups, step
   counters, scalars, python's RNG state) to ``.json``. Tuples, non-string dict keys, NaN/inf and
   numpy arrays survive the round trip through small tagged JSON objects (see ``_Encoder``).
4. The RNG states (python ``random``, numpy's global generator when numpy is imported, torch CPU,
   torch CUDA on every device when CUDA is available) are always saved and, by default, restored.

Layout of one checkpoint directory::

    step-00000120/
      modules/<name>.safetensors   # state_dict tensors, keyed by parameter name (tied: stored once)
      modules/<name>.json          # the state_dict structure (aliases of tied tensors, extra state)
      optimizers/<name>.safetensors, optimizers/<name>.json
      schedulers/<name>.safetensors (only when it holds tensors), schedulers/<name>.json
      state.json (+ state.safetensors when `state` holds tensors)
      rng.json, rng.safetensors
      COMPLETE                     # JSON manifest; written last

One writer per run directory: two processes saving into the same ``checkpoints/`` at once will
delete each other's temporary directories.
"""
from __future__ import annotations

import hashlib
import json
import math
import operator
import os
import random
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from fourfold.atomic import fsync_dir as _fsync_dir
from fourfold.errors import FourfoldError

__all__ = [
    "CheckpointError",
    "CorruptCheckpointError",
    "capture_rng_state",
    "checkpoint_dirs",
    "checkpoint_step",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "restore_rng_state",
    "save_checkpoint",
    "save_pretrained_atomic",
]

FORMAT = "fourfold-checkpoint"
FORMAT_VERSION = 1
CHECKPOINTS_DIR = "checkpoints"
COMPLETE = "COMPLETE"
TMP_PREFIX = ".tmp-"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_KINDS = ("modules", "optimizers", "schedulers")


class CheckpointError(FourfoldError, RuntimeError):
    """A checkpoint is missing, incomplete, or does not hold what the caller asked to load."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint directory is not whole: no valid manifest, or a file whose sha256 does not match
    it. Nothing was loaded from it; an older checkpoint may still be good."""


# ---- durable file-system primitives --------------------------------------------------------------


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _token() -> str:
    # os.urandom, not `random`/tempfile: saving must not consume any RNG the run depends on.
    return f"{os.getpid()}-{os.urandom(4).hex()}"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


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


def _write_component(directory: Path, name: str, obj: Any, *, what: str, lenient: bool = False) -> None:
    """``directory/name.json`` (+ ``name.safetensors`` when there are tensors), each fsynced."""
    directory.mkdir(parents=True, exist_ok=True)
    enc = _Encoder(what, lenient=lenient)
    tree = enc.encode(obj)
    tree = None if tree is _DROP else tree
    if enc.tensors:
        st_path = directory / f"{name}.safetensors"
        safetensors.torch.save_file(enc.tensors, str(st_path), metadata={"format": "pt"})
        _fsync_file(st_path)
    doc = {"tree": tree, "tensors_file": bool(enc.tensors), "dropped": enc.dropped}
    _write_bytes(directory / f"{name}.json", json.dumps(doc, allow_nan=False).encode())


def _read_component(directory: Path, name: str, *, map_location: Any = "cpu") -> Any:
    doc = json.loads((directory / f"{name}.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    if doc["tensors_file"]:
        device = str(torch.device(map_location)) if map_location is not None else "cpu"
        tensors = safetensors.torch.load_file(str(directory / f"{name}.safetensors"), device=device)
    return _decode(doc["tree"], tensors)


# ---- RNG -----------------------------------------------------------------------------------------


def capture_rng_state() -> dict:
    """The global RNG states: ``python`` (``random.getstate()``), ``numpy`` (only when numpy is
    already imported), ``torch_cpu`` (ByteTensor), ``torch_cuda`` (list of ByteTensors, one per
    device, only when CUDA is available). Storable by ``save_checkpoint`` without pickle."""
    out: dict[str, Any] = {"python": random.getstate(), "torch_cpu": torch.get_rng_state()}
    np = sys.modules.get("numpy")
    if np is not None:
        out["numpy"] = np.random.get_state()
    if torch.cuda.is_available():
        out["torch_cuda"] = list(torch.cuda.get_rng_state_all())
    return out


def restore_rng_state(d: Mapping[str, Any]) -> None:
    """Inverse of ``capture_rng_state``; entries that are absent are left alone. CUDA states are
    restored on the first ``min(saved, present)`` devices."""
    if "python" in d:
        random.setstate(_as_tuple(d["python"]))
    if "torch_cpu" in d:
        torch.set_rng_state(d["torch_cpu"].to("cpu", torch.uint8))
    if "numpy" in d:
        import numpy as np

        np.random.set_state(tuple(d["numpy"]))
    if "torch_cuda" in d and torch.cuda.is_available():
        states = [s.to("cpu", torch.uint8) for s in d["torch_cuda"]]
        for i, s in enumerate(states[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, device=i)


def _as_tuple(x: Any) -> Any:
    """random.setstate needs tuples all the way down (a JSON round trip without tags gives lists)."""
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


# ---- manifest / discovery ------------------------------------------------------------------------


def _read_manifest(path: Path) -> dict | None:
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


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """All complete checkpoints of a run, oldest (lowest step) first."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and _read_manifest(p) is not None:
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
    manifest = _read_manifest(Path(path))
    if manifest is None:
        raise CheckpointError(f"{path}: not a complete checkpoint")
    return int(manifest["step"])


# ---- save / load ---------------------------------------------------------------------------------


def _check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{kind} name {name!r}: use letters, digits, '_', '.', '-' (file names)")


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    *,
    modules: Mapping[str, torch.nn.Module] | None = None,
    optimizers: Mapping[str, torch.optim.Optimizer] | None = None,
    schedulers: Mapping[str, Any] | None = None,
    state: Mapping[str, Any] | None = None,
    keep: int | None = 2,
) -> Path:
    """Atomically write ``run_dir/checkpoints/step-{step:08d}`` and return its path.

    ``modules``/``optimizers``/``schedulers``: name -> object with ``state_dict()``; ``state``:
    a JSON-able dict (tensors, tuples, numpy arrays and non-finite floats are allowed too) that
    ``load_checkpoint`` returns. The global RNG states are always stored. A scheduler's entries
    that are neither JSON-able nor tensors (functions) are left out (``None`` inside lists): the
    caller rebuilds them (LambdaLR already puts ``None`` for plain-function lambdas). Afterwards all but the newest
    ``keep`` complete checkpoints and every stale ``.tmp-*`` entry are deleted (``keep`` None or
    <= 0: keep all). Saving a step that already exists replaces it atomically.
    """
    step = operator.index(step)
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    groups = {"modules": dict(modules or {}), "optimizers": dict(optimizers or {}), "schedulers": dict(schedulers or {})}
    for kind, objs in groups.items():
        for name in objs:
            _check_name(kind, name)
    rng = capture_rng_state()  # first: nothing below draws random numbers, but be explicit

    run_dir = Path(run_dir)
    root = run_dir / CHECKPOINTS_DIR
    if not root.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        _fsync_dir(run_dir)
    final = root / f"step-{step:08d}"
    tmp = root / f"{TMP_PREFIX}{final.name}-{_token()}"
    tmp.mkdir()
    try:
        for kind, objs in groups.items():
            for name, obj in objs.items():
                _write_component(
                    tmp / kind, name, obj.state_dict(), what=f"{kind}[{name!r}]", lenient=kind == "schedulers"
                )
        _write_component(tmp, "state", dict(state or {}), what="state")
        _write_component(tmp, "rng", rng, what="rng")
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                rel = p.relative_to(tmp).as_posix()
                files[rel] = {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        manifest = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "step": step,
            **{kind: sorted(objs) for kind, objs in groups.items()},
            "files": files,
        }
        _write_bytes(tmp / COMPLETE, json.dumps(manifest, indent=1).encode())
        for kind in _KINDS:
            if (tmp / kind).is_dir():
                _fsync_dir(tmp / kind)
        _fsync_dir(tmp)
    except BaseException as e:
        _remove(tmp)
        _reraise_naming(e, final)
    _swap_into_place(tmp, final)
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int | None) -> None:
    if keep is not None and keep > 0:
        for old in list_checkpoints(root.parent)[:-keep]:
            doomed = root / f"{TMP_PREFIX}del-{old.name}-{_token()}"
            os.rename(old, doomed)  # atomic: a kill mid-delete leaves only a .tmp-* entry
            _remove(doomed)
        _fsync_dir(root)
    for p in root.iterdir():
        if p.name.startswith(TMP_PREFIX):
            _remove(p)


def load_checkpoint(
    path: str | os.PathLike,
    *,
    modules: Mapping[str, torch.nn.Module] | None = None,
    optimizers: Mapping[str, torch.optim.Optimizer] | None = None,
    schedulers: Mapping[str, Any] | None = None,
    restore_rng: bool = True,
    map_location: Any = "cpu",
    verify: bool = True,
) -> dict:
    """Load a complete checkpoint into the given objects in place and return its ``state``.

    Only the named objects are loaded (a checkpoint may hold more). Module state dicts load with
    ``strict=True``. ``restore_rng``: also restore the global RNG states saved with it.
    ``verify``: check every file's sha256 against the manifest first (sizes are always checked).
    """
    path = Path(path)
    manifest = _read_manifest(path)
    if manifest is None:
        raise CorruptCheckpointError(f"{path}: not a complete checkpoint (no valid {COMPLETE} manifest)")
    if "layout" in manifest:
        raise CheckpointError(f"{path}: a sharded ({manifest['layout']}) checkpoint of a torchrun run: "
                              "load it with fourfold.checkpoint_dcp.load_sharded")
    if verify:
        for rel, info in manifest["files"].items():
            if _sha256(path / rel) != info["sha256"]:
                raise CorruptCheckpointError(f"{path / rel}: sha256 does not match the manifest (corrupted)")
    groups = {"modules": modules or {}, "optimizers": optimizers or {}, "schedulers": schedulers or {}}
    for kind, objs in groups.items():
        missing = sorted(set(objs) - set(manifest.get(kind, [])))
        if missing:
            raise CheckpointError(f"{path}: no {kind} named {missing} (it has {manifest.get(kind, [])})")
    for name, module in groups["modules"].items():
        saved = _read_component(path / "modules", name, map_location=map_location)
        _check_same_shapes(saved, module.state_dict(), f"{path}: modules/{name}")
        module.load_state_dict(saved)
    for name, opt in groups["optimizers"].items():
        opt.load_state_dict(_read_component(path / "optimizers", name, map_location=map_location))
    for name, sched in groups["schedulers"].items():
        sched.load_state_dict(_read_component(path / "schedulers", name, map_location="cpu"))
    if restore_rng:
        restore_rng_state(_read_component(path, "rng", map_location="cpu"))
    return _read_component(path, "state", map_location=map_location)


def _check_same_shapes(saved: Mapping[str, Any], current: Mapping[str, Any], where: str) -> None:
    """One line naming the first key that is missing, extra or of another shape in ``saved``
    (another architecture than the checkpoint's), instead of torch's multi-line report."""
    for key, value in current.items():
        if key not in saved:
            raise CheckpointError(f"{where}: the checkpoint has no {key} (another architecture?)")
        old = saved[key]
        if isinstance(value, torch.Tensor) and isinstance(old, torch.Tensor) and old.shape != value.shape:
            raise CheckpointError(f"{where}: {key} has shape {list(old.shape)} in the checkpoint but "
                                  f"{list(value.shape)} in the model (another architecture?)")
    extra = [key for key in saved if key not in current]
    if extra:
        raise CheckpointError(f"{where}: the checkpoint holds {extra[0]}, which the model has not (another architecture?)")


# ---- Hugging Face style output directories -------------------------------------------------------


def _fsync_tree(top: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(top):
        for f in filenames:
            p = Path(dirpath) / f
            if not p.is_symlink():
                _fsync_file(p)
        _fsync_dir(Path(dirpath))


def save_pretrained_atomic(saver: Callable[[Path], None], out_dir: str | os.PathLike) -> Path:
    """Run ``saver(tmp_dir)`` (e.g. ``lambda d: model.save_pretrained(d)``) into a temporary
    sibling ``.tmp-<name>-*`` of ``out_dir``, fsync it, then swap it into place: the old
    ``out_dir`` is renamed to ``.tmp-trash-<name>-*``, the new one renamed to ``out_dir``, and
    the trash deleted. A kill never leaves a half-written directory under ``out_dir``; in the
    instant between the two renames ``out_dir`` is absent and the previous copy is in the trash
    directory. Stale ``.tmp-<name>-*``/``.tmp-trash-<name>-*`` siblings from killed calls are
    removed first. Returns ``out_dir``."""
    out = Path(out_dir)
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    stale = re.compile(rf"^{re.escape(TMP_PREFIX)}(trash-)?{re.escape(out.name)}-\d+-[0-9a-f]{{8}}$")
    for p in list(parent.iterdir()):
        if stale.match(p.name):
            _remove(p)
    tmp = parent / f"{TMP_PREFIX}{out.name}-{_token()}"
    tmp.mkdir()
    try:
        saver(tmp)
        _fsync_tree(tmp)
    except BaseException as e:
        _remove(tmp)
        _reraise_naming(e, out)
    _swap_into_place(tmp, out)
    return out


_OS_ERROR = re.compile(r"os error (\d+)")


def _reraise_naming(error: BaseException, target: Path) -> None:
    """Re-raise ``error``; a failed write (disk full, the file-size limit) becomes an OSError naming
    the directory being saved instead of a file in its deleted temporary copy (or no file at all).
    safetensors reports its write errors as a SafetensorError quoting the OS error number."""
    errno = None
    if isinstance(error, OSError) and not isinstance(error, FourfoldError):
        errno = error.errno
    elif isinstance(error, safetensors.SafetensorError) and (m := _OS_ERROR.search(str(error))):
        errno = int(m.group(1))
    if errno is not None:
        raise OSError(errno, os.strerror(errno), str(target)) from error
    raise error


def _swap_into_place(tmp: Path, final: Path) -> None:
    """Rename the finished ``tmp`` directory to ``final`` (its sibling), replacing any old
    ``final`` through a trash name that is put back if the swap fails; fsync the parent."""
    parent = final.parent
    trash: Path | None = None
    try:
        if final.exists():
            trash = parent / f"{TMP_PREFIX}trash-{final.name}-{_token()}"
            os.rename(final, trash)
        os.rename(tmp, final)
        _fsync_dir(parent)
    except BaseException:
        if trash is not None and trash.exists() and not final.exists():
            os.rename(trash, final)
            trash = None
        _remove(tmp)
        raise
    if trash is not None:
        _remove(trash)
