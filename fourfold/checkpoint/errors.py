"""What goes wrong with a checkpoint, as :class:`~fourfold.errors.FourfoldError` kinds (one line each)."""
from __future__ import annotations

from fourfold.errors import FourfoldError

__all__ = ["CheckpointError", "CorruptCheckpointError"]


class CheckpointError(FourfoldError, RuntimeError):
    """A checkpoint is missing, incomplete, or does not hold what the caller asked to load."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint directory is not whole: no valid manifest, or a file whose sha256 does not match
    it. Nothing was loaded from it; an older checkpoint may still be good."""
