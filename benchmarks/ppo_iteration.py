"""PPO iterations on a synthetic workload; prints one JSON line.

Random-init models (policy, reference, critic and reward model all of one shape), random prompts,
responses of exactly --response-len tokens (EOS disabled). Runs the same functions as
``fourfold ppo`` (collect -> compute_advantages -> ppo_update), so the figures are the trainer's.

    python benchmarks/ppo_iteration.py                      # workload W of ../shared/reference/anchors.md
    python benchmarks/ppo_iteration.py --device cuda --precision bf16-mixed --hidden 896 --layers 24 \
        --heads 14 --intermediate 4864 --vocab 32000 --batch 64 --prompt-len 64 --response-len 128 --minibatch 16

Precision (``--precision``): ``fp32`` everywhere; ``bf16`` = every model's weights, gradients and
AdamW state in bf16 (fast, not how one should train); ``bf16-mixed`` = the trained roles (policy,
critic) keep fp32 master weights and AdamW state and compute under bf16 autocast, the frozen roles
(reference, reward model) hold bf16 weights (the standard recipe on GPUs).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import resource
import statistics
import sys
import time
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="llama", choices=["llama"])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default 4 x hidden)")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--batch", type=int, default=32, help="prompts per iteration")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--response-len", type=int, default=32)
    p.add_argument("--ppo-epochs", type=int, default=4)
    p.add_argument("--minibatch", type=int, default=8)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="iterations excluded from the median")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default=None, choices=["fp32", "bf16", "bf16-mixed"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="older spelling: bfloat16 = --precision bf16")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--concurrent", action="store_true",
                   help="critic epochs in a second thread beside the policy's (run.concurrent_roles)")
    args = p.parse_args(argv)
    if args.precision is None:
        args.precision = "bf16" if args.dtype == "bfloat16" else "fp32"

    import contextlib

    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()

    from fourfold.config import GenerationConfig, PPOAlgoConfig
    from fourfold.models.factory import llama_config, random_causal_lm, random_scalar_model
    from fourfold.models.roles import FrozenReference, ModelReward, ScalarModel
    from fourfold.rollout.noise import RowNoise
    from fourfold.trainers.common import NonFiniteGuard, seed_everything
    from fourfold.trainers.lm import Roles, collect
    from fourfold.trainers.ppo import compute_advantages, make_optim, ppo_update

    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32  # trained roles
    frozen_dtype = torch.float32 if args.precision == "fp32" else torch.bfloat16  # reference, reward

    def autocast(cache: bool = True):
        """bf16 autocast for bf16-mixed. The cast cache lives as long as the autocast region: fine
        for generation and scoring (weights fixed), wrong across optimizer steps (every forward
        after the first step would reuse bf16 copies of the old weights), so training turns it off."""
        if args.precision != "bf16-mixed":
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=cache)

    seed_everything(0)
    cfg = llama_config(args.vocab, args.hidden, args.layers, args.heads, args.intermediate,
                       max_positions=args.prompt_len + args.response_len + 8, pad_token_id=0, eos_token_id=1)
    policy = random_causal_lm(cfg, seed=0, dtype=dtype).to(device)
    reference = FrozenReference(copy.deepcopy(policy).to(frozen_dtype))
    critic = ScalarModel(random_scalar_model(cfg, seed=1, dtype=dtype).to(device))
    reward_model = ScalarModel(copy.deepcopy(critic.hf).to(frozen_dtype))
    roles = Roles(SimpleNamespace(eos_token_id=1, pad_token_id=0), policy, reference, ModelReward(reward_model), critic, reward_model)
    algo = PPOAlgoConfig(iterations=args.iterations, rollout_batch_size=args.batch, minibatch_size=args.minibatch,
                         ppo_epochs=args.ppo_epochs, lr=1e-5, critic_lr=1e-5)
    algo.validate()
    gen = GenerationConfig(max_new_tokens=args.response_len, temperature=args.temperature, stop_at_eos=False)
    opt = make_optim(roles, algo)
    guard = NonFiniteGuard(limit=10**9)
    prompts = torch.randint(2, args.vocab, (args.batch, args.prompt_len), device=device)
    prompt_mask = torch.ones_like(prompts)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    rows = []
    for it in range(args.iterations):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        with autocast():
            col = collect(roles, [""] * args.batch, prompts, prompt_mask, gen, kl_coef=algo.kl_coef,
                          concurrent=args.concurrent, noise=RowNoise(0, it + 1))  # the trainer's sampling
        rollout = compute_advantages(col.rollout, algo)
        if cuda:
            torch.cuda.synchronize(device)
        t1 = time.perf_counter()
        with autocast(cache=False):
            ppo_update(roles, rollout, algo, opt, gen.temperature, guard, it, concurrent=args.concurrent)
        if cuda:
            torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        rows.append({"s_iter": t2 - t0, "s_generate": col.metrics["time/generate_s"],
                     "s_score": col.metrics["time/score_s"], "s_train": t2 - t1,
                     "tokens": col.metrics["rollout/tokens"]})
    timed = rows[args.warmup:] or rows
    med = lambda k: statistics.median(r[k] for r in timed)  # noqa: E731
    if cuda:
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    gen_tokens = args.batch * args.response_len
    train_tokens = args.ppo_epochs * args.batch * (args.prompt_len + args.response_len)
    result = {
        "benchmark": "ppo_iteration",
        "s_per_iter": round(med("s_iter"), 4),
        "s_generate": round(med("s_generate"), 4),
        "s_score": round(med("s_score"), 4),
        "s_train": round(med("s_train"), 4),
        "gen_tokens_per_s": round(gen_tokens / med("s_generate"), 1),
        "train_tokens_per_s": round(train_tokens / med("s_train"), 1),
        "peak_mem_mib": round(peak, 1),
        "peak_mem_kind": "cuda_max_allocated" if cuda else "rss",
        "iterations_timed": len(timed),
        "workload": {k: getattr(args, k) for k in ("arch", "hidden", "layers", "heads", "intermediate", "vocab", "batch",
                                                    "prompt_len", "response_len", "ppo_epochs", "minibatch", "precision", "device",
                                                    "temperature", "concurrent")}
                    | {"optimizer_steps_per_iter": algo.steps_per_iteration, "threads": torch.get_num_threads(),
                       "params_per_model_m": round(sum(p.numel() for p in policy.parameters()) / 1e6, 2)},
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
