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

Mode: four full models by default. ``--lora R`` builds the roles as the trainer's LoRA mode does
(:mod:`fourfold.models.lora`): one frozen base (in the frozen roles' dtype) with a trained adapter
``policy``, the reference = the base with adapters disabled; ``--critic-mode adapter`` puts the
critic on the base too (a second adapter + value head; ``separate``: a full critic as without
LoRA), ``--reward-mode adapter`` the reward model (a frozen third adapter + score head), so one
base serves all four roles. ``--frozen-dtype`` sets the weights dtype of the frozen roles and of the
LoRA base (``model.frozen_dtype``). ``--grad-ckpt`` turns on gradient checkpointing of policy and critic
(:func:`fourfold.models.levers.enable_gradient_checkpointing`). ``estimate_peak_mib`` is what
``fourfold.models.estimate.memory`` predicts for the same settings (live tensors: compare it with the
measured peak minus the framework's baseline, which ``estimate_vs_measured.py`` measures).

Rollout engine (the ``generation`` keys, built by ``fourfold.rollout.engine.make_engine`` and synced
with the policy every iteration as the trainer does): ``--engine eager|static``, ``--weights
live|gathered|copy``, ``--compile`` (the static engine's step), ``--stop-check-every N``.
``s_generate`` is the median rollout; ``s_generate_first`` the first one (a compiled step compiles
there: compile time apart from the steady state); ``s_sync`` the weight sync.

    python benchmarks/ppo_iteration.py --engine static --weights copy --compile
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


SYNTHETIC = "synthetic"
"""The source every role's plan names: the workload's one model config (:func:`model_config`)."""


def model_config(args):
    """The workload's model config: every role has this shape."""
    from fourfold.models.factory import llama_config

    return llama_config(args.vocab, args.hidden, args.layers, args.heads, args.intermediate,
                        max_positions=max(args.prompt_len + args.response_len, getattr(args, "env_max_tokens", None) or 0) + 8,
                        pad_token_id=0, eos_token_id=1)


def workload_plan(args):
    """The role plan of the workload, by the rules `fourfold ppo` uses (:func:`fourfold.models.plan.plan_roles`
    over the model, dist and run sections these flags stand for): forms (``--lora``, ``--critic-mode``,
    ``--reward-mode``), dtypes (``--precision``, ``--frozen-dtype``: unset, the frozen roles are bf16
    unless fp32), gradient checkpointing, and the placement under torchrun (the trained roles as
    ``--fsdp`` / ``--replicate`` say, the frozen ones replicated, fourfold's default). Every model
    source is :data:`SYNTHETIC`; a reward adapter is named by a stand-in directory that only marks it
    as one (the weights are random, built by :func:`build_roles`)."""
    import tempfile
    from pathlib import Path

    from fourfold.config import LMDistConfig, LMModelConfig, LoraConfig
    from fourfold.models.plan import ADAPTER_CONFIG, plan_roles

    lora = args.lora
    adapters = lora and args.critic_mode == "adapter", lora and args.reward_mode == "adapter"
    trained = "replicate" if getattr(args, "replicate", False) else "fsdp"
    with tempfile.TemporaryDirectory() as stand_in:
        (Path(stand_in) / ADAPTER_CONFIG).write_text("{}")
        model = LMModelConfig(policy=SYNTHETIC, reward=stand_in if adapters[1] else SYNTHETIC,
                              critic_init="reward" if adapters[0] == adapters[1] else "policy",
                              lora=LoraConfig(r=lora) if lora else None,
                              critic_mode="adapter" if adapters[0] else "separate",
                              precision=args.precision, frozen_dtype=args.frozen_dtype,
                              gradient_checkpointing=args.grad_ckpt)
        cfg = SimpleNamespace(model=model, dist=LMDistConfig(policy=trained, critic=trained),
                              ppo=SimpleNamespace(loads_critic=True),
                              run=SimpleNamespace(concurrent_roles=getattr(args, "concurrent", False)))
        return plan_roles("ppo", cfg)


def build_roles(args, device):
    """(model config, roles) of the synthetic workload, as its role plan (:func:`workload_plan`) says:
    four random models of one shape, or LoRA roles over one random base, in the plan's dtypes."""
    from fourfold.models.build import Roles
    from fourfold.models.factory import random_causal_lm, random_scalar_model
    from fourfold.models.levers import enable_gradient_checkpointing
    from fourfold.models.lora import REWARD, AdapterLM, AdapterScalarModel, SharedBase, add_critic, value_head
    from fourfold.models.plan import ADAPTER, BASE
    from fourfold.models.roles import AdapterDisabledReference, FrozenReference, ModelReward, ScalarModel
    from fourfold.run.common import seed_everything

    plan = workload_plan(args)
    policy_spec, reference_spec, reward_spec, critic_spec = (plan.role(n) for n in plan.names)
    seed_everything(0)
    cfg = model_config(args)
    lora = plan.lora
    policy = random_causal_lm(cfg, seed=0, dtype=plan.base_dtype if lora else policy_spec.dtype).to(device)
    base = SharedBase(policy, lora) if lora else None
    reference = AdapterDisabledReference(base) if reference_spec.form == BASE else \
        FrozenReference(copy.deepcopy(policy).to(reference_spec.dtype))
    if critic_spec.form == ADAPTER:
        critic = add_critic(base, lora)
    else:
        critic = ScalarModel(random_scalar_model(cfg, seed=1, dtype=critic_spec.dtype).to(device))
    if reward_spec.form == ADAPTER:
        base.add_adapter(REWARD, lora.peft_config(), trainable=False)
        reward_model = AdapterScalarModel(base, REWARD, value_head(base).requires_grad_(False))
        reward_model.reset_head("normal")
    elif isinstance(critic, ScalarModel):
        reward_model = ScalarModel(copy.deepcopy(critic.hf).to(reward_spec.dtype))
    else:
        reward_model = ScalarModel(random_scalar_model(cfg, seed=1, dtype=reward_spec.dtype).to(device))
    if lora:
        policy = AdapterLM(base)
        policy.train()
        critic.train()
    if plan.gradient_checkpointing:
        enable_gradient_checkpointing(policy)
        enable_gradient_checkpointing(critic)
    roles = Roles(SimpleNamespace(eos_token_id=1, pad_token_id=0), policy, reference, ModelReward(reward_model),
                  critic, reward_model, base=base)
    return cfg, roles


def collectives(prof, iterations: int) -> dict:
    """The collectives a torch.profiler run recorded (gloo's or NCCL's own events), per iteration:
    ``{kind: {"count": n, "mib": size}}`` with size the elements of the tensor each one fills
    (all_gather: the gathered output; all_reduce, broadcast: the buffer) at 4 bytes each. (On gloo
    FSDP's reduce-scatter is an all_reduce of the whole gradient buffer.)"""
    out: dict = {}
    for event in prof.events():
        backend, _, kind = event.name.partition(":")
        if backend not in ("gloo", "nccl") or not kind:
            continue
        shape = event.input_shapes[0] if event.input_shapes and event.input_shapes[0] else [0]
        elements = 1
        for n in shape:
            elements *= n
        if kind == "all_gather":
            elements *= int(os.environ.get("WORLD_SIZE", "1"))
        entry = out.setdefault(kind, {"count": 0, "mib": 0.0})
        entry["count"] += 1
        entry["mib"] += elements * 4 / 2**20
    return {k: {"count": round(v["count"] / iterations, 1), "mib": round(v["mib"] / iterations, 3)}
            for k, v in sorted(out.items())}


def estimate_of(args, cfg, nproc: int = 1, env_max_tokens: int | None = None):
    """What :mod:`fourfold.models.estimate.memory` predicts for the workload's plan on ``nproc`` devices
    (``env_max_tokens``: an environment run's env.max_tokens, on the eager engine)."""
    from fourfold.config.ppo import resolve_weights
    from fourfold.models.estimate.memory import Workload, estimate

    weights = resolve_weights(getattr(args, "weights", "auto"), nproc > 1 and getattr(args, "fsdp", False) and not args.lora)
    workload = Workload(rollout_batch_size=args.batch, minibatch_size=args.minibatch,
                        micro_batch_size=getattr(args, "micro_batch", None), max_prompt_len=args.prompt_len,
                        max_new_tokens=args.response_len, nproc=nproc, engine_weights=weights,
                        env_max_tokens=env_max_tokens, engine="eager")
    return estimate(workload_plan(args), workload, {SYNTHETIC: cfg})


def allocator_env(args=None) -> dict:
    """The glibc malloc settings of the environment (``MALLOC_*_``, ``GLIBC_TUNABLES``) and of
    ``--malloc-mmap-threshold-kib``: on CPU they change the peak RSS (see docs/benchmarks.md), so the
    JSON line records them."""
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_") or k == "GLIBC_TUNABLES"}
    if args is not None and args.malloc_mmap_threshold_kib is not None:
        env["run.malloc_mmap_threshold_kib"] = args.malloc_mmap_threshold_kib
    return env


def rss_file_mib() -> float | None:
    """The file-backed part of the resident set now (``RssFile`` of /proc/self/status; None off Linux):
    mostly the code pages of torch's shared libraries. It is part of ``peak_mem_mib`` (ru_maxrss), but
    its size depends on how the page cache holds those libraries, not on the workload: where the kernel
    caches files in large folios, a page fault maps the whole folio, and W measures 110 to 227 MiB of
    it from one run to another with the same code (docs/benchmarks.md). The JSON line records the
    largest value seen after any iteration: the pages stay mapped unless the kernel reclaims them, so
    ``peak_mem_mib - rss_file_mib`` is the peak of the process's own memory (an upper bound), the
    figure to compare across machines and sittings."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssFile:"):
                    return int(line.split()[1]) / 1024  # kB -> MiB
    except OSError:
        pass
    return None


def apply_allocator(args) -> None:
    """``--malloc-mmap-threshold-kib``: the run.malloc_mmap_threshold_kib lever, applied as
    `fourfold ppo` applies it (before any model exists); an error when it cannot be."""
    if args.malloc_mmap_threshold_kib is not None:
        from fourfold.run.allocator import set_mmap_threshold

        why = set_mmap_threshold(args.malloc_mmap_threshold_kib)
        if why:
            raise SystemExit(f"--malloc-mmap-threshold-kib: {why}")


def add_mode_args(p: argparse.ArgumentParser) -> None:
    """--lora, --critic-mode, --reward-mode and --grad-ckpt (shared with estimate_vs_measured.py)."""
    p.add_argument("--lora", type=int, default=0, metavar="R", help="LoRA rank: roles over one shared base (0: full)")
    p.add_argument("--critic-mode", default="separate", choices=["separate", "adapter"],
                   help="with --lora: the critic as an adapter on the base, or a full model")
    p.add_argument("--reward-mode", default="separate", choices=["separate", "adapter"],
                   help="with --lora: the reward model as a frozen adapter on the base, or a full model")
    p.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing for policy and critic")
    p.add_argument("--fsdp", action="store_true",
                   help="under torchrun: policy and critic sharded with FSDP2 as `fourfold ppo` places them "
                        "(--batch and --minibatch are global; rank 0 prints the line)")
    p.add_argument("--replicate", action="store_true",
                   help="under torchrun: policy and critic replicated (dist.policy/critic: replicate; one gradient "
                        "all-reduce per optimizer step)")
    p.add_argument("--profile", action="store_true",
                   help="torch.profiler over the timed iterations: the collectives per iteration in the JSON line, "
                        "the top operators by self CPU time on stderr (rank 0)")
    p.add_argument("--frozen-dtype", default=None, choices=["float32", "bfloat16"],
                   help="weights of the frozen roles (reference, reward model, LoRA base); default: float32 "
                        "under --precision fp32, else bfloat16 (model.frozen_dtype's default)")
    p.add_argument("--malloc-mmap-threshold-kib", type=int, default=None, metavar="KIB",
                   help="glibc: tensors of KIB or more get their own mapping, returned to the OS when freed "
                        "(run.malloc_mmap_threshold_kib; 256 makes the peak RSS the live tensors)")


def parse_args(argv=None) -> argparse.Namespace:
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
    add_mode_args(p)
    add_engine_args(p)
    args = p.parse_args(argv)
    if args.precision is None:
        args.precision = "bf16" if args.dtype == "bfloat16" else "fp32"
    if args.lora and args.concurrent:
        p.error("--concurrent needs four separate models: roles over one LoRA base run one at a time")
    if args.compile and args.engine != "static":
        p.error("--compile compiles the static engine's step: add --engine static")
    return args


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The rollout engine: --engine, --weights, --compile, --stop-check-every (the generation keys)."""
    p.add_argument("--engine", default="eager", choices=["eager", "static"], help="generation.engine")
    p.add_argument("--weights", default="auto", choices=["auto", "live", "gathered", "copy"],
                   help="generation.weights (auto, its default: gathered for an FSDP-sharded policy, else live)")
    p.add_argument("--compile", action="store_true", help="generation.compile (with --engine static)")
    p.add_argument("--stop-check-every", type=int, default=8, help="generation.stop_check_every")


def iterate(args, roles, algo, gen, engine, device, profiler=None) -> list[dict]:
    """``--iterations`` PPO iterations of the trainer's functions: the engine synced with the policy,
    collect (under the bf16-mixed autocast region), advantages, the PPO epochs; per iteration its
    phase times. ``profiler`` (not entered) records the iterations from ``--warmup`` on."""
    import torch

    from fourfold.models.levers import autocast_region
    from fourfold.rollout.noise import RowNoise
    from fourfold.run.optim import NonFiniteGuard
    from fourfold.trainers.ppo import compute_advantages, make_optim, ppo_update
    from fourfold.trainers.rollouts import collect

    opt = make_optim(roles, algo)
    guard = NonFiniteGuard(limit=10**9)
    prompts = torch.randint(2, args.vocab, (args.batch, args.prompt_len), device=device)
    prompt_mask = torch.ones_like(prompts)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for it in range(args.iterations):
        if profiler is not None and it == min(args.warmup, args.iterations - 1):
            profiler.__enter__()
        sync()
        t0, cpu0 = time.perf_counter(), time.process_time()
        engine.sync(roles.policy)  # the trainer's weight sync, once per iteration
        sync()
        t_sync = time.perf_counter() - t0
        # bf16-mixed: one autocast region with its cast cache for the whole collection (weights fixed)
        with autocast_region(args.precision, device.type):
            col = collect(roles, [""] * args.batch, prompts, prompt_mask, gen, kl_coef=algo.kl_coef,
                          concurrent=args.concurrent, noise=RowNoise(0, it + 1), engine=engine)
        rollout = compute_advantages(col.rollout, algo)
        sync()
        t1 = time.perf_counter()
        # training: every forward opens its own region (a cast cache must never span an optimizer step)
        with autocast_region(args.precision, device.type, cache=False):
            ppo_update(roles, rollout, algo, opt, gen.temperature, guard, it, concurrent=args.concurrent)
        sync()
        t2 = time.perf_counter()
        rows.append({"s_iter": t2 - t0, "cpu_s_iter": time.process_time() - cpu0, "s_sync": t_sync,
                     "s_generate": col.metrics["time/generate_s"], "s_score": col.metrics["time/score_s"],
                     "s_train": t2 - t1, "tokens": col.metrics["rollout/tokens"],
                     "rss_file_mib": rss_file_mib()})  # outside the timing (see rss_file_mib)
    return rows


def main(argv=None) -> dict:
    args = parse_args(argv)
    apply_allocator(args)
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    from fourfold import dist
    from fourfold.config import GenerationConfig, PPOAlgoConfig
    from fourfold.rollout.engine import make_engine
    from fourfold.run.parallel import place_roles

    device = torch.device(args.device)
    world = dist.init_from_env(device)
    if world.distributed and args.fsdp == args.replicate:
        raise SystemExit("ppo_iteration.py: under torchrun with more than one process, pass --fsdp or --replicate")
    cfg, roles = build_roles(args, device)
    if args.fsdp or args.replicate:
        place_roles(roles, workload_plan(args), device)
    algo = PPOAlgoConfig(iterations=args.iterations, rollout_batch_size=args.batch, minibatch_size=args.minibatch,
                         ppo_epochs=args.ppo_epochs, lr=1e-5, critic_lr=1e-5)
    algo.validate()
    gen = GenerationConfig(max_new_tokens=args.response_len, temperature=args.temperature, stop_at_eos=False,
                           engine=args.engine, weights=args.weights, compile=args.compile,
                           stop_check_every=args.stop_check_every)
    gen.validate()
    engine = make_engine(gen, precision=args.precision, max_prompt_len=args.prompt_len)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) \
        if args.profile else None
    rows = iterate(args, roles, algo, gen, engine, device, profiler)
    result = summarize(args, rows, cfg, roles, algo, world)
    if profiler is not None:
        profiler.__exit__(None, None, None)
        result["collectives_per_iter"] = collectives(profiler, len(rows[args.warmup:] or rows))
        if world.is_main:
            print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), file=sys.stderr)
    if world.is_main:
        print(json.dumps(result))
    dist.shutdown(sync=True)
    return result


def summarize(args, rows: list[dict], cfg, roles, algo, world) -> dict:
    """The JSON line: medians over the iterations after ``--warmup`` (the first iteration's
    generation apart: compile included), the peak memory beside the estimate, the workload."""
    import torch

    timed = rows[args.warmup:] or rows
    med = lambda k: statistics.median(r[k] for r in timed)  # noqa: E731
    if args.device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated(torch.device(args.device)) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    estimate = estimate_of(args, cfg, world.world_size)
    gen_tokens = args.batch * args.response_len
    train_tokens = args.ppo_epochs * args.batch * (args.prompt_len + args.response_len)
    return {
        "benchmark": "ppo_iteration",
        "s_per_iter": round(med("s_iter"), 4),
        "cpu_s_per_iter": round(med("cpu_s_iter"), 4),  # process CPU time: what a busy machine does not inflate
        "s_generate": round(med("s_generate"), 4),
        "s_generate_first": round(rows[0]["s_generate"], 4),  # the first rollout: a compiled step compiles here
        "s_sync": round(med("s_sync"), 4),
        "s_score": round(med("s_score"), 4),
        "s_train": round(med("s_train"), 4),
        "gen_tokens_per_s": round(gen_tokens / med("s_generate"), 1),
        "train_tokens_per_s": round(train_tokens / med("s_train"), 1),
        "peak_mem_mib": round(peak, 1),
        "peak_mem_kind": "cuda_max_allocated" if args.device.startswith("cuda") else "rss",
        "rss_file_mib": max((round(r["rss_file_mib"], 1) for r in rows if r["rss_file_mib"] is not None), default=None),
        "estimate_peak_mib": round(estimate.peak_bytes / 2**20, 1),
        "iterations_timed": len(timed),
        "workload": {k: getattr(args, k) for k in ("arch", "hidden", "layers", "heads", "intermediate", "vocab", "batch",
                                                    "prompt_len", "response_len", "ppo_epochs", "minibatch", "precision", "device",
                                                    "temperature", "concurrent", "lora", "critic_mode", "reward_mode",
                                                    "grad_ckpt", "frozen_dtype", "fsdp", "replicate", "engine", "weights",
                                                    "compile", "stop_check_every")}
                    | {"world_size": world.world_size, "optimizer_steps_per_iter": algo.steps_per_iteration,
                       "threads": torch.get_num_threads(),
                       "params_per_model_m": round(estimate.roles["reference"].params / 1e6, 2),
                       "trainable_policy_params_m": round(sum(p.numel() for p in roles.policy.parameters()) / 1e6, 3)},
        "allocator_env": allocator_env(args),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
