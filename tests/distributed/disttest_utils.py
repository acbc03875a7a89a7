"""Helpers of the distributed tests: a ``torchrun --nproc-per-node 2`` launcher (gloo on CPU), the
toy model's settings and the comparisons of a distributed run with a one-process run."""
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import safetensors.torch

from fourfold.reporting import is_timing_key, read_metrics

REPO = Path(__file__).resolve().parents[2]


def model_overrides(data: dict) -> list[str]:
    """A random-init Llama of hidden 32, 2 layers over the toy tokenizer, on CPU, quiet."""
    return ["model.from_scratch=true", f"model.tokenizer={data['tok']}", "model.hidden_size=32", "model.num_layers=2",
            "model.num_heads=4", "model.max_positions=32", "train.max_len=16", "train.batch_size=8",
            "train.log_every=1", "run.device=cpu", "run.progress=false", "run.tensorboard=false"]


def torchrun(stage: str, overrides: list[str], *, nproc: int = 2, timeout: float = 240.0, wait: bool = True,
             check: bool = True):
    """``torchrun --standalone --nproc-per-node nproc -m fourfold.cli stage overrides`` (gloo on CPU):
    the CompletedProcess (``wait``; ``check``: it must have succeeded) with ``wall_s`` set on it, or
    the running Popen."""
    return _launch(["-m", "fourfold.cli", stage, *overrides], nproc, timeout, wait, check)


def torchrun_script(script, *args, nproc: int = 2, timeout: float = 240.0, check: bool = True):
    """``torchrun --standalone --nproc-per-node nproc script args`` (a worker script of these tests,
    same environment as :func:`torchrun`): the CompletedProcess with ``wall_s``."""
    return _launch([str(script), *map(str, args)], nproc, timeout, True, check)


def _launch(tail: list[str], nproc: int, timeout: float, wait: bool, check: bool):
    """``python -m torch.distributed.run --standalone --nproc-per-node nproc *tail``, one torch thread
    per process, offline, warnings off."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *tail]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    t0 = time.perf_counter()
    if not wait:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.t0 = t0
        return proc
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    proc.wall_s = time.perf_counter() - t0
    assert proc.returncode == 0 or not check, proc.stderr[-3000:]
    return proc


def metric_rows(out) -> list[dict]:
    """The metrics rows of a run without the timing keys."""
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in read_metrics(Path(out) / "metrics.jsonl")]


def max_relative_diff(rows_a: list[dict], rows_b: list[dict]) -> float:
    """The largest |a - b| / max(|a|, 1e-6) over every metric of every row (same steps and keys)."""
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b]
    worst = 0.0
    for a, b in zip(rows_a, rows_b):
        assert a.keys() == b.keys(), set(a) ^ set(b)
        for key, x in a.items():
            y = b[key]
            if x is None or y is None or (isinstance(x, float) and math.isnan(x)):
                assert x == y or (x is None) == (y is None), (key, x, y)
                continue
            worst = max(worst, abs(x - y) / max(abs(x), 1e-6))
    return worst


def max_weight_diff(dir_a, dir_b) -> float:
    """The largest absolute difference between the weights of two exported HF directories."""
    a = safetensors.torch.load_file(str(Path(dir_a) / "model.safetensors"))
    b = safetensors.torch.load_file(str(Path(dir_b) / "model.safetensors"))
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
