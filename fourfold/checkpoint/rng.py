"""The global random-number states a checkpoint stores and a resume restores: python ``random``,
numpy's global generator (when numpy is imported), torch CPU and torch CUDA on every device (when
CUDA is available). Both forms are storable without pickle (:func:`~fourfold.checkpoint.format.write_component`)."""
from __future__ import annotations

import random
import sys
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["capture_rng_state", "restore_rng_state"]


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
