"""Multi-turn rollout against a single turn of the same total tokens (eager path); prints one JSON line.

A random-init Llama policy (default: the demo's hidden 128, 2 layers, 4 heads, 282-word vocabulary),
``--batch`` rows with ``--prompt-len`` prompt tokens. Multi-turn: ``--turns`` policy turns of
exactly ``--turn-len`` tokens (EOS off) with an environment answering ``--obs-len`` tokens after each
turn but the last (``fourfold.rollout.turns.sample_turns``: one KV cache kept across turns, each
observation prefilled in one chunk). Single turn: ``fourfold.rollout.eager.sample`` of
``turns * turn_len + (turns - 1) * obs_len`` tokens, the same trajectory length. Reported: the median
seconds of ``--repeats`` rollouts of each (interleaved, after ``--warmup``), ``*_tokens_per_s`` (rows x
trajectory tokens after the prompt / seconds), and ``slowdown`` = single-turn tokens/s over multi-turn
tokens/s (issue 31's target: at most 1.3).

    python benchmarks/turns.py --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=282)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--turn-len", type=int, default=16)
    p.add_argument("--obs-len", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    return p.parse_args(argv)


class _Answer:
    """Answers every turn with the same ``obs`` ids (as text through ``encode_next``); never done."""

    def __init__(self, where: str):
        self.where = where

    def step(self, action: str, turn: int = 0):
        return "obs", 0.0, False


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    from fourfold.models.factory import llama_config, random_causal_lm
    from fourfold.rollout.eager import sample
    from fourfold.rollout.noise import RowNoise
    from fourfold.rollout.turns import TurnSettings, sample_turns

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = llama_config(args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads,
                       max_positions=4 * (args.prompt_len + args.turns * (args.turn_len + args.obs_len)),
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = random_causal_lm(cfg, seed=0).to(device).eval()
    g = torch.Generator().manual_seed(0)
    first = torch.randint(3, args.vocab, (args.batch, args.prompt_len), generator=g)
    obs_ids = torch.randint(3, args.vocab, (args.obs_len,), generator=g).tolist()
    traj_len = args.turns * args.turn_len + (args.turns - 1) * args.obs_len
    noise = RowNoise(0, 0).uniforms(range(args.batch), traj_len)
    settings = TurnSettings(max_turns=args.turns, max_tokens=args.prompt_len + traj_len + 1, max_new_tokens=args.turn_len,
                            decode=lambda ids: "", pad_token_id=0)
    envs = [_Answer(f"row {i}") for i in range(args.batch)]

    def multi():
        return sample_turns(model, envs, first.tolist(), settings, lambda obs, where, after_eos: obs_ids, noise=noise, device=device)

    def single():
        return sample(model, first.to(device), torch.ones_like(first).to(device), max_new_tokens=traj_len,
                      pad_token_id=0, noise=noise)

    def timed(fn) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    out = multi()
    assert int(out.samples.attention_mask[:, args.prompt_len:].sum()) == args.batch * traj_len
    for _ in range(args.warmup):
        multi(), single()
    times = {"multi": [], "single": []}
    for _ in range(args.repeats):
        times["multi"].append(timed(multi))
        times["single"].append(timed(single))
    s_multi, s_single = statistics.median(times["multi"]), statistics.median(times["single"])
    tokens = args.batch * traj_len
    print(json.dumps({
        "multi_turn_s": s_multi, "single_turn_s": s_single,
        "multi_tokens_per_s": tokens / s_multi, "single_tokens_per_s": tokens / s_single,
        "slowdown": (tokens / s_single) / (tokens / s_multi),
        "workload": {"hidden": args.hidden, "layers": args.layers, "heads": args.heads, "vocab": args.vocab,
                     "batch": args.batch, "prompt_len": args.prompt_len, "turns": args.turns, "turn_len": args.turn_len,
                     "obs_len": args.obs_len, "trajectory_tokens": traj_len, "repeats": args.repeats,
                     "device": args.device, "threads": torch.get_num_threads(), "torch": torch.__version__,
                     "machine": platform.processor() or platform.machine()},
    }))


if __name__ == "__main__":
    main()
