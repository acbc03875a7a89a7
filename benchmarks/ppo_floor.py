"""The floor under one PPO iteration on this machine; prints one JSON line.

Same four models and the same optimizer steps as ``ppo_iteration.py`` (workload W by default), with
none of PPO around them: 16 optimizer steps of a plain forward + backward + AdamW for the policy and
for the critic on minibatches of the iteration's shape, plus the three no-grad scoring passes
(reference, reward model, critic) over the whole rollout. Generation is left out (it is a few
percent of an iteration). Whatever a PPO implementation does, it cannot do these in less time, so
``s_floor`` bounds how fast an iteration can be here; ``gemm_gflops`` says how close that floor is to
the machine's matrix-multiply peak, and the ``rss_*`` figures what memory is taken before any PPO
state exists (the interpreter with torch, then with transformers, then with the four models and two
optimizers).

    python benchmarks/ppo_floor.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def gemm_gflops(torch, n: int = 1024, seconds: float = 1.0) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=None)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--response-len", type=int, default=32)
    p.add_argument("--ppo-epochs", type=int, default=4)
    p.add_argument("--minibatch", type=int, default=8)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)

    rss = {"rss_python_mib": rss_mib()}
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rss["rss_torch_mib"] = rss_mib()
    import transformers  # noqa: F401  (what importing it costs, before any model exists)

    from fourfold.models.factory import llama_config, random_causal_lm, random_scalar_model

    transformers.utils.logging.set_verbosity_error()
    rss["rss_transformers_mib"] = rss_mib()

    L, T = args.prompt_len + args.response_len, args.response_len
    cfg = llama_config(args.vocab, args.hidden, args.layers, args.heads, args.intermediate, max_positions=L + 8,
                       pad_token_id=0, eos_token_id=1)
    policy, reference = random_causal_lm(cfg, seed=0), random_causal_lm(cfg, seed=0)
    critic, reward = random_scalar_model(cfg, seed=1), random_scalar_model(cfg, seed=1)
    for m in (policy, reference, critic, reward):
        m.eval()  # dropout off, as in the trainer
    reference.requires_grad_(False)
    reward.requires_grad_(False)
    popt = torch.optim.AdamW(policy.parameters(), lr=1e-5, fused=True)
    copt = torch.optim.AdamW(critic.parameters(), lr=1e-5, fused=True)
    rss["rss_models_mib"] = rss_mib()

    ids = torch.randint(2, args.vocab, (args.batch, L))
    mask = torch.ones_like(ids)
    steps = args.ppo_epochs * (args.batch // args.minibatch)

    def score() -> None:
        with torch.no_grad():
            reference(input_ids=ids, attention_mask=mask, logits_to_keep=T + 1)
            for scalar in (reward, critic):  # backbone + head at every position, as the trainer's roles
                scalar.score(scalar.base_model(input_ids=ids, attention_mask=mask).last_hidden_state)

    def train() -> None:
        for s in range(steps):
            rows = slice((s * args.minibatch) % args.batch, (s * args.minibatch) % args.batch + args.minibatch)
            logits = policy(input_ids=ids[rows], attention_mask=mask[rows], logits_to_keep=T + 1).logits
            logits.float().logsumexp(-1).mean().backward()
            popt.step()
            popt.zero_grad(set_to_none=True)
            hidden = critic.base_model(input_ids=ids[rows], attention_mask=mask[rows]).last_hidden_state
            critic.score(hidden[:, -T - 1:]).square().mean().backward()
            copt.step()
            copt.zero_grad(set_to_none=True)

    times = []
    for _ in range(args.iterations):
        t0 = time.perf_counter()
        score()
        t1 = time.perf_counter()
        train()
        times.append((t1 - t0, time.perf_counter() - t1))
    timed = times[1:] or times
    s_score = statistics.median(t[0] for t in timed)
    s_train = statistics.median(t[1] for t in timed)
    n_params = sum(p.numel() for p in policy.model.layers.parameters())  # matmul weights per token
    # forward 2 flops per weight per token; backward twice the forward; LM head only at T positions
    head = args.vocab * args.hidden
    flops_train = steps * 2 * (3 * 2 * n_params * args.minibatch * L + 3 * 2 * head * args.minibatch * T)
    flops_score = 3 * 2 * n_params * args.batch * L
    gflops = (flops_train + flops_score) / 1e9
    result = {
        "benchmark": "ppo_floor",
        "s_floor": round(s_score + s_train, 4),
        "s_score": round(s_score, 4),
        "s_train": round(s_train, 4),
        "gflop_per_iter": round(gflops, 1),
        "achieved_gflops": round(gflops / (s_score + s_train), 1),
        "gemm_gflops": round(gemm_gflops(torch), 1),
        **{k: round(v, 1) for k, v in rss.items()},
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),  # KiB on Linux
        "workload": {**{k: getattr(args, k) for k in ("hidden", "layers", "heads", "vocab", "batch", "prompt_len",
                                                        "response_len", "ppo_epochs", "minibatch")},
                     "optimizer_steps_per_iter": 2 * steps, "threads": torch.get_num_threads()},
        "torch": torch.__version__,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
