"""The process group of a run launched by ``torchrun`` (one process without it), and the few
collectives the trainers need.

Everything here is a no-op identity in a single process (no ``torchrun``, or a world of 1), so a
trainer calls the same functions either way::

    world = dist.init_from_env()          # reads RANK / WORLD_SIZE / LOCAL_RANK; starts the group
    rows = dist.shard(n_rows, world)      # this rank's slice of a global batch
    total = dist.all_reduce_sum(t)        # a sum over every rank (t itself in one process)
    everything = dist.all_gather_rows(t)  # rank 0's rows, then rank 1's, ... (same shapes)
    parts = dist.all_gather_objects(x)    # every rank's picklable x, in rank order
    n, = dist.all_reduce_checked([k], e)  # a sum carrying this rank's error e (None: none) as a
                                          # flag: any rank's error is raised on every rank

An error met on one rank only (a user's environment, which each rank steps for its own rows) must
stop every rank, or the others wait in their next collective until the group's timeout: the rank
keeps the error, joins the next collective every rank makes anyway with a flag added to it
(:func:`all_reduce_checked`), and when a flag is up every rank raises the lowest failing rank's
error (:func:`raise_first_error`: one more collective, on failure only).

Backend: NCCL when the run's device is CUDA, gloo otherwise. On CPU the device mesh is built on
``"cpu"`` explicitly (a GPU machine running a gloo group otherwise crashes: pytorch#132471).
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional, Sequence

import torch
import torch.distributed as tdist

from fourfold.errors import ConfigError, FourfoldError, UserCodeError, user_traceback

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class World:
    """Where this process stands: ``rank`` of ``world_size`` (``local_rank`` on its node)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """True on rank 0, the process that writes files, logs and progress."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when more than one process runs the training (collectives are real)."""
        return self.world_size > 1


SINGLE = World()

_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Read error", "Write error",
              "NCCL communicator was aborted", "Socket Timeout", "Timed out waiting")
"""What a collective's error says when another rank has died (gloo's TCP pair, NCCL, the store)."""


class PeerLostError(FourfoldError, RuntimeError):
    """Another rank of the run is gone (killed or crashed): this one stops too, with one line."""


def is_peer_failure(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because another rank died (a process group was
    running): torch's DistError family, or a gloo/NCCL RuntimeError saying the connection is gone."""
    if not started():
        return False
    if isinstance(error, tdist.DistError):
        return True
    return isinstance(error, RuntimeError) and any(marker in str(error) for marker in _PEER_GONE)


def launched_by_torchrun() -> bool:
    """True when the environment has torchrun's variables (``RANK``, ``WORLD_SIZE``, ...)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def rank_from_env() -> int:
    """This process's rank as torchrun's environment gives it (0 without torchrun), usable before the
    process group starts."""
    return int(os.environ["RANK"]) if launched_by_torchrun() else 0


def world_size_from_env() -> int:
    """How many processes torchrun started (1 without torchrun), usable before the group starts."""
    return int(os.environ["WORLD_SIZE"]) if launched_by_torchrun() else 1


def world() -> World:
    """This process's :class:`World`: from the started process group, else a single process."""
    if tdist.is_available() and tdist.is_initialized():
        return World(tdist.get_rank(), tdist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    return SINGLE


def init_from_env(device: Optional[torch.device] = None, *, timeout_s: float = 1800.0) -> World:
    """Start the process group when launched by torchrun (NCCL on a CUDA ``device``, gloo
    otherwise) and return this process's :class:`World`; a single process without torchrun is
    ``World(0, 1, 0)`` and starts nothing. Calling it again returns the started group's world."""
    if not launched_by_torchrun():
        return world()
    if tdist.is_initialized():
        return world()
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = device is not None and torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank)
    tdist.init_process_group(backend="nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s))
    return world()


def started() -> bool:
    """True when torchrun's process group is running in this process (even a world of 1: the
    models are then sharded with FSDP2 and checkpoints are written with DCP)."""
    return tdist.is_available() and tdist.is_initialized()


def shutdown(*, sync: bool = False, settle: bool = False) -> None:
    """Destroy the process group if one was started (end of a run). ``sync`` (a run that ended well
    on every rank): wait for every rank first, so no rank tears its connections down while a peer
    still uses them (gloo then aborts the peer: "terminate called without an active exception").
    Without ``sync`` (an error, a lost peer) nothing waits. ``settle`` (an error raised on every rank
    at once, :func:`raised_on_every_rank`): wait for every rank as ``sync`` does, so rank 0 has
    printed it before any rank exits, but a peer gone meanwhile ends the wait, not the process.

    Before the group goes, a garbage collection: the run's sharded modules sit in reference cycles
    (module <-> hooks <-> FSDP state) that keep references to the group and its work objects, so
    without it they would be freed only during interpreter finalization, where gloo's threads and
    tensors are torn down without the GIL (a SIGABRT: "terminate called without an active
    exception"). Collected here, they go while the interpreter is whole."""
    if tdist.is_available() and tdist.is_initialized():
        if sync:
            tdist.barrier()
        elif settle:
            try:
                tdist.barrier()
            except Exception:  # a peer that exited meanwhile: the error is said; nothing to wait for
                pass
        gc.collect()
        tdist.destroy_process_group()


def cpu_mesh(w: World):
    """A 1-D device mesh over every rank on ``"cpu"`` (explicit: see the module docstring)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (w.world_size,))


def check_divisible(key: str, value: int, w: World) -> None:
    """A global batch size ``value`` (config ``key``) must split evenly over the ranks."""
    if value % w.world_size:
        raise ConfigError(f"{key}: {value} does not divide by the world size {w.world_size} "
                          f"(batch sizes are global; use a multiple of {w.world_size})")


def shard(n: int, w: World) -> slice:
    """This rank's contiguous slice of ``n`` global rows: ``n / world_size`` each when it divides,
    else as even as can be (the lower ranks one fewer; a rank may get none when ``n`` is smaller
    than the world)."""
    return slice(w.rank * n // w.world_size, (w.rank + 1) * n // w.world_size)


def _all_reduce(t: torch.Tensor, op: str) -> torch.Tensor:
    """``t`` reduced element-wise over every rank by ``tdist.ReduceOp.<op>`` (a new tensor; ``t``
    itself in one process)."""
    if not world().distributed:
        return t
    out = t.detach().clone()
    tdist.all_reduce(out, op=getattr(tdist.ReduceOp, op))
    return out


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of ``t`` over every rank (a new tensor; ``t`` itself in one process)."""
    return _all_reduce(t, "SUM")


def all_reduce_sum_(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over every rank in place (no copy; returns ``t``; nothing in one process)."""
    if world().distributed:
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """The element-wise maximum of ``t`` over every rank (``t`` itself in one process)."""
    return _all_reduce(t, "MAX")


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP2's sharded parameters and what is computed from them) as the whole tensor,
    the same on every rank (a collective every rank makes in the same order); any other tensor as is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def all_gather_rows(t: torch.Tensor) -> torch.Tensor:
    """Every rank's ``t`` concatenated along dim 0 in rank order (same shape on every rank)."""
    if not world().distributed:
        return t
    parts = [torch.empty_like(t) for _ in range(world().world_size)]
    tdist.all_gather(parts, t.contiguous())
    return torch.cat(parts, 0)


def all_gather_objects(obj: Any) -> list:
    """Every rank's ``obj`` (picklable; keep it small, on the CPU), in rank order (``[obj]`` in one
    process)."""
    if not world().distributed:
        return [obj]
    out: list = [None] * world().world_size
    tdist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (``obj`` itself in one process)."""
    if not world().distributed:
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    """Wait for every rank (nothing in one process)."""
    if world().distributed:
        tdist.barrier()


def all_reduce_checked(values: Sequence[int], error: Optional[BaseException], op: str = "SUM") -> list[int]:
    """``values`` (integers) reduced over every rank by ``op`` ("SUM" or "MAX") with this rank's
    ``error`` (None: none) riding on the same all-reduce as one more element: when some rank has one,
    every rank raises the first failing rank's error (:func:`raise_first_error`) instead of returning.
    In one process: ``error`` raised if given, else ``values`` as a list."""
    if not world().distributed:
        if error is not None:
            raise error
        return list(values)
    cuda = tdist.get_backend() == "nccl"  # NCCL reduces CUDA tensors only, gloo CPU ones
    flagged = torch.tensor([*values, int(error is not None)], dtype=torch.long,
                           device=torch.device("cuda", torch.cuda.current_device()) if cuda else "cpu")
    *reduced, failed = _all_reduce(flagged, op).tolist()
    if failed:
        raise_first_error(error)
    return reduced


def _portable(error: Optional[BaseException]) -> Optional[tuple]:
    """What another rank needs to raise ``error`` again: (its class when it is fourfold's own, else
    None; its message; the user's traceback under it, as text)."""
    if error is None:
        return None
    if isinstance(error, FourfoldError):
        return type(error), str(error), user_traceback(error)
    return None, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}", ""


def _copy(kind: Optional[type], message: str, text: str, rank: int) -> BaseException:
    """Rank ``rank``'s error raised again here: the same class and message (a UserCodeError with its
    user's traceback as text); an error that is not fourfold's own is said to be that rank's."""
    if kind is not None:
        try:
            error = kind(message)
        except Exception:  # a class that takes other arguments: said as below
            error = None
        if isinstance(error, FourfoldError):
            if isinstance(error, UserCodeError):
                error.traceback_text = text
            return error
    return PeerLostError(f"rank {rank} of {world().world_size} raised {message} (its traceback is in that rank's "
                         "output), so this one stops")


def raise_first_error(error: Optional[BaseException]) -> None:
    """Raise, on every rank, the error of the lowest rank that has one: every rank calls it once a
    collective they all made has said some rank failed (:func:`all_reduce_checked`); ``error``:
    this rank's (None: none). That rank raises its own exception (its cause and traceback kept); the
    others a copy of the same class and message, so every rank stops with the line
    one process would have printed. One all_gather_object of the ranks' messages."""
    if not world().distributed:
        if error is not None:
            raise error
        return
    parts = all_gather_objects(_portable(error))
    rank = next(r for r, part in enumerate(parts) if part is not None)
    raised = error if rank == world().rank and error is not None else _copy(*parts[rank], rank=rank)
    if parts[rank][0] is not None and isinstance(raised, parts[rank][0]):  # fourfold's own on every rank
        raised.on_every_rank = True  # all alive, all stopping with it: see raised_on_every_rank
    raise raised


def raised_on_every_rank(error: BaseException) -> bool:
    """Whether ``error`` (fourfold's own) was raised on every rank at once (:func:`raise_first_error`):
    then every rank is alive and stops with it, and may wait for the others at :func:`shutdown`
    (``settle``), so that no rank exits, and torchrun stops the rest, before rank 0 has printed it."""
    return bool(getattr(error, "on_every_rank", False))
