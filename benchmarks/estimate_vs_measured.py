"""The memory estimate beside the measured peak of PPO iterations; prints one JSON line.

The workload of ``ppo_iteration.py`` (random-init Llama-shaped policy, reference, critic and reward
model of one shape, random prompts, responses of exactly --response-len tokens), run through the
trainer's functions (collect -> compute_advantages -> ppo_update) for --iterations iterations; the
figures are those of the last one (AdamW state allocated). Beside them, what
``fourfold.models.estimate.memory`` predicts for the same settings.

* CPU: resident memory minus the framework baseline: the RSS after importing torch, transformers'
  Llama classes (transformers imports them lazily: ~100 MiB) and the trainer modules, and one
  iteration of a throwaway 1-layer workload (lazy imports, kernel and thread-pool set-up: ~20 MiB
  more), before the workload's models are built (``baseline_imports_mib``: the RSS before that).
  ``peak_mib`` is ``ru_maxrss`` (exact); the per-phase peaks come from sampling ``/proc/self/statm``
  every millisecond (a lower bound). Compare ``peak_mib``: freed memory mostly stays resident in
  the C heap, so from the second iteration on each phase starts at the previous one's high-water
  mark and the phases cannot be told apart in RSS. The estimate counts live tensors; the RSS adds
  the allocator's retention and fragmentation on top (W, fp32, 1 thread: predicted 180 MiB,
  measured 210-218 MiB in two runs).
* CUDA: ``torch.cuda.max_memory_allocated`` per phase (reset before each).

``--env``: an environment run (``env.factory`` set) through the trainer's functions for it
(collect_turns -> compute_advantages -> ppo_update, as ``fourfold ppo`` calls them): one toy
environment per row (:class:`FixedObservations`) whose first observation is ``--prompt-len``
tokens (BOS + words of a word-level tokenizer over the model's vocabulary) and whose every later
observation is ``--obs-len`` tokens, never done; turns of ``--response-len`` tokens (EOS off), so
every trajectory reaches ``--env-max-tokens`` (default: 3 turns and 2 observations after the
prompt). The estimate is the one of the same run's ``env.max_tokens`` (``Workload.env_max_tokens``,
eager engine); the JSON line adds an ``env`` object (its settings and the trajectory lengths
measured, min and max).

    python benchmarks/estimate_vs_measured.py                   # workload W, fp32 on CPU
    python benchmarks/estimate_vs_measured.py --hidden 512 --layers 8 --heads 8
    python benchmarks/estimate_vs_measured.py --env                             # W as an environment run
    python benchmarks/estimate_vs_measured.py --device cuda --precision bf16-mixed --hidden 896 --layers 24 \
        --heads 14 --intermediate 4864 --vocab 32000 --batch 64 --prompt-len 64 --response-len 128 --minibatch 16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import sys
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ppo_iteration.py builds the workload
from ppo_iteration import add_mode_args, allocator_env, apply_allocator  # noqa: E402

MiB = 1 << 20


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssSampler:
    """Highest RSS seen since the last reset(), sampled by a daemon thread every ``interval`` s."""

    def __init__(self, interval: float = 0.001):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes())

    def reset(self) -> None:
        self.peak = rss_bytes()

    def read(self) -> int:
        return max(self.peak, rss_bytes())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    p.add_argument("--micro-batch", type=int, default=None)
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "bf16-mixed"])
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--env", action="store_true", help="an environment run (collect_turns) of fixed-length observations")
    p.add_argument("--obs-len", type=int, default=8, help="--env: tokens of each later observation")
    p.add_argument("--env-max-tokens", type=int, default=None,
                   help="--env: env.max_tokens (default: prompt + 3 turns + 2 observations)")
    add_mode_args(p)  # --lora, --critic-mode, --reward-mode, --grad-ckpt, --frozen-dtype
    p.set_defaults(concurrent=False)
    args = p.parse_args(argv)
    if args.env and args.env_max_tokens is None:
        args.env_max_tokens = args.prompt_len + 3 * args.response_len + 2 * args.obs_len
    if not args.env:
        args.env_max_tokens = None  # single-turn: model_config's and estimate_of's lengths are P + T
    return args


class FixedObservations:
    """A toy environment: ``reset()`` is ``first`` (a text), every ``step()`` answers ``obs`` with
    reward 1.0 and is never done, so a trajectory ends at env.max_tokens (or env.max_turns)."""

    def __init__(self, first: str, obs: str):
        self.first, self.obs = first, obs

    def reset(self) -> str:
        return self.first

    def step(self, action: str):
        return self.obs, 1.0, False


def env_setup(args, roles):
    """(env config, environments maker, tokenizer) of ``--env``: a word-level tokenizer whose ids are
    the model's vocabulary (pad 0, BOS 1, EOS 2, unk 3, then words), the first observation BOS +
    ``prompt_len - 1`` words, each later one ``obs_len`` words."""
    from fourfold.config import EnvConfig
    from fourfold.rollout.env import BoundEnv
    from fourfold.tasks.tokenizer import build_word_tokenizer

    words = [f"w{i}" for i in range(4, args.vocab)]
    tok = build_word_tokenizer(words)
    if len(tok) != args.vocab or args.prompt_len < 2 or args.obs_len < 1:
        raise SystemExit("--env: needs --vocab > 4, --prompt-len >= 2 and --obs-len >= 1")
    first = " ".join(words[i % len(words)] for i in range(args.prompt_len - 1))
    obs = " ".join(words[-1 - i % len(words)] for i in range(args.obs_len))
    env = EnvConfig(factory="benchmark:FixedObservations", max_turns=args.env_max_tokens,
                    max_tokens=args.env_max_tokens, truncation="bootstrap")
    make = lambda: [BoundEnv(FixedObservations(first, obs), "FixedObservations", f"row {i}") for i in range(args.batch)]
    return env, make, tok


def build(args, device):
    """The roles (ppo_iteration.py's :func:`build_roles`), optimizers and algorithm settings of the
    synthetic workload."""
    from ppo_iteration import build_roles

    from fourfold.config import GenerationConfig, PPOAlgoConfig
    from fourfold.trainers.ppo import make_optim

    cfg, roles = build_roles(args, device)
    algo = PPOAlgoConfig(iterations=args.iterations, rollout_batch_size=args.batch, minibatch_size=args.minibatch,
                         micro_batch_size=args.micro_batch, ppo_epochs=args.ppo_epochs, lr=1e-5, critic_lr=1e-5)
    algo.validate()
    gen = GenerationConfig(max_new_tokens=args.response_len, temperature=args.temperature, stop_at_eos=False)
    return cfg, roles, algo, gen, make_optim(roles, algo)


def run_iterations(args, device, phase, lengths: list | None = None) -> object:
    """Build the workload and run its iterations; ``phase(name)`` is a context manager around the
    generation (collect + advantages; ``--env``: collect_turns + compute_advantages over the policy's tokens) and the training
    (ppo_update) of each; ``lengths`` gets the last iteration's row lengths. Returns the config."""
    import torch

    from fourfold.rollout.eager import EagerEngine
    from fourfold.rollout.noise import RowNoise
    from fourfold.run.optim import NonFiniteGuard
    from fourfold.trainers.env_rollouts import collect_turns
    from fourfold.trainers.ppo import compute_advantages, ppo_update
    from fourfold.trainers.rollouts import collect

    def autocast(cache: bool):
        # Training runs with the cast cache off: a cached bf16 copy would survive the optimizer step
        # and the next forward would use the old weights.
        if args.precision != "bf16-mixed":
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=cache)

    cfg, roles, algo, gen, opt = build(args, device)
    guard = NonFiniteGuard(limit=10**9)
    prompts = torch.randint(2, args.vocab, (args.batch, args.prompt_len), device=device)
    if args.env_max_tokens is not None:
        env, make_envs, tok = env_setup(args, roles)
        roles.tokenizer = tok
    for it in range(args.iterations):
        with phase("generate_peak_mib"), autocast(cache=True):
            if args.env_max_tokens is not None:  # EnvSource.collect's call, on the eager engine
                col = collect_turns(roles, make_envs, env, gen, kl_coef=algo.kl_coef, noise=RowNoise(0, it + 1),
                                    max_first_tokens=args.prompt_len, engine=EagerEngine())
                rollout = compute_advantages(col.rollout, algo, col.bootstrap)
            else:
                col = collect(roles, [""] * args.batch, prompts, torch.ones_like(prompts), gen, engine=EagerEngine(),
                              kl_coef=algo.kl_coef, noise=RowNoise(0, it + 1))  # the trainer's sampling
                rollout = compute_advantages(col.rollout, algo)
        if lengths is not None:
            lengths[:] = rollout.context["attention_mask"].sum(1).tolist()
        with phase("train_peak_mib"), autocast(cache=False):
            ppo_update(roles, rollout, algo, opt, gen.temperature, guard, it)
    return cfg


def predict(args, cfg) -> dict:
    """The estimate for the workload's settings, in MiB."""
    from ppo_iteration import estimate_of

    est = estimate_of(args, cfg, env_max_tokens=args.env_max_tokens)
    return {"generate_peak_mib": est.generate_peak_bytes / MiB, "train_peak_mib": est.train_peak_bytes / MiB,
            "peak_mib": est.peak_bytes / MiB}


def measure(args, device, lengths: list | None = None) -> tuple[dict, dict, object]:
    """(baselines, measured peaks above the baseline, the workload's config); sizes in MiB;
    ``lengths``: gets the last iteration's row lengths."""
    import torch

    cuda = device.type == "cuda"
    imports = rss_bytes()
    tiny = {"hidden": 32, "layers": 1, "heads": 2, "intermediate": None, "vocab": 64, "batch": 4, "prompt_len": 4,
            "response_len": 4, "minibatch": 2, "micro_batch": None, "iterations": 1}
    if args.env:  # the environment path's imports and set-up belong to the baseline too
        tiny |= {"obs_len": 2, "env_max_tokens": 4 + 4 + 2 + 4}
    run_iterations(argparse.Namespace(**{**vars(args), **tiny}), device, lambda name: contextlib.nullcontext())
    baseline = torch.cuda.memory_allocated(device) if cuda else rss_bytes()
    sampler = None if cuda else RssSampler()
    measured = {}

    @contextlib.contextmanager
    def phase(name):
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        else:
            sampler.reset()
        yield
        if cuda:
            torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) if cuda else sampler.read()
        measured[name] = (peak - baseline) / MiB  # the last iteration's

    cfg = run_iterations(args, device, phase, lengths)
    if cuda:
        measured["peak_mib"] = max(measured.values())
    else:
        sampler.close()
        measured["peak_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline) / MiB
    return {"baseline_imports_mib": imports / MiB, "baseline_mib": baseline / MiB}, measured, cfg


def main(argv=None) -> dict:
    args = parse(argv)
    apply_allocator(args)  # before the baseline is measured: it is part of the process's set-up
    import torch
    from transformers.utils import logging as hf_logging

    import fourfold.trainers.ppo  # noqa: F401  (the trainer modules belong to the baseline)

    hf_logging.set_verbosity_error()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    lengths: list = []
    baselines, measured, cfg = measure(args, torch.device(args.device), lengths)
    predicted = predict(args, cfg)
    ratio = predicted["peak_mib"] / measured["peak_mib"] if measured["peak_mib"] > 0 else None  # tiny runs: noise
    result = {
        "benchmark": "estimate_vs_measured",
        "measure": "cuda_max_allocated" if args.device.startswith("cuda") else "rss_minus_baseline",
        **{k: round(v, 1) for k, v in baselines.items()},
        "measured": {k: round(v, 1) for k, v in measured.items()},
        "predicted": {k: round(v, 1) for k, v in predicted.items()},
        "ratio": None if ratio is None else round(ratio, 3),
        "within_25pct": None if ratio is None else abs(ratio - 1) <= 0.25,
        "s_total": round(time.perf_counter() - t0, 2),
        "workload": {k: getattr(args, k) for k in ("hidden", "layers", "heads", "intermediate", "vocab", "batch",
                                                    "prompt_len", "response_len", "ppo_epochs", "minibatch",
                                                    "micro_batch", "iterations", "precision", "grad_ckpt", "device",
                                                    "lora", "critic_mode", "reward_mode", "frozen_dtype")}
                    | {"threads": torch.get_num_threads()},
        **({"env": {"max_tokens": args.env_max_tokens, "obs_len": args.obs_len, "turn_len": args.response_len,
                    "max_turns": args.env_max_tokens, "engine": "eager", "stop_at_eos": False,
                    "trajectory_tokens": [min(lengths), max(lengths)]}} if args.env else {}),
        "allocator_env": allocator_env(args),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
