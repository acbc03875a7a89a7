"""Multi-turn rollout against a single turn of the same total tokens, on each engine; prints one JSON line.

A random-init Llama policy (default: the demo's hidden 128, 2 layers, 4 heads, 282-word vocabulary),
``--batch`` rows with ``--prompt-len`` prompt tokens. Multi-turn: ``--turns`` policy turns of
exactly ``--turn-len`` tokens (EOS off) with an environment answering ``--obs-len`` tokens after each
turn but the last (``fourfold.rollout.turns.sample_turns`` with the engine: one KV cache kept across
turns, each observation prefilled in one chunk). Single turn: the same engine's plain rollout of
``turns * turn_len + (turns - 1) * obs_len`` tokens, the same trajectory length.

``--engines`` (default ``eager,static``): ``eager`` (the growing cache) and ``static`` (the
preallocated cache, env.max_tokens + 1 slots for the turns; its one-token step compiled unless
``--no-compile``). Per engine: the median seconds of ``--repeats`` rollouts of each (interleaved,
after the first call and ``--warmup`` more), ``*_tokens_per_s`` (rows x trajectory tokens after the
prompt / seconds), ``slowdown`` = single-turn tokens/s over multi-turn tokens/s (issue 31's
target: at most 1.3), and apart from the steady state the first call's seconds and
``compile_*_s`` = first call minus the median (what compiling the static step costs; about 0 for
eager).

    python benchmarks/turns.py --threads 1
    python benchmarks/turns.py --threads 1 --engines static --no-compile
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
    p.add_argument("--engines", default="eager,static", help="comma-separated: eager, static")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="compile the static engine's one-token step (generation.compile)")
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
    from fourfold.rollout.eager import EagerEngine
    from fourfold.rollout.noise import RowNoise
    from fourfold.rollout.static import StaticEngine
    from fourfold.rollout.turns import TurnSettings, sample_turns

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for name in engines:
        if name not in ("eager", "static"):
            raise SystemExit(f"--engines: {name!r}: expected eager or static")
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
    tokens = args.batch * traj_len

    def make(name):
        # one engine per rollout kind: each keeps its own cache (and compiled step) across calls
        return EagerEngine() if name == "eager" else StaticEngine(compile=args.compile)

    def timed(fn) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    results = {}
    for name in engines:
        multi_engine, single_engine = make(name), make(name)

        def multi(engine=multi_engine):
            return sample_turns(model, envs, first.tolist(), settings, lambda obs, where, after_eos: obs_ids, noise=noise,
                                device=device, engine=engine)

        def single(engine=single_engine):
            return engine(model, first.to(device), torch.ones_like(first).to(device), max_new_tokens=traj_len,
                                 pad_token_id=0, noise=noise)

        first_multi = timed(multi)
        out = multi()
        assert int(out.samples.attention_mask[:, args.prompt_len:].sum()) == tokens
        first_single = timed(single)
        for _ in range(args.warmup):
            multi(), single()
        times = {"multi": [], "single": []}
        for _ in range(args.repeats):
            times["multi"].append(timed(multi))
            times["single"].append(timed(single))
        s_multi, s_single = statistics.median(times["multi"]), statistics.median(times["single"])
        results[name] = {
            "multi_turn_s": s_multi, "single_turn_s": s_single,
            "multi_tokens_per_s": tokens / s_multi, "single_tokens_per_s": tokens / s_single,
            "slowdown": (tokens / s_single) / (tokens / s_multi),
            "first_multi_s": first_multi, "first_single_s": first_single,
            "compile_multi_s": max(first_multi - s_multi, 0.0), "compile_single_s": max(first_single - s_single, 0.0),
            "compiled": name == "static" and args.compile,
        }
        if name == "static":
            results[name]["cache_positions"] = {"multi": multi_engine.cache_positions, "single": single_engine.cache_positions}
    print(json.dumps({
        "engines": results,
        "workload": {"hidden": args.hidden, "layers": args.layers, "heads": args.heads, "vocab": args.vocab,
                     "batch": args.batch, "prompt_len": args.prompt_len, "turns": args.turns, "turn_len": args.turn_len,
                     "obs_len": args.obs_len, "trajectory_tokens": traj_len, "repeats": args.repeats,
                     "warmup": args.warmup, "device": args.device, "threads": torch.get_num_threads(),
                     "torch": torch.__version__, "machine": platform.processor() or platform.machine()},
    }))


if __name__ == "__main__":
    main()
