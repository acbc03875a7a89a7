"""Atomic, resumable checkpoints without pickle: plain ones of a one-process run, sharded ones of a
run under torchrun, both in one on-disk format.

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
   numpy arrays survive the round trip through small tagged JSON objects. (A sharded checkpoint's
   models and optimizers are DCP's files, whose ``.metadata`` is torch's own pickle.)
4. The RNG states (python ``random``, numpy's global generator when numpy is imported, torch CPU,
   torch CUDA on every device when CUDA is available) are always saved and, by default, restored.

The modules:

- :mod:`~fourfold.checkpoint.durable`: fsynced writes, temporary names, swapping a directory into
  place, the error that names the directory being saved; :func:`save_pretrained_atomic`.
- :mod:`~fourfold.checkpoint.errors`: :class:`CheckpointError`, :class:`CorruptCheckpointError`.
- :mod:`~fourfold.checkpoint.encoding`: the tagged-JSON + safetensors components (no pickle).
- :mod:`~fourfold.checkpoint.format`: what both kinds share on disk: names, the manifest, finding
  a run's checkpoints, putting a finished one in place and pruning the old ones.
- :mod:`~fourfold.checkpoint.rng`: the global random-number states.
- :mod:`~fourfold.checkpoint.plain`: :func:`save_checkpoint` / :func:`load_checkpoint` (one process).
- :mod:`~fourfold.checkpoint.sharded`: :func:`save_sharded` / :func:`load_sharded` (DCP, every rank)
  and :func:`load_plain_sharded` (a plain checkpoint into sharded models).
- :mod:`~fourfold.checkpoint.interface`: what a run uses: :func:`checkpointer` (``sharded``) picks a
  :class:`Checkpointer` once, whose ``save`` writes the run's kind and whose ``load`` reads either::

      ckpt = checkpointer(sharded=dist.started())
      ckpt.save(run_dir, step, modules=..., optimizers=..., schedulers=..., state=..., keep=2)
      state, note = ckpt.load(run_dir / "checkpoints" / "step-00000120", modules=..., optimizers=...)
"""
from fourfold.checkpoint.durable import TMP_PREFIX, save_pretrained_atomic
from fourfold.checkpoint.errors import CheckpointError, CorruptCheckpointError
from fourfold.checkpoint.format import (
    CHECKPOINTS_DIR,
    COMPLETE,
    FORMAT,
    FORMAT_VERSION,
    checkpoint_dirs,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
)
from fourfold.checkpoint.interface import Checkpointer, PlainCheckpointer, ShardedCheckpointer, checkpointer
from fourfold.checkpoint.plain import load_checkpoint, save_checkpoint
from fourfold.checkpoint.rng import capture_rng_state, restore_rng_state
from fourfold.checkpoint.sharded import is_sharded_checkpoint, load_plain_sharded, load_sharded, save_sharded

__all__ = [
    "CHECKPOINTS_DIR",
    "COMPLETE",
    "FORMAT",
    "FORMAT_VERSION",
    "TMP_PREFIX",
    "CheckpointError",
    "Checkpointer",
    "CorruptCheckpointError",
    "PlainCheckpointer",
    "ShardedCheckpointer",
    "capture_rng_state",
    "checkpoint_dirs",
    "checkpoint_step",
    "checkpointer",
    "is_sharded_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_plain_sharded",
    "load_sharded",
    "restore_rng_state",
    "save_checkpoint",
    "save_pretrained_atomic",
    "save_sharded",
]
