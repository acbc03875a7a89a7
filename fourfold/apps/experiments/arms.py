"""The arms: which trainer each runs, how its config differs from the demo's PPO, which RM it uses.

The arms are named in one list, ``fourfold.apps.experiments.config.EXPERIMENT_ARMS`` (the names
``ExperimentsConfig.arms`` accepts); :data:`ARM_ORDER` is that list, the order the arms run and
are reported in.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from fourfold.apps.cache import digest, keyed
from fourfold.apps.experiments.config import EXPERIMENT_ARMS, ExperimentsConfig
from fourfold.checkpoint import checkpoint_dirs
from fourfold.config import (
    DPOAlgoConfig,
    DPOConfig,
    InitModelConfig,
    LMModelConfig,
    PPOConfig,
    PreferenceDataConfig,
    PromptDataConfig,
    ReinforceAlgoConfig,
    ReinforceConfig,
    RolloutConfig,
    RunConfig,
    TrainLoopConfig,
    config_to_dict,
)

ARM_ORDER = EXPERIMENT_ARMS
"""Every arm, in the order they run and are reported ('reinforce' expands to one arm per learning-rate
multiplier)."""


@dataclasses.dataclass
class Arm:
    """One arm: its trainer ('ppo', 'reinforce' or 'dpo'), how its config differs, which RM it uses
    (dpo uses none: the RM only scores its final evaluation's proxy column)."""

    name: str
    stage: str
    what: str
    ppo: dict = dataclasses.field(default_factory=dict)
    """PPOAlgoConfig fields changed from demo.ppo (ppo arms); ``iterations`` here replaces the sweep's (a
    critic warm-up's iterations come before the policy's: the warm-up family)."""
    model: dict = dataclasses.field(default_factory=dict)
    """LMModelConfig fields changed from the sweep's model section (policy = the SFT model, reward =
    the arm's RM, critic_init unset: 'reward' with a critic): e.g. precision (ppo and reinforce arms),
    critic_init (ppo arms with a critic)."""
    generation: dict = dataclasses.field(default_factory=dict)
    """GenerationConfig fields changed from demo.generation: e.g. weights (ppo and reinforce arms)."""
    lr_multiplier: float = 1.0
    """REINFORCE: learning rate = this x demo.ppo.lr."""
    reinforce: dict = dataclasses.field(default_factory=dict)
    """ReinforceAlgoConfig fields changed from the sweep's REINFORCE (reinforce arms)."""
    rm: str = "biased"
    """'biased' (the demo's RM) or 'unbiased' (the RM of the unbiased labelers)."""
    rollout: dict = dataclasses.field(default_factory=dict)
    """RolloutConfig fields (ppo arms): e.g. max_staleness (the staleness family's lags)."""

    @property
    def model_dir(self) -> str:
        """The run directory's subdirectory holding the final model ('model' for dpo, else 'policy')."""
        return "model" if self.stage == "dpo" else "policy"


PRACTICE_ARMS = ("ppo-critic-policy-init", "ppo-critic-warmup", "ppo-beta0-dual-clip", "ppo-bf16-copy",
                 "ppo-bf16-copy-recompute", "ppo-bf16-copy-tis")
"""The arms of issue 32's questions of practice (docs/correction.md, "Sweep arms"; the 'practice'
claims): the critic's bad start and its warm-up, dual-clip under beta = 0, the bf16 copy's mismatch
and its corrections."""
DUAL_CLIP = 3.0
"""ppo-beta0-dual-clip's ppo.dual_clip (docs/correction.md)."""


MEASURE_ARMS = ("ppo-snr", "reinforce-steps-none", "reinforce-steps-mean", "reinforce-steps-loo", "ppo-stress",
                "ppo-stress-dual-clip", "ppo-no-clip", "ppo-lr3x", "ppo-lr3x-no-clip", "ppo-stress-no-clip",
                "ppo-no-baseline")
"""Issue 39's measurement arms (docs/experiments.md, "The update's measurements"): policy/grad_snr of
PPO's GAE and of REINFORCE with each baseline at PPO's optimizer steps per batch and lr; PPO
where the ratios get large (STRESS_EPOCHS epochs at STRESS_LR_MULTIPLIER x the lr) with and
without dual-clip (policy/dual_clipfrac); the clip removed (ppo.clip_eps = NO_CLIP) at the demo's
4 epochs, at STRESS_LR_MULTIPLIER x the lr and under the stress; and critic-free PPO without a
baseline (advantage rloo with K = 1: A = R), beside ppo-no-critic's batch-whitened returns."""
NO_CLIP = 1e6
"""The no-clip arms' ppo.clip_eps: the ratio is bounded to [1 - 1e6, 1 + 1e6], i.e. never clipped
(policy/clipfrac 0); the value clip (vf_clip_eps) stays."""
STRESS_EPOCHS = 12
"""ppo-stress's ppo.ppo_epochs (the demo's 4 x 3)."""
STRESS_LR_MULTIPLIER = 3.0
"""ppo-stress's lr, x demo.ppo.lr."""


def _measure_arm(name: str, cfg: ExperimentsConfig) -> Arm:
    """One arm of :data:`MEASURE_ARMS`."""
    ppo = cfg.demo.ppo
    if name.startswith("reinforce-steps-"):
        baseline = name.rsplit("-", 1)[1]
        steps = {"batch_epochs": ppo.ppo_epochs, "minibatches": ppo.rollout_batch_size // ppo.minibatch_size}
        return Arm(name, "reinforce", f"REINFORCE, baseline {baseline}, PPO's {ppo.steps_per_iteration} steps per "
                                      f"batch ({steps['batch_epochs']} passes x {steps['minibatches']} minibatches) "
                                      "and lr, grad SNR logged",
                   reinforce={**steps, "baseline": baseline, "log_grad_snr": True})
    stress = {"ppo_epochs": STRESS_EPOCHS, "lr": ppo.lr * STRESS_LR_MULTIPLIER}
    what = f"PPO, {STRESS_EPOCHS} epochs at {STRESS_LR_MULTIPLIER:g}x the lr"
    hot = {"lr": ppo.lr * STRESS_LR_MULTIPLIER}
    hot_what = f"PPO, {ppo.ppo_epochs} epochs at {STRESS_LR_MULTIPLIER:g}x the lr"
    off = {"clip_eps": NO_CLIP}
    return {
        "ppo-snr": Arm(name, "ppo", "PPO (as ppo), grad SNR logged", ppo={"log_grad_snr": True}),
        "ppo-stress": Arm(name, "ppo", what, ppo=stress),
        "ppo-stress-dual-clip": Arm(name, "ppo", f"{what}, dual-clip c={DUAL_CLIP:g}", ppo={**stress, "dual_clip": DUAL_CLIP}),
        "ppo-no-clip": Arm(name, "ppo", f"PPO (as ppo) without the clip (clip_eps={NO_CLIP:g})", ppo=off),
        "ppo-lr3x": Arm(name, "ppo", hot_what, ppo=hot),
        "ppo-lr3x-no-clip": Arm(name, "ppo", f"{hot_what}, without the clip", ppo={**hot, **off}),
        "ppo-stress-no-clip": Arm(name, "ppo", f"{what}, without the clip", ppo={**stress, **off}),
        "ppo-no-baseline": Arm(name, "ppo", "PPO without a critic or any baseline: A = R, the sequence reward "
                                            "(advantage rloo, K=1)", ppo={"advantage": "rloo", "samples_per_prompt": 1}),
    }[name]


def critic_warmup_iterations(cfg: ExperimentsConfig) -> int:
    """ppo-critic-warmup's ppo.critic_warmup: iterations // 10 (6 of the sweep's 60)."""
    return cfg.iterations // 10


def _practice_arm(name: str, cfg: ExperimentsConfig) -> Arm:
    """One arm of :data:`PRACTICE_ARMS`: the demo's PPO with the change docs/correction.md gives it."""
    bf16 = {"model": {"precision": "bf16-mixed"}, "generation": {"weights": "copy"}}
    return {
        "ppo-critic-policy-init": Arm(name, "ppo", "PPO, critic from the policy (a fresh zero value head)",
                                      model={"critic_init": "policy"}),
        "ppo-critic-warmup": Arm(name, "ppo", f"PPO, critic from the policy, {critic_warmup_iterations(cfg)} "
                                              "critic-only warm-up iterations", model={"critic_init": "policy"},
                                 ppo={"critic_warmup": critic_warmup_iterations(cfg)}),
        "ppo-beta0-dual-clip": Arm(name, "ppo", f"PPO, beta=0, dual-clip c={DUAL_CLIP:g}",
                                   ppo={"kl_coef": 0.0, "adaptive_kl": False, "dual_clip": DUAL_CLIP}),
        "ppo-bf16-copy": Arm(name, "ppo", "PPO under bf16-mixed, sampling from the bf16 copy, pi_old the engine's",
                             ppo={"old_logprobs": "engine"}, **bf16),
        "ppo-bf16-copy-recompute": Arm(name, "ppo", "PPO under bf16-mixed, the bf16 copy, pi_old recomputed",
                                       ppo={"old_logprobs": "recompute"}, **bf16),
        "ppo-bf16-copy-tis": Arm(name, "ppo", "PPO under bf16-mixed, the bf16 copy, pi_old recomputed, token TIS",
                                 ppo={"old_logprobs": "recompute", "rollout_correction": "token_tis"}, **bf16),
    }[name]


def _mult(m: float) -> str:
    return f"{m:g}x"


def _arms_named(name: str, cfg: ExperimentsConfig) -> list[Arm]:
    """The arm(s) of one name of :data:`ARM_ORDER`."""
    ppo = cfg.demo.ppo
    beta = ppo.kl_coef
    if name == "reinforce":
        return [Arm(f"reinforce-lr{_mult(m)}", "reinforce", f"naive REINFORCE, lr={m:g}x PPO's ({ppo.lr * m:g})",
                    lr_multiplier=m) for m in cfg.reinforce_lr_multipliers]
    if name in PRACTICE_ARMS:
        return [_practice_arm(name, cfg)]
    if name in MEASURE_ARMS:
        return [_measure_arm(name, cfg)]
    if name == "ppo-beta-high":
        b = beta * cfg.beta_high_multiplier
        return [Arm(name, "ppo", f"PPO, beta={b:g} ({cfg.beta_high_multiplier:g}x)",
                    ppo={"kl_coef": b, "adaptive_kl": False})]
    k, n = cfg.group_size, ppo.rollout_batch_size
    same = f"KL in the reward (beta={beta:g}), {ppo.ppo_epochs} epochs, clip and lr as ppo"
    arm = {
        "ppo": Arm(name, "ppo", f"PPO, beta={beta:g}, {ppo.ppo_epochs} epochs, critic"),
        "grpo": Arm(name, "ppo", f"GRPO: no critic, advantage (R - group mean) / group std over K={k} samples "
                                 f"of a prompt ({n // k} prompts x {k}); {same}",
                    ppo={"advantage": "grpo", "samples_per_prompt": k}),
        "rloo": Arm(name, "ppo", f"RLOO: no critic, baseline the mean of the other K-1={k - 1} samples of a prompt "
                                 f"({n // k} prompts x {k}); {same}",
                    ppo={"advantage": "rloo", "samples_per_prompt": k}),
        "reinforce-pp": Arm(name, "ppo", f"REINFORCE++: no critic, returns whitened over the batch; {same}",
                            ppo={"advantage": "reinforce_pp"}),
        "dpo": Arm(name, "dpo", f"DPO on the demo's pairs from the SFT model (beta={cfg.dpo_beta:g}, lr "
                                f"{cfg.dpo_lr:g}, the RM's budget: {cfg.demo.reward.steps} steps x "
                                f"{cfg.demo.reward.batch_size} pairs); no RM, no sampling"),
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


def models_in_memory(cfg: ExperimentsConfig, arm: Arm) -> tuple[int, int]:
    """(trained, frozen) models one run of ``arm`` holds: ppo 2 + 2 (policy and critic; reference
    and RM), a critic-free arm or REINFORCE 1 + 2, dpo 1 + 1 (policy; the SFT reference, whose
    log-probs fourfold dpo computes up front before it releases it)."""
    if arm.stage == "dpo":
        return 1, 1
    if arm.stage == "ppo" and dataclasses.replace(cfg.demo.ppo, **arm.ppo).loads_critic:
        return 2, 2
    return 1, 2


def _dpo_config(cfg: ExperimentsConfig, run: RunConfig, sft: Path, data: Path) -> DPOConfig:
    """The dpo arm: the demo's pairs (its held-out pairs for the held-out loss), the reward model's
    budget (demo.reward.steps steps of demo.reward.batch_size pairs), checkpoints as often per run
    as the RL arms'."""
    d = cfg.demo
    steps = d.reward.steps
    run = dataclasses.replace(run, save_every=max(1, round(steps * cfg.run.save_every / cfg.iterations)))
    return DPOConfig(model=InitModelConfig(path=str(sft)),
                     data=PreferenceDataConfig(train=str(data / "preferences.jsonl"),
                                               eval=str(data / "preferences_eval.jsonl")),
                     train=TrainLoopConfig(max_steps=steps, batch_size=d.reward.batch_size, lr=cfg.dpo_lr,
                                           warmup_steps=max(1, steps // 20), max_len=d.model.max_positions),
                     dpo=DPOAlgoConfig(beta=cfg.dpo_beta), run=run)


def run_config(cfg: ExperimentsConfig, arm: Arm, seed: int, *, sft: Path, rm: Path, run_dir: Path):
    """The PPOConfig / ReinforceConfig / DPOConfig of one arm x seed (every RL arm shares generation,
    prompts, batch size and number of iterations: the same sample budget; dpo trains on the demo's
    pairs in ``sft``'s sibling ``data/``)."""
    d = cfg.demo
    resume = bool(checkpoint_dirs(run_dir))  # a killed sweep continues its runs; a new one starts over
    run = RunConfig(output_dir=str(run_dir), seed=seed, device=cfg.run.device, threads=cfg.run.threads,
                    save_every=cfg.run.save_every, keep_checkpoints=1, resume=resume, overwrite=not resume, progress=False,
                    tensorboard=False, max_consecutive_skips=cfg.run.max_consecutive_skips,
                    concurrent_roles=cfg.run.concurrent_roles)
    if arm.stage == "dpo":
        return _dpo_config(cfg, run, sft, sft.parent / "data")
    data = PromptDataConfig(task="review", max_prompt_len=16, task_options=dict(d.task_options))
    generation = dataclasses.replace(d.generation, **arm.generation)
    if arm.stage == "ppo":
        algo = dataclasses.replace(d.ppo, **{"iterations": cfg.iterations, **arm.ppo})  # an arm may set its own (a warm-up's)
        model = LMModelConfig(policy=str(sft), reward=str(rm))  # a critic (gae) starts as the RM
        return PPOConfig(model=dataclasses.replace(model, **arm.model), data=data, generation=generation,
                         ppo=algo, run=run, rollout=RolloutConfig(**arm.rollout))
    algo = ReinforceAlgoConfig(
        iterations=cfg.iterations, rollout_batch_size=d.ppo.rollout_batch_size, lr=d.ppo.lr * arm.lr_multiplier,
        kl_coef=d.ppo.kl_coef, kl_estimator=d.ppo.kl_estimator, baseline="none", max_grad_norm=None,
        lr_schedule=d.ppo.lr_schedule)
    algo = dataclasses.replace(algo, **arm.reinforce)
    return ReinforceConfig(model=LMModelConfig(policy=str(sft), reward=str(rm), **arm.model), data=data,
                           generation=generation, reinforce=algo, run=run)


MODEL_PATH_KEYS = ("policy", "reference", "reward", "critic", "tokenizer")
"""Model-section keys :func:`run_key` does not count: where the models are (the demo stages they come
from are counted by their keys)."""


def run_key(run_cfg, stage: str, demo_keys: Mapping[str, Any]) -> str:
    """What a run's result depends on: its algorithm/generation/data settings, its seed and the demo
    stages its models come from (paths, device, threads and logging do not count). The model section
    counts by critic_init (unset, as a critic-free run leaves it, counts as 'reward', the value
    every run had before it could be unset) and by every other key an arm changes from
    LMModelConfig's defaults (e.g. precision); a key at its default is left out, so the keys of
    arms that change none stay as they were before the model section was counted (the cache of
    their results stays valid). The rollout section counts the same way: only when it is not the
    default (the staleness family's lags)."""
    d = config_to_dict(run_cfg)
    if stage == "dpo":
        return digest({"stage": stage, "algo": d["dpo"], "train": d["train"], "seed": d["run"]["seed"],
                       "demo": demo_keys})
    algo = run_cfg.ppo if stage == "ppo" else run_cfg.reinforce
    key = {"stage": stage, "algo": keyed(algo), "generation": keyed(run_cfg.generation),
           "data": keyed(run_cfg.data), "critic_init": d["model"].get("critic_init") or "reward", "seed": d["run"]["seed"],
           "demo": demo_keys}
    default = config_to_dict(LMModelConfig())
    model = {k: v for k, v in d["model"].items()
             if k not in MODEL_PATH_KEYS and k != "critic_init" and v != default.get(k)}
    if model:
        key["model"] = model
    rollout = getattr(run_cfg, "rollout", None)  # counted only when an arm changes it (older keys stay valid)
    if rollout is not None and rollout != RolloutConfig():
        key["rollout"] = config_to_dict(rollout)
    return digest(key)
