"""Set-up pieces every trainer (and ``fourfold generate``/``score``) shares: seeding, quiet
transformers, the warning lines on skipped data rows. A trainer never imports another trainer; what
two of them need lives below them, here in :mod:`fourfold.run` (the run scaffold, the optimisation,
the data-parallel seam, the export)."""

from __future__ import annotations

import random
import sys
import warnings
from pathlib import Path
from typing import Iterable, Optional, Sequence

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


BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
"""CPU flags (``/proc/cpuinfo``) of native bf16 arithmetic: AVX512-BF16 and AMX-BF16 on x86, BF16
on Arm. Without one, oneDNN and ATen emulate bf16: on an AMD EPYC with AVX2 only a bf16 matmul of
256x512 by 512x2048 took about 1000 ms against 4 ms in fp32 (250x); on an AVX512-BF16 EPYC made
to run AVX2 kernels (ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2), 509 ms against 2.6 ms
(197x; benchmarks/bf16_matmul.py, docs/benchmarks.md)."""


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> Optional[set[str]]:
    """The CPU's flags (x86 ``flags``, Arm ``Features``) of its first processor; None when the
    file cannot be read (another OS): then nothing is known."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def cpu_has_bf16(capability: str, flags: Optional[Iterable[str]]) -> bool:
    """Whether this CPU computes bf16 natively: torch's CPU ``capability``
    (``torch.backends.cpu.get_cpu_capability()``: DEFAULT, AVX2, AVX512, ...) and its ``flags``
    (:func:`cpu_flags`). AVX2 kernels have no bf16 path whatever the flags (also when
    ATEN_CPU_CAPABILITY caps them there); otherwise one of :data:`BF16_FLAGS`; unknown flags:
    assumed yes (no warning rather than a wrong one)."""
    if capability.upper() == "AVX2":
        return False
    if flags is None:
        return True
    return any(f in set(flags) for f in BF16_FLAGS)


def bf16_cpu_warning(cfg, device: torch.device, capability: Optional[str] = None,
                     flags: Optional[Iterable[str]] = None) -> Optional[str]:
    """The warning line of a run (or an estimate) that asks for bf16 on a CPU without native bf16
    (:func:`cpu_has_bf16`): ``model.precision`` bf16 or bf16-mixed, or a bf16 ``model.dtype`` /
    ``model.frozen_dtype``, with ``device`` a CPU; None otherwise. ``capability`` and ``flags``
    default to this machine's."""
    m = getattr(cfg, "model", None)
    if device.type != "cpu" or m is None:
        return None
    asked = [f"model.{k}={getattr(m, k)}" for k in ("precision", "dtype", "frozen_dtype")
             if str(getattr(m, k, None)) in ("bf16", "bf16-mixed", "bfloat16")]
    if not asked:
        return None
    capability = capability if capability is not None else torch.backends.cpu.get_cpu_capability()
    if cpu_has_bf16(capability, cpu_flags() if flags is None else flags):
        return None
    return (f"{', '.join(asked)} on a CPU without native bf16 (torch CPU kernels {capability}, no "
            f"{'/'.join(BF16_FLAGS)} flag): bf16 is emulated there, a matmul about 100-250x slower than "
            "float32 (benchmarks/bf16_matmul.py); for speed run float32 (model.precision=fp32, model.dtype="
            "float32, model.frozen_dtype=float32), at the memory fourfold estimate shows for it")
