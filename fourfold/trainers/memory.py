"""Memory around a run: the levers of a config applied to loaded models, and the memory estimate of
a PPO or REINFORCE config (``fourfold estimate``, and the one line ``fourfold ppo`` prints first).

The levers themselves live in :mod:`fourfold.models.levers`; here the config's model section
decides which apply to which role. The estimate reads only the models' ``config.json``
(:func:`fourfold.models.estimate.estimate_from_settings`), with the mode of ``model.lora`` (null:
full fine-tuning), ``model.critic_mode`` and a LoRA reward adapter (``model.reward``) as the
trainers build the roles (:func:`fourfold.trainers.lm.load_roles`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from fourfold.models.levers import (
    autocast_forwards,
    enable_gradient_checkpointing,
    role_dtypes,
    set_logits_chunk,
)

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _reference_module(reference) -> Optional[torch.nn.Module]:
    """The model a reference role runs (a frozen copy, or the shared LoRA base's causal LM)."""
    model = getattr(reference, "model", None)
    if model is None and getattr(reference, "base", None) is not None:
        model = reference.base.lm
    return model


def apply_levers(roles, model_cfg, device: torch.device):
    """The memory levers of ``model_cfg`` (an ``LMModelConfig``) on loaded ``roles`` (PPO and
    REINFORCE; returns them): gradient checkpointing of the trained roles (policy, critic), bf16
    autocast of every forward under ``bf16-mixed``, and the logits chunk of the policy and the
    reference. The frozen dtype is applied at load (:func:`~fourfold.trainers.lm.load_roles`)."""
    reference = _reference_module(roles.reference)
    if model_cfg.gradient_checkpointing:
        for role in (roles.policy, roles.critic):
            if role is not None:
                enable_gradient_checkpointing(role)
    if model_cfg.precision == "bf16-mixed":
        autocast_forwards([roles.policy, reference, roles.critic, roles.reward_model], device.type)
    if model_cfg.logits_chunk:
        for model in (roles.policy, reference):
            if model is not None:
                set_logits_chunk(model, model_cfg.logits_chunk)
    return roles


def apply_model_levers(model: torch.nn.Module, model_cfg, device: torch.device) -> torch.nn.Module:
    """The levers of an SFT or reward-model stage (an ``InitModelConfig``) on its one trained model:
    gradient checkpointing and, under ``bf16-mixed``, bf16 autocast of its forwards."""
    if model_cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if model_cfg.precision == "bf16-mixed":
        autocast_forwards([model], device.type)
    return model


def trained_dtype(model_cfg) -> torch.dtype:
    """Weights dtype of a stage's trained model (``model.dtype`` and ``model.precision``)."""
    return role_dtypes(model_cfg.dtype, model_cfg.precision)[0]


# ---------------------------------------------------------------------------------------------
# The estimate of a config
# ---------------------------------------------------------------------------------------------


def _lora_fields(lora) -> Optional[dict]:
    """``model.lora`` (a ``LoraConfig`` or None) as the estimate's {r, target_modules, dropout}."""
    if lora is None:
        return None
    targets = lora.target_modules
    return {"r": int(lora.r), "target_modules": targets if isinstance(targets, str) else list(targets),
            "dropout": float(lora.dropout)}


def estimate_settings(stage: str, cfg, nproc: int = 1):
    """The :class:`~fourfold.models.estimate.EstimateSettings` of a ``ppo`` or ``reinforce`` config
    run on ``nproc`` devices: model sources, mode (full / LoRA, critic and reward as adapters),
    precision, frozen dtype, gradient checkpointing, logits chunk, batch sizes and lengths."""
    from fourfold.models.estimate import EstimateSettings, LoraSettings
    from fourfold.models.lora_io import is_adapter_dir

    m = cfg.model
    lora = _lora_fields(m.lora)
    reward_adapter = lora is not None and m.reward is not None and is_adapter_dir(m.reward)
    trained, frozen = role_dtypes(m.dtype, m.precision, m.frozen_dtype)
    critic = None
    if stage == "ppo" and cfg.ppo.loads_critic:  # gae with use_critic: the critic-free estimators load none
        from_reward = m.critic_init == "reward" and m.reward is not None and not reward_adapter
        critic = m.critic or (m.reward if from_reward else m.policy)
    if stage == "ppo":
        algo = cfg.ppo
        batch = dict(rollout_batch_size=algo.rollout_batch_size, minibatch_size=algo.minibatch_size,
                     micro_batch_size=algo.micro_batch_size, with_entropy=algo.entropy_coef > 0)
    else:  # reinforce: one gradient step on the whole batch
        n = cfg.reinforce.rollout_batch_size
        batch = dict(rollout_batch_size=n, minibatch_size=n)
    lora_settings = None
    if lora is not None:
        critic_mode = m.critic_mode if critic is not None else "separate"
        lora_settings = LoraSettings(**lora, critic_mode=critic_mode,
                                     reward_mode="adapter" if reward_adapter else "separate")
    return EstimateSettings(
        policy=m.policy, reference=None if lora is not None else m.reference,
        reward=None if reward_adapter else m.reward, critic=critic, lora=lora_settings,
        precision=m.precision if trained == torch.float32 else "bf16", frozen_dtype=_DTYPE_NAMES[frozen],
        gradient_checkpointing=m.gradient_checkpointing, max_prompt_len=cfg.data.max_prompt_len,
        max_new_tokens=cfg.generation.max_new_tokens, concurrent_roles=cfg.run.concurrent_roles, nproc=nproc,
        trust_remote_code=m.trust_remote_code, logits_chunk=m.logits_chunk, **batch)


def estimate_config(stage: str, cfg, nproc: int = 1):
    """The :class:`~fourfold.models.estimate.Estimate` of a ``ppo`` or ``reinforce`` config."""
    from fourfold.models.estimate import estimate_from_settings

    return estimate_from_settings(estimate_settings(stage, cfg, nproc))


def estimate_line(stage: str, cfg: Any) -> str:
    """The estimate's one-line summary for the start of a run; never raises: when the estimate
    cannot be made, a one-line note saying why."""
    try:
        return estimate_config(stage, cfg).summary()
    except Exception as e:  # the estimate is advice: a run never fails because of it
        reason = str(e).splitlines()[0] if str(e) else ""
        return f"memory estimate unavailable ({type(e).__name__}: {reason[:200]})"
