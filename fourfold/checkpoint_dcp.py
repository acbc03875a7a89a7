"""Sharded checkpoints of a run under ``torchrun``: ``torch.distributed.checkpoint`` (DCP).

The same directory names, the same atomicity and the same manifest as :mod:`fourfold.checkpoint`
(a 1-process run keeps that module's format); what differs is how the models and optimizers are
stored. Every rank writes its own shards of each tracked model and optimizer state (the state dicts
of ``torch.distributed.checkpoint.state_dict.get_model_state_dict`` / ``get_optimizer_state_dict``,
keyed by parameter name, so the same checkpoint loads at any world size, and in one process
without torchrun) and its own random-number states; rank 0 writes the schedulers and the trainer's
state as JSON, then, after every rank has finished, the ``COMPLETE`` manifest and the rename::

    step-00000120/
      dcp/                          # DCP: .metadata and one __<rank>_0.distcp per rank
      schedulers/<name>.json        # as in fourfold.checkpoint
      state.json (+ .safetensors)
      rng-rank00000.json, rng-rank00000.safetensors, rng-rank00001.json, ...
      COMPLETE                      # manifest (layout "dcp", world_size, sha256 of every file)

A save in progress lives in ``checkpoints/.tmp-step-*`` (named by rank 0), which readers ignore; a
kill at any moment, of one rank or all, leaves the last complete checkpoint as it was. The run
directory must be on a file system every rank sees (one machine, or a shared one across nodes).
DCP's own ``.metadata`` file is a pickle (torch's format, not fourfold's): resume checkpoints you
wrote. Loading on another world size reshards the models and optimizers (DCP); the random-number
states of the old ranks cannot map onto new ones, so every rank then takes rank 0's (every rank
draws the same global streams in fourfold's runs: data order, minibatch permutations, init).
"""

from __future__ import annotations

import json
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import torch

from fourfold import dist
from fourfold.checkpoint import (
    CHECKPOINTS_DIR,
    COMPLETE,
    FORMAT,
    FORMAT_VERSION,
    TMP_PREFIX,
    CheckpointError,
    CorruptCheckpointError,
    _fsync_dir,
    _prune,
    _read_component,
    _read_manifest,
    _remove,
    _reraise_naming,
    _sha256,
    _swap_into_place,
    _token,
    _write_bytes,
    _write_component,
    capture_rng_state,
    restore_rng_state,
)

LAYOUT = "dcp"
"""The manifest's ``layout`` of a sharded checkpoint (a plain one has none)."""
DCP_DIR = "dcp"


def is_sharded_checkpoint(path: str | Path) -> bool:
    """Whether the complete checkpoint at ``path`` was written by :func:`save_sharded`."""
    manifest = _read_manifest(Path(path))
    return manifest is not None and manifest.get("layout") == LAYOUT


def _first_failure(error: BaseException) -> BaseException:
    """DCP's CheckpointException (every rank's failures, with tracebacks, over many lines) as its
    first failure itself: a full disk stays an OSError (then the run's one-line OutputError), a
    lost peer the collective's error; anything else is returned as it is."""
    failures = getattr(error, "failures", None)
    if not isinstance(failures, dict) or not failures:
        return error
    first = next(iter(failures.values()))
    return first[0] if isinstance(first, tuple) else first


@contextmanager
def _one_process_is_known() -> Iterator[None]:
    """Without a process group DCP warns that it saves or loads in one process: that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rng_name(rank: int) -> str:
    return f"rng-rank{rank:05d}"


def _dcp_state(modules: Mapping[str, torch.nn.Module], optimizers: Mapping[str, torch.optim.Optimizer]) -> dict:
    """``{"modules": {name: model state dict}, "optimizers": {name: optimizer state dict}}``, keyed by
    parameter name; an optimizer belongs to the module of the same name."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    unpaired = sorted(set(optimizers) - set(modules))
    if unpaired:
        raise CheckpointError(f"sharded checkpoints pair each optimizer with the module of its name: {unpaired} have none")
    return {"modules": {name: get_model_state_dict(m) for name, m in modules.items()},
            "optimizers": {name: get_optimizer_state_dict(modules[name], opt) for name, opt in optimizers.items()}}


def _write_rank0_parts(tmp: Path, schedulers: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    for name, sched in schedulers.items():
        _write_component(tmp / "schedulers", name, sched.state_dict(), what=f"schedulers[{name!r}]", lenient=True)
    _write_component(tmp, "state", dict(state), what="state")


def _write_manifest(tmp: Path, step: int, groups: Mapping[str, Mapping]) -> None:
    files = {}
    for p in sorted(tmp.rglob("*")):
        if p.is_file():
            files[p.relative_to(tmp).as_posix()] = {"bytes": p.stat().st_size, "sha256": _sha256(p)}
    manifest = {"format": FORMAT, "version": FORMAT_VERSION, "layout": LAYOUT, "step": step,
                "world_size": dist.world().world_size, **{kind: sorted(objs) for kind, objs in groups.items()},
                "files": files}
    _write_bytes(tmp / COMPLETE, json.dumps(manifest, indent=1).encode())
    for sub in (tmp / DCP_DIR, tmp / "schedulers", tmp):
        if sub.is_dir():
            _fsync_dir(sub)


def save_sharded(run_dir: str | Path, step: int, *, modules: Mapping[str, torch.nn.Module],
                 optimizers: Mapping[str, torch.optim.Optimizer], schedulers: Optional[Mapping[str, Any]] = None,
                 state: Optional[Mapping[str, Any]] = None, keep: Optional[int] = 2) -> Path:
    """Write ``run_dir/checkpoints/step-{step:08d}`` from every rank (a collective: every rank calls
    it at the same step; in one process without a group it works alone) and return its path; see
    the module docstring for what goes where.
    Afterwards all but the newest ``keep`` complete checkpoints are deleted (by rank 0)."""
    import torch.distributed.checkpoint as dcp

    w = dist.world()
    root = Path(run_dir) / CHECKPOINTS_DIR
    final = root / f"step-{step:08d}"
    tmp = root / dist.broadcast_object(f"{TMP_PREFIX}{final.name}-{_token()}" if w.is_main else None)
    groups = {"modules": dict(modules), "optimizers": dict(optimizers), "schedulers": dict(schedulers or {})}
    if w.is_main:
        root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    dist.barrier()
    try:
        _write_component(tmp, _rng_name(w.rank), capture_rng_state(), what="rng")
        with _one_process_is_known():
            dcp.save(_dcp_state(modules, optimizers), checkpoint_id=str(tmp / DCP_DIR), no_dist=not dist.started())
        if w.is_main:
            _write_rank0_parts(tmp, groups["schedulers"], state or {})
        dist.barrier()  # every rank's files are in place
        if w.is_main:
            _write_manifest(tmp, step, groups)
    except BaseException as e:
        if w.is_main:
            _remove(tmp)
        _reraise_naming(_first_failure(e), final)
    if w.is_main:
        _swap_into_place(tmp, final)
        _prune(root, keep)
    dist.barrier()
    return final


def _verified_manifest(path: Path, verify: bool) -> dict:
    """The manifest of ``path`` after rank 0 checked every file's size and sha256 (every rank gets
    its verdict: a CorruptCheckpointError everywhere, or the manifest)."""
    problem = None
    manifest = _read_manifest(path)
    if dist.world().is_main:
        if manifest is None:
            problem = f"{path}: not a complete checkpoint (no valid {COMPLETE} manifest)"
        elif verify:
            bad = [rel for rel, info in manifest["files"].items() if _sha256(path / rel) != info["sha256"]]
            problem = f"{path / bad[0]}: sha256 does not match the manifest (corrupted)" if bad else None
    problem = dist.broadcast_object(problem)
    if problem is not None or manifest is None:
        raise CorruptCheckpointError(problem or f"{path}: not a complete checkpoint")
    return manifest


def _load_models(path: Path, modules: Mapping, optimizers: Mapping) -> None:
    """Read every tracked model and optimizer state from ``path/dcp`` into the objects (resharded to
    this world size by DCP)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state = _dcp_state(modules, optimizers)
    try:
        with _one_process_is_known():
            dcp.load(state, checkpoint_id=str(path / DCP_DIR), no_dist=not dist.started())
    except (Exception, CheckpointException) as e:
        e = _first_failure(e)
        if dist.is_peer_failure(e):
            raise e from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: its models do not load into this run's ({first[:300]}); "
                              "another architecture?") from None
    for name, module in modules.items():
        set_model_state_dict(module, state["modules"][name])
    for name, opt in optimizers.items():
        set_optimizer_state_dict(modules[name], opt, state["optimizers"][name])


def _require_named(path: Path, manifest: dict, **kinds: Mapping) -> None:
    """Every object to load has its name among the checkpoint's of that kind (modules, optimizers,
    schedulers); else a CheckpointError naming the missing ones and what the checkpoint has."""
    for kind, objs in kinds.items():
        missing = sorted(set(objs) - set(manifest.get(kind, [])))
        if missing:
            raise CheckpointError(f"{path}: no {kind} named {missing} (it has {manifest.get(kind, [])})")


def load_sharded(path: str | Path, *, modules: Mapping[str, torch.nn.Module],
                 optimizers: Mapping[str, torch.optim.Optimizer], schedulers: Optional[Mapping[str, Any]] = None,
                 restore_rng: bool = True, verify: bool = True) -> tuple[dict, Optional[str]]:
    """Load a sharded checkpoint into the given objects (every rank calls it; also in one process
    without torchrun) and return ``(its state, a note when it was resharded, else None)``. The note
    says from how many ranks to how many and that every rank took rank 0's random-number state."""
    path = Path(path)
    manifest = _verified_manifest(path, verify)
    _require_named(path, manifest, modules=modules, optimizers=optimizers, schedulers=schedulers or {})
    _load_models(path, modules, optimizers)
    for name, sched in (schedulers or {}).items():
        sched.load_state_dict(_read_component(path / "schedulers", name))
    w, saved = dist.world(), int(manifest["world_size"])
    note = None
    if saved != w.world_size:
        note = (f"{path.name} was written by {saved} rank{'s' if saved > 1 else ''} and resumes on {w.world_size}: "
                "resharded the models and optimizers; every rank takes rank 0's random-number state")
    if restore_rng:
        restore_rng_state(_read_component(path, _rng_name(w.rank if note is None else 0)))
    return _read_component(path, "state"), note


def _by_name(saved: dict, module: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    """A plain optimizer state dict (parameters by index, in the order ``opt`` holds them) keyed by
    parameter name instead, as ``set_optimizer_state_dict`` takes a full one."""
    name_of = {id(p): name for name, p in module.named_parameters()}
    order = [name_of[id(p)] for group in opt.param_groups for p in group["params"]]
    return {"state": {order[i]: state for i, state in saved["state"].items()},
            "param_groups": [{**group, "params": [order[i] for i in group["params"]]} for group in saved["param_groups"]]}


def load_plain_sharded(path: str | Path, *, modules: Mapping[str, torch.nn.Module],
                       optimizers: Mapping[str, torch.optim.Optimizer], schedulers: Optional[Mapping[str, Any]] = None,
                       verify: bool = True) -> tuple[dict, str]:
    """Load a one-process (plain, :mod:`fourfold.checkpoint`) checkpoint into sharded models under
    torchrun: every rank reads the whole weights and AdamW state and keeps its shards; every rank
    takes the one random-number state. Returns ``(its state, the note that it was sharded)``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    path = Path(path)
    manifest = _verified_manifest(path, verify)
    _require_named(path, manifest, modules=modules, optimizers=optimizers, schedulers=schedulers or {})
    full = StateDictOptions(full_state_dict=True)
    try:
        for name, module in modules.items():
            set_model_state_dict(module, _read_component(path / "modules", name), options=full)
        for name, opt in optimizers.items():
            saved = _by_name(_read_component(path / "optimizers", name), modules[name], opt)
            set_optimizer_state_dict(modules[name], opt, saved, options=full)
    except (RuntimeError, KeyError, ValueError, IndexError) as e:  # torch lists every mismatch over many lines
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: its models do not load into this run's ({first[:300]}); "
                              "another architecture?") from None
    for name, sched in (schedulers or {}).items():
        sched.load_state_dict(_read_component(path / "schedulers", name))
    restore_rng_state(_read_component(path, "rng"))
    note = (f"{path.name} was written by one process (no torchrun) and resumes on {dist.world().world_size} "
            "ranks: sharded the models and optimizers; every rank takes its random-number state")
    return _read_component(path, "state"), note
