"""One interface for a run's checkpoints: :class:`Checkpointer` (``save`` and ``load``), done by
:class:`PlainCheckpointer` in one process and by :class:`ShardedCheckpointer` under torchrun;
:func:`checkpointer` picks one, once, when the run knows whether it has a process group.

Either one loads either kind of checkpoint: the format is read from the checkpoint's manifest, and
a load across kinds or world sizes returns a note saying so (None otherwise)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from fourfold.checkpoint.plain import load_checkpoint, save_checkpoint
from fourfold.checkpoint.sharded import is_sharded_checkpoint, load_plain_sharded, load_sharded, save_sharded

__all__ = ["Checkpointer", "PlainCheckpointer", "ShardedCheckpointer", "checkpointer"]


class Checkpointer(Protocol):
    """How a run saves and resumes: name -> object with ``state_dict()`` for ``modules``,
    ``optimizers`` and ``schedulers``, and the trainer's JSON-able ``state``."""

    def save(self, run_dir: str | os.PathLike, step: int, *, modules: Mapping[str, torch.nn.Module],
             optimizers: Mapping[str, torch.optim.Optimizer], schedulers: Mapping[str, Any] | None = None,
             state: Mapping[str, Any] | None = None, keep: int | None = 2) -> Path:
        """Write ``run_dir/checkpoints/step-{step:08d}`` atomically, keep the newest ``keep``
        complete checkpoints (None or <= 0: all) and return its path."""
        ...

    def load(self, ckpt_dir: str | os.PathLike, *, modules: Mapping[str, torch.nn.Module],
             optimizers: Mapping[str, torch.optim.Optimizer],
             schedulers: Mapping[str, Any] | None = None) -> tuple[dict, str | None]:
        """Load the checkpoint ``ckpt_dir`` (plain or sharded) into the objects, and the global RNG
        states; return ``(its state, a note when it was resharded or sharded, else None)``. A
        checkpoint that is not whole is a CorruptCheckpointError."""
        ...


class PlainCheckpointer:
    """One process (no torchrun): :func:`~fourfold.checkpoint.plain.save_checkpoint`; loads a plain
    checkpoint, or a sharded one of a torchrun run (gathered into this process, with a note)."""

    save = staticmethod(save_checkpoint)  # written by this process alone

    def load(self, ckpt_dir: str | os.PathLike, *, modules: Mapping[str, torch.nn.Module],
             optimizers: Mapping[str, torch.optim.Optimizer],
             schedulers: Mapping[str, Any] | None = None) -> tuple[dict, str | None]:
        """See :meth:`Checkpointer.load`."""
        if is_sharded_checkpoint(ckpt_dir):
            return load_sharded(ckpt_dir, modules=modules, optimizers=optimizers, schedulers=schedulers)
        return load_checkpoint(ckpt_dir, modules=modules, optimizers=optimizers, schedulers=schedulers), None


class ShardedCheckpointer:
    """Under torchrun (every rank calls both): :func:`~fourfold.checkpoint.sharded.save_sharded`;
    loads a sharded checkpoint (resharded when written at another world size) or a plain one of a
    one-process run (sharded on load), each with its note."""

    save = staticmethod(save_sharded)  # a collective: written by every rank

    def load(self, ckpt_dir: str | os.PathLike, *, modules: Mapping[str, torch.nn.Module],
             optimizers: Mapping[str, torch.optim.Optimizer],
             schedulers: Mapping[str, Any] | None = None) -> tuple[dict, str | None]:
        """See :meth:`Checkpointer.load`; a collective."""
        if is_sharded_checkpoint(ckpt_dir):
            return load_sharded(ckpt_dir, modules=modules, optimizers=optimizers, schedulers=schedulers)
        return load_plain_sharded(ckpt_dir, modules=modules, optimizers=optimizers, schedulers=schedulers)


def checkpointer(sharded: bool) -> Checkpointer:
    """The run's :class:`Checkpointer`: :class:`ShardedCheckpointer` when ``sharded`` (a process
    group is started: torchrun), else :class:`PlainCheckpointer`."""
    return ShardedCheckpointer() if sharded else PlainCheckpointer()
