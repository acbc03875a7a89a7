"""The warm-up family's settings (``family: warmup``, examples/warmup.yaml; docs/experiments.md, "The
critic's warm-up, where the critic pays"): the world, the warm-up lengths and the claims'
thresholds. Imports only the standard library and the config loader."""

from __future__ import annotations

import dataclasses

from fourfold.config.loader import require


@dataclasses.dataclass
class WarmupClaimsConfig:
    """Thresholds of the warm-up family's claims, written before its first run (docs/experiments.md,
    "The critic's warm-up"). Explained variance (EV) is ``value/explained_variance_mc`` (of the Monte
    Carlo return, a target the values do not enter), measured on each batch before the critic's
    update; the *ceiling* is the ceiling arm's EV over its last ``plateau_iterations`` warm-up
    iterations (a critic trained on the SFT policy's samples until it stops improving), mean over
    seeds. Gold differences are in the world's SFT sd; seeds are paired."""

    plateau_iterations: int = 10
    """The ceiling: the mean EV over the ceiling arm's last this many warm-up iterations; its drift:
    that mean minus the mean over the this many before."""
    ceiling_min_ev: float = 0.3
    """'ceiling' (check): the ceiling arm's plateau EV at least this in every seed (the critic can learn the state)."""
    ceiling_max_drift: float = 0.05
    """'ceiling' (check): the plateau's drift (mean over seeds) at most this: the ceiling critic has converged."""
    start_max_share: float = 0.5
    """'rm-start': the reward-model-initialised critic's EV at iteration 1 at most this share of the
    ceiling in every seed (a bad start)."""
    close_min_share: float = 0.8
    """'closes': a warm-up arm's EV at its first policy iteration at least this share of the ceiling in every seed."""
    early_iterations: int = 5
    """'early-ev': the EV averaged over the first this many policy iterations."""
    early_min_gain: float = 0.1
    """'early-ev': a warm-up arm's early EV minus its no-warm-up arm's (per seed, paired) at least this
    (mean over seeds) and > noise_z SE."""
    noise_z: float = 2.0
    """'Beyond noise': this many standard errors (the larger of the seeds' spread and the evaluation's)."""
    margin_share: float = 0.2
    """'warmup-keeps': a warm-up arm's gold cost (no-warm-up arm's gold minus its) non-inferior at this
    share of PPO's gold gain over SFT (the rm arm's; upper 95% bound below the margin)."""
    gold_min_gain_sd: float = 0.1
    """'warmup-gold': a warm-up arm's gold minus its no-warm-up arm's at least this (mean over seeds, SFT sd) and > noise_z SE."""
    critic_min_gain_sd: float = 0.1
    """'critic-pays': the rm arm's (PPO's) gold minus ppo-no-critic's at least this (mean, SFT sd) and > noise_z SE."""
    same_start_tol: float = 1e-6
    """'same-start' (check): on a seed the reward-model-initialised arms' EV at iteration 1 agree within
    this (the same batch, the same critic); the policy-initialised arms' (a zero value head: a constant) is 0 within it."""

    def validate(self, prefix: str = "warmup.claims") -> None:
        require(self.plateau_iterations >= 1, f"{prefix}.plateau_iterations", "must be >= 1")
        require(self.early_iterations >= 1, f"{prefix}.early_iterations", "must be >= 1")
        require(0 < self.start_max_share < 1, f"{prefix}.start_max_share", "must be in (0, 1)")
        require(0 < self.close_min_share <= 1, f"{prefix}.close_min_share", "must be in (0, 1]")
        require(0 < self.margin_share < 1, f"{prefix}.margin_share", "must be in (0, 1)")
        require(self.noise_z > 0, f"{prefix}.noise_z", "must be > 0")
        for key in ("ceiling_max_drift", "same_start_tol"):
            require(getattr(self, key) > 0, f"{prefix}.{key}", "must be > 0")
        for key in ("ceiling_min_ev", "early_min_gain", "gold_min_gain_sd", "critic_min_gain_sd"):
            require(getattr(self, key) >= 0, f"{prefix}.{key}", "must be >= 0")


@dataclasses.dataclass
class WarmupConfig:
    """The warm-up family (``family: warmup``): PPO on the horizon family's longest horizon with the
    critic started from the reward model (the default) or from the policy (a zero value head),
    each without and with ``warmup`` critic-only iterations before the policy's (the same policy
    updates: ``iterations`` of them in every arm), a ceiling arm (``ceiling_warmup`` critic-only
    iterations on the SFT policy's samples, then one policy iteration), and ppo-no-critic."""

    horizon_config: str = "examples/horizon.yaml"
    """The horizon family's config (a path from the working directory, else from the checkout): its
    longest horizon is the world (its demo stages, cached where that family caches them)."""
    warmup: int = 10
    """ppo.critic_warmup of the -warmup arms (their ppo.iterations: the family's iterations + this)."""
    ceiling_warmup: int = 30
    """ppo.critic_warmup of the ceiling arm (its ppo.iterations: this + 1)."""
    no_critic: bool = True
    """Run ppo-no-critic too (the 'critic-pays' claim: the critic matters in this world)."""
    claims: WarmupClaimsConfig = dataclasses.field(default_factory=WarmupClaimsConfig)
    """The claims' thresholds."""

    def validate(self, prefix: str = "warmup") -> None:
        require(self.warmup >= 1, f"{prefix}.warmup", f"must be >= 1, got {self.warmup}")
        require(self.ceiling_warmup > self.warmup, f"{prefix}.ceiling_warmup",
                f"must exceed warmup ({self.warmup}), got {self.ceiling_warmup}")
        p = self.claims.plateau_iterations
        require(self.ceiling_warmup >= 2 * p, f"{prefix}.ceiling_warmup",
                f"must be >= 2 x claims.plateau_iterations ({2 * p}: the plateau and the window before it), "
                f"got {self.ceiling_warmup}")
        require(bool(self.horizon_config), f"{prefix}.horizon_config", "must name the horizon family's config")
