"""Set-up pieces every trainer (and ``fourfold generate``/``score``) shares: seeding, quiet
transformers, the warning lines on skipped data rows. A trainer never imports another trainer; what
two of them need lives below them, here in :mod:`fourfold.run` (the run scaffold, the optimisation,
the data-parallel seam, the export)."""

from __future__ import annotations

import random
import sys
import warnings
from typing import Sequence

import torch


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy (when imported) and torch; return a dedicated CPU generator for sampling."""
    random.seed(seed)
    torch.manual_seed(seed)
    if "numpy" in sys.modules:
        import numpy as np

        np.random.seed(seed % 2**32)
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gen


def quiet_transformers() -> None:
    """Keep transformers' load reports and progress bars off the terminal (our own bar is there),
    and the one FutureWarning every LoRA run would print: peft's ``PeftModel.__init__`` reads
    ``model.is_gradient_checkpointing``, which transformers 5 deprecates (nothing of ours calls it;
    the filter matches that message alone)."""
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


def skipped_lines(skipped: Sequence, notes: Sequence[str] = ()) -> list[str]:
    """The warnings on a data source read with ``data.on_error: skip``: how many bad rows were
    skipped and the first (none when none was), then each note on the data as a whole."""
    lines = [f"{len(skipped)} bad rows skipped (data.on_error=skip); first: {skipped[0]}"] if skipped else []
    return lines + list(notes)
