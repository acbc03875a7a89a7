"""PPO's training step (the epochs of one iteration: policy and critic) on the demo's shapes, eager
or with the training-step levers; prints one JSON line.

The demo's policy and critic (a Llama of hidden 128, 2 layers, 4 heads over its 282-word
vocabulary), a synthetic rollout of 64 responses of 10-40 tokens after prompts of 4-16 (left-padded),
minibatch 16, 4 epochs: 16 optimizer steps per model per iteration, through ``ppo_update``, the
function ``fourfold ppo`` runs. ``--mode``: ``eager``; ``tokens`` (``ppo.micro_batch_tokens``);
``compiled`` (``model.compile``); ``compiled-tokens`` (both). Reported apart: the first iteration
(with compile) and the steady state (median of the rest).

    python benchmarks/train_step.py --mode eager --threads 1
    python benchmarks/train_step.py --mode compiled --threads 1 --iterations 8
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
from types import SimpleNamespace


def synthetic_rollout(args, generator):
    """A GAE-ready rollout: left-padded prompts, right-padded responses of random lengths."""
    import torch

    from fourfold.core import Rollout

    B, P, T, V = args.batch, args.prompt_len, args.response_len, args.vocab
    prompt_len = torch.randint(4, P + 1, (B,), generator=generator)
    response_len = torch.randint(10, T + 1, (B,), generator=generator)
    cols = torch.arange(P + T)[None, :]
    attn = ((cols >= P - prompt_len[:, None]) & (cols < P + response_len[:, None])).long()
    ids = torch.randint(3, V, (B, P + T), generator=generator) * attn
    mask = attn[:, P:].float()
    noise = torch.randn(B, T, generator=generator)
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), response_len - 1] = torch.randn(B, generator=generator)
    return Rollout(actions=ids[:, P:], mask=mask, logprobs=(-2.0 - noise.abs()) * mask, values=0.1 * noise * mask,
                   rewards=rewards, ref_logprobs=(-2.0 - noise.abs()) * mask, scores=rewards.sum(1),
                   context={"input_ids": ids, "attention_mask": attn})


MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_weight_int8pack_mm", "mkldnn::_linear_pointwise")


def matmul_share(profiler) -> dict:
    """The profiled update's self CPU time in ms: all operators, the matrix products (what compile
    cannot shrink: the floor of any fusion) and their share."""
    events = profiler.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / 1000
    mm = sum(e.self_cpu_time_total for e in events if e.key in MATMULS) / 1000
    return {"self_cpu_ms": round(total, 1), "matmul_ms": round(mm, 1), "matmul_share": round(mm / total, 3) if total else None}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["eager", "tokens", "compiled", "compiled-tokens"], default="eager")
    p.add_argument("--iterations", type=int, default=6, help="PPO updates timed (the first apart)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokens", type=int, default=256, help="ppo.micro_batch_tokens of the tokens modes")
    p.add_argument("--vocab", type=int, default=282)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--response-len", type=int, default=40)
    p.add_argument("--profile", action="store_true",
                   help="torch.profiler over the last update: the top operators by self CPU time on stderr, "
                        "the matrix products' share in the JSON line")
    args = p.parse_args(argv)

    import torch

    from fourfold.config import PPOAlgoConfig
    from fourfold.models.build import Roles
    from fourfold.models.factory import llama_config, random_causal_lm, random_scalar_model
    from fourfold.models.roles import ScalarModel
    from fourfold.run.optim import NonFiniteGuard
    from fourfold.trainers.ppo import compute_advantages, make_optim, ppo_update

    torch.set_num_threads(args.threads)
    cfg = llama_config(args.vocab, hidden=128, layers=2, heads=4, max_positions=64, pad_token_id=0, eos_token_id=1)
    policy, critic = random_causal_lm(cfg, seed=0), ScalarModel(random_scalar_model(cfg, seed=1))
    roles = Roles(SimpleNamespace(eos_token_id=1, pad_token_id=0), policy=policy, critic=critic)
    tokens = args.tokens if args.mode.endswith("tokens") else None
    algo = PPOAlgoConfig(iterations=args.iterations, rollout_batch_size=args.batch, minibatch_size=16, lr=1e-4,
                         critic_lr=1e-4, micro_batch_tokens=tokens)
    opt = make_optim(roles, algo, compiled=args.mode.startswith("compiled"))
    rollout = compute_advantages(synthetic_rollout(args, torch.Generator().manual_seed(0)), algo)
    torch.manual_seed(0)
    seconds, profiler = [], None
    for it in range(1, args.iterations + 1):
        if args.profile and it == args.iterations:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            profiler.__enter__()
        t0 = time.perf_counter()
        ppo_update(roles, rollout, algo, opt, 1.0, NonFiniteGuard(limit=10**9), it)
        seconds.append(time.perf_counter() - t0)
    if profiler is not None:
        profiler.__exit__(None, None, None)
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), file=sys.stderr)
    steady = statistics.median(seconds[1:]) if len(seconds) > 1 else float("nan")
    steps = 2 * algo.steps_per_iteration  # policy and critic
    result = {"benchmark": "train_step", "mode": args.mode, "threads": args.threads, "micro_batch_tokens": tokens,
              "first_update_s": round(seconds[0], 3), "steady_update_s": round(steady, 4),
              "steady_ms_per_step": round(1000 * steady / steps, 2), "updates": len(seconds),
              "rollout_tokens": int(rollout.context["attention_mask"].sum()),
              "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
              "torch": torch.__version__, "machine": platform.machine(), "python": platform.python_version()}
    if profiler is not None:
        result["profile"] = matmul_share(profiler)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
