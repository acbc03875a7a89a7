"""`fourfold ppo`: the language-model sections (models, prompts, generation) and the PPO settings.

The model, prompt and generation sections are shared with REINFORCE and the demo."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Literal, Optional

from fourfold.config.critic import require_critic_init
from fourfold.config.dist import LMDistConfig, check_dist
from fourfold.config.env import EnvConfig
from fourfold.config.loader import require, validate_precision
from fourfold.config.lora import LoraConfig
from fourfold.config.model_limits import require_fits
from fourfold.config.rewards import ENV_PART, RewardSourcesConfig, require_rewards, reward_part_names
from fourfold.config.rollout import RolloutConfig
from fourfold.config.run import RunConfig
from fourfold.config.sampling import FILTERS_OFF, require_filters
from fourfold.names import (  # the zoo's names, written once there (fourfold.core reads them too)
    ADVANTAGE_NAMES,
    CORRECTION_CAPS,
    CORRECTION_MODES,
    CRITIC_ADVANTAGES,
    KL_KINDS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    RATIO_LEVELS,
    ZERO_AT_ONE_SAMPLE,
)


@dataclasses.dataclass
class PolicySourcesConfig:
    """The causal LMs of a model section (the first keys of :class:`LMModelConfig`)."""

    policy: Optional[str] = None
    """The SFT model: initialises the policy and (unless `reference` is set) is the frozen reference."""
    reference: Optional[str] = None
    """Frozen reference for the KL penalty; null = a frozen copy of `policy`."""


@dataclasses.dataclass
class LMModelConfig(RewardSourcesConfig, PolicySourcesConfig):
    """Which models play which role. Paths are local HF directories (or hub names when online). The
    reward sources (reward, reward_fn, reward_fns, reward_url and their weights) are
    :class:`~fourfold.config.rewards.RewardSourcesConfig`'s, shared with `fourfold score` and `fourfold bon`
    (the bases' keys come last base first: policy and reference, the reward sources, then these)."""

    critic: Optional[str] = None
    """Critic directory; null = initialise from `critic_init`."""
    critic_init: Optional[Literal["reward", "policy"]] = None
    """Where the critic starts (with model.critic null): 'reward', the reward model's backbone and
    head, or 'policy', the policy's backbone and a zero-initialised head; null (default) = reward
    when the run has a reward model (model.reward), else policy (validation writes the choice into
    the config). Only with a critic (ppo.advantage gae): refused with the critic-free estimators and in
    fourfold reinforce."""
    tokenizer: Optional[str] = None
    """Tokenizer directory; null = the policy's."""
    trust_remote_code: bool = False
    """Allow model code from the model's repository. Off unless you trust the source."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights dtype. float32 on CPU; bfloat16 on recent GPUs."""
    lora: Optional[LoraConfig] = None
    """LoRA mode: one frozen copy of `policy` in memory; the policy is an adapter on it, the
    reference is it with the adapters disabled, a LoRA reward model (the `model-adapter/` of a
    LoRA `fourfold reward` run on `policy`) is a third adapter. null = full fine-tuning."""
    critic_mode: Literal["separate", "adapter"] = "separate"
    """PPO's critic: 'separate', its own model as without LoRA (trained in full), or 'adapter', a
    second trained adapter plus a value head on the shared base (needs `lora`; with
    critic_init=reward it starts as the reward adapter, so the reward must be a LoRA adapter)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer of the trained roles (policy, critic) in backward instead of
    keeping its activations: less memory, about a third more compute; same loss and gradients."""
    precision: Literal["fp32", "bf16-mixed", "bf16"] = "fp32"
    """fp32: every role computes in its weights' dtype (model.dtype). bf16-mixed: the trained roles
    keep float32 master weights, gradients and AdamW state (model.dtype must be float32) and every
    forward runs under bf16 autocast (the standard on GPUs). bf16: the trained roles' weights,
    gradients and AdamW moments in bf16. Log-probs, values and losses are float32 in every mode."""
    frozen_dtype: Optional[Literal["bfloat16", "float16", "float32"]] = None
    """Weights dtype of the frozen roles (reference, reward model; with `lora`, the shared base);
    null = bfloat16 under precision bf16-mixed, else the trained roles' (float32 keeps them in
    float32 under bf16-mixed too)."""
    logits_chunk: Optional[int] = None
    """Apply the LM head to this many response tokens at a time when computing log-probs and
    entropies (recomputed in backward), so the full [tokens x vocab] logits never exist at once;
    null = all at once."""
    compile: bool = False
    """torch.compile each micro-batch's training pass of the trained roles (the policy's and the
    critic's forward and loss: PPO), with dynamic shapes (one graph whatever a minibatch's trimmed
    width). Same losses and gradients up to float rounding. Compiling costs tens of seconds per graph
    on a small CPU, so it pays only over long runs (docs/benchmarks.md); not with logits_chunk."""

    def validate(self, prefix: str = "model") -> None:
        require(self.policy is not None, f"{prefix}.policy", "missing: path to the SFT model directory")
        validate_precision(self.dtype, self.precision, prefix)
        require(self.logits_chunk is None or self.logits_chunk >= 1, f"{prefix}.logits_chunk",
                f"must be >= 1 or null, got {self.logits_chunk}")
        require(not (self.compile and self.logits_chunk), f"{prefix}.compile",
                "a compiled pass takes the whole logits at once; leave model.logits_chunk null with it")
        if self.lora is not None:
            require(self.reference is None, f"{prefix}.reference",
                    "must be null with model.lora: the reference is the policy's base model with adapters disabled")
        if self.critic_mode == "adapter":
            require(self.lora is not None, f"{prefix}.critic_mode", "'adapter' needs model.lora (the shared base)")
            require(self.critic is None, f"{prefix}.critic",
                    "a ready critic directory is a separate model: use critic_mode=separate")


@dataclasses.dataclass
class PromptDataConfig:
    """Where prompts come from."""

    prompts: Optional[str] = None
    """JSONL or Parquet file with a `prompt` (or chat `messages`) field per row."""
    task: Optional[str] = None
    """An embedded task name (e.g. 'review'), resolved by the CLI: prompts are sampled from it when
    `prompts` is null, and its hidden gold reward is logged as reward/gold_mean."""
    task_options: dict = dataclasses.field(default_factory=dict)
    """Options of that task (for 'review': fourfold.tasks.ReviewTaskConfig fields, e.g. {sentences: 3});
    {} = its defaults."""
    max_prompt_len: int = 64
    """Prompts longer than this many tokens are an error naming the file and line."""
    on_error: Literal["raise", "skip"] = "raise"
    """Bad rows: stop with an error naming file and line, or skip them and count them in the log."""

    def validate(self, prefix: str = "data") -> None:
        require(self.prompts is not None or self.task is not None, f"{prefix}.prompts",
                "missing: a prompts file (or data.task for an embedded task)")
        require(self.max_prompt_len >= 1, f"{prefix}.max_prompt_len", "must be >= 1")
        require(self.task is not None or not self.task_options, f"{prefix}.task_options", "set, but data.task is null")


def resolve_weights(weights: str, policy_sharded: bool) -> str:
    """The engine weights a run uses for ``generation.weights`` = ``weights``: ``auto`` is
    ``gathered`` when the policy is FSDP-sharded (each unit gathered once per rollout instead of at
    every token: the same numbers, about 4x faster generation on workload W with two processes) and
    ``live`` otherwise (where the two are the same module); any other value is itself."""
    if weights != "auto":
        return weights
    return "gathered" if policy_sharded else "live"


@dataclasses.dataclass
class GenerationConfig:
    """How the policy samples responses during training."""

    max_new_tokens: int = 32
    """Longest response; rows stop at their first EOS."""
    temperature: float = 1.0
    """Sampling temperature; the same temperature scales every log-prob used in training."""
    top_k: int = 0
    """Sample from the top_k most probable tokens (ties with the k-th kept), after the temperature;
    0 = off. With a filter (top_k, top_p, min_p) the rollout's log-probs are the truncated
    distribution's, renormalised, the trainer's the full softmax: the gap is logged
    (rollout/log_kept_mass, mismatch/*), ppo.old_logprobs auto recomputes pi_old and
    ppo.rollout_correction corrects it (docs/correction.md, Truncated sampling)."""
    top_p: float = 1.0
    """Nucleus, in (0, 1]: the smallest set of most probable tokens whose probability reaches top_p
    (after top_k; the top token always, tokens tied at the edge all); 1 = off."""
    min_p: float = 0.0
    """In [0, 1): only the tokens of probability >= min_p x the top token's (after top_p); 0 = off."""
    missing_eos_score: Optional[float] = None
    """If set, a response that reaches max_new_tokens without EOS gets this score in place of the
    reward model's (counted as reward/no_eos_penalised)."""
    stop_at_eos: bool = True
    """Stop rows at EOS (false: fixed-length responses, used by benchmarks)."""
    engine: Literal["eager", "static"] = "eager"
    """What runs the rollout's sampling loop (fourfold.rollout.engine). 'eager': Hugging Face
    forwards with a KV cache that grows by one position per token, and one host-device sync per
    token to see whether every row has finished. 'static': a KV cache preallocated for
    data.max_prompt_len + max_new_tokens positions and a one-token step whose tensors never change
    shape (compiled with `compile`), the finished check every stop_check_every tokens. The same
    tokens from the same seed; log-probs equal up to float rounding (about 1e-6 in float32). With
    env.factory (multi-turn) both keep the KV cache across turns; the static engine's holds
    env.max_tokens + 1 positions and checks every token (stop strings end turns)."""
    weights: Literal["auto", "live", "gathered", "copy"] = "auto"
    """Where the engine's forwards take the policy's weights from (fourfold.rollout.weights), synced
    once per iteration after the update. 'auto' (the default): 'gathered' when the policy is
    FSDP-sharded (under torchrun), else 'live': the fastest of the two, and both compute the same
    numbers (resolve_weights). 'live': the training module as it is (a LoRA adapter applied on the
    fly, bf16 autocast under bf16-mixed, FSDP gathering every layer at every token: the least
    memory under torchrun, the slowest). 'gathered': the training module with each FSDP unit
    gathered once per rollout (the whole policy on every rank while sampling, counted by
    `fourfold estimate`; the same as live in one process). 'copy': a plain
    inference copy of the policy refreshed in place after each update: LoRA merged into it, FSDP
    shards gathered into it, in bf16 when model.precision is bf16-mixed or bf16 (no autocast while
    sampling; under bf16-mixed pi_old then differs from the training forward by bf16 rounding).
    Costs one more copy of the policy's weights (counted by `fourfold estimate`)."""
    compile: bool = False
    """torch.compile the static engine's one-token step (engine: static only): CUDA graphs
    (mode reduce-overhead) on CUDA, inductor on CPU. The first rollout pays the compile (tens of
    seconds on CPU), so it pays on long runs only. Under torchrun with an FSDP policy it needs
    weights: copy."""
    stop_check_every: int = 8
    """The static engine reads "has every row finished?" (a host-device sync, and an all-reduce
    under torchrun) every this many tokens instead of every token; finished rows emit pad until
    then and the extra steps are cut off, so the result does not change (engine: static only: with
    the eager engine, which checks every token, a value other than 8 is refused, as compile is)."""

    ENGINE_KEYS = ("engine", "weights", "compile", "stop_check_every")
    """The keys that choose how sampling runs, not what it samples (a stage key leaves them out at
    their defaults: fourfold.apps.cache.LATER_KEYS)."""
    TRUNCATION_KEYS = tuple(FILTERS_OFF)
    """The sampling filters (fourfold.config.sampling): off, a stage key leaves them out (LATER_KEYS)."""

    def validate(self, prefix: str = "generation") -> None:
        require(self.max_new_tokens >= 1, f"{prefix}.max_new_tokens", "must be >= 1")
        require(self.temperature > 0, f"{prefix}.temperature", f"must be > 0, got {self.temperature}")
        require_filters(self, prefix)
        # the static engine's own keys, off their defaults, are refused with the eager engine (which
        # reads neither): one rule for both, so no setting is silently ignored
        require(not self.compile or self.engine == "static", f"{prefix}.compile",
                f"compiles the static engine's step; set {prefix}.engine=static (or compile=false)")
        require(self.stop_check_every == STOP_CHECK_EVERY or self.engine == "static", f"{prefix}.stop_check_every",
                f"the static engine's setting (the eager engine checks every token); set {prefix}.engine=static "
                f"(or leave stop_check_every at {STOP_CHECK_EVERY})")
        require(self.stop_check_every >= 1, f"{prefix}.stop_check_every", f"must be >= 1, got {self.stop_check_every}")


STOP_CHECK_EVERY = 8
"""The default of ``generation.stop_check_every`` (the only value the eager engine accepts)."""


@dataclasses.dataclass
class PPOAlgoConfig:
    """PPO hyperparameters, named as in the literature (Ziegler et al. 2019, Ouyang et al. 2022)."""

    iterations: int = 100
    """PPO iterations; each samples rollout_batch_size responses."""
    rollout_batch_size: int = 64
    """Responses per iteration (= prompts, unless samples_per_prompt > 1)."""
    minibatch_size: int = 16
    """Responses per optimizer step; rollout_batch_size / minibatch_size steps per epoch."""
    micro_batch_size: Optional[int] = None
    """Gradient-accumulation chunk within a minibatch (memory); null = the whole minibatch."""
    micro_batch_tokens: Optional[int] = None
    """Instead of micro_batch_size: micro-batches by tokens. A minibatch's rows are sorted by length
    (prompt + response) and grouped so that each group, padded to its own longest row, holds at most
    this many tokens (a longer row alone): no compute on the padding a mixed-length minibatch
    carries. The same loss and gradients up to float rounding; null = rows (micro_batch_size)."""
    ppo_epochs: int = 4
    """Passes over each rollout batch."""
    clip_eps: float = 0.2
    """Clip range of the probability ratio in the surrogate objective."""
    vf_clip_eps: Optional[float] = 0.2
    """Clip range of the value update around the rollout's values; null = plain MSE."""
    gamma: float = 1.0
    """Discount (1: the episode is one response)."""
    lam: float = 0.95
    """GAE lambda."""
    kl_coef: float = 0.05
    """beta: weight of the per-token KL penalty to the reference."""
    kl_estimator: Literal[KL_KINDS] = "k1"
    """Per-token KL estimator used in the reward (k1 = log pi - log pi_ref); the loss term of
    kl_in=loss is always k3."""
    adaptive_kl: bool = False
    """Adapt kl_coef toward kl_target (Ziegler et al.)."""
    kl_target: float = 6.0
    """Target per-sequence KL (nats) of the adaptive controller."""
    kl_horizon: int = 10000
    """Horizon (in samples) of the adaptive controller."""
    lr: float = 1e-5
    """Policy learning rate (AdamW)."""
    critic_lr: float = 1e-5
    """Critic learning rate (AdamW)."""
    lr_schedule: Literal["linear", "constant"] = "linear"
    """Linear decay to 0 over all optimizer steps, or constant."""
    weight_decay: float = 0.0
    """AdamW weight decay for both trained models."""
    max_grad_norm: Optional[float] = 1.0
    """Global gradient-norm clip per model; null = no clipping."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus in the policy loss."""
    whiten_rewards: bool = False
    """Whiten the token rewards over the batch before GAE."""
    whiten_advantages: bool = True
    """Whiten advantages over the batch (valid tokens) before the epochs (advantage: gae only; the
    critic-free estimators normalise their own)."""
    use_critic: bool = True
    """False: no value baseline; advantages are the whitened returns (ablation 'ppo-no-critic').
    Applies to `advantage: gae` only, where false runs the estimator `reinforce_pp` instead (the
    discounted returns, whitened over the batch; needs whiten_advantages: true). The critic-free
    estimators never load a critic, whatever this says."""
    advantage: str = "gae"
    """Advantage estimator, a name registered in fourfold.core.estimators: 'gae' (GAE with the
    critic; PPO), or one that loads no critic (vf_clip_eps, critic_lr, lam and whiten_advantages do
    not apply; each normalises its own advantages): 'grpo' (group mean and std of the K samples of a
    prompt; Shao et al. 2024: K = 8 or so with kl_in=loss, kl_coef=0.04, seq-mean-token-mean),
    'dr_grpo' (group mean, no std; Liu et al. 2025: with loss_agg=seq-mean-token-sum), 'rloo'
    (leave-one-out mean of the other K - 1 samples; Ahmadian et al. 2024: K = 2-4, KL in the
    reward; K = 1 is REINFORCE without a baseline), 'reinforce_pp' (discounted returns whitened
    over the batch; Hu 2025: KL in the reward, K = 1)."""
    samples_per_prompt: int = 1
    """K responses sampled per prompt, on K consecutive rows (the group of grpo, dr_grpo and rloo).
    rollout_batch_size stays the responses per iteration, so an iteration draws
    rollout_batch_size / K prompts (K must divide it) and budgets compare at equal samples."""
    kl_in: Literal["reward", "loss"] = "reward"
    """Where the KL to the reference goes. 'reward': -kl_coef * KL_t (kl_estimator) on every token
    of the rewards (Ziegler et al. 2019; PPO, RLOO, REINFORCE++). 'loss': the rewards carry the score
    alone and kl_coef * the k3 estimate of KL(pi || pi_ref) joins the policy loss, aggregated like it
    (GRPO: Shao et al. 2024, kl_coef 0.04); kl_coef stays fixed (adaptive_kl steers the reward's KL)."""
    loss_agg: Literal[LOSS_AGG_MODES] = "token-mean"
    """How the per-token policy loss (and the entropy bonus and KL term) is averaged: over every
    valid token (token-mean: PPO as in TRL; DAPO, Yu et al. 2025), per response then over responses
    (seq-mean-token-mean: GRPO's formula, a length bias), or summed per response then averaged
    (seq-mean-token-sum: Dr. GRPO, Liu et al. 2025). Micro-batches are weighted to give the
    minibatch's aggregate."""
    clip_eps_low: Optional[float] = None
    """Lower clip range of the ratio (1 - clip_eps_low); null = clip_eps."""
    clip_eps_high: Optional[float] = None
    """Upper clip range of the ratio (1 + clip_eps_high); null = clip_eps. DAPO's clip-higher (Yu et
    al. 2025) uses 0.2 low / 0.28 high: low-probability tokens with a positive advantage grow further."""
    old_logprobs: Literal["auto", "engine", "recompute"] = "auto"
    """Where the update's pi_old comes from. 'engine': the rollout engine's log-probs of the sampled
    tokens. 'recompute': one no-grad training forward of the policy on the rollout before the
    update (the first epoch's micro-batches, so the first minibatch's ratio is exactly 1).
    'auto' (default): recompute when the engine's numerics differ from the training forward's
    beyond float32 rounding, i.e. model.precision bf16-mixed or bf16 (the engine's bf16 copy, or
    autocast over a KV cache: 1e-3 per token on the tiny test model), a rollout_correction, or a
    generation.top_k/top_p/min_p filter (the engine's log-probs are the truncated distribution's);
    else engine (fp32: the eager and static engines, compiled or not, agree with the training
    forward to ~5e-7). rollout.max_staleness >= 1 without a rollout_correction: engine (docs/correction.md,
    Stale samples). The run's first lines say which (resolve_old_logprobs)."""
    measure_mismatch: bool = True
    """Log mismatch/* every iteration: the training forward's log-probs against the engine's on the
    same tokens. Free under recompute (that forward is it); under engine it costs one no-grad
    policy forward per iteration (measured on the tiny test model: docs/correction.md)."""
    rollout_correction: Literal[CORRECTION_MODES] = "none"
    """Importance weights for the engine-trainer mismatch, multiplying each token's policy loss
    (fourfold.core.correction.rollout_correction_weights; docs/correction.md): 'token_tis' /
    'seq_tis' truncate the token / sequence ratio pi_train / pi_engine at the cap (TRL
    token_truncate / sequence_truncate), 'token_mis' / 'seq_mis' zero the tokens / responses whose
    ratio exceeds it (TRL token_mask / sequence_mask), 'geo_mis' zeroes the responses whose
    per-token geometric-mean ratio leaves [1/cap, cap]. Needs old_logprobs recompute (or auto)."""
    rollout_correction_cap: Optional[float] = None
    """The cap (> 1) of rollout_correction; null = the mode's preset (CORRECTION_CAPS: token_tis and
    token_mis 2, as verl's token TIS; seq_tis and seq_mis 3, TRL's clip_max; geo_mis 1.01)."""
    policy_loss: Literal[POLICY_LOSSES] = "clip"
    """'clip': PPO's clipped surrogate. 'cispo' (MiniMax-M1, 2025): the ratio as a detached weight
    clipped at 1 + clip_eps_high, times A and the log-prob: every token keeps a gradient."""
    ratio_level: Literal[RATIO_LEVELS] = "token"
    """'token': one ratio per token (PPO). 'sequence' (GSPO, Zheng et al. 2025): every token of a
    response uses its geometric-mean ratio exp(mean_t log(pi/pi_old)), clipped as a token's."""
    dual_clip: Optional[float] = None
    """c > 1: dual-clip PPO (Ye et al. 2020): for A < 0 the surrogate is bounded below by c * A, so
    a huge ratio on a negative advantage cannot blow up the loss (verl clip_ratio_c = 3); null = off."""
    critic_warmup: int = 0
    """The first this many iterations train only the critic (the policy's weights, optimiser state
    and LR schedule untouched; its schedule spans the iterations after them). advantage: gae only."""
    critic_lam: Optional[float] = None
    """GAE lambda of the critic's value targets (returns = GAE(critic_lam) + V); the advantages keep
    `lam` (decoupled, as VAPO: Yue et al. 2025, critic lambda 1.0). null = lam."""
    critic_from: Optional[str] = None
    """Warm-start the critic's weights (only: a fresh optimiser) from an earlier run's checkpoint
    directory (checkpoints/step-N) or its run directory (its newest checkpoint). A plain critic
    directory is model.critic instead. null = model.critic / model.critic_init."""
    filter_groups: bool = False
    """DAPO's dynamic sampling (Yu et al. 2025): drop the groups (the samples_per_prompt rows of a
    prompt) whose scores are all equal and refill from rollouts of further prompts, at most
    filter_groups_max_batches rollouts an iteration; when still short, dropped groups complete the
    batch (fourfold.trainers.groups). Needs samples_per_prompt >= 2."""
    filter_groups_max_batches: int = 3
    """The bound on filter_groups' rollouts per iteration (>= 1; 1 = measure, never refill)."""
    overlong_buffer: Optional[int] = None
    """DAPO's soft overlong punishment: responses longer than generation.max_new_tokens - this many
    tokens lose up to overlong_penalty of score, linearly (fourfold.core.correction.overlong_penalty);
    null = off."""
    overlong_penalty: float = 1.0
    """The largest overlong punishment (at max_new_tokens tokens)."""
    mask_truncated: bool = False
    """Leave the responses that reached max_new_tokens without EOS out of the losses (their rows'
    tokens get no weight; TRL mask_truncated_completions). Needs generation.stop_at_eos."""
    log_grad_snr: bool = False
    """Log policy/grad_snr: ||mean g|| / rms ||g_i - mean g|| of each epoch's minibatch gradients
    (unclipped), averaged over epochs; needs >= 2 minibatches per epoch. Costs a float32 copy of the
    gradient per step and two of memory (docs/experiments.md); changes nothing else."""

    PRACTICE_KEYS = ("old_logprobs", "measure_mismatch", "rollout_correction", "rollout_correction_cap",
                     "policy_loss", "ratio_level", "dual_clip", "critic_warmup", "critic_lam", "critic_from",
                     "filter_groups", "filter_groups_max_batches", "overlong_buffer", "overlong_penalty",
                     "mask_truncated")
    """The keys of issue 32 (the mismatch, its correction, the newer losses, the critic's lifecycle):
    at their defaults a run computes what it did before they existed (a stage key leaves them out
    then: fourfold.apps.cache.LATER_KEYS)."""

    def validate(self, prefix: str = "ppo") -> None:
        require(self.iterations >= 1, f"{prefix}.iterations", "must be >= 1")
        require(self.rollout_batch_size >= 1, f"{prefix}.rollout_batch_size", "must be >= 1")
        require(self.minibatch_size >= 1, f"{prefix}.minibatch_size", "must be >= 1")
        require(self.minibatch_size <= self.rollout_batch_size, f"{prefix}.minibatch_size",
                f"{self.minibatch_size} is larger than rollout_batch_size={self.rollout_batch_size}")
        require(self.rollout_batch_size % self.minibatch_size == 0, f"{prefix}.rollout_batch_size",
                f"{self.rollout_batch_size} is not divisible by minibatch_size={self.minibatch_size}")
        require(not self.log_grad_snr or self.rollout_batch_size >= 2 * self.minibatch_size, f"{prefix}.log_grad_snr",
                "needs >= 2 minibatches per epoch (rollout_batch_size >= 2 x minibatch_size)")
        require(self.micro_batch_tokens is None or self.micro_batch_tokens >= 1, f"{prefix}.micro_batch_tokens",
                f"must be >= 1 or null, got {self.micro_batch_tokens}")
        require(self.micro_batch_tokens is None or self.micro_batch_size is None, f"{prefix}.micro_batch_tokens",
                "splits minibatches by tokens instead of rows: leave micro_batch_size null with it")
        if self.micro_batch_size is not None:
            require(self.micro_batch_size >= 1 and self.minibatch_size % self.micro_batch_size == 0,
                    f"{prefix}.micro_batch_size", f"must divide minibatch_size={self.minibatch_size}")
        require(self.ppo_epochs >= 1, f"{prefix}.ppo_epochs", "must be >= 1")
        require(self.clip_eps > 0, f"{prefix}.clip_eps", f"must be > 0, got {self.clip_eps}")
        require(self.vf_clip_eps is None or self.vf_clip_eps > 0, f"{prefix}.vf_clip_eps", "must be > 0 or null")
        require(0 <= self.gamma <= 1, f"{prefix}.gamma", "must be in [0, 1]")
        require(0 <= self.lam <= 1, f"{prefix}.lam", "must be in [0, 1]")
        require(self.kl_coef >= 0, f"{prefix}.kl_coef", f"must be >= 0, got {self.kl_coef}")
        require(self.kl_target > 0, f"{prefix}.kl_target", "must be > 0")
        require(self.kl_horizon >= 1, f"{prefix}.kl_horizon", "must be >= 1")
        require(self.lr > 0, f"{prefix}.lr", "must be > 0")
        require(self.critic_lr > 0, f"{prefix}.critic_lr", "must be > 0")
        require(self.weight_decay >= 0, f"{prefix}.weight_decay", f"must be >= 0, got {self.weight_decay}")
        require(self.max_grad_norm is None or self.max_grad_norm > 0, f"{prefix}.max_grad_norm", "must be > 0 or null")
        require(self.entropy_coef >= 0, f"{prefix}.entropy_coef", "must be >= 0")
        self._validate_estimator(prefix)

    def _validate_estimator(self, prefix: str) -> None:
        """The keys of the estimator and its knobs (advantage ... clip_eps_high)."""
        if self.advantage not in ADVANTAGE_NAMES:
            close = difflib.get_close_matches(self.advantage, ADVANTAGE_NAMES, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            require(False, f"{prefix}.advantage",
                    f"unknown estimator {self.advantage!r}{hint}; known: {', '.join(ADVANTAGE_NAMES)}")
        K = self.samples_per_prompt
        require(K >= 1, f"{prefix}.samples_per_prompt", f"must be >= 1, got {K}")
        require(self.rollout_batch_size % K == 0, f"{prefix}.samples_per_prompt",
                f"{K} does not divide rollout_batch_size={self.rollout_batch_size} (the responses per "
                "iteration: an iteration draws rollout_batch_size / samples_per_prompt prompts)")
        require(K >= 2 or self.advantage not in ZERO_AT_ONE_SAMPLE, f"{prefix}.samples_per_prompt",
                f"advantage={self.advantage} needs >= 2 samples per prompt (with 1 every advantage is 0), e.g. 4")
        require(self.use_critic or self.advantage not in CRITIC_ADVANTAGES or self.whiten_advantages,
                f"{prefix}.use_critic", "false runs advantage=reinforce_pp, whose returns are whitened: "
                "whiten_advantages=false (the raw returns as advantages) has no critic-free form")
        require(not self.whiten_rewards or self.advantage in CRITIC_ADVANTAGES, f"{prefix}.whiten_rewards",
                f"applies to advantage=gae only (advantage={self.advantage} normalises its own advantages)")
        require(not (self.adaptive_kl and self.kl_in == "loss"), f"{prefix}.adaptive_kl",
                "steers the KL in the reward; kl_in=loss takes the fixed kl_coef")
        for key in ("clip_eps_low", "clip_eps_high"):
            value = getattr(self, key)
            require(value is None or value > 0, f"{prefix}.{key}", f"must be > 0 or null, got {value}")
        self._validate_practice(prefix)

    def _validate_practice(self, prefix: str) -> None:
        """The keys of pi_old, the rollout correction, the newer losses and the critic's lifecycle."""
        require(self.rollout_correction == "none" or self.old_logprobs != "engine", f"{prefix}.rollout_correction",
                "weights pi_train / pi_engine need the trainer's pi_old: set old_logprobs to recompute or auto")
        cap = self.rollout_correction_cap
        require(cap is None or cap > 1, f"{prefix}.rollout_correction_cap", f"must be > 1 or null, got {cap}")
        require(cap is None or self.rollout_correction != "none", f"{prefix}.rollout_correction_cap",
                f"set, and {prefix}.rollout_correction is none: there are no weights to cap (set a mode, e.g. token_tis)")
        require(self.dual_clip is None or self.dual_clip > 1, f"{prefix}.dual_clip",
                f"must be > 1 or null, got {self.dual_clip}")
        require(self.dual_clip is None or self.policy_loss == "clip", f"{prefix}.dual_clip",
                "bounds the clipped surrogate: it needs policy_loss=clip")
        critic = self.loads_critic
        require(self.critic_warmup >= 0, f"{prefix}.critic_warmup", f"must be >= 0, got {self.critic_warmup}")
        require(self.critic_warmup < self.iterations, f"{prefix}.critic_warmup",
                f"{self.critic_warmup} leaves no policy iteration of iterations={self.iterations}")
        require(self.critic_warmup == 0 or critic, f"{prefix}.critic_warmup", "needs a critic (advantage: gae)")
        require(self.critic_lam is None or (0 <= self.critic_lam <= 1 and critic), f"{prefix}.critic_lam",
                f"must be in [0, 1] with a critic (advantage: gae), got {self.critic_lam}")
        require(self.critic_from is None or critic, f"{prefix}.critic_from", "needs a critic (advantage: gae)")
        require(not self.filter_groups or self.samples_per_prompt >= 2, f"{prefix}.filter_groups",
                "drops groups whose scores are all equal: it needs samples_per_prompt >= 2")
        require(self.filter_groups_max_batches >= 1, f"{prefix}.filter_groups_max_batches",
                f"must be >= 1, got {self.filter_groups_max_batches}")
        require(self.overlong_buffer is None or self.overlong_buffer >= 1, f"{prefix}.overlong_buffer",
                f"must be >= 1 or null, got {self.overlong_buffer}")
        require(self.overlong_penalty >= 0, f"{prefix}.overlong_penalty", f"must be >= 0, got {self.overlong_penalty}")

    @property
    def correction_cap(self) -> float:
        """The cap rollout_correction uses: rollout_correction_cap, or the mode's preset."""
        return self.rollout_correction_cap or CORRECTION_CAPS.get(self.rollout_correction, 2.0)

    @property
    def estimator(self) -> str:
        """The registered estimator the run computes: ``advantage``, except that ``use_critic:
        false`` with gae is ``reinforce_pp`` (the same whitened discounted returns, no critic)."""
        if not self.use_critic and self.advantage in CRITIC_ADVANTAGES:
            return "reinforce_pp"
        return self.advantage

    @property
    def loads_critic(self) -> bool:
        """The run loads and trains a critic: its estimator reads critic values (gae with use_critic)."""
        return self.estimator in CRITIC_ADVANTAGES

    @property
    def steps_per_iteration(self) -> int:
        """Optimizer steps per iteration (per trained model)."""
        return self.ppo_epochs * (self.rollout_batch_size // self.minibatch_size)


@dataclasses.dataclass
class RolloutStageConfig:
    """What the language-model RL stages (PPO, REINFORCE) share: the models, the prompts and the
    generation; each stage adds its algorithm section, then ``run`` and ``dist``."""

    model: LMModelConfig = dataclasses.field(default_factory=LMModelConfig)
    data: PromptDataConfig = dataclasses.field(default_factory=PromptDataConfig)
    generation: GenerationConfig = dataclasses.field(default_factory=GenerationConfig)
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)

    def validate(self, prefix: str = "") -> None:
        check_dist(self.dist, self.run)
        if self.env.factory is None:
            unused = [f.name for f in dataclasses.fields(EnvConfig) if getattr(self.env, f.name) != getattr(EnvConfig(), f.name)]
            require(not unused, f"env.{unused[0] if unused else ''}",
                    "set, and env.factory is null: there is no environment to apply it to (set env.factory)")
            require_one_reward(self.model)
            require_rollout_fits(self.model, self.data, self.generation)
        else:
            require_env_fits(self.model, self.env, self.generation)


def require_env_fits(model: LMModelConfig, env: EnvConfig, gen: GenerationConfig) -> None:
    """With ``env.factory``: the environment's step is one reward part (``env.reward_weight``), any
    reward model, function or server beside it the others (each checked as without an environment),
    no missing-EOS score (a turn's reward is the environment's), and a whole trajectory
    (``env.max_tokens``) fits every model directory of the run."""
    if reward_part_names(model):
        require_rewards(model)
    for name, key in reward_part_names(model):
        require(name != ENV_PART, key, f"named {ENV_PART!r}, the environment's own part with env.factory: give it another name")
    require(gen.missing_eos_score is None, "generation.missing_eos_score",
            "not applied with env.factory (each turn's reward is the environment's); set it to null")
    require_fits(env.max_tokens, "env.max_tokens",
                 [(f"model.{role}", getattr(model, role)) for role in ("policy", "reference", "critic", "reward")])


@dataclasses.dataclass
class PPOConfig(RolloutStageConfig):
    """`fourfold ppo`: the four-model PPO stage."""

    ppo: PPOAlgoConfig = dataclasses.field(default_factory=PPOAlgoConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs/ppo"))
    dist: LMDistConfig = dataclasses.field(default_factory=LMDistConfig)

    def validate(self, prefix: str = "") -> None:
        super().validate(prefix)
        buffer = self.ppo.overlong_buffer
        gen = self.generation
        if self.env.factory is None:
            limit, what = gen.max_new_tokens, f"generation.max_new_tokens={gen.max_new_tokens}"
        else:  # an environment run's lengths are its trajectories' policy tokens
            limit = self.env.policy_token_budget(gen.max_new_tokens)
            what = (f"the trajectory budget {limit} (generation.max_new_tokens x env.max_turns, at most "
                    f"env.max_tokens)")
        require(buffer is None or buffer <= limit, "ppo.overlong_buffer", f"{buffer} is more than {what}")
        require(not self.ppo.mask_truncated or gen.stop_at_eos, "ppo.mask_truncated",
                "a truncated response is one without EOS: it needs generation.stop_at_eos true")
        require(self.ppo.critic_from is None or self.model.critic is None, "ppo.critic_from",
                "model.critic is set too: keep one source of the critic's weights")
        require_critic_init(self.model, self.ppo, env_run=self.env.factory is not None)


def resolve_old_logprobs(algo: PPOAlgoConfig, precision: str, staleness: int = 0) -> tuple[str, str]:
    """``(engine | recompute, why)``: the pi_old a run uses for ``ppo.old_logprobs`` (``auto``:
    recompute under a rollout correction or a bf16 ``model.precision``, whose engine log-probs
    differ from the training forward's by bf16 rounding; else engine). The engine does not enter:
    in fp32 the eager engine and the static one, compiled by inductor or not, give the training
    forward's log-probs to float rounding (at most 4.8e-7 per token on the tiny test model, as a
    KV-cache step and a full forward round apart: tests/trainers/test_practice.py).

    With a sampler running ahead (``staleness`` = ``rollout.max_staleness`` >= 1) and no correction,
    ``auto`` is engine whatever the precision: the ratio pi / pi_sampler keeps the staleness, which a
    recomputed pi_old without a correction would drop (docs/correction.md, Stale samples)."""
    if algo.old_logprobs != "auto":
        return algo.old_logprobs, f"ppo.old_logprobs: {algo.old_logprobs}"
    if algo.rollout_correction != "none":
        return "recompute", f"ppo.old_logprobs: auto = recompute (rollout_correction {algo.rollout_correction})"
    if staleness > 0:
        return "engine", (f"ppo.old_logprobs: auto = engine (rollout.max_staleness {staleness} without a "
                          "rollout_correction: the ratio is pi / pi_sampler, its staleness included)")
    if precision != "fp32":
        return "recompute", (f"ppo.old_logprobs: auto = recompute (model.precision {precision}: the engine's "
                             "log-probs differ from the training forward's by bf16 rounding)")
    return "engine", "ppo.old_logprobs: auto = engine (fp32: the engine's log-probs are the trainer's to float rounding)"


def require_one_reward(model, prefix: str = "model") -> None:
    """At least one reward source scores the responses (the model section of PPO, REINFORCE and
    `fourfold score`): :func:`fourfold.config.rewards.require_rewards`."""
    require_rewards(model, prefix)


def require_rollout_fits(model: LMModelConfig, data: PromptDataConfig, gen: GenerationConfig) -> None:
    """The longest prompt plus the longest response fits every model directory of the run (read
    from their config.json, before any model loads): PPO and REINFORCE."""
    require_fits(data.max_prompt_len + gen.max_new_tokens,
                 f"data.max_prompt_len + generation.max_new_tokens = {data.max_prompt_len} + {gen.max_new_tokens}",
                 [(f"model.{role}", getattr(model, role)) for role in ("policy", "reference", "reward", "critic")])
