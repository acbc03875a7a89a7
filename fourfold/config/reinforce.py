"""`fourfold reinforce`: the naive policy-gradient baseline on the language-model rollout."""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

from fourfold.config.critic import require_critic_init
from fourfold.config.dist import LMDistConfig
from fourfold.config.loader import require
from fourfold.config.ppo import RolloutStageConfig
from fourfold.config.run import RunConfig
from fourfold.names import CORRECTION_CAPS, CORRECTION_MODES, KL_KINDS


@dataclasses.dataclass
class ReinforceAlgoConfig:
    """Naive REINFORCE: sequence reward, no critic, no clipping, one gradient step per batch (by
    default; batch_epochs x minibatches steps to match PPO's optimizer steps)."""

    iterations: int = 100
    """Iterations; each samples rollout_batch_size prompts and takes batch_epochs x minibatches
    optimizer steps (one by default)."""
    rollout_batch_size: int = 64
    """Prompts (= responses) per iteration = per gradient step."""
    lr: float = 1e-5
    """Learning rate (AdamW)."""
    kl_coef: float = 0.05
    """beta: the same per-token KL penalty as PPO, folded into the returns."""
    kl_estimator: Literal[KL_KINDS] = "k1"
    """Per-token KL estimator used in the reward."""
    baseline: Literal["none", "mean", "loo"] = "none"
    """'none': G_t itself. 'mean': subtract the batch-mean return (the token mean of the returns-to-go).
    'loo': each response's baseline is that mean over the other responses' tokens (leave-one-out,
    fourfold.core.leave_one_out_baseline), so it does not depend on the response's own sample.
    Computed once per batch, before any step."""
    batch_epochs: int = 1
    """Passes over each batch; with minibatches, batch_epochs x minibatches optimizer steps per batch
    (PPO takes ppo_epochs x rollout_batch_size / minibatch_size). No importance ratio: after the
    first step the samples are off-policy and REINFORCE ignores that (what the comparison measures)."""
    minibatches: int = 1
    """Minibatches per pass, each an optimizer step on rollout_batch_size / minibatches responses of a
    fresh shuffle (1: the whole batch, unshuffled, as before)."""
    log_grad_snr: bool = False
    """Log policy/grad_snr over each pass's minibatch gradients, as ppo.log_grad_snr (minibatches >= 2)."""
    max_grad_norm: Optional[float] = None
    """Global gradient-norm clip; null (default) = none, as naive REINFORCE has."""
    lr_schedule: Literal["linear", "constant"] = "constant"
    """LR schedule over the iterations."""
    rollout_correction: Literal[CORRECTION_MODES] = "none"
    """Importance weights pi_train / pi_engine on each token's loss, as ppo.rollout_correction (the
    loss's own training forward is pi_train; docs/correction.md). mismatch/* is logged every step."""
    rollout_correction_cap: Optional[float] = None
    """The cap (> 1) of rollout_correction; null = the mode's preset (as ppo.rollout_correction_cap)."""

    @property
    def steps_per_iteration(self) -> int:
        """Optimizer steps per iteration: batch_epochs x minibatches."""
        return self.batch_epochs * self.minibatches

    @property
    def correction_cap(self) -> float:
        """The cap rollout_correction uses: rollout_correction_cap, or the mode's preset."""
        return self.rollout_correction_cap or CORRECTION_CAPS.get(self.rollout_correction, 2.0)

    def validate(self, prefix: str = "reinforce") -> None:
        require(self.iterations >= 1, f"{prefix}.iterations", "must be >= 1")
        require(self.rollout_batch_size >= 1, f"{prefix}.rollout_batch_size", "must be >= 1")
        require(self.lr > 0, f"{prefix}.lr", "must be > 0")
        require(self.kl_coef >= 0, f"{prefix}.kl_coef", f"must be >= 0, got {self.kl_coef}")
        require(self.max_grad_norm is None or self.max_grad_norm > 0, f"{prefix}.max_grad_norm", "must be > 0 or null")
        require(self.batch_epochs >= 1, f"{prefix}.batch_epochs", f"must be >= 1, got {self.batch_epochs}")
        require(self.minibatches >= 1 and self.rollout_batch_size % self.minibatches == 0, f"{prefix}.minibatches",
                f"must be >= 1 and divide rollout_batch_size={self.rollout_batch_size}, got {self.minibatches}")
        require(not self.log_grad_snr or self.minibatches >= 2, f"{prefix}.log_grad_snr",
                f"needs >= 2 minibatches per pass ({prefix}.minibatches), got {self.minibatches}")
        cap = self.rollout_correction_cap
        require(cap is None or cap > 1, f"{prefix}.rollout_correction_cap", f"must be > 1 or null, got {cap}")
        require(cap is None or self.rollout_correction != "none", f"{prefix}.rollout_correction_cap",
                f"set, and {prefix}.rollout_correction is none: there are no weights to cap (set a mode, e.g. token_tis)")


@dataclasses.dataclass
class ReinforceConfig(RolloutStageConfig):
    """`fourfold reinforce`: the naive policy-gradient baseline on the same rollout."""

    reinforce: ReinforceAlgoConfig = dataclasses.field(default_factory=ReinforceAlgoConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs/reinforce"))
    dist: LMDistConfig = dataclasses.field(default_factory=LMDistConfig)

    def validate(self, prefix: str = "") -> None:
        super().validate(prefix)
        require_critic_init(self.model, None)
