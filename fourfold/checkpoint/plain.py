"""Plain checkpoints: one process (no torchrun) saves and loads every tensor itself.

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

import operator
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fourfold.atomic import fsync_dir
from fourfold.checkpoint.durable import remove, reraise_naming, temp_name
from fourfold.checkpoint.encoding import read_component, write_component
from fourfold.checkpoint.errors import CheckpointError, CorruptCheckpointError
from fourfold.checkpoint.format import commit_checkpoint, find_corruption, read_manifest, require_named, step_dir, write_manifest
from fourfold.checkpoint.rng import capture_rng_state, restore_rng_state

__all__ = ["load_checkpoint", "save_checkpoint"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


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

    final = step_dir(run_dir, step)
    root = final.parent
    if not root.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        fsync_dir(root.parent)
    tmp = root / temp_name(final.name)
    tmp.mkdir()
    try:
        for kind, objs in groups.items():
            for name, obj in objs.items():
                write_component(
                    tmp / kind, name, obj.state_dict(), what=f"{kind}[{name!r}]", lenient=kind == "schedulers"
                )
        write_component(tmp, "state", dict(state or {}), what="state")
        write_component(tmp, "rng", rng, what="rng")
        write_manifest(tmp, step, groups)
    except BaseException as e:
        remove(tmp)
        reraise_naming(e, final)
    commit_checkpoint(tmp, final, keep)
    return final


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
    manifest = read_manifest(path)
    if manifest is not None and "layout" in manifest:
        raise CheckpointError(f"{path}: a sharded ({manifest['layout']}) checkpoint of a torchrun run: "
                              "load it with fourfold.checkpoint.load_sharded")
    problem = find_corruption(path, manifest, verify=verify)
    if problem is not None or manifest is None:
        raise CorruptCheckpointError(problem)
    groups = {"modules": modules or {}, "optimizers": optimizers or {}, "schedulers": schedulers or {}}
    require_named(path, manifest, **groups)
    for name, module in groups["modules"].items():
        saved = read_component(path / "modules", name, map_location=map_location)
        _check_same_shapes(saved, module.state_dict(), f"{path}: modules/{name}")
        module.load_state_dict(saved)
    for name, opt in groups["optimizers"].items():
        opt.load_state_dict(read_component(path / "optimizers", name, map_location=map_location))
    for name, sched in groups["schedulers"].items():
        sched.load_state_dict(read_component(path / "schedulers", name, map_location="cpu"))
    if restore_rng:
        restore_rng_state(read_component(path, "rng", map_location="cpu"))
    return read_component(path, "state", map_location=map_location)


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
