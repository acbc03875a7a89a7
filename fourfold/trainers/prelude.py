"""Step 0 of every language-model stage (sft, reward, dpo, ppo, reinforce) for its roles, written
once: the world checks, the role plan, the roles built from it (or the ones passed in, with the
plan's levers), placed on the ranks::

    roles = stage_roles(run, "ppo", cfg, device, {"ppo.rollout_batch_size": 8, ...})

The gym stage has no role plan (its agent is built by its own loop).
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

import torch

from fourfold.models.build import Roles, apply_levers, build_roles
from fourfold.models.plan import plan_roles
from fourfold.run.parallel import check_world, place_roles


def stage_roles(run, stage: str, cfg, device: torch.device, batch_sizes: Mapping[str, int], *,
                roles: Optional[Roles] = None, concurrent: bool = False, without: Sequence[str] = (),
                before_placing: Optional[Callable[[Roles], None]] = None,
                reward_functions: Optional[dict] = None) -> Roles:
    """The roles of ``stage`` for the run ``run`` (its :class:`~fourfold.run.scaffold.RunScaffold`),
    in four steps:

    1. what a run over several ranks needs of the config
       (:func:`~fourfold.run.parallel.check_world`: every global batch size of ``batch_sizes``,
       config key -> value, divides by the world size; ``concurrent``: ``run.concurrent_roles``,
       refused there);
    2. the stage's role plan (:func:`~fourfold.models.plan.plan_roles`);
    3. ``roles`` when given (the plan's memory levers applied,
       :func:`~fourfold.models.build.apply_levers`), else every role of the plan but ``without``
       (roles the caller brings ready-made) built on ``device``
       (:func:`~fourfold.models.build.build_roles`; ``reward_functions``: the reward functions
       the run loaded and checked against its prompts before anything else,
       :func:`~fourfold.trainers.rl.prepare_rewards`);
    4. ``before_placing(roles)`` when given (what must see the roles unsharded: DPO's reference
       pass), then the roles placed on the ranks as the plan says
       (:func:`~fourfold.run.parallel.place_roles`; nothing in one process), before any optimizer
       sees their parameters."""
    check_world(run.world, concurrent, dict(batch_sizes))
    plan = plan_roles(stage, cfg)
    if roles is not None:
        roles = apply_levers(roles, plan, device)
    else:
        roles = build_roles(plan.without(*without) if without else plan, device, reward_functions=reward_functions)
    if before_placing is not None:
        before_placing(roles)
    place_roles(roles, plan, device)  # torchrun: FSDP2 (before the optimizer sees the parameters)
    return roles
