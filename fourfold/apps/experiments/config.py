"""`fourfold experiments`: the method's claims as measured experiments (fourfold.apps.experiments):
the arm and claim vocabulary and the sweep's settings."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Literal, Optional

from fourfold.apps.experiments.goodhart_config import GoodhartConfig
from fourfold.apps.experiments.staleness_config import StalenessConfig
from fourfold.apps.experiments.warmup_config import WarmupConfig
from fourfold.config.demo import DemoConfig
from fourfold.config.loader import require
from fourfold.config.run import MAX_SEED, RunConfig

EXPERIMENT_ARMS = ("ppo", "ppo-beta0", "ppo-beta-high", "ppo-1epoch", "ppo-no-critic", "grpo", "rloo", "reinforce-pp",
                   "reinforce", "dpo", "ppo-unbiased-rm", "ppo-adaptive-kl", "ppo-critic-policy-init",
                   "ppo-critic-warmup", "ppo-beta0-dual-clip", "ppo-bf16-copy", "ppo-bf16-copy-recompute",
                   "ppo-bf16-copy-tis", "ppo-snr", "reinforce-steps-none", "reinforce-steps-mean", "reinforce-steps-loo",
                   "ppo-stress", "ppo-stress-dual-clip", "ppo-no-clip", "ppo-lr3x", "ppo-lr3x-no-clip",
                   "ppo-stress-no-clip", "ppo-no-baseline")
"""Arms `fourfold experiments` knows (see docs/experiments.md); 'reinforce' runs once per entry
of reinforce_lr_multipliers (as reinforce-lr1x, reinforce-lr3x, ...). ppo-bf16-copy-tis and the
five before it are the practice arms (docs/correction.md, "Sweep arms"; examples/practice.yaml runs
them); the last eleven are issue 39's measurement arms (the variance, clip, baseline and dual-clip questions;
docs/experiments.md, "The update's measurements"), none of them a default arm."""

DEFAULT_CLAIM_GROUPS = ("ppo", "beta0", "beta-high", "epochs", "reinforce", "critic", "length", "critic-free",
                        "baseline", "dpo")
"""The claim groups of the default sweep (examples/experiments.yaml)."""
CLAIM_GROUPS = DEFAULT_CLAIM_GROUPS + ("practice", "measure")
"""Groups of claims `fourfold experiments` checks; a group whose arms did not run is left out.
'practice' (the practice arms' claims, examples/practice.yaml) and 'measure' (issue 39's
measurement arms' claims, examples/measure.yaml) are not default groups: their arms are not
default arms."""


@dataclasses.dataclass
class ExperimentsClaimsConfig:
    """Which claims are checked, and their thresholds. Gold and proxy differences are in units of
    the SFT model's per-sample standard deviation (sd) on the evaluation prompts; "in every seed"
    compares arms seed by seed (same seed = same prompt order)."""

    groups: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_CLAIM_GROUPS))
    """Claim groups to check: ppo, beta0, beta-high, epochs, reinforce, critic, length, critic-free,
    baseline, dpo; practice and measure (not defaults: the practice arms' claims, examples/practice.yaml;
    the measurement arms', examples/measure.yaml)."""
    ppo_min_gold_gain_sd: float = 0.3
    """ppo: final gold above SFT's by at least this many sd, in every seed."""
    ppo_min_well_formed_ratio: float = 0.9
    """ppo: well-formed share at least this fraction of SFT's, in every seed."""
    beta0_min_gold_drop_sd: float = 0.5
    """ppo-beta0: final gold below both SFT's and ppo's by at least this many sd, in every seed."""
    beta0_min_kl_ratio: float = 5.0
    """ppo-beta0: KL to the reference at least this multiple of ppo's, in every seed."""
    beta0_min_degeneration: float = 0.1
    """ppo-beta0: well-formed share lower than ppo's, or repetition rate higher, by at least this
    (absolute share), in every seed."""
    beta0_proxy_margin_sd: float = 0.25
    """ppo-beta0: proxy (RM) reward at least ppo's minus this many (RM-score) sd, in every seed."""
    beta_high_max_kl: float = 0.2
    """ppo-beta-high: KL to the reference (nats per response) below this, in every seed."""
    noise_z: float = 2.0
    """'Within noise' / 'beyond noise': this many standard errors of the evaluation (finite
    sample of prompts and responses) of the difference."""
    clear_margin_sd: float = 0.5
    """'Clearly beats': gold higher by at least this many sd, in every seed."""
    critic_free_margin_share: float = 0.2
    """critic-free: removing the critic costs PPO less than this share of PPO's gold gain, by
    non-inferiority (ppo's gold minus grpo's, rloo's, reinforce-pp's, mean over seeds: its upper 95%
    bound below the margin; fourfold.apps.claim_stats), each arm its own claim."""
    quick: bool = False
    """The claims a short budget settles, and only those (set by --quick): the claims of
    fourfold.apps.experiments.claims.QUICK_CLAIMS, each against noise_z standard errors of its own
    evaluation instead of a fixed sd, ratio or share; every other claim is listed as needing the
    full sweep."""

    def validate(self, prefix: str = "claims") -> None:
        for g in self.groups:
            close = difflib.get_close_matches(str(g), CLAIM_GROUPS, n=1, cutoff=0.5)
            require(g in CLAIM_GROUPS, f"{prefix}.groups", f"unknown group {g!r}"
                    + (f" (did you mean {close[0]!r}?)" if close else "") + f"; known: {', '.join(CLAIM_GROUPS)}")
        require(self.ppo_min_well_formed_ratio >= 0, f"{prefix}.ppo_min_well_formed_ratio", "must be >= 0")
        require(self.beta0_min_kl_ratio > 0, f"{prefix}.beta0_min_kl_ratio", "must be > 0")
        require(self.beta_high_max_kl > 0, f"{prefix}.beta_high_max_kl", "must be > 0")
        require(self.noise_z > 0, f"{prefix}.noise_z", "must be > 0")
        require(self.clear_margin_sd >= 0, f"{prefix}.clear_margin_sd", "must be >= 0")
        require(0 < self.critic_free_margin_share < 1, f"{prefix}.critic_free_margin_share", "must be in (0, 1)")


HORIZON_ARMS = ("ppo", "ppo-beta0", "ppo-beta-high", "ppo-1epoch", "ppo-no-critic", "grpo", "rloo", "reinforce-pp",
                "reinforce", "ppo-adaptive-kl")
"""Arms the horizon family runs at each horizon (every arm but those that need another reward model
or no sampling: ppo-unbiased-rm, dpo)."""
GROUP_ARMS = ("grpo", "rloo")
"""Arms whose baseline is the group of K samples of a prompt."""


@dataclasses.dataclass
class HorizonClaimsConfig:
    """Thresholds of the horizon family's claims, written before its first run (docs/experiments.md).
    Gold differences are in units of the SFT model's per-sample sd at that horizon (each horizon has
    its own SFT model and gold); "in every seed" compares arms seed by seed."""

    critic_min_increase_sd: float = 0.1
    """'The critic's baseline helps more as the horizon grows': its gain (ppo's gold minus
    ppo-no-critic's) at the longest horizon minus its gain at the shortest must be at least this
    (mean over seeds), and above noise_z standard errors of the evaluation in every seed."""
    match_margin_share: float = 0.2
    """'A group baseline matches the critic at every horizon tried': ppo's gold minus the group arm's
    (grpo, rloo; mean over seeds) non-inferior at a margin of this share of ppo's gold gain there
    (the upper 95% bound below it; fourfold.apps.claim_stats), at every horizon and under the
    noisier labels."""
    noise_z: float = 2.0
    """'Beyond noise': this many standard errors of the evaluation of the difference."""

    def validate(self, prefix: str = "horizon.claims") -> None:
        require(self.critic_min_increase_sd >= 0, f"{prefix}.critic_min_increase_sd", "must be >= 0")
        require(0 < self.match_margin_share < 1, f"{prefix}.match_margin_share", "must be in (0, 1)")
        require(self.noise_z > 0, f"{prefix}.noise_z", "must be > 0")


@dataclasses.dataclass
class HorizonConfig:
    """The horizon family (``family: horizon``, examples/horizon.yaml): the review task with gold
    wanting reviews of k sentences (the task's ``sentences`` knob), one demo (SFT, pairs, reward model)
    per horizon k, and arms at each horizon; at the longest horizon also a noisier reward (labels
    from noisier labelers, the same SFT model) and the group arm at other group sizes."""

    horizons: list[int] = dataclasses.field(default_factory=lambda: [1, 3, 6])
    """The horizons k: gold wants k sentences (fourfold.tasks.ReviewTaskConfig.sentences)."""
    arms: list[str] = dataclasses.field(default_factory=lambda: ["ppo", "ppo-no-critic", "grpo", "rloo"])
    """The arms run at every horizon (as the claims family defines them)."""
    tokens_per_sentence: int = 12
    """Responses may have up to tokens_per_sentence x (k + 1) tokens at horizon k (generation.
    max_new_tokens): room for one sentence more than gold wants (the corpus averages 7 words a
    sentence; the word-level tokenizer gives a token a word)."""
    task_options: dict = dataclasses.field(default_factory=lambda: {"labeler_length_bias": 0.0})
    """Task options of every horizon (over demo.task_options): by default unbiased labelers, so that
    gold measures credit over the horizon rather than the labelers' length flaw (the claims family
    studies that)."""
    noisy_task_options: dict = dataclasses.field(default_factory=lambda: {"labeler_noise": 0.3})
    """The noisier reward at the longest horizon: these labeler options over the horizon's (its SFT
    model is the horizon's, copied; pairs and reward model are new); {} = none."""
    noisy_arms: list[str] = dataclasses.field(default_factory=lambda: ["ppo", "grpo"])
    """The arms run against the noisier reward."""
    group_sizes: list[int] = dataclasses.field(default_factory=lambda: [2, 8])
    """Other group sizes K of group_arm at the longest horizon (the arms above use group_size); []
    = none. Every K keeps demo.ppo.rollout_batch_size responses per iteration (so batch / K prompts)."""
    group_arm: str = "grpo"
    """The group arm run at group_sizes."""
    demo_dir: str = "runs/demo-horizon"
    """The horizons' demo stages are cached in '<demo_dir>-h<k>' (the noisier reward's in
    '<demo_dir>-h<k>-noisy')."""
    credit_prompts: int = 4
    """Prompts of the token-credit view (each with group_size responses), from the longest horizon's
    ppo and group_arm runs of the first seed; 0 = no view."""
    claims: HorizonClaimsConfig = dataclasses.field(default_factory=HorizonClaimsConfig)
    """The claims' thresholds."""

    def validate(self, prefix: str = "horizon") -> None:
        require(len(self.horizons) >= 1 and all(k >= 1 for k in self.horizons), f"{prefix}.horizons",
                "must list horizons >= 1")
        require(len(set(self.horizons)) == len(self.horizons), f"{prefix}.horizons", "a horizon is listed twice")
        for key, arms in (("arms", self.arms), ("noisy_arms", self.noisy_arms), ("group_arm", [self.group_arm])):
            bad = [a for a in arms if a not in HORIZON_ARMS] + [None]
            require(bad[0] is None, f"{prefix}.{key}",
                    f"arm {bad[0]!r} does not run in the horizon family; it runs {', '.join(HORIZON_ARMS)}")
        require(len(self.arms) >= 1 and len(set(self.arms)) == len(self.arms), f"{prefix}.arms",
                "must list arms, each once")
        require(self.group_arm in GROUP_ARMS, f"{prefix}.group_arm", f"must be one of {', '.join(GROUP_ARMS)}")
        require(all(k >= 2 for k in self.group_sizes), f"{prefix}.group_sizes", "must be >= 2 (a group of one has no baseline)")
        require(self.tokens_per_sentence >= 1, f"{prefix}.tokens_per_sentence", "must be >= 1")
        require("sentences" not in self.task_options, f"{prefix}.task_options", "sentences is set by horizons")
        require(self.credit_prompts >= 0, f"{prefix}.credit_prompts", "must be >= 0")


@dataclasses.dataclass
class OveroptimizationClaimsConfig:
    """Thresholds of the overoptimization family's claims, written before its first run
    (docs/experiments.md, "The overoptimization family"). Gold is in units of the SFT model's
    per-sample sd of gold on the family's held-out prompts; curves are means over seeds."""

    fall_min_sd: float = 0.1
    """'Gold peaks and falls': the gold at the curve's last point is below its peak by at least
    this many sd (and the peak is not the last point), at every reward-model size."""
    r2_min: float = 0.8
    """'Each form fits its method': the fit's R^2 (mean over seeds) at least this, at every size."""

    def validate(self, prefix: str = "overoptimization.claims") -> None:
        require(self.fall_min_sd >= 0, f"{prefix}.fall_min_sd", "must be >= 0")
        require(0 < self.r2_min <= 1, f"{prefix}.r2_min", "must be in (0, 1]")


@dataclasses.dataclass
class OveroptimizationConfig:
    """The overoptimization family (``family: overoptimization``, examples/overoptimization.yaml):
    Gao et al.'s gold-vs-proxy curves on the demo's world. One demo (pairs, reward model) per
    reward-model size (number of preference pairs), all over one SFT model; per size: best-of-n for
    n = 1..bon_n by the unbiased estimator, and PPO with kl_coef (0 by default) evaluated on held-out
    prompts every eval_every iterations; and PPO at the demo's KL coefficient, to place it on the curves."""

    rm_pairs: list[int] = dataclasses.field(default_factory=lambda: [500, 1500, 4000])
    """The reward-model sizes: preference pairs each RM is trained on (demo.pairs.pairs), smallest first."""
    demo_dir: str = "runs/demo-overopt"
    """Each size's demo stages are cached in '<demo_dir>-p<pairs>' (the SFT stage trained in the first
    and copied into the others)."""
    bon_n: int = 64
    """N: responses sampled per held-out prompt for best-of-n; the estimator gives every n <= N."""
    bon_prompts: int = 256
    """Held-out prompts of best-of-n (the first of the family's eval prompts)."""
    curve_prompts: int = 256
    """Held-out prompts each PPO checkpoint is evaluated on (gold, proxy, KL to the SFT model)."""
    eval_every: int = 3
    """PPO checkpoints evaluated every this many iterations (and at the end)."""
    kl_coef: float = 0.0
    """The KL coefficient of the overoptimizing PPO runs (0: none, the paper's RL curves had small ones)."""
    lr_multiplier: float = 0.1
    """The overoptimizing PPO runs' learning rates (policy and critic) are this x demo.ppo's: at the
    demo's own rate and no KL penalty PPO passes the gold peak within 4 iterations (measured: d = 2.75
    and gold below SFT's at iteration 4), too fast for a curve of checkpoints to trace."""
    default_kl: bool = True
    """Also run PPO at demo.ppo.kl_coef per size and seed (its final point placed on the curves)."""
    claims: OveroptimizationClaimsConfig = dataclasses.field(default_factory=OveroptimizationClaimsConfig)
    """The claims' thresholds."""
    design: Literal["sizes", "goodhart"] = "sizes"
    """'sizes': the published family (RM sizes by pairs from the demo's labelers, the keys above);
    'goodhart': issue 41's re-posed design (the goodhart section: worlds where the proxy's error
    costs gold on the SFT support, RM quality levels, best-of-1024, a KL sweep at one learning rate),
    run by fourfold.apps.experiments.goodhart (runner built, not yet run in full)."""
    goodhart: GoodhartConfig = dataclasses.field(default_factory=GoodhartConfig)
    """The re-posed design's settings (issue 41; fourfold.apps.experiments.goodhart_config; not read
    by the published 'sizes' design above)."""

    def validate(self, prefix: str = "overoptimization") -> None:
        require(len(self.rm_pairs) >= 1 and all(p >= 2 for p in self.rm_pairs), f"{prefix}.rm_pairs",
                "must list reward-model sizes (preference pairs) >= 2")
        require(len(set(self.rm_pairs)) == len(self.rm_pairs), f"{prefix}.rm_pairs", "a size is listed twice")
        require(self.bon_n >= 2, f"{prefix}.bon_n", "must be >= 2")
        require(self.bon_prompts >= 1, f"{prefix}.bon_prompts", "must be >= 1")
        require(self.curve_prompts >= 2, f"{prefix}.curve_prompts", "must be >= 2")
        require(self.eval_every >= 1, f"{prefix}.eval_every", "must be >= 1")
        require(self.kl_coef >= 0, f"{prefix}.kl_coef", "must be >= 0")
        require(self.lr_multiplier > 0, f"{prefix}.lr_multiplier", "must be > 0")


TURNS_ARMS = ("ppo", "ppo-no-critic", "grpo", "rloo", "ppo-256x1", "ppo-no-critic-256x1")
"""Arms of the turns family: PPO with a critic (GAE over the policy's tokens), PPO without one
(whitened returns, reinforce_pp), and the group estimators, each over the same rows x K (the
rollout batch / group_size rows, group_size trajectories each); and the PPO arms at the rollout
batch's rows x 1 (``-256x1``: the family's first design, the rows x K contrast as its own factor)."""
TURNS_DEFAULT_ARMS = ("ppo", "ppo-no-critic", "grpo", "rloo", "ppo-256x1")
"""The arms turns.arms runs by default: every estimator at rows x K, and ppo at rows x 1."""
TURNS_CRITIC_ARMS = ("ppo", "ppo-256x1")
"""The turns arms with a critic (turns.critic_lr, turns.critic_warmup; value/explained_variance logged)."""


@dataclasses.dataclass
class TurnsClaimsConfig:
    """Thresholds of the turns family's claims, written before its first run (docs/experiments.md,
    "The turns family"). Gold is the share of held-out rows answered right (an absolute share, not
    sd units), sampled at temperature 1 from each final policy, one trajectory per row; seeds are
    paired (same seed: same prompt order and initial state, same evaluation rows)."""

    knob_min_step: float = 0.5
    """'The turns knob works': the SFT policy's mean turns per held-out trajectory at each hops
    exceeds the previous hops' by at least this."""
    ev_min: float = 0.1
    """'The critic learns' (a check): each critic arm's value/explained_variance, mean over the
    last ev_tail_share of its iterations, at least this in every seed at every turn count."""
    ev_tail_share: float = 0.25
    """The share of a run's last iterations whose explained variance 'the critic learns' reads."""
    learn_min_gain: float = 0.1
    """'Every arm learns at every turn count': its gold minus the SFT policy's gold, at least this
    and above noise_z evaluation standard errors, in every seed."""
    grow_min: float = 0.03
    """'ppo's gain over an arm grows with the turns' (at matched rows x K): (ppo's gold minus the
    arm's) at the most turns minus the same at the fewest, paired by seed, at least this (mean over
    seeds) and above noise_z standard errors (the larger of the seeds' spread and the evaluation's)."""
    match_margin_share: float = 0.2
    """'A critic-free arm costs ppo less than this share of ppo's gold gain' at every turn count
    (matched rows x K): non-inferiority, the upper 95% bound of the mean cost below the margin."""
    rows_min_gain: float = 0.03
    """'256 rows x 1 beat rows x K at the same trajectories': the -256x1 arm's gold minus its
    rows x K arm's, at least this (mean over seeds) and above noise_z standard errors, per turn count."""
    noise_z: float = 2.0
    """'Beyond noise': this many standard errors."""

    def validate(self, prefix: str = "turns.claims") -> None:
        require(self.knob_min_step >= 0, f"{prefix}.knob_min_step", "must be >= 0")
        require(-1 <= self.ev_min <= 1, f"{prefix}.ev_min", "must be in [-1, 1]")
        require(0 < self.ev_tail_share <= 1, f"{prefix}.ev_tail_share", "must be in (0, 1]")
        require(0 <= self.learn_min_gain <= 1, f"{prefix}.learn_min_gain", "must be in [0, 1]")
        require(self.grow_min >= 0, f"{prefix}.grow_min", "must be >= 0")
        require(0 < self.match_margin_share < 1, f"{prefix}.match_margin_share", "must be in (0, 1)")
        require(self.rows_min_gain >= 0, f"{prefix}.rows_min_gain", "must be >= 0")
        require(self.noise_z > 0, f"{prefix}.noise_z", "must be > 0")


@dataclasses.dataclass
class TurnsConfig:
    """The turns family (``family: turns``, examples/turns.yaml): the lookup world
    (fourfold.tasks.lookup) at several hops (hops + 1 turns of perfect play), its data, tokenizer
    and SFT model once per hops, and PPO with and without a critic, GRPO and RLOO on each, every
    final policy's gold measured on the world's held-out chains."""

    hops: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 3])
    """Lookups before the answer (LookupTaskConfig.hops): 0, 1, 3 = 1, 2, 4 turns."""
    arms: list[str] = dataclasses.field(default_factory=lambda: list(TURNS_DEFAULT_ARMS))
    """The arms run at every hops (TURNS_ARMS): ppo, ppo-no-critic, grpo, rloo at rows x K, and
    ppo-256x1 (ppo-no-critic-256x1 too when listed) at one trajectory a row."""
    world_dir: str = "runs/turns-world"
    """Each hops' data, tokenizer and SFT model are cached in '<world_dir>-h<hops>'."""
    sft_config: str = "examples/lookup_sft.yaml"
    """The SFT stage's base config (a path from the working directory, else from the checkout)."""
    rl_config: str = "examples/lookup_grpo.yaml"
    """Every arm's base PPOConfig (env.factory, generation, ppo): the arm's settings go over it."""
    sft_overrides: list[str] = dataclasses.field(default_factory=list)
    """key=value overrides of the SFT config (paths, seed, lengths are set by the family)."""
    rl_overrides: list[str] = dataclasses.field(default_factory=list)
    """key=value overrides of every arm's config (before the arm's own settings)."""
    value_digits: int = 2
    """Digits of a chain's value (2: 100 values, too many (key, value) pairs to memorise)."""
    error_rate: float = 0.6
    """Share of SFT episodes with one mistake."""
    guess_share: float = 0.2
    """Share of those mistakes that guess without looking (hops >= 1)."""
    sft_examples: int = 4000
    """SFT episodes (training-side chains)."""
    prompts: int = 2048
    """RL prompts-file rows (training-side chains)."""
    world_seed: int = 0
    """Seed of the data and of the SFT model (one per hops, shared by every arm and seed)."""
    sft_steps_per_turn: int = 150
    """SFT steps = this x (hops + 1): a longer episode needs more (150: 300 steps at 2 turns, the
    measured recipe of docs/environments.md; at 4 turns 300 steps left the loss still falling)."""
    tokens_base: int = 20
    """env.max_tokens = tokens_base + tokens_per_hop x hops (room for perfect play and a mistake)."""
    tokens_per_hop: int = 12
    """Tokens of env.max_tokens per hop (see tokens_base)."""
    critic_lr: float = 3e-3
    """ppo.critic_lr of the critic arms (ppo, ppo-256x1): the value head starts at zero
    (model.critic_init=policy), and PPOConfig's default 1e-5 leaves it untrained (explained
    variance 0.000 over the family's first run); chosen on the pilot (docs/experiments.md)."""
    critic_warmup: int = 0
    """ppo.critic_warmup of the critic arms: iterations that train only the critic, run *before*
    the family's ``iterations`` (their ppo.iterations is iterations + this, so every arm takes the
    same policy updates; the warm-up's trajectories are extra). Chosen on the pilot."""
    critic_overrides: list[str] = dataclasses.field(default_factory=list)
    """key=value overrides of the critic arms only, after their critic_lr and critic_warmup (for a
    critic-only key such as ppo.critic_lam, which the critic-free arms' configs refuse)."""
    claims: TurnsClaimsConfig = dataclasses.field(default_factory=TurnsClaimsConfig)
    """The claims' thresholds."""

    def validate(self, prefix: str = "turns") -> None:
        require(len(self.hops) >= 1 and all(isinstance(h, int) and 0 <= h <= 3 for h in self.hops), f"{prefix}.hops",
                "must list hops in [0, 3]")
        require(len(set(self.hops)) == len(self.hops), f"{prefix}.hops", "a hops value is listed twice")
        bad = [a for a in self.arms if a not in TURNS_ARMS] + [None]
        require(bad[0] is None, f"{prefix}.arms", f"arm {bad[0]!r} does not run in the turns family; it runs "
                f"{', '.join(TURNS_ARMS)}")
        require(len(self.arms) >= 1 and len(set(self.arms)) == len(self.arms), f"{prefix}.arms",
                "must list arms, each once")
        require(1 <= self.value_digits <= 3, f"{prefix}.value_digits", "must be in [1, 3]")
        for key in ("error_rate", "guess_share"):
            require(0 <= getattr(self, key) <= 1, f"{prefix}.{key}", "must be in [0, 1]")
        require(self.sft_examples >= 1, f"{prefix}.sft_examples", "must be >= 1")
        require(self.sft_steps_per_turn >= 1, f"{prefix}.sft_steps_per_turn", "must be >= 1")
        require(self.prompts >= 1, f"{prefix}.prompts", "must be >= 1")
        require(self.tokens_base >= 8, f"{prefix}.tokens_base", "must be >= 8")
        require(self.tokens_per_hop >= 1, f"{prefix}.tokens_per_hop", "must be >= 1")
        require(self.critic_lr > 0, f"{prefix}.critic_lr", "must be > 0")
        require(isinstance(self.critic_warmup, int) and self.critic_warmup >= 0, f"{prefix}.critic_warmup",
                "must be an integer >= 0")
        require(isinstance(self.world_seed, int) and self.world_seed >= 0, f"{prefix}.world_seed",
                "must be an integer >= 0")
        for key in ("sft_overrides", "rl_overrides", "critic_overrides"):
            bad = [o for o in getattr(self, key) if not (isinstance(o, str) and "=" in o and o.split("=", 1)[0].strip())]
            require(not bad, f"{prefix}.{key}", f"each entry must be 'key=value' (got {bad[0]!r})" if bad else "")


@dataclasses.dataclass
class ExperimentsConfig:
    """`fourfold experiments`: every arm x seed on the demo's task at the same sample budget, a
    final evaluation of each saved policy on the same held-out prompts, report.html and summary.md
    with the claims table (see docs/experiments.md)."""

    quick: bool = False
    """A short check (about 5 minutes on 2 cores): seed 0, arms ppo / ppo-beta0 / grpo / dpo, a
    short budget, the quick demo (demo.quick=true) and only the claims that budget settles, against
    its own evaluation error (claims.quick); the summary lists the claims that need the full sweep.
    Default output paths get a '-quick' suffix so a quick run never replaces a full one. With
    family: horizon: seed 0, horizons 1 and 3, ppo and grpo, the quick demo's budgets, only the
    'knob' claim (fourfold.apps.experiments.horizon.HORIZON_QUICK)."""
    fresh: bool = False
    """Rerun every arm and evaluation (the demo's cached stages are kept: use demo.fresh for those)."""
    demo: DemoConfig = dataclasses.field(default_factory=DemoConfig)
    """The shared SFT model and reward model: `fourfold demo`'s settings (its stages are reused from
    the cache in demo.run.output_dir), and its ppo/generation sections, the base of every arm."""
    arms: list[str] = dataclasses.field(default_factory=lambda: [
        "ppo", "ppo-beta0", "ppo-beta-high", "ppo-1epoch", "ppo-no-critic", "grpo", "rloo", "reinforce-pp",
        "reinforce", "dpo", "ppo-unbiased-rm"])
    """Arms to run: ppo, ppo-beta0, ppo-beta-high, ppo-1epoch, ppo-no-critic, grpo, rloo, reinforce-pp,
    reinforce, dpo, ppo-unbiased-rm, ppo-adaptive-kl (optional: demo.ppo.kl_target as the target);
    the practice arms (optional, examples/practice.yaml): ppo-critic-policy-init, ppo-critic-warmup,
    ppo-beta0-dual-clip, ppo-bf16-copy, ppo-bf16-copy-recompute, ppo-bf16-copy-tis."""
    seeds: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2])
    """Seeds of every arm (run.seed of each run)."""
    iterations: int = 60
    """PPO iterations per run (each demo.ppo.rollout_batch_size samples); REINFORCE gets the same
    number of samples (same batch size, same number of iterations)."""
    workers: int = 2
    """Runs in parallel, each a `python -m fourfold.cli ppo|reinforce|dpo` subprocess with
    run.threads torch threads."""
    reinforce_lr_multipliers: list[float] = dataclasses.field(default_factory=lambda: [1.0, 3.0, 10.0])
    """REINFORCE learning rates as multiples of demo.ppo.lr (1.0 = PPO's; the best of the others is
    the tuned baseline)."""
    beta_high_multiplier: float = 100.0
    """ppo-beta-high uses kl_coef = this x demo.ppo.kl_coef."""
    unbiased_task_options: dict = dataclasses.field(default_factory=lambda: {"labeler_length_bias": 0.0})
    """Task options (over demo.task_options) of the labelers whose RM ppo-unbiased-rm uses."""
    unbiased_demo_dir: Optional[str] = None
    """Where the unbiased demo stages are cached; null = '<demo.run.output_dir>-unbiased'."""
    eval_prompts: int = 2048
    """Held-out prompts of the final evaluation (the demo's eval prompts: the same for every run)."""
    samples_in_report: int = 4
    """Sample responses per arm shown in the report."""
    claims: ExperimentsClaimsConfig = dataclasses.field(default_factory=ExperimentsClaimsConfig)
    """Which claims are checked and their thresholds."""
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(
        output_dir="runs/experiments", threads=1, save_every=10, tensorboard=False))
    """output_dir: report.html, summary.md, runs/<arm>/seed<k>/, logs/; threads: torch threads of
    each run; save_every: checkpoint period of each run (an interrupted sweep resumes); device;
    progress. run.seed is not used (see seeds)."""
    group_size: int = 4
    """K, the responses sampled per prompt by grpo and rloo (ppo.samples_per_prompt): an iteration
    still samples demo.ppo.rollout_batch_size responses, from rollout_batch_size / K prompts."""
    dpo_beta: float = 0.1
    """dpo: dpo.beta (the DPO paper's 0.1). The arm's data budget is the reward model's: the demo's
    pairs, demo.reward.steps steps of demo.reward.batch_size pairs."""
    dpo_lr: float = 1e-4
    """dpo: peak learning rate (linear warm-up over 5% of the steps, then linear decay)."""
    family: Literal["claims", "horizon", "overoptimization", "turns", "staleness", "warmup"] = "claims"
    """Which experiments: 'claims' (the method's claims, the arms above on the demo's task), 'horizon'
    (the same trainers at several response lengths gold wants: the horizon section) or
    'overoptimization' (gold and proxy against sqrt(KL) for best-of-n and PPO at several reward-model
    sizes: the overoptimization section) or 'turns' (PPO with and without a critic, GRPO, RLOO on the
    lookup world at 1, 2 and 4 turns: the turns section) or 'staleness' (a sampler running ahead:
    the objectives for stale samples and truncated sampling, the staleness section) or 'warmup' (the
    critic's start and warm-up where the critic pays: the warmup section); with the last five, arms,
    unbiased_* and the claims section are not read."""
    horizon: HorizonConfig = dataclasses.field(default_factory=HorizonConfig)
    """The horizon family's settings (family: horizon)."""
    overoptimization: OveroptimizationConfig = dataclasses.field(default_factory=OveroptimizationConfig)
    """The overoptimization family's settings (family: overoptimization)."""
    turns: TurnsConfig = dataclasses.field(default_factory=TurnsConfig)
    """The turns family's settings (family: turns; its runs read iterations, seeds, workers,
    group_size, eval_prompts: the held-out rows of every evaluation)."""
    staleness: StalenessConfig = dataclasses.field(default_factory=StalenessConfig)
    """The staleness family's settings (family: staleness; its runs read iterations, seeds, workers,
    eval_prompts and the demo section, as the claims family's)."""
    warmup: WarmupConfig = dataclasses.field(default_factory=WarmupConfig)
    """The warm-up family's settings (family: warmup; its runs read iterations, seeds, workers and
    eval_prompts; its world's demo section is the horizon family's, warmup.horizon_config)."""

    def validate(self, prefix: str = "") -> None:
        for a in self.arms:
            close = difflib.get_close_matches(str(a), EXPERIMENT_ARMS, n=1, cutoff=0.5)
            require(a in EXPERIMENT_ARMS, "arms", f"unknown arm {a!r}"
                    + (f" (did you mean {close[0]!r}?)" if close else "") + f"; known: {', '.join(EXPERIMENT_ARMS)}")
        require(len(set(self.arms)) == len(self.arms), "arms", "an arm is listed twice")
        require(len(self.arms) >= 1, "arms", "must name at least one arm")
        require(len(self.seeds) >= 1, "seeds", "must list at least one seed")
        require(len(set(self.seeds)) == len(self.seeds), "seeds", "a seed is listed twice")
        require(all(0 <= s <= MAX_SEED for s in self.seeds), "seeds", "each seed must be an integer in [0, 2**63 - 1]")
        require(self.iterations >= 1, "iterations", "must be >= 1")
        if "ppo-critic-warmup" in self.arms:
            require(self.iterations >= 10, "iterations", "must be >= 10 with arm ppo-critic-warmup (its "
                    f"critic_warmup is iterations // 10 and must be >= 1), got {self.iterations}")
        require(self.workers >= 1, "workers", "must be >= 1")
        if "reinforce" in self.arms:
            require(len(self.reinforce_lr_multipliers) >= 1, "reinforce_lr_multipliers", "must list at least one")
        require(all(m > 0 for m in self.reinforce_lr_multipliers), "reinforce_lr_multipliers", "must be > 0")
        require(len(set(self.reinforce_lr_multipliers)) == len(self.reinforce_lr_multipliers),
                "reinforce_lr_multipliers", "a multiplier is listed twice")
        require(self.beta_high_multiplier > 0, "beta_high_multiplier", "must be > 0")
        require(self.eval_prompts >= 2, "eval_prompts", "must be >= 2")
        require(self.samples_in_report >= 0, "samples_in_report", "must be >= 0")
        require(self.group_size >= 2, "group_size", "must be >= 2 (a group of one has no baseline)")
        require(self.dpo_beta > 0, "dpo_beta", "must be > 0")
        require(self.dpo_lr > 0, "dpo_lr", "must be > 0")
        if self.family == "horizon":
            need = 16 + self.horizon.tokens_per_sentence * (max(self.horizon.horizons) + 1)
            require(self.demo.model.max_positions >= need, "demo.model.max_positions",
                    f"must hold a 16-token prompt and the longest horizon's responses (horizon.tokens_per_sentence "
                    f"x (k + 1) tokens): >= {need}, got {self.demo.model.max_positions}")
        if self.family == "overoptimization":  # the keys of the design that runs ('sizes' or 'goodhart')
            o = self.overoptimization
            g, at = (o.goodhart, "overoptimization.goodhart") if o.design == "goodhart" else (o, "overoptimization")
            require(max(g.bon_prompts, g.curve_prompts) <= self.eval_prompts, f"{at}.bon_prompts",
                    f"bon_prompts and curve_prompts are taken from the eval prompts: must be <= eval_prompts "
                    f"({self.eval_prompts})")
            require(min(g.rm_pairs) >= self.demo.reward.batch_size, f"{at}.rm_pairs",
                    f"every size must have at least demo.reward.batch_size={self.demo.reward.batch_size} pairs")
        if "ppo-unbiased-rm" in self.arms:
            require(bool(self.unbiased_task_options), "unbiased_task_options",
                    "must change a task option (e.g. {labeler_length_bias: 0})")
