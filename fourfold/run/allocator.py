"""The CPU allocator lever: glibc's mmap threshold (``run.malloc_mmap_threshold_kib``).

On Linux, CPU tensors live in memory from glibc's ``malloc``. glibc serves a block of at least
``M_MMAP_THRESHOLD`` bytes with its own memory mapping, returned to the operating system the
moment it is freed; smaller blocks come from the heap, whose freed memory mostly stays resident.
By default the threshold is *dynamic*: it starts at 128 KiB and rises to the size of the largest
mapped block freed so far (up to 32 MiB). A PPO iteration frees blocks of a few MiB (the logits and
activations of generation, scoring and each minibatch), so after the first one nearly every tensor
comes from the heap, and memory freed by one phase (the KV cache and logits of generation) stays
resident while the next one (the update's activations and gradients) allocates other sizes beside
it. The peak RSS then exceeds the live tensors, the figure ``fourfold estimate`` predicts, by
150-175 MiB on hidden 512 / 8 layers (docs/benchmarks.md).

Setting the threshold fixes it (glibc's ``mallopt(M_MMAP_THRESHOLD, n)``, which also turns the
dynamic adjustment off): every tensor of ``n`` bytes or more is its own mapping and leaves the
resident set when freed, so the peak RSS is the live tensors plus the framework. The price is a
page fault per fresh page of every such tensor (the kernel hands out zeroed pages); the CPU time
this costs is measured in docs/benchmarks.md. The environment variable ``MALLOC_MMAP_THRESHOLD_``
(bytes) does the same from the process's first allocation; this applies it when a run starts.

Nothing here applies off glibc (macOS, musl, Windows) or on CUDA memory, which PyTorch's caching
allocator manages: :func:`set_mmap_threshold` says why in one line instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Optional

from fourfold.config.run import MMAP_THRESHOLD_MAX_KIB

M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def _libc() -> Optional[ctypes.CDLL]:
    """The C library when it is glibc (the one with ``mallopt`` and ``gnu_get_libc_version``)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        if not (hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt")):  # only glibc has both
            return None
    except OSError:
        return None
    return libc


def set_mmap_threshold(kib: int) -> Optional[str]:
    """Serve every allocation of ``kib`` KiB or more with its own mapping, returned to the OS when
    freed (glibc ``mallopt(M_MMAP_THRESHOLD, kib * 1024)``; the threshold then stays fixed).

    Returns None when applied, else one line saying why not (not glibc, or glibc refused the
    value). ``kib`` must be in [1, 32768] (glibc's upper limit on 64-bit)."""
    if not 1 <= kib <= MMAP_THRESHOLD_MAX_KIB:
        raise ValueError(f"the mmap threshold must be in [1, {MMAP_THRESHOLD_MAX_KIB}] KiB, got {kib}")
    libc = _libc()
    if libc is None:
        return f"run.malloc_mmap_threshold_kib is a glibc (Linux) setting; not applied on {sys.platform}"
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    if libc.mallopt(M_MMAP_THRESHOLD, kib * 1024) != 1:
        return f"glibc refused run.malloc_mmap_threshold_kib={kib} (mallopt returned 0); not applied"
    return None
