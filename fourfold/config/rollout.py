"""The ``rollout`` section of ``fourfold ppo`` and ``fourfold reinforce``: how the sampler runs
against the trainer (docs/engines.md, "Running ahead"). Imports only the standard library."""

from __future__ import annotations

import dataclasses

from fourfold.config.loader import require


@dataclasses.dataclass
class RolloutConfig:
    """How the rollouts are produced against the updates (``RolloutStageConfig.rollout``)."""

    max_staleness: int = 0
    """The sampler's lag k, in policy versions (updates). 0 = today's synchronous run: each
    iteration samples with the weights of the update just before it. k >= 1: a sampler thread
    samples ahead while the trainer trains; iteration i (1-based) always samples with the
    weights after update max(0, i - 1 - k) (a fixed lag, so a run does not depend on thread
    timing; rollout/version_lag = min(i - 1, k)), each from its own copy of those weights. The
    update sees stale samples: ppo.old_logprobs engine clips around the sampler's policy,
    recompute (with rollout_correction) around the trainer's (docs/correction.md, Stale samples).
    Not with env.factory, ppo.filter_groups or several processes (refused)."""

    def validate(self, prefix: str = "rollout") -> None:
        require(self.max_staleness >= 0, f"{prefix}.max_staleness",
                f"must be >= 0 (0 = synchronous), got {self.max_staleness}")


def require_staleness(cfg) -> None:
    """What a run-ahead sampler (``rollout.max_staleness`` >= 1) does not support, each refused in
    one line naming the key: an environment run (its turns call the user's environment, which
    would then run in the sampler's thread), and PPO's ``filter_groups`` (its further rollouts of
    one iteration would sample past the fixed lag). Several processes are refused when the run
    starts (:func:`fourfold.trainers.ahead.require_one_process`)."""
    k = cfg.rollout.max_staleness
    if k == 0:
        return
    require(cfg.env.factory is None, "rollout.max_staleness",
            f"{k} runs the sampler ahead of the trainer, which an environment run (env.factory) does not "
            "support yet; set rollout.max_staleness=0")
    algo = getattr(cfg, "ppo", None)
    require(algo is None or not algo.filter_groups, "rollout.max_staleness",
            f"{k} runs the sampler ahead of the trainer, which ppo.filter_groups (further rollouts within "
            "an iteration) does not support; set ppo.filter_groups=false or rollout.max_staleness=0")
