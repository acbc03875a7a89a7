"""The rollout engines side by side on one decode workload; prints one JSON line.

A random-init Llama policy (by default the demo's: hidden 128, 2 layers, 4 heads, the review
task's 282-word vocabulary), ``--batch`` left-padded prompts of ``--prompt-len`` tokens, responses
of exactly ``--response-len`` tokens (EOS disabled: every engine does the same work), the trainer's
per-row noise. Each engine is built as the trainers build it (``fourfold.rollout.engine.make_engine``
from a ``GenerationConfig``), synced with the policy, and called as ``collect`` calls it (inside the
``bf16-mixed`` autocast region when ``--precision bf16-mixed``):

* ``eager``: ``generation.engine: eager``, the policy's own weights (``weights: live``);
* ``static``: ``engine: static``, ``weights: --static-weights`` (default ``copy``);
* ``static-compiled``: the same with ``compile: true`` (CUDA graphs on CUDA, inductor on CPU).

Per engine: ``first_call_s`` (the first rollout: compile included), the median wall and process CPU
seconds of the ``--repeats`` rollouts after ``--warmup`` more (the engines' timed rollouts
interleaved, so a machine whose load changes treats them alike), ``tokens_per_s`` (rows x new tokens
over the median rollout), ``decode_tokens_per_s`` (the tokens after the first, over the rollout
minus the prompt's forward, measured apart: the one-token steps alone), ``compile_s`` (first call
minus a steady one), ``speedup_vs_eager``, the peak memory (CUDA: ``max_memory_allocated`` over
the engine's first and warm-up calls; CPU: the process's peak RSS so far, so run one engine per
process for its own) and whether
its tokens are the eager engine's (with the largest log-prob difference).

    python benchmarks/decode.py --threads 1                       # the demo's shapes, 64 rows x 40 tokens
    python benchmarks/decode.py --device cuda --precision bf16-mixed --hidden 896 --layers 24 --heads 14 \\
        --intermediate 4864 --vocab 32000 --prompt-len 64 --response-len 1024   # workload G, long responses
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ENGINES = ("eager", "static", "static-compiled")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default 4 x hidden)")
    p.add_argument("--vocab", type=int, default=282, help="the demo's review vocabulary by default")
    p.add_argument("--batch", type=int, default=64, help="rows sampled together")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--response-len", type=int, default=40)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    p.add_argument("--static-weights", default="copy", choices=["live", "copy"], help="generation.weights of the static engines")
    p.add_argument("--stop-check-every", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5, help="timed rollouts per engine (the median is reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rollouts after the first call")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "bf16-mixed"],
                   help="the policy's weights: fp32 (fp32, bf16-mixed: the static engines' copy is bf16 and the eager "
                        "engine runs under bf16 autocast) or bf16")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = p.parse_args(argv)
    args.engines = [e for e in args.engines.split(",") if e]
    unknown = set(args.engines) - set(ENGINES)
    if unknown:
        p.error(f"--engines: unknown {sorted(unknown)}; known: {', '.join(ENGINES)}")
    return args


def build(args, device):
    """(policy, prompt ids, prompt mask, noise): a random Llama and left-padded random prompts (the
    first quarter of the rows a quarter shorter)."""
    import torch

    from fourfold.models.factory import llama_config, random_causal_lm
    from fourfold.rollout.noise import RowNoise

    cfg = llama_config(args.vocab, args.hidden, args.layers, args.heads, args.intermediate,
                       max_positions=args.prompt_len + args.response_len + 8, pad_token_id=0, eos_token_id=1)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    policy = random_causal_lm(cfg, seed=0, dtype=dtype).to(device).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, args.vocab, (args.batch, args.prompt_len), generator=g)
    mask = torch.ones_like(ids)
    mask[: args.batch // 4, : args.prompt_len // 4] = 0
    noise = RowNoise(0, 1).uniforms(range(args.batch), args.response_len)
    return policy, (ids * mask).to(device), mask.to(device), noise


def make(name: str, args):
    """The engine ``name`` as the trainers build it from a generation config."""
    from fourfold.config import GenerationConfig
    from fourfold.rollout.engine import make_engine

    static = name != "eager"
    gen = GenerationConfig(max_new_tokens=args.response_len, temperature=args.temperature, stop_at_eos=False,
                           engine="static" if static else "eager", weights=args.static_weights if static else "live",
                           compile=name == "static-compiled", stop_check_every=args.stop_check_every)
    return make_engine(gen, precision=args.precision, max_prompt_len=args.prompt_len)


def timed(fn, device) -> tuple[float, float, object]:
    """(wall seconds, process CPU seconds, result) of ``fn()``, the device synchronised around it."""
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    sync()
    return time.perf_counter() - t0, time.process_time() - c0, out


class Contender:
    """One engine under test: built and synced as the trainers do, called as ``collect`` calls it."""

    def __init__(self, name: str, args, policy, ids, mask, noise, device):
        self.name, self.args, self.policy, self.ids, self.mask, self.device = name, args, policy, ids, mask, device
        self.engine = make(name, args)
        self.engine.sync(policy)
        self.kw = dict(max_new_tokens=args.response_len, temperature=args.temperature, eos_token_id=None,
                       pad_token_id=0, noise=noise, sync_stop=False)
        self.runs: list[tuple[float, float]] = []
        self.prefills: list[float] = []

    def rollout(self):
        import torch

        from fourfold.models.levers import autocast_region

        with torch.no_grad(), autocast_region(self.args.precision, self.device.type):
            return self.engine(self.policy, self.ids, self.mask, **self.kw)

    def start(self) -> None:
        """The first call (a compiled step compiles here) and the warm-up calls, alone: the peak
        memory is this engine's (CUDA)."""
        import torch

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.first, _, self.samples = timed(self.rollout, self.device)
        for _ in range(self.args.warmup):
            self.rollout()
        self.peak = (torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda"
                     else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)

    def time_once(self) -> None:
        wall, cpu, _ = timed(self.rollout, self.device)
        self.runs.append((wall, cpu))
        self.prefills.append(timed(lambda: prefill_only(self.engine, self.policy, self.ids, self.mask, self.args),
                                   self.device)[0])

    def figures(self) -> dict:
        wall, cpu = statistics.median(r[0] for r in self.runs), statistics.median(r[1] for r in self.runs)
        prefill = statistics.median(self.prefills)
        B, T = self.args.batch, self.args.response_len
        return {"first_call_s": round(self.first, 4), "s_per_rollout": round(wall, 4), "cpu_s_per_rollout": round(cpu, 4),
                "s_prefill": round(prefill, 4), "tokens_per_s": round(B * T / wall, 1),
                "decode_tokens_per_s": round(B * (T - 1) / max(wall - prefill, 1e-9), 1),
                "compile_s": round(max(self.first - wall, 0.0), 3), "peak_mem_mib": round(self.peak / 2**20, 1)}


def prefill_only(engine, policy, ids, mask, args):
    """The prompt's forward alone, with the engine's weights, as both engines make it."""
    import torch

    from fourfold.models.levers import autocast_region
    from fourfold.rollout.sampling import prefill

    with torch.no_grad(), autocast_region(args.precision, ids.device.type), engine.weights.model(policy) as m:
        return prefill(m, ids, mask)


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    device = torch.device(args.device)
    policy, ids, mask, noise = build(args, device)
    contenders = [Contender(name, args, policy, ids, mask, noise, device) for name in args.engines]
    for c in contenders:
        c.start()
    for _ in range(args.repeats):  # interleaved: a machine whose load changes treats every engine alike
        for c in contenders:
            c.time_once()
    engines, reference = {}, contenders[0]
    for c in contenders:
        figures = c.figures()
        figures["same_tokens_as_" + reference.name] = bool(torch.equal(c.samples.sequences, reference.samples.sequences))
        figures["max_logprob_diff"] = float((c.samples.logprobs - reference.samples.logprobs).abs().max())
        engines[c.name] = figures
    if "eager" in engines:
        for figures in engines.values():
            figures["speedup_vs_eager"] = round(engines["eager"]["s_per_rollout"] / figures["s_per_rollout"], 3)
    result = {
        "benchmark": "decode", "engines": engines,
        "peak_mem_kind": "cuda_max_allocated per engine" if device.type == "cuda" else "process rss so far",
        "workload": {k: getattr(args, k) for k in ("hidden", "layers", "heads", "intermediate", "vocab", "batch",
                                                    "prompt_len", "response_len", "temperature", "precision", "device",
                                                    "static_weights", "stop_check_every", "repeats", "warmup")}
                    | {"threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                       "params_m": round(sum(p.numel() for p in policy.parameters()) / 1e6, 3)},
        "torch": torch.__version__, "python": platform.python_version(),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
