"""The memory estimate of a PPO or REINFORCE config (``fourfold estimate``, and the one line
``fourfold ppo`` prints first), before anything is loaded.

Which roles exist and how each is built (full or adapter, dtypes, sources, placements) is the role
plan (:func:`fourfold.models.plan.plan_roles`), the same plan the loader builds, read as it is, so the
estimate cannot drift from what loads; the models' sizes come from their ``config.json`` only
(:func:`fourfold.models.estimate.memory.estimate`). Here the config adds the batch shape.
"""

from __future__ import annotations

from typing import Any

from fourfold.config.ppo import resolve_weights
from fourfold.models.estimate.memory import Estimate, estimate
from fourfold.models.estimate.settings import Workload
from fourfold.models.plan import FULL, plan_roles


def workload_of(stage: str, cfg, nproc: int = 1) -> Workload:
    """The :class:`~fourfold.models.estimate.settings.Workload` of a ``ppo`` or ``reinforce`` config run
    on ``nproc`` devices: its batch sizes and lengths, ``generation.weights`` and ``.engine``, and with
    ``env.factory`` set (a multi-turn environment run) ``env.max_tokens``."""
    if stage == "ppo":
        algo = cfg.ppo
        batch = dict(rollout_batch_size=algo.rollout_batch_size, minibatch_size=algo.minibatch_size,
                     micro_batch_size=algo.micro_batch_size, with_entropy=algo.entropy_coef > 0)
    else:  # reinforce: one gradient step on the whole batch
        n = cfg.reinforce.rollout_batch_size
        batch = dict(rollout_batch_size=n, minibatch_size=n)
    plan = plan_roles(stage, cfg)
    policy = plan.role("policy")  # auto: gathered for a policy FSDP shards itself (a LoRA policy's base is not its own)
    weights = resolve_weights(cfg.generation.weights, nproc > 1 and policy.form == FULL and policy.placement == "fsdp")
    env = getattr(cfg, "env", None)
    env_max_tokens = env.max_tokens if env is not None and env.factory is not None else None
    return Workload(nproc=nproc, max_prompt_len=cfg.data.max_prompt_len, max_new_tokens=cfg.generation.max_new_tokens,
                    engine_weights=weights, env_max_tokens=env_max_tokens, engine=cfg.generation.engine, **batch)


def estimate_config(stage: str, cfg, nproc: int = 1) -> Estimate:
    """The :class:`~fourfold.models.estimate.result.Estimate` of a ``ppo`` or ``reinforce`` config."""
    return estimate(plan_roles(stage, cfg), workload_of(stage, cfg, nproc))


def estimate_line(stage: str, cfg: Any, nproc: int = 1) -> str:
    """The estimate's one-line summary for the start of a run on ``nproc`` devices; never raises:
    when the estimate cannot be made, a one-line note saying why. With ``generation.weights: auto``
    it ends with what auto is for this run (``gathered`` or ``live``)."""
    try:
        workload = workload_of(stage, cfg, nproc)
        auto = f"; generation.weights: auto = {workload.engine_weights}" if cfg.generation.weights == "auto" else ""
        return estimate(plan_roles(stage, cfg), workload).summary() + auto
    except Exception as e:  # the estimate is advice: a run never fails because of it
        reason = str(e).splitlines()[0] if str(e) else ""
        return f"memory estimate unavailable ({type(e).__name__}: {reason[:200]})"
