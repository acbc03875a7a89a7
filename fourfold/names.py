"""The names fourfold's layers share as strings, each written once and read by every layer that
needs it (the standard library alone, so fourfold.config reads it without torch and fourfold.core
without the config):

* the metric names: every name a loop logs, documented once (``METRICS``), the names made from the
  config by their pattern (``METRIC_PATTERNS``) and the groups' titles (``METRIC_GROUPS``).
  :mod:`fourfold.reporting` re-exports them and renders the table (the README embeds it); a test
  checks that every name a loop logs is here.
* the method zoo's names: the values of each config key that picks a piece of math
  (``ppo.advantage``, ``ppo.policy_loss``, ``ppo.ratio_level``, ``ppo.loss_agg``,
  ``ppo.kl_estimator``, ``ppo.rollout_correction`` and its preset caps, ``dpo.loss``,
  ``env.truncation``). The config types its keys with them (``Literal[POLICY_LOSSES]``) and
  validates against them; fourfold.core's registries and tables are checked against them when
  core is imported (:func:`check_names`: a name without an entry, or an entry without a name,
  stops the import).
"""
from __future__ import annotations

import re

# ---- the metric table ----------------------------------------------------------------------------

METRICS: dict[str, str] = {
    # counters
    "iteration": "PPO/REINFORCE iteration (one rollout batch + its updates), 1-based.",
    "samples": "Responses (prompts x ppo.samples_per_prompt) sampled so far.",
    # reward
    "reward/score_mean": ("Mean reward-model score of the sampled responses (before KL penalty); under ppo.filter_groups "
                          "the kept batch's (as are score_std/min/max), the first rollout's is reward/first_score_mean."),
    "reward/first_score_mean": ("Under ppo.filter_groups: the mean score of the iteration's first rollout, before "
                                "groups of equal scores were dropped and refilled (reward/score_mean is the kept batch's)."),
    "reward/score_std": "Standard deviation of the reward-model scores in the batch.",
    "reward/score_min": "Smallest reward-model score in the batch.",
    "reward/score_max": "Largest reward-model score in the batch.",
    "reward/gold_mean": "Mean task-provided gold reward of the responses (only for tasks that have one).",
    "reward/token_reward_sum_mean": "Mean over sequences of the summed per-token rewards (KL-penalised unless ppo.kl_in is loss).",
    "reward/no_eos_penalised": "Share of responses given the missing-EOS penalty instead of their score.",
    "reward/frac_zero_std": ("Share of prompt groups (ppo.samples_per_prompt > 1) whose scores are all equal: a group "
                             "estimator gives them advantage 0 (TRL's frac_reward_zero_std)."),
    "reward/filtered_groups": "Groups dropped by DAPO's dynamic sampling this iteration (ppo.filter_groups).",
    "reward/filter_batches": "Rollouts drawn this iteration under ppo.filter_groups (1: no refill).",
    "reward/overlong_penalty_mean": "Mean DAPO overlong punishment added to the scores (ppo.overlong_buffer; <= 0).",
    # kl
    "kl/k1": "Mean over sequences of the summed k1 estimate (logp_policy - logp_ref) of KL to the reference; "
             "unbiased, so a batch's mean can be negative (by chance, most near the start); kl/k3 never is.",
    "kl/k3": "Mean over sequences of the summed k3 estimate ((r - 1) - log r) of KL to the reference.",
    "kl/coef": "KL penalty coefficient used for this iteration (adaptive controller value or fixed).",
    # policy
    "policy/loss": "Clipped surrogate (PPO) or REINFORCE policy loss, mean over minibatches.",
    "policy/clipfrac": "Share of valid tokens whose probability ratio was clipped.",
    "policy/approx_kl": "Mean k3 estimate of KL(old policy || new policy) over the updates.",
    "policy/dual_clipfrac": ("Share of valid tokens where ppo.dual_clip's bound c*A is active (A < 0 and ratio > c: the "
                             "loss is bounded and the token's gradient 0), mean over the updates; 0 when dual_clip is "
                             "null. These tokens are counted in policy/clipfrac too."),
    "policy/entropy": ("Mean per-token entropy of the policy's (temperature-scaled) distribution; under a "
                       "generation.top_k/top_p/min_p filter, of the truncated distribution sampled from."),
    "policy/first_ratio_abs_dev": "Mean |r - 1| on the first minibatch before any step (0 under old_logprobs recompute).",
    "policy/lr": "Policy learning rate at the end of the iteration.",
    "policy/grad_norm": "Policy gradient norm before clipping, mean over updates.",
    "policy/grad_snr": ("Gradient signal-to-noise of the update: per epoch, with g_1..g_M its M >= 2 minibatch "
                        "gradients (before clipping) and g their mean, ||g|| / sqrt(mean_i ||g_i - g||^2); the mean "
                        "over the epochs (fourfold.core.gradients; opt-in: ppo.log_grad_snr, reinforce.log_grad_snr)."),
    "policy/kl_loss": ("Mean k3 estimate of KL(policy || reference) per valid token in the updates (ppo.kl_in: loss only; "
                       "kl_coef times it is part of policy/loss)."),
    # value
    "value/loss": "Clipped value (critic) loss, mean over minibatches.",
    "value/clipfrac": "Share of valid tokens whose value prediction was clipped.",
    "value/explained_variance": "1 - Var(returns - values) / Var(returns) over valid tokens.",
    "value/explained_variance_mc": ("1 - Var(G - values) / Var(G) over valid tokens, G the Monte Carlo return "
                                    "(the discounted reward-to-go: GAE at lambda 1 + V), a target the values do not enter."),
    "value/mean": "Mean critic value over valid tokens of the rollout.",
    "value/lr": "Critic learning rate at the end of the iteration.",
    "value/grad_norm": "Critic gradient norm before clipping, mean over updates.",
    "value/error": "Mean squared error (V - R)^2 of the rollout's values against its returns, over valid tokens.",
    "value/returns_mean": "Mean of the returns (the critic's targets) over valid tokens.",
    "value/returns_std": "Standard deviation of the returns over valid tokens (the spread explained variance divides).",
    # mismatch: d_t = log pi_train - log pi_engine of the sampled tokens (docs/correction.md)
    "mismatch/token_abs_diff_mean": "Mean |d_t| over valid tokens: the engine's log-probs against the training forward's.",
    "mismatch/token_abs_diff_max": "Largest |d_t| over valid tokens.",
    **{f"mismatch/seq_ratio_{s}": f"{w} over responses of the sequence probability ratio exp(sum_t d_t)."
       for s, w in (("mean", "Mean"), ("min", "Smallest"), ("max", "Largest"))},
    **{f"mismatch/geo_ratio_{s}": f"{w} over responses of the per-token (geometric-mean) ratio exp(mean_t d_t)."
       for s, w in (("mean", "Mean"), ("min", "Smallest"), ("max", "Largest"))},
    "mismatch/is_weight_mean": "Mean rollout-correction weight over valid tokens (ppo.rollout_correction).",
    "mismatch/is_masked_share": "Share of valid tokens given weight 0 by a masking correction (token_mis, seq_mis, geo_mis).",
    "mismatch/is_truncated_share": "Share of valid tokens whose weight the cap truncated (token_tis, seq_tis).",
    # rollout
    "rollout/response_length": "Mean response length in tokens (up to and including EOS).",
    "rollout/no_eos_share": "Share of responses that hit the length limit without an EOS token.",
    "rollout/tokens": "Response tokens generated in this iteration.",
    "rollout/log_kept_mass": ("Mean over valid tokens of log Z_t, the log of the probability mass the generation.top_k/"
                              "top_p/min_p filter kept (<= 0): the per-token gap between the rollout's (truncated) "
                              "log-probs and the policy's full softmax; mismatch/* measure it from the trainer's side."),
    "rollout/masked_truncated_share": "Share of responses without EOS left out of the losses (ppo.mask_truncated).",
    "rollout/version_lag": ("Updates between the weights that sampled this iteration's batch and the trainer's "
                            "(rollout.max_staleness k: min(iteration - 1, k), exactly k after the first k iterations; "
                            "below k in the first k iterations of an extended resume)."),
    "rollout/is_ess": ("Effective sample size of the token weights pi_trainer / pi_sampler (proximal over behaviour) over "
                       "valid tokens, before any cap: (sum w)^2 / (n sum w^2), in (0, 1], 1 when on-policy "
                       "(rollout.max_staleness >= 1; docs/correction.md, Stale samples)."),
    # time
    "time/generate_s": "Seconds spent generating responses this iteration.",
    "time/score_s": "Seconds spent in reward, reference and critic forward passes this iteration.",
    "time/train_s": "Seconds spent in optimisation (forward, backward, step) this iteration.",
    "time/iteration_s": "Wall-clock seconds of the whole iteration.",
    "time/step_s": "Mean seconds per optimizer step since the previous row (SFT, reward model, DPO).",
    "time/gen_tokens_per_s": "Generated response tokens per second of generation time.",
    "time/sampler_wait_s": ("Seconds the trainer waited for the sampler running ahead this iteration, near 0 when the "
                            "batch was ready (rollout.max_staleness >= 1; time/generate_s is then the sampler's own "
                            "time on the batch, overlapped with the previous update)."),
    "time/train_tokens_per_s": ("Trained tokens per second of training time (ppo: all epochs of the iteration; "
                                "sft: the tokens in the loss since the previous row)."),
    "time/env_steps_per_s": "Environment steps per second of wall-clock time (gym).",
    # training health
    "train/nonfinite_skips": "Updates skipped so far because the loss or gradients were not finite.",
    # sft
    "sft/loss": "Supervised fine-tuning cross-entropy over response tokens.",
    "sft/token_accuracy": "Share of response tokens whose argmax prediction is the target token.",
    "sft/eval_loss": "SFT cross-entropy on the held-out split.",
    "sft/lr": "SFT learning rate.",
    "sft/grad_norm": "SFT gradient norm before clipping.",
    # reward model
    "rm/loss": "Bradley-Terry loss -log sigmoid(r_chosen - r_rejected) on the training batch.",
    "rm/accuracy": "Share of training pairs with r_chosen > r_rejected.",
    "rm/margin": "Mean r_chosen - r_rejected on the training batch.",
    "rm/eval_accuracy": "Share of held-out pairs with r_chosen > r_rejected.",
    "rm/eval_loss": "Bradley-Terry loss on the held-out pairs.",
    "rm/lr": "Reward-model learning rate.",
    "rm/grad_norm": "Reward-model gradient norm before clipping.",
    "rm/score_mean": "Mean reward-model score of the training responses (chosen and rejected).",
    "rm/score_std": "Standard deviation of those scores.",
    # dpo (h = (log pi - log pi_ref)(chosen) - (log pi - log pi_ref)(rejected); implicit reward r = beta (log pi - log pi_ref))
    "dpo/loss": "DPO loss (dpo.loss: sigmoid or ipo) on the training pairs, mean over steps.",
    "dpo/reward_margin": "Mean implicit reward margin r_chosen - r_rejected = beta * h over the training pairs.",
    "dpo/accuracy": "Share of training pairs with r_chosen > r_rejected (strictly).",
    "dpo/chosen_logps": "Mean policy log-prob of the chosen responses (summed over their tokens).",
    "dpo/rejected_logps": "Mean policy log-prob of the rejected responses (summed over their tokens).",
    "dpo/chosen_reward": "Mean implicit reward beta * (log pi - log pi_ref) of the chosen responses.",
    "dpo/rejected_reward": "Mean implicit reward beta * (log pi - log pi_ref) of the rejected responses.",
    "dpo/eval_loss": "DPO loss on the held-out pairs.",
    "dpo/eval_accuracy": "Share of held-out pairs with r_chosen > r_rejected (strictly).",
    "dpo/lr": "DPO learning rate of the last optimizer step of the row.",
    "dpo/grad_norm": "DPO gradient norm before clipping, mean over the row's updates.",
    "dpo/eval_reward_margin": "Mean implicit reward margin r_chosen - r_rejected on the held-out pairs.",
    # gym
    "gym/episodic_return": "Mean undiscounted return of the episodes that finished in this rollout.",
    "gym/episodic_length": "Mean length of the episodes that finished in this rollout.",
    "gym/eval_return": "Mean return of deterministic evaluation episodes.",
    "gym/eval_return_std": "Standard deviation of the returns of those evaluation episodes.",
    "time/rollout_s": "Seconds spent stepping the environments and the policy (gym).",
    "policy/epochs": "PPO epochs actually run this iteration (fewer when the gym stage's ppo.target_kl stops early).",
    "policy/advantage_mean": "Mean return minus baseline of the batch (gym's REINFORCE).",
    # multi-turn environments (env.factory; docs/environments.md)
    "env/turns_mean": "Mean policy turns per trajectory.",
    "env/truncated_frac": "Share of trajectories cut by env.max_turns or env.max_tokens (not ended by the environment).",
    "env/done_frac": "Share of trajectories the environment ended (done).",
    "env/observation_tokens_mean": "Mean observation tokens per trajectory after the first observation (never trained on).",
    "env/policy_tokens_mean": "Mean policy (sampled, trained) tokens per trajectory.",
    "env/turn_reward_mean": "Mean reward per stepped turn.",
    "env/return_mean": "Mean summed turn rewards per trajectory.",
}

# ---- which trainer logs which metric ---------------------------------------------------------------
# "trainer, trainer (condition); ...": a trainer without a condition logs the metric at every row; a
# condition in parentheses says when it does (a config key, a critic, an environment). A test runs
# ppo, reinforce and gym (both algos) and checks both ways (tests/test_metric_sources.py).

_RL = "ppo, reinforce"
_PPO_GAE = "ppo (with a critic: ppo.advantage gae)"
LOGGED_BY: dict[str, str] = {
    "iteration": f"{_RL}, gym",
    "samples": _RL,
    **dict.fromkeys(("reward/score_mean", "reward/score_std", "reward/score_min", "reward/score_max",
                     "reward/token_reward_sum_mean", "reward/no_eos_penalised"), _RL),
    **dict.fromkeys(("reward/first_score_mean", "reward/filtered_groups", "reward/filter_batches"),
                    "ppo (ppo.filter_groups)"),
    "reward/gold_mean": "ppo (a task with a gold: data.task, a probe), reinforce (the same)",
    "reward/frac_zero_std": "ppo (ppo.samples_per_prompt > 1)",
    "reward/overlong_penalty_mean": "ppo (ppo.overlong_buffer)",
    **dict.fromkeys(("kl/k1", "kl/k3", "kl/coef"), _RL),
    "policy/loss": f"{_RL}, gym",
    **dict.fromkeys(("policy/clipfrac", "policy/approx_kl"), "ppo, gym (algo ppo)"),
    "policy/entropy": f"{_RL}, gym",
    "policy/first_ratio_abs_dev": "ppo",
    "policy/dual_clipfrac": "ppo",
    "policy/grad_snr": "ppo (ppo.log_grad_snr), reinforce (reinforce.log_grad_snr)",
    "policy/lr": f"{_RL}, gym (algo ppo)",
    "policy/grad_norm": f"{_RL}, gym",
    "policy/kl_loss": "ppo (ppo.kl_in loss)",
    **dict.fromkeys(("value/loss", "value/clipfrac", "value/explained_variance", "value/mean"),
                    f"{_PPO_GAE}, gym (algo ppo)"),
    **dict.fromkeys(("value/lr", "value/grad_norm", "value/error", "value/returns_mean", "value/returns_std",
                     "value/explained_variance_mc"), _PPO_GAE),
    **dict.fromkeys([k for k in METRICS if k.startswith(("mismatch/token_", "mismatch/seq_", "mismatch/geo_"))], _RL),
    "mismatch/is_weight_mean": "ppo (ppo.rollout_correction), reinforce (reinforce.rollout_correction)",
    "mismatch/is_masked_share": "ppo (a masking rollout_correction: token_mis, seq_mis, geo_mis), reinforce (the same)",
    "mismatch/is_truncated_share": "ppo (a truncating rollout_correction: token_tis, seq_tis), reinforce (the same)",
    **dict.fromkeys(("rollout/response_length", "rollout/no_eos_share", "rollout/tokens"), _RL),
    "rollout/masked_truncated_share": "ppo (ppo.mask_truncated)",
    "rollout/log_kept_mass": "ppo (a generation filter: top_k, top_p, min_p), reinforce (the same)",
    **dict.fromkeys(("rollout/version_lag", "rollout/is_ess", "time/sampler_wait_s"),
                    "ppo (rollout.max_staleness >= 1), reinforce (the same)"),
    **dict.fromkeys(("time/generate_s", "time/score_s", "time/gen_tokens_per_s"), _RL),
    **dict.fromkeys(("time/train_s", "time/iteration_s"), f"{_RL}, gym"),
    "time/train_tokens_per_s": "ppo, sft",
    "time/step_s": "sft, reward, dpo",
    **dict.fromkeys(("time/env_steps_per_s", "time/rollout_s"), "gym"),
    "train/nonfinite_skips": f"{_RL}, gym, sft, reward, dpo",
    **{k: "sft" for k in METRICS if k.startswith("sft/")},
    "sft/eval_loss": "sft (an eval file: data.eval)",
    **{k: "reward" for k in METRICS if k.startswith("rm/")},
    **dict.fromkeys(("rm/eval_accuracy", "rm/eval_loss"), "reward (an eval split)"),
    **{k: "dpo" for k in METRICS if k.startswith("dpo/")},
    **dict.fromkeys(("dpo/eval_loss", "dpo/eval_accuracy", "dpo/eval_reward_margin"), "dpo (an eval split)"),
    **dict.fromkeys(("gym/episodic_return", "gym/episodic_length"), "gym (an episode finished in the rollout)"),
    **dict.fromkeys(("gym/eval_return", "gym/eval_return_std"), "gym (an evaluation iteration)"),
    "policy/epochs": "gym (algo ppo)",
    "policy/advantage_mean": "gym (algo reinforce)",
    **{k: "ppo (env.factory), reinforce (env.factory)" for k in METRICS if k.startswith("env/")},
}


def logged_by(name: str) -> dict[str, str]:
    """``{trainer: condition}`` of a documented metric (condition "" = logged at every row)."""
    return {trainer: when for trainer, when in _SOURCE.findall(LOGGED_BY[name])}


_SOURCE = re.compile(r"(?:^|, )(\w+)(?: \(([^)]*)\))?")


METRIC_PATTERNS: dict[str, str] = {"reward/<name>_mean": "Mean of one part of a weighted reward (model.reward_fns, "
                                    "...): rm (the reward model), remote (the server) or the function's name."}

METRIC_GROUPS: dict[str, str] = {
    "": "Counters",
    "reward": "Rewards of the sampled responses",
    "kl": "KL to the reference model",
    "policy": "Policy updates",
    "value": "Critic updates",
    "mismatch": "Rollout engine against the training forward (docs/correction.md)",
    "rollout": "Rollouts",
    "time": "Timing (seconds `_s`, rates `_per_s`)",
    "train": "Training health",
    "sft": "Supervised fine-tuning",
    "rm": "Reward-model training",
    "dpo": "Direct preference optimisation",
    "gym": "Classic-control PPO",
    "env": "Multi-turn environments",
}


# ---- the method zoo: the names each config key takes, and fourfold.core implements ----------------

ADVANTAGE_NAMES = ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp")
"""``ppo.advantage``: the estimators of fourfold.core.estimators' registry (ADVANTAGE_ESTIMATORS)."""
CRITIC_ADVANTAGES = ("gae",)
"""The estimators that read critic values (their registry records' ``needs_critic``): only they
load a critic."""
ZERO_AT_ONE_SAMPLE = ("grpo", "dr_grpo")
"""The estimators whose advantages are all 0 with one sample per prompt (a group of one is its own
mean): they need ``samples_per_prompt >= 2``."""

POLICY_LOSSES = ("clip", "cispo")
"""``ppo.policy_loss``: the surrogate terms of fourfold.core.losses (SURROGATE_TERMS): PPO's
clipped surrogate, or CISPO's clipped-weight policy gradient."""
RATIO_LEVELS = ("token", "sequence")
"""``ppo.ratio_level``: one probability ratio per token (PPO), or per response (GSPO)."""
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
"""``ppo.loss_agg``: how fourfold.core.losses.aggregate_loss reduces a per-token loss."""
KL_KINDS = ("k1", "k2", "k3", "abs")
"""``ppo.kl_estimator``: the per-token KL estimates of fourfold.core.kl.kl_estimate."""

CORRECTION_CAPS = {"token_tis": 2.0, "token_mis": 2.0, "seq_tis": 3.0, "seq_mis": 3.0, "geo_mis": 1.01}
"""The preset cap of each ``ppo.rollout_correction`` mode but 'none' (``rollout_correction_cap``
null)."""
CORRECTION_MODES = ("none", *CORRECTION_CAPS)
"""``ppo.rollout_correction``: the importance weights of
fourfold.core.correction.rollout_correction_weights."""

DPO_LOSSES = ("sigmoid", "ipo", "ipo_sum")
"""``dpo.loss``: the preference losses fourfold.core.losses.dpo_loss knows: DPO's, IPO's on
per-token mean log-ratios (as the IPO authors and TRL compute it) and IPO's on summed log-ratios."""
TRUNCATION_MODES = ("bootstrap", "terminal")
"""``env.truncation`` (fourfold.core.turns): what a truncated trajectory's last value is: ``bootstrap``
= the critic's value of the state it was cut in, ``terminal`` = 0 (as if the environment had ended
it)."""


def check_names(what: str, names, table) -> None:
    """Raise RuntimeError unless ``table`` (the keys of an implementation table or registry) holds
    exactly ``names``, in any order: one line naming ``what`` and each name without an entry and
    each entry without a name. fourfold.core calls it on its tables when it is imported."""
    missing = [n for n in names if n not in table]
    extra = [n for n in table if n not in names]
    if missing or extra:
        parts = ([f"names without an entry: {', '.join(missing)}"] if missing else []) + (
            [f"entries without a name: {', '.join(extra)}"] if extra else [])
        raise RuntimeError(f"{what} and fourfold.names disagree: {'; '.join(parts)}")
