"""The ``rollout`` section of ``fourfold ppo`` and ``fourfold reinforce``: how the sampler runs
against the trainer (docs/engines.md, "Running ahead"). Imports only the standard library."""

from __future__ import annotations

import dataclasses

from fourfold.config.loader import require


@dataclasses.dataclass
class RolloutConfig:
    """How the rollouts are produced against the updates (``RolloutStageConfig.rollout``)."""

    max_staleness: int = 0
    """How many updates the sampler may run ahead of the trainer (k): 0 = the synchronous run (each
    iteration samples with the weights of the update just before it); k >= 1 = a sampler thread
    samples the next batches while the trainer trains, iteration i (1-based) always with the
    weights after update max(0, i - 1 - k). The lag is fixed, so a run does not depend on thread
    timing (rollout/version_lag = min(i - 1, k)); each batch in flight has its own copy of its
    weights (k + 1 copies of the policy), and the k batches in flight are saved in every checkpoint.
    The update sees stale samples: ppo.old_logprobs engine (auto's choice without a correction)
    clips around the sampler's policy; recompute with a rollout_correction is the decoupled
    objective (clip around the trainer's policy, the tokens weighted pi_trainer / pi_sampler);
    rollout/is_ess measures the staleness (docs/correction.md, Stale samples; docs/engines.md,
    Running ahead). ppo.filter_groups' further rollouts of an iteration are sampled by the trainer,
    then, with its current weights."""

    def validate(self, prefix: str = "rollout") -> None:
        require(self.max_staleness >= 0, f"{prefix}.max_staleness",
                f"must be >= 0 (0 = synchronous), got {self.max_staleness}")

