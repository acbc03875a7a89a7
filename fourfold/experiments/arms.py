"""The arms: which trainer each runs, how its config differs from the demo's PPO, which RM it uses.

The arms are named in one list, ``fourfold.experiments.config.EXPERIMENT_ARMS`` (the names
``ExperimentsConfig.arms`` accepts); :data:`ARM_ORDER` is that list, the order the arms run and
are reported in.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from fourfold.config import LMModelConfig, PPOConfig, PromptDataConfig, ReinforceAlgoConfig, ReinforceConfig, RunConfig, config_to_dict
from fourfold.experiments.config import EXPERIMENT_ARMS, ExperimentsConfig
from fourfold.stages import digest

ARM_ORDER = EXPERIMENT_ARMS
"""Every arm, in the order they run and are reported ('reinforce' expands to one arm per learning-rate
multiplier)."""


@dataclasses.dataclass
class Arm:
    """One arm: its trainer ('ppo' or 'reinforce'), how its config differs, which RM it uses."""

    name: str
    stage: str
    what: str
    ppo: dict = dataclasses.field(default_factory=dict)
    """PPOAlgoConfig fields changed from demo.ppo (ppo arms)."""
    lr_multiplier: float = 1.0
    """REINFORCE: learning rate = this x demo.ppo.lr."""
    rm: str = "biased"
    """'biased' (the demo's RM) or 'unbiased' (the RM of the unbiased labelers)."""


def _mult(m: float) -> str:
    return f"{m:g}x"


def _arms_named(name: str, cfg: ExperimentsConfig) -> list[Arm]:
    """The arm(s) of one name of :data:`ARM_ORDER`."""
    ppo = cfg.demo.ppo
    beta = ppo.kl_coef
    if name == "reinforce":
        return [Arm(f"reinforce-lr{_mult(m)}", "reinforce", f"naive REINFORCE, lr={m:g}x PPO's ({ppo.lr * m:g})",
                    lr_multiplier=m) for m in cfg.reinforce_lr_multipliers]
    if name == "ppo-beta-high":
        b = beta * cfg.beta_high_multiplier
        return [Arm(name, "ppo", f"PPO, beta={b:g} ({cfg.beta_high_multiplier:g}x)",
                    ppo={"kl_coef": b, "adaptive_kl": False})]
    arm = {
        "ppo": Arm(name, "ppo", f"PPO, beta={beta:g}, {ppo.ppo_epochs} epochs, critic"),
        "ppo-beta0": Arm(name, "ppo", "PPO, beta=0 (no KL penalty)", ppo={"kl_coef": 0.0, "adaptive_kl": False}),
        "ppo-1epoch": Arm(name, "ppo", "PPO, 1 epoch per batch", ppo={"ppo_epochs": 1}),
        "ppo-no-critic": Arm(name, "ppo", "PPO without a critic (whitened returns as advantages)",
                             ppo={"use_critic": False}),
        "ppo-unbiased-rm": Arm(name, "ppo", "PPO against the RM of unbiased labelers", rm="unbiased"),
        "ppo-adaptive-kl": Arm(name, "ppo", f"PPO, adaptive KL (target {ppo.kl_target:g} nats)",
                               ppo={"adaptive_kl": True}),
    }[name]
    return [arm]


def build_arms(cfg: ExperimentsConfig) -> list[Arm]:
    """The arms cfg.arms names, in a fixed order ('reinforce' expands to one arm per multiplier)."""
    return [arm for name in ARM_ORDER if name in cfg.arms for arm in _arms_named(name, cfg)]


def run_config(cfg: ExperimentsConfig, arm: Arm, seed: int, *, sft: Path, rm: Path, run_dir: Path):
    """The PPOConfig / ReinforceConfig of one arm x seed (every arm shares generation, prompts,
    batch size and number of iterations: the same sample budget)."""
    d = cfg.demo
    run = RunConfig(output_dir=str(run_dir), seed=seed, device=cfg.run.device, threads=cfg.run.threads,
                    save_every=cfg.run.save_every, keep_checkpoints=1, resume=True, progress=False,
                    tensorboard=False, max_consecutive_skips=cfg.run.max_consecutive_skips,
                    concurrent_roles=cfg.run.concurrent_roles)
    data = PromptDataConfig(task="review", max_prompt_len=16)
    if arm.stage == "ppo":
        algo = dataclasses.replace(d.ppo, iterations=cfg.iterations, **arm.ppo)
        return PPOConfig(model=LMModelConfig(policy=str(sft), reward=str(rm), critic_init="reward"),
                         data=data, generation=d.generation, ppo=algo, run=run)
    algo = ReinforceAlgoConfig(
        iterations=cfg.iterations, rollout_batch_size=d.ppo.rollout_batch_size, lr=d.ppo.lr * arm.lr_multiplier,
        kl_coef=d.ppo.kl_coef, kl_estimator=d.ppo.kl_estimator, baseline="none", max_grad_norm=None,
        lr_schedule=d.ppo.lr_schedule)
    return ReinforceConfig(model=LMModelConfig(policy=str(sft), reward=str(rm)), data=data,
                           generation=d.generation, reinforce=algo, run=run)


def run_key(run_cfg, stage: str, demo_keys: Mapping[str, Any]) -> str:
    """What a run's result depends on: its algorithm/generation/data settings, its seed and the demo
    stages its models come from (paths, device, threads and logging do not count)."""
    d = config_to_dict(run_cfg)
    return digest({"stage": stage, "algo": d.get("ppo") or d.get("reinforce"), "generation": d["generation"],
                   "data": d["data"], "critic_init": d["model"].get("critic_init"), "seed": d["run"]["seed"],
                   "demo": demo_keys})
