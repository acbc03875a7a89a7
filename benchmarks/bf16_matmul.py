"""bf16 against float32 on this CPU: one matmul of 256x512 by 512x2048 (a small model's MLP on a
batch of 256 tokens), timed in each dtype after a warm-up; prints one JSON line: the CPU's name,
torch's CPU kernels (``torch.backends.cpu.get_cpu_capability()``), whether the CPU has native bf16
(``fourfold.run.common.cpu_has_bf16``), the median milliseconds of each dtype and their ratio.

    python benchmarks/bf16_matmul.py
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python benchmarks/bf16_matmul.py   # an AVX2-only CPU, emulated

Where the ratio is large (no native bf16: an AVX2-only CPU), every run in bf16 (model.precision
bf16 / bf16-mixed, a bf16 frozen base) is that much slower: fourfold warns at a run's start.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch


def _ms(a: torch.Tensor, b: torch.Tensor, repeats: int) -> float:
    a @ b  # warm-up: kernels chosen, caches filled
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    from fourfold.run.common import cpu_flags, cpu_has_bf16

    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 512, generator=g), torch.randn(512, 2048, generator=g)
    fp32 = _ms(a, b, args.repeats)
    bf16 = _ms(a.bfloat16(), b.bfloat16(), args.repeats)
    capability = torch.backends.cpu.get_cpu_capability()
    out = {"benchmark": "bf16_matmul", "cpu": cpu_name(), "torch": torch.__version__, "capability": capability,
           "native_bf16": cpu_has_bf16(capability, cpu_flags()), "threads": torch.get_num_threads(),
           "shape": "256x512 @ 512x2048", "fp32_ms": round(fp32, 3), "bf16_ms": round(bf16, 3),
           "bf16_over_fp32": round(bf16 / fp32, 2)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
