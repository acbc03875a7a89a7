"""The overoptimization family re-posed (issue 41; ``overoptimization.design: goodhart``,
examples/overoptimization-goodhart.yaml; docs/experiments.md, "Overoptimization that can turn
over"): worlds where the proxy is wrong on the SFT support in a way gold penalises, reward-model
quality as the axis, best-of-n to n = 1024, PPO at one learning rate over a KL sweep with a gold
arm, and the claims' thresholds, written before the first run. Run by
fourfold.apps.experiments.goodhart (not yet run in full). Imports only the standard library and
the config loader."""

from __future__ import annotations

import dataclasses

from fourfold.config.loader import require

GOODHART_WORLDS: dict[str, dict] = {
    # Extremal Goodhart: the labelers keep their length bias (0.12 per word) while gold's length range
    # ends at 22 words, near the SFT samples' 90th percentile (24 words), and costs 0.08 per word past
    # it (capped at 1): the proxy's favourite long samples lose gold, on the SFT support itself.
    "extremal": {"length_range": [6, 22], "length_penalty_per_word": 0.08, "max_length_penalty": 1.0},
    # Regressional Goodhart: unbiased labelers (no length bias) who answer by a fair coin on 30% of
    # pairs; gold is the demo's. The proxy is gold plus reward-model error, larger with fewer pairs, so
    # the extreme proxy scores are increasingly error (a shrinking gain; a turnover only off-support).
    "regressional": {"labeler_length_bias": 0.0, "labeler_noise": 0.3},
}
"""The worlds of the re-posed family, as review-task options over demo.task_options
(fourfold.tasks.ReviewTaskConfig): {name: options}. Neither changes the SFT corpus (only gold's
length terms and the labelers), so one SFT model serves both. tests/tasks/test_review_goodhart.py
shows each world's property on SFT samples."""


@dataclasses.dataclass
class GoodhartClaimsConfig:
    """Thresholds of the re-posed family's claims, written before its first run (docs/experiments.md,
    "Overoptimization that can turn over"; fourfold.apps.experiments.goodhart_claims). A curve is
    one (world, reward model, method): gold per prompt (mean over seeds) at points ordered by d =
    sqrt(KL to the SFT model), the first the SFT model; gains are over that first point."""

    peak_z: float = 2.0
    """'Rise, peak and fall': the peak's rise and fall each beyond this many paired SE on the half of
    the prompts that did not choose it, both ways round (fourfold.core.curve_fits.peak_test)."""
    beta_share: float = 0.95
    """... and the law's beta > 0 in at least this share of bootstrap resamples of the prompts."""
    bootstrap_reps: int = 200
    """Bootstrap resamples of the prompts (beta's sign)."""
    peak_min_levels: int = 1
    """'Rise, peak and fall' holds for a (world, method) when it holds at >= this many RM levels."""
    train_share: float = 0.6
    """'The law beats peak-free forms': each form fit on the smallest train_share of the d points
    and scored on the rest (fourfold.core.curve_fits.compare_forms)."""
    accuracy_min_spread: float = 0.05
    """'RM quality is an axis': gold pair accuracy on the policies' own samples strictly increasing
    with the pairs and its highest level above its lowest by at least this."""
    min_levels: int = 4
    """The quality claims need at least this many RM levels."""
    margin_share: float = 0.2
    """'A KL penalty acts as early stopping': the equivalence margin (TOST), this share of the
    unpenalised curve's peak gold gain."""
    noise_z: float = 2.0
    """'Best-of-n is more KL-efficient than PPO': its mean gain over the common d range above PPO's
    by more than this many SE."""
    null_draws: int = 100
    """Draws of each computed null (a peak-free curve matched to the data, noise resampled from it)."""
    null_rate: float = 0.05
    """A computed null 'says yes' when its rule passes on more than this share of its draws."""

    def validate(self, prefix: str = "overoptimization.goodhart.claims") -> None:
        require(self.peak_z > 0 and self.noise_z > 0, f"{prefix}.peak_z", "z thresholds must be > 0")
        require(0.5 <= self.beta_share <= 1, f"{prefix}.beta_share", "must be in [0.5, 1]")
        require(self.bootstrap_reps >= 20, f"{prefix}.bootstrap_reps", "must be >= 20")
        require(self.peak_min_levels >= 1, f"{prefix}.peak_min_levels", "must be >= 1")
        require(0 < self.train_share < 1, f"{prefix}.train_share", "must be in (0, 1)")
        require(self.accuracy_min_spread >= 0, f"{prefix}.accuracy_min_spread", "must be >= 0")
        require(self.min_levels >= 2, f"{prefix}.min_levels", "must be >= 2")
        require(0 < self.margin_share < 1, f"{prefix}.margin_share", "must be in (0, 1)")
        require(self.null_draws >= 10, f"{prefix}.null_draws", "must be >= 10")
        require(0 < self.null_rate < 1, f"{prefix}.null_rate", "must be in (0, 1)")


@dataclasses.dataclass
class GoodhartConfig:
    """The re-posed design's settings (read when overoptimization.design is 'goodhart'; the 'sizes'
    design, the published family, reads none of them)."""

    worlds: dict = dataclasses.field(default_factory=lambda: {k: dict(v) for k, v in GOODHART_WORLDS.items()})
    """{world: review-task options over demo.task_options}: each world gets its own labels and reward
    models over the one SFT model (default: :data:`GOODHART_WORLDS`, extremal and regressional)."""
    rm_pairs: list[int] = dataclasses.field(default_factory=lambda: [100, 300, 1000, 4000])
    """The reward-model quality axis: preference pairs from each world's labelers, smallest first (>= 4
    levels; their gold accuracy is measured, on held-out SFT pairs and on the policies' own samples,
    and the claims order the levels by that measured accuracy, not by the pairs)."""
    bon_n: int = 1024
    """N: responses sampled per best-of-n prompt; every n of bon_grid <= N by the unbiased estimator."""
    bon_prompts: int = 64
    """Held-out prompts of best-of-n (64 x 1024 = 65,536 SFT samples per seed)."""
    bon_grid: list[int] = dataclasses.field(default_factory=list)
    """The n at which best-of-n is reported; [] = the powers of 2 up to bon_n."""
    curve_prompts: int = 128
    """Held-out prompts each PPO checkpoint is evaluated on (gold, proxy, KL to the SFT model, per prompt)."""
    accuracy_samples: int = 8
    """Per curve prompt, this many samples of each evaluated policy are kept for the reward models'
    pairwise gold accuracy on the policies' own samples (fourfold.core.overopt_measures.pair_accuracy)."""
    kl_coefs: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.01, 0.05])
    """PPO's KL coefficients, all at the one learning rate lr_multiplier x demo.ppo's (no lr confound)."""
    sweep_pairs: int = 1000
    """The level whose reward model the kl_coefs > 0 run against (kl_coef 0 runs against every
    level: the quality claims need its curve at each); one of rm_pairs."""
    lr_multiplier: float = 0.1
    """The one learning-rate multiplier (policy and critic) of every PPO run, the gold arm's included."""
    gold_arm: bool = True
    """Also run PPO on gold itself (kl_coef 0, the same rate): the optimiser's own KL-efficiency, the
    ceiling a proxy's curve is compared with at equal d (with best-of-n by gold for best-of-n)."""
    dense_checkpoints: int = 6
    """Every PPO iteration 1..dense_checkpoints is evaluated (fourfold.core.overopt_measures.checkpoint_schedule) ..."""
    checkpoint_every: int = 3
    """... then every checkpoint_every-th, and the last."""
    kl_curves: bool = False
    """Evaluate the kl_coef > 0 runs on the whole checkpoint schedule (true) or at their last
    checkpoint only (false, the default: their claims read the final point; the budget)."""
    demo_dir: str = "runs/demo-goodhart"
    """Each (world, pairs) demo's stages are cached in '<demo_dir>-<world>-p<pairs>'."""
    claims: GoodhartClaimsConfig = dataclasses.field(default_factory=GoodhartClaimsConfig)
    """The claims' thresholds."""

    def validate(self, prefix: str = "overoptimization.goodhart") -> None:
        require(len(self.worlds) >= 1 and all(isinstance(v, dict) for v in self.worlds.values()),
                f"{prefix}.worlds", "must map world names to task-option dicts")
        require(all("sentences" not in v for v in self.worlds.values()), f"{prefix}.worlds",
                "sentences (the horizon knob) is not a Goodhart world's option")
        require(len(self.rm_pairs) >= 4 and all(p >= 2 for p in self.rm_pairs), f"{prefix}.rm_pairs",
                "must list >= 4 reward-model quality levels (preference pairs >= 2)")
        require(len(set(self.rm_pairs)) == len(self.rm_pairs), f"{prefix}.rm_pairs", "a level is listed twice")
        require(self.bon_n >= 2, f"{prefix}.bon_n", "must be >= 2")
        require(all(1 <= n <= self.bon_n for n in self.bon_grid), f"{prefix}.bon_grid", "each n must be in 1..bon_n")
        require(self.bon_prompts >= 4, f"{prefix}.bon_prompts", "must be >= 4 (the peak test splits the prompts)")
        require(self.curve_prompts >= 4, f"{prefix}.curve_prompts", "must be >= 4 (the peak test splits the prompts)")
        require(self.accuracy_samples >= 2, f"{prefix}.accuracy_samples", "must be >= 2 (a pair)")
        require(len(self.kl_coefs) >= 1 and all(c >= 0 for c in self.kl_coefs), f"{prefix}.kl_coefs",
                "must list KL coefficients >= 0")
        require(0.0 in self.kl_coefs, f"{prefix}.kl_coefs", "must include 0 (the unpenalised curve)")
        require(self.sweep_pairs in self.rm_pairs, f"{prefix}.sweep_pairs", "must be one of rm_pairs")
        require(self.lr_multiplier > 0, f"{prefix}.lr_multiplier", "must be > 0")
        require(self.dense_checkpoints >= 0, f"{prefix}.dense_checkpoints", "must be >= 0")
        require(self.checkpoint_every >= 1, f"{prefix}.checkpoint_every", "must be >= 1")

    def ppo_runs(self) -> list[tuple[str, object, float]]:
        """The PPO runs of one seed: (world, reward, kl_coef), reward the pairs of an RM level or
        'gold' (the gold arm, kl_coef 0): kl_coef 0 at every level, the other coefficients at
        sweep_pairs, the gold arm once per world (each world has its own gold)."""
        runs: list[tuple[str, object, float]] = []
        for w in self.worlds:
            runs += [(w, p, 0.0) for p in sorted(self.rm_pairs)]
            runs += [(w, self.sweep_pairs, c) for c in sorted(self.kl_coefs) if c > 0]
            runs += [(w, "gold", 0.0)] if self.gold_arm else []
        return runs

    def grid(self) -> list[int]:
        """The n of best-of-n: bon_grid, or the powers of 2 up to bon_n (and bon_n)."""
        if self.bon_grid:
            return sorted(set(self.bon_grid))
        return sorted({2**k for k in range(self.bon_n.bit_length()) if 2**k <= self.bon_n} | {self.bon_n})
