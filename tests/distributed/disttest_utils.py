"""Helpers of the distributed tests: a ``torchrun --nproc-per-node 2`` launcher (gloo on CPU), the
toy model's settings and the comparisons of a distributed run with a one-process run."""
import math
import os
import signal
import socket
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


def _env() -> dict:
    """The environment of a launch: this repository first, one torch thread, offline, warnings off."""
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")


def _launch(tail: list[str], nproc: int, timeout: float, wait: bool, check: bool):
    """``python -m torch.distributed.run --standalone --nproc-per-node nproc *tail``, one torch thread
    per process, offline, warnings off."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *tail]
    env = _env()
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


ROUNDING_KEYS = ("mismatch/token_abs_diff_mean", "mismatch/token_abs_diff_max", "policy/first_ratio_abs_dev")
"""Metrics that measure float rounding itself in an fp32 run (the engine's log-probs against the
training forward's, ~1e-7), which differs with how the ranks lay out the batch: compared as both
below 1e-5, not relatively."""


ABS_FLOOR = 1e-6
"""Float32 rounding of a metric of order 1 (its eps is 1.2e-7) and of a sum of a few such terms."""


def max_relative_diff(rows_a: list[dict], rows_b: list[dict]) -> float:
    """The largest |a - b| / max(|a|, 1e-6) over every metric of every row (same steps and keys;
    :data:`ROUNDING_KEYS` only checked to be below 1e-5 in both). A difference below
    :data:`ABS_FLOOR` counts as 0: a metric that is float rounding itself in one row (the KL of
    iteration 1, whose policy is the reference: ~1e-7 either side of 0) has no relative error."""
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b]
    worst = 0.0
    for a, b in zip(rows_a, rows_b):
        assert a.keys() == b.keys(), set(a) ^ set(b)
        for key, x in a.items():
            y = b[key]
            if key in ROUNDING_KEYS:
                assert abs(x) < 1e-5 and abs(y) < 1e-5, (key, x, y)
                continue
            if x is None or y is None or (isinstance(x, float) and math.isnan(x)):
                assert x == y or (x is None) == (y is None), (key, x, y)
                continue
            if abs(x - y) >= ABS_FLOOR:
                worst = max(worst, abs(x - y) / max(abs(x), 1e-6))
    return worst


def max_weight_diff(dir_a, dir_b) -> float:
    """The largest absolute difference between the weights of two exported HF directories."""
    a = safetensors.torch.load_file(str(Path(dir_a) / "model.safetensors"))
    b = safetensors.torch.load_file(str(Path(dir_b) / "model.safetensors"))
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def two_nodes(stage: str, overrides: list[str], *, timeout: float = 240.0, wait: bool = True) -> list:
    """Two torchrun launchers on this machine as two nodes of one job (``--nnodes 2 --node-rank 0|1
    --nproc-per-node 1``, a c10d rendezvous on 127.0.0.1 at a free port; node 0 first): the
    launchers' Popens (``wait``: after both ended, with ``stdout``/``stderr`` read and ``wall_s``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}", "--nproc-per-node=1",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=fourfold-test",
               "-m", "fourfold.cli", stage, *overrides]
        procs.append(subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
        time.sleep(0.5)  # node 0's launcher hosts the rendezvous
    if not wait:
        return procs
    for proc in procs:
        proc.out, proc.err = proc.communicate(timeout=timeout)
        proc.wall_s = time.perf_counter() - t0
    return procs


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (Linux /proc)."""
    return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]


def kill_job(proc) -> list[int]:
    """SIGKILL a launcher and the ranks it started (each in a session of its own); their pids."""
    job = [proc.pid, *children(proc.pid)]
    for pid in job:
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    return job


def killed_after(stage: str, overrides: list[str], checkpoint: Path) -> None:
    """A ``torchrun --nproc-per-node 2`` job SIGKILLed as a whole (torchrun and both ranks) once
    ``checkpoint`` (a directory it writes) is complete."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "fourfold.cli",
           stage, *overrides]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 180
    while not checkpoint.is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert checkpoint.is_dir() and len(kill_job(proc)) == 3


def max_scaled_diff(rows_a: list[dict], rows_b: list[dict]) -> float:
    """The largest |a - b| / max(|a|, 1) over every metric of every row (relative above 1, absolute
    below: a KL or a loss near 0 is a difference of larger numbers)."""
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b]
    worst = 0.0
    for a, b in zip(rows_a, rows_b):
        assert a.keys() == b.keys(), set(a) ^ set(b)
        for key, x in a.items():
            if isinstance(x, float) and math.isnan(x):
                assert math.isnan(b[key]), key
            elif x is not None:
                worst = max(worst, abs(x - b[key]) / max(abs(x), 1.0))
    return worst


def max_tensor_diff(dir_a, dir_b, file: str = "model.safetensors") -> float:
    """The largest |a - b| / max(max |a|, 1) over the tensors of one safetensors file of two directories."""
    a = safetensors.torch.load_file(str(Path(dir_a) / file))
    b = safetensors.torch.load_file(str(Path(dir_b) / file))
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) / max(float(a[k].double().abs().max()), 1.0)
               for k in a)
