"""The sampler running ahead against the synchronous run (issue 42, item 4); prints one JSON line.

``fourfold ppo`` itself (``fourfold.trainers.ppo.train``) on workload W of
../shared/reference/anchors.md (policy and reward model Llamas of hidden 256, 4 layers, a 512-word
vocabulary; the critic from the reward model, the reference from the policy; 32 prompts x 16
tokens, 32 new tokens with EOS off, 4 epochs, minibatch 8, fp32), three configurations, each in
a fresh process (its own peak memory):

* ``k0``: ``rollout.max_staleness: 0`` (synchronous), ``run.threads`` 2: today's run, both cores
  on every phase;
* ``k1``, ``k2``: ``rollout.max_staleness`` 1 and 2, ``run.threads`` 1: the sampler's thread and
  the trainer's one torch thread each, generating the next batch while the update runs.

Per configuration: ``s_first_iteration`` (the first iteration apart: warm-up, and at k >= 1 the
first batch cannot overlap anything), the steady state over the iterations after ``--warmup``
(``s_per_iteration``: median ``time/iteration_s``; ``gen_tokens_per_s``: generated tokens over the
steady iterations' wall-clock), where the time goes (medians of ``time/generate_s``, the
sampler's own time at k >= 1, overlapped with the update; ``time/score_s``, ``time/train_s``,
``time/sampler_wait_s``: what the trainer waited for the sampler, null at k0), ``version_lag`` (per
iteration: 0 at k0, min(i - 1, k) else), ``s_wall`` (the whole
``train`` call: loading, the loop, the export) and ``peak_mem_mib`` (the process's ``ru_maxrss``;
on CUDA also ``peak_cuda_mib``, ``torch.cuda.max_memory_allocated``). ``speedup_k1``, ``speedup_k2``:
k0's steady s/iteration over theirs.

    python benchmarks/async.py                 # workload W on this machine's CPU (the real measurement)
    python benchmarks/async.py --tiny          # a tiny model, 3 iterations: proves it runs (seconds)
    python benchmarks/async.py --device cuda --precision bf16-mixed --hidden 896 --layers 24 --heads 14 \\
        --intermediate 4864 --vocab 32000 --batch 64 --prompt-len 64 --response-len 128 --minibatch 16  # G
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONFIGS = (("k0", 0, 2), ("k1", 1, 1), ("k2", 2, 1))
"""(name, rollout.max_staleness, run.threads) of each configuration, in the order they run."""


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="a tiny model and 3 iterations: proves the benchmark runs")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default 4 x hidden)")
    p.add_argument("--vocab", type=int, default=512, help="words of the tokenizer")
    p.add_argument("--batch", type=int, default=32, help="prompts (= responses) per iteration")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--response-len", type=int, default=32)
    p.add_argument("--ppo-epochs", type=int, default=4)
    p.add_argument("--minibatch", type=int, default=8)
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2, help="iterations excluded from the steady state")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "bf16-mixed"])
    p.add_argument("--threads", type=int, default=2, help="k0's run.threads (k >= 1: one per thread)")
    p.add_argument("--configs", default=",".join(c[0] for c in CONFIGS), help="which of k0,k1,k2 to run")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: one configuration, in its process
    args = p.parse_args(argv)
    if args.tiny:
        args.hidden, args.layers, args.heads, args.vocab = 32, 2, 4, 40
        args.batch, args.prompt_len, args.response_len, args.minibatch, args.ppo_epochs = 8, 4, 6, 4, 2
        args.iterations, args.warmup = 3, 1
    if args.iterations <= args.warmup:
        p.error(f"--iterations ({args.iterations}) must be more than --warmup ({args.warmup})")
    return args


def build_workload(args, root: Path) -> None:
    """``root/sft`` (the policy), ``root/rm`` (the reward model) and ``root/prompts.jsonl``."""
    from fourfold.models.factory import llama_config, random_causal_lm, random_scalar_model
    from fourfold.tasks.tokenizer import build_word_tokenizer

    words = [f"w{i}" for i in range(args.vocab)]
    tok = build_word_tokenizer(words)
    cfg = llama_config(len(tok), args.hidden, args.layers, args.heads, args.intermediate,
                       max_positions=args.prompt_len + args.response_len + 16, pad_token_id=tok.pad_token_id,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    for name, model in (("sft", random_causal_lm(cfg, seed=0)), ("rm", random_scalar_model(cfg, seed=1))):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    rng = random.Random(0)
    with open(root / "prompts.jsonl", "w") as f:
        for _ in range(args.batch * 4):
            f.write(json.dumps({"prompt": " ".join(rng.choice(words) for _ in range(args.prompt_len))}) + "\n")


def overrides(args, root: Path, out: Path, k: int, threads: int) -> list[str]:
    over = {"model.policy": root / "sft", "model.reward": root / "rm", "model.critic_init": "reward",
            "model.precision": args.precision, "data.prompts": root / "prompts.jsonl",
            "data.max_prompt_len": args.prompt_len + 4, "generation.max_new_tokens": args.response_len,
            "generation.stop_at_eos": "false", "generation.temperature": 0.7, "run.output_dir": out,
            "run.device": args.device, "run.threads": threads, "run.seed": 0, "run.progress": "false",
            "run.tensorboard": "false", "run.save_every": 0, "rollout.max_staleness": k,
            "ppo.iterations": args.iterations, "ppo.rollout_batch_size": args.batch,
            "ppo.minibatch_size": args.minibatch, "ppo.ppo_epochs": args.ppo_epochs}
    return [f"{key}={v}" for key, v in over.items()]


def child(args) -> dict:
    """One configuration in this process: ``fourfold ppo`` on the workload, its figures."""
    import torch

    from fourfold.config import PPOConfig, load_config
    from fourfold.reporting import read_metrics
    from fourfold.trainers.ppo import train

    name, root = args.child.split(":", 1)
    _, k, threads = next(c for c in CONFIGS if c[0] == name)
    root = Path(root)
    out = root / f"run-{name}"
    cfg = load_config(PPOConfig, None, overrides(args, root, out, k, threads))
    t0 = time.perf_counter()
    train(cfg)
    wall = time.perf_counter() - t0
    rows = read_metrics(out / "metrics.jsonl")
    steady = rows[args.warmup:]
    med = lambda key: round(statistics.median(r.get(key, 0.0) for r in steady), 4)
    fig = {"config": name, "max_staleness": k, "threads": threads,
           "s_first_iteration": round(rows[0]["time/iteration_s"], 4), "s_per_iteration": med("time/iteration_s"),
           "gen_tokens_per_s": round(sum(r["rollout/tokens"] for r in steady)
                                     / sum(r["time/iteration_s"] for r in steady), 1),
           "s_generate": med("time/generate_s"), "s_score": med("time/score_s"), "s_train": med("time/train_s"),
           "s_sampler_wait": med("time/sampler_wait_s") if k else None, "s_wall": round(wall, 2),
           "version_lag": [r.get("rollout/version_lag", 0.0) for r in rows],
           "peak_mem_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if torch.cuda.is_available() and args.device.startswith("cuda"):
        fig["peak_cuda_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return fig


def main(argv=None) -> None:
    args = parse(argv)
    if args.child is not None:
        print(json.dumps(child(args)), flush=True)
        return
    wanted = args.configs.split(",")
    with tempfile.TemporaryDirectory(prefix="fourfold-async-") as tmp:
        root = Path(tmp)
        build_workload(args, root)
        passed = list(argv if argv is not None else sys.argv[1:])
        runs = {}
        for name, _, _ in CONFIGS:
            if name not in wanted:
                continue
            proc = subprocess.run([sys.executable, __file__, *passed, "--child", f"{name}:{root}"],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr[-3000:])
                raise SystemExit(f"async.py: configuration {name} failed (exit {proc.returncode})")
            runs[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    base = runs.get("k0", {}).get("s_per_iteration")
    line = {"benchmark": "async", "workload": "tiny" if args.tiny else "W" if args.hidden == 256 else "custom",
            "device": args.device, "precision": args.precision, "iterations": args.iterations, "warmup": args.warmup,
            "machine": f"{platform.machine()} {os.cpu_count()} cpus", "runs": list(runs.values())}
    for name in ("k1", "k2"):
        if base and name in runs:
            line[f"speedup_{name}"] = round(base / runs[name]["s_per_iteration"], 3)
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
