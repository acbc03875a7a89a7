"""The staleness family's settings (``family: staleness``, examples/staleness.yaml; docs/experiments.md,
"Running ahead: the corrections where they matter"): the sampler's lags, the objectives for stale
samples, the truncated-sampling arms, the worlds, and the claims' thresholds. Imports only the
standard library and the config loader."""

from __future__ import annotations

import dataclasses
from typing import Optional

from fourfold.config.loader import require

STALENESS_OBJECTIVES = ("engine", "recompute", "decoupled")
"""The objectives for stale samples: 'engine' (pi_old the sampler's log-probs: the clip around the
behaviour policy; ppo.old_logprobs engine), 'recompute' (pi_old recomputed with the trainer's
weights, no importance weight: ppo.old_logprobs recompute), 'decoupled' (recompute plus the
behaviour-to-proximal weight truncated: ppo.rollout_correction token_tis, AReaL's decoupled PPO)."""


@dataclasses.dataclass
class StalenessClaimsConfig:
    """Thresholds of the staleness family's claims, written before its first run (docs/experiments.md,
    "Running ahead"). Gold differences are in units of the world's SFT model's per-sample sd of gold;
    seeds are paired (same seed: same prompt order and initial state)."""

    noise_z: float = 2.0
    """'Beyond noise': this many standard errors (the larger of the seeds' spread and the evaluation's)."""
    margin_share: float = 0.2
    """The equivalence margin (TOST) of the 'agree' and 'decoupled' claims: this share of PPO's gold
    gain over SFT in that world (k0-engine, the demo's PPO)."""
    decoupled_max_k: int = 2
    """'decoupled': recompute + token TIS keeps gold within the margin of its k = 0 run at every k in
    1..decoupled_max_k."""
    cost_min_growth_sd: float = 0.1
    """'stale-cost': an objective's cost in gold (its k = 0 gold minus its gold at k) at the largest
    k minus at the smallest k >= 1: at least this (mean over seeds) and > noise_z SE."""
    agree_max_ratio_dev: float = 1e-4
    """'ratio' at k = 0: every objective's policy/first_ratio_abs_dev and mismatch/token_abs_diff_mean
    (means over iterations) below this (fp32 rounding is ~5e-7), the TIS weights' mean within it of 1."""
    topp_min_gap: float = 1e-3
    """'ratio' under top-p: the uncorrected engine objective's first ratio deviates, and the
    recompute objective's mismatch/token_abs_diff_mean is, at least this (nats per token, mean over
    iterations): the truncation's log Z_t."""
    topp_max_corrected_dev: float = 1e-6
    """'ratio' under top-p: the corrected objective's policy/first_ratio_abs_dev at most this."""
    crash_window: int = 5
    """Stability: the training batches' gold (reward/gold_mean) is smoothed by a moving mean over
    this many iterations."""
    crash_drop_sd: float = 0.5
    """Stability: a gold crash is the smoothed gold falling this many SFT sd below its running peak."""
    spike_ratio: float = 10.0
    """Stability: a grad-norm spike is an iteration whose policy/grad_norm exceeds this x the run's median."""
    entropy_collapse_share: float = 0.5
    """Stability: an entropy collapse is the last quarter's mean policy/entropy below this share of
    the first quarter's."""

    def validate(self, prefix: str = "staleness.claims") -> None:
        require(self.noise_z > 0, f"{prefix}.noise_z", "must be > 0")
        require(0 < self.margin_share < 1, f"{prefix}.margin_share", "must be in (0, 1)")
        require(self.decoupled_max_k >= 1, f"{prefix}.decoupled_max_k", "must be >= 1")
        require(self.cost_min_growth_sd >= 0, f"{prefix}.cost_min_growth_sd", "must be >= 0")
        for key in ("agree_max_ratio_dev", "topp_min_gap", "topp_max_corrected_dev", "crash_drop_sd"):
            require(getattr(self, key) > 0, f"{prefix}.{key}", "must be > 0")
        require(self.crash_window >= 1, f"{prefix}.crash_window", "must be >= 1")
        require(self.spike_ratio > 1, f"{prefix}.spike_ratio", "must be > 1")
        require(0 < self.entropy_collapse_share < 1, f"{prefix}.entropy_collapse_share", "must be in (0, 1)")


@dataclasses.dataclass
class StalenessConfig:
    """The staleness family (``family: staleness``): every objective of ``objectives`` at every lag
    of ``ks`` (rollout.max_staleness), and the same objectives at k = 0 sampling with
    generation.top_p = ``top_p``, on the demo's world and on the horizon family's longest-horizon
    world (``horizon_config``); every run the demo's PPO otherwise."""

    ks: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2, 4])
    """The sampler's lags k (rollout.max_staleness); must include 0 (the synchronous reference)."""
    objectives: list[str] = dataclasses.field(default_factory=lambda: list(STALENESS_OBJECTIVES))
    """The objectives for stale samples: engine, recompute, decoupled (see STALENESS_OBJECTIVES)."""
    top_p: float = 0.9
    """generation.top_p of the truncated-sampling arms (topp-<objective>, k = 0); 1.0 = none."""
    demo_world: bool = True
    """Run on the demo's world (the demo section's stages, cached in demo.run.output_dir)."""
    horizon_config: Optional[str] = "examples/horizon.yaml"
    """The horizon family's config (a path from the working directory, else from the checkout) whose
    longest horizon is the second world (its demo stages, cached where that family caches them);
    null = no horizon world."""
    claims: StalenessClaimsConfig = dataclasses.field(default_factory=StalenessClaimsConfig)
    """The claims' thresholds."""

    def validate(self, prefix: str = "staleness") -> None:
        require(0 in self.ks and all(isinstance(k, int) and k >= 0 for k in self.ks), f"{prefix}.ks",
                f"must list lags >= 0 including 0 (the synchronous reference), got {self.ks}")
        require(len(set(self.ks)) == len(self.ks), f"{prefix}.ks", "a lag is listed twice")
        bad = [o for o in self.objectives if o not in STALENESS_OBJECTIVES] + [None]
        require(bad[0] is None, f"{prefix}.objectives",
                f"unknown objective {bad[0]!r}; known: {', '.join(STALENESS_OBJECTIVES)}")
        require(len(self.objectives) >= 1 and len(set(self.objectives)) == len(self.objectives),
                f"{prefix}.objectives", "must list objectives, each once")
        require(0 < self.top_p <= 1, f"{prefix}.top_p", f"must be in (0, 1] (1 = no top-p arms), got {self.top_p}")
        require(self.demo_world or self.horizon_config, f"{prefix}.demo_world",
                "no world: set demo_world=true or a horizon_config")
