"""Sharded checkpoints of a run under ``torchrun``: ``torch.distributed.checkpoint`` (DCP).

The same directory names, the same atomicity and the same manifest as a plain checkpoint
(:mod:`fourfold.checkpoint.plain`; a 1-process run keeps that format); what differs is how the
models and optimizers are stored. Every rank writes its own shards of each tracked model and
optimizer state (the state dicts of ``torch.distributed.checkpoint.state_dict.get_model_state_dict``
/ ``get_optimizer_state_dict``, keyed by parameter name, so the same checkpoint loads at any world
size, and in one process without torchrun) and its own random-number states; rank 0 writes the
schedulers and the trainer's state as JSON, then, after every rank has finished, the ``COMPLETE``
manifest and the rename::

    step-00000120/
      dcp/                          # DCP: .metadata and one __<rank>_0.distcp per rank
      schedulers/<name>.json        # as in a plain checkpoint
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
:func:`load_plain_sharded` loads a plain checkpoint into sharded models.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from fourfold import dist
from fourfold.checkpoint.durable import remove, reraise_naming, temp_name
from fourfold.checkpoint.encoding import read_component, write_component
from fourfold.checkpoint.errors import CheckpointError, CorruptCheckpointError
from fourfold.checkpoint.format import commit_checkpoint, find_corruption, read_manifest, require_named, step_dir, write_manifest
from fourfold.checkpoint.rng import capture_rng_state, restore_rng_state

__all__ = ["DCP_DIR", "LAYOUT", "is_sharded_checkpoint", "load_plain_sharded", "load_sharded", "save_sharded"]

LAYOUT = "dcp"
"""The manifest's ``layout`` of a sharded checkpoint (a plain one has none)."""
DCP_DIR = "dcp"


def is_sharded_checkpoint(path: str | Path) -> bool:
    """Whether the complete checkpoint at ``path`` was written by :func:`save_sharded`."""
    manifest = read_manifest(Path(path))
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


def _mismatch(path: Path, error: BaseException) -> CheckpointError:
    """The one-line error of models that do not load (torch lists every mismatch over many lines)."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return CheckpointError(f"{path}: its models do not load into this run's ({first[:300]}); another architecture?")


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
        write_component(tmp / "schedulers", name, sched.state_dict(), what=f"schedulers[{name!r}]", lenient=True)
    write_component(tmp, "state", dict(state), what="state")


def save_sharded(run_dir: str | Path, step: int, *, modules: Mapping[str, torch.nn.Module],
                 optimizers: Mapping[str, torch.optim.Optimizer], schedulers: Mapping[str, Any] | None = None,
                 state: Mapping[str, Any] | None = None, keep: int | None = 2) -> Path:
    """Write ``run_dir/checkpoints/step-{step:08d}`` from every rank (a collective: every rank calls
    it at the same step; in one process without a group it works alone) and return its path; see
    the module docstring for what goes where.
    Afterwards all but the newest ``keep`` complete checkpoints are deleted (by rank 0)."""
    import torch.distributed.checkpoint as dcp

    w = dist.world()
    final = step_dir(run_dir, step)
    root = final.parent
    tmp = root / dist.broadcast_object(temp_name(final.name) if w.is_main else None)
    groups = {"modules": dict(modules), "optimizers": dict(optimizers), "schedulers": dict(schedulers or {})}
    if w.is_main:
        root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    dist.barrier()
    try:
        write_component(tmp, _rng_name(w.rank), capture_rng_state(), what="rng")
        with _one_process_is_known():
            dcp.save(_dcp_state(modules, optimizers), checkpoint_id=str(tmp / DCP_DIR), no_dist=not dist.started())
        if w.is_main:
            _write_rank0_parts(tmp, groups["schedulers"], state or {})
        dist.barrier()  # every rank's files are in place
        if w.is_main:
            write_manifest(tmp, step, groups, layout=LAYOUT, world_size=w.world_size)
    except BaseException as e:
        if w.is_main:
            remove(tmp)
        reraise_naming(_first_failure(e), final)
    if w.is_main:
        commit_checkpoint(tmp, final, keep)
    dist.barrier()
    return final


def _verified_manifest(path: Path, verify: bool) -> dict:
    """The manifest of ``path`` after rank 0 checked every file's size and sha256 (every rank gets
    its verdict: a CorruptCheckpointError everywhere, or the manifest)."""
    manifest = read_manifest(path)
    problem = find_corruption(path, manifest, verify=verify) if dist.world().is_main else None
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
        raise _mismatch(path, e) from None
    for name, module in modules.items():
        set_model_state_dict(module, state["modules"][name])
    for name, opt in optimizers.items():
        set_optimizer_state_dict(modules[name], opt, state["optimizers"][name])


def load_sharded(path: str | Path, *, modules: Mapping[str, torch.nn.Module],
                 optimizers: Mapping[str, torch.optim.Optimizer], schedulers: Mapping[str, Any] | None = None,
                 restore_rng: bool = True, verify: bool = True) -> tuple[dict, str | None]:
    """Load a sharded checkpoint into the given objects (every rank calls it; also in one process
    without torchrun) and return ``(its state, a note when it was resharded, else None)``. The note
    says from how many ranks to how many and that every rank took rank 0's random-number state."""
    path = Path(path)
    manifest = _verified_manifest(path, verify)
    require_named(path, manifest, modules=modules, optimizers=optimizers, schedulers=schedulers or {})
    _load_models(path, modules, optimizers)
    for name, sched in (schedulers or {}).items():
        sched.load_state_dict(read_component(path / "schedulers", name))
    w, saved = dist.world(), int(manifest["world_size"])
    note = None
    if saved != w.world_size:
        note = (f"{path.name} was written by {saved} rank{'s' if saved > 1 else ''} and resumes on {w.world_size}: "
                "resharded the models and optimizers; every rank takes rank 0's random-number state")
    if restore_rng:
        restore_rng_state(read_component(path, _rng_name(w.rank if note is None else 0)))
    return read_component(path, "state"), note


def _by_name(saved: dict, module: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    """A plain optimizer state dict (parameters by index, in the order ``opt`` holds them) keyed by
    parameter name instead, as ``set_optimizer_state_dict`` takes a full one."""
    name_of = {id(p): name for name, p in module.named_parameters()}
    order = [name_of[id(p)] for group in opt.param_groups for p in group["params"]]
    return {"state": {order[i]: state for i, state in saved["state"].items()},
            "param_groups": [{**group, "params": [order[i] for i in group["params"]]} for group in saved["param_groups"]]}


def load_plain_sharded(path: str | Path, *, modules: Mapping[str, torch.nn.Module],
                       optimizers: Mapping[str, torch.optim.Optimizer], schedulers: Mapping[str, Any] | None = None,
                       verify: bool = True) -> tuple[dict, str]:
    """Load a one-process (plain, :mod:`fourfold.checkpoint.plain`) checkpoint into sharded models
    under torchrun: every rank reads the whole weights and AdamW state and keeps its shards; every
    rank takes the one random-number state. Returns ``(its state, the note that it was sharded)``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    path = Path(path)
    manifest = _verified_manifest(path, verify)
    require_named(path, manifest, modules=modules, optimizers=optimizers, schedulers=schedulers or {})
    full = StateDictOptions(full_state_dict=True)
    try:
        for name, module in modules.items():
            set_model_state_dict(module, read_component(path / "modules", name), options=full)
        for name, opt in optimizers.items():
            saved = _by_name(read_component(path / "optimizers", name), modules[name], opt)
            set_optimizer_state_dict(modules[name], opt, saved, options=full)
    except (RuntimeError, KeyError, ValueError, IndexError) as e:  # torch lists every mismatch over many lines
        raise _mismatch(path, e) from None
    for name, sched in (schedulers or {}).items():
        sched.load_state_dict(read_component(path / "schedulers", name))
    restore_rng_state(read_component(path, "rng"))
    note = (f"{path.name} was written by one process (no torchrun) and resumes on {dist.world().world_size} "
            "ranks: sharded the models and optimizers; every rank takes its random-number state")
    return read_component(path, "state"), note
