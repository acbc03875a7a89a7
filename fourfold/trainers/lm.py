"""Shared pieces of the language-model RL stages (PPO and REINFORCE): loading the roles, the prompt
stream, and one call that turns a batch of prompts into a scored :class:`~fourfold.core.Rollout`.

A trainer never knows an embedded task: it gets prompts (a file or a list) and an optional
:data:`Probe`, ``probe(prompts, responses) -> {metric name: value}``, logged every iteration. The
CLI and the demo build both from a task (``task_prompts`` and ``task_probe`` in the tasks package).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

import torch

from fourfold import dist
from fourfold.config import GenerationConfig, LMModelConfig, PromptDataConfig
from fourfold.core import Rollout, kl_estimate, masked_mean, token_rewards
from fourfold.data import EpochSampler, chat_template_renderer, encode_prompts, left_pad, line_of, load_prompts
from fourfold.dist import World
from fourfold.errors import ConfigError
from fourfold.models import load_reward_fn
from fourfold.models.checks import RoleChecker
from fourfold.models.levers import role_dtypes
from fourfold.models.loading import ensure_pad_embedding, load_causal_lm, load_sequence_scorer, load_tokenizer
from fourfold.models.lora import SharedRoles, build_shared_roles
from fourfold.models.lora_io import is_adapter_dir
from fourfold.models.roles import FrozenReference, FunctionReward, ModelReward, ScalarModel
from fourfold.rollout.lm import RolloutEngine, Samples, Scores, decode_responses, gather_rows, sample, score, select_rows
from fourfold.rollout.noise import RowNoise
from fourfold.trainers.common import global_sums
from fourfold.trainers.fsdp import shard_roles
from fourfold.trainers.lora import lora_settings

Probe = Callable[[list[str], list[str]], dict[str, float]]
"""``probe(prompts, responses) -> {metric name: value}``: extra measurements of each batch of
responses (e.g. a task's hidden gold reward as ``reward/gold_mean``), logged every iteration
under the names it returns; it never affects training. A probe may also carry
``probe.per_response(prompts, responses) -> {name: [one value per response]}`` (e.g. ``gold``):
the sample completions (``samples.jsonl``) then show those values next to each response."""

SAMPLE_ROWS = 4
"""How many completions of a batch (its first rows) a samples log shows."""


@dataclass
class Roles:
    """The four roles of classic RLHF. ``critic`` is None for REINFORCE, the no-critic ablation and
    the critic-free advantage estimators."""

    tokenizer: object
    policy: torch.nn.Module
    reference: object
    reward: object
    critic: Optional[ScalarModel] = None
    reward_model: Optional[ScalarModel] = None


def load_roles(model: LMModelConfig, device: torch.device, *, with_critic: bool, concurrent: bool = False) -> Roles:
    """Tokenizer, trained policy, frozen reference, frozen reward (model or function), critic; each
    model checked against its role and the tokenizer (:class:`~fourfold.models.checks.RoleChecker`).

    The trained roles (policy, critic) get the weights dtype of ``model.dtype`` and
    ``model.precision``, the frozen ones (reference, reward model) ``model.frozen_dtype``
    (:func:`~fourfold.models.levers.role_dtypes`); a critic initialised from the reward model is
    copied from it before the reward model takes the frozen dtype.

    With ``model.lora``: :func:`load_shared_roles`. ``concurrent``: the trainer will run roles in
    parallel threads (``run.concurrent_roles``), which roles over one shared base cannot."""
    if model.lora is not None:
        return load_shared_roles(model, device, with_critic=with_critic, concurrent=concurrent)
    if model.reward is not None and is_adapter_dir(model.reward):
        raise ConfigError(f"model.reward: {model.reward} is a LoRA adapter directory: set model.lora to load it "
                          f"as an adapter on the policy's base, or give the merged model (model/ of the same run)")
    tok = load_tokenizer(model.tokenizer or model.policy, trust_remote_code=model.trust_remote_code)
    check = RoleChecker(tok, "model.tokenizer" if model.tokenizer else "model.policy", model.tokenizer or model.policy,
                        trust_remote_code=model.trust_remote_code)  # each model fits its role and the vocabulary
    trained, frozen = role_dtypes(model.dtype, model.precision, model.frozen_dtype)
    kw = dict(dtype=trained, device=device, trust_remote_code=model.trust_remote_code)
    frozen_kw = dict(kw, dtype=frozen)
    policy = load_causal_lm(model.policy, **kw)
    check.causal_lm(policy, "model.policy", model.policy)
    ensure_pad_embedding(policy, tok)
    ref_model = load_causal_lm(model.reference or model.policy, **frozen_kw)
    check.causal_lm(ref_model, "model.reference" if model.reference else "model.policy", model.reference or model.policy)
    ensure_pad_embedding(ref_model, tok)
    reference = FrozenReference(ref_model)
    reward_model = None
    copies_reward = with_critic and model.critic is None and model.critic_init == "reward"
    if model.reward is not None:
        reward_model = ScalarModel(load_sequence_scorer(model.reward, **(kw if copies_reward else frozen_kw)))
        check.scorer(reward_model.hf, "model.reward", model.reward)
        ensure_pad_embedding(reward_model.hf, tok)
        reward = ModelReward(reward_model)
    else:
        reward = FunctionReward(load_reward_fn(model.reward_fn), name=model.reward_fn)
    critic = separate_critic(model, kw, tok, reward_model, check) if with_critic else None
    if reward_model is not None:
        reward_model.to(frozen)  # a no-op unless it was loaded in the trained dtype for the critic's copy
    policy.train()
    return Roles(tok, policy, reference, reward, critic, reward_model)


def separate_critic(model: LMModelConfig, kw: dict, tok, reward_model, check: Optional[RoleChecker] = None) -> ScalarModel:
    """The critic as a model of its own (trained in full): ``model.critic``, a copy of the reward
    model (``critic_init: reward``) or the policy's backbone with a zero value head."""
    if model.critic is not None:
        critic = ScalarModel(load_sequence_scorer(model.critic, **kw))
        if check is not None:
            check.scorer(critic.hf, "model.critic", model.critic)
    elif model.critic_init == "reward":
        if reward_model is None:
            raise ConfigError("model.critic_init: 'reward' needs model.reward")
        if not isinstance(reward_model, ScalarModel):
            raise ConfigError("model.critic_init: 'reward' with critic_mode 'separate' copies a full reward model, "
                              "and model.reward is a LoRA adapter: use critic_mode=adapter (the critic starts as "
                              "that adapter) or critic_init=policy")
        critic = copy.deepcopy(reward_model)  # backbone and head from the reward model
    else:
        critic = ScalarModel(load_sequence_scorer(model.policy, **kw))
        critic.reset_head("zero")  # fresh value head: V = 0 everywhere at the start
    ensure_pad_embedding(critic.hf, tok)
    critic.train()
    critic.requires_grad_(True)
    return critic


def load_shared_roles(model: LMModelConfig, device: torch.device, *, with_critic: bool,
                      concurrent: bool = False) -> SharedRoles:
    """LoRA mode (``model.lora``): one frozen copy of ``model.policy`` for the policy (adapter
    ``policy``), the reference (adapters disabled), a LoRA reward model (adapter ``reward``, when
    ``model.reward`` is an adapter directory) and, with ``critic_mode: adapter``, the critic (adapter
    ``critic`` + value head); see :func:`fourfold.models.lora.build_shared_roles`. A full reward
    model and a ``critic_mode: separate`` critic are models of their own, as without LoRA.

    Dtypes (:func:`~fourfold.models.levers.role_dtypes`): the base and a full reward model are
    frozen (``model.frozen_dtype``, else the trained roles' dtype); a separate critic is trained. A
    separate critic that starts as a full reward model of another dtype is loaded from
    ``model.reward`` in its own dtype rather than copied from the frozen one."""
    adapter_critic = with_critic and model.critic_mode == "adapter"
    trained, frozen = role_dtypes(model.dtype, model.precision, model.frozen_dtype)
    roles = build_shared_roles(
        model.policy, lora_settings(model.lora), device, tokenizer=model.tokenizer, dtype=frozen,
        trust_remote_code=model.trust_remote_code, reward=model.reward,
        reward_fn=load_reward_fn(model.reward_fn) if model.reward is None else None,
        with_critic=adapter_critic, critic_init=model.critic_init, concurrent=concurrent)
    if with_critic and not adapter_critic:
        kw = dict(dtype=trained, device=device, trust_remote_code=model.trust_remote_code)
        source = model
        if trained != frozen and model.critic is None and model.critic_init == "reward" \
                and isinstance(roles.reward_model, ScalarModel):
            source = replace(model, critic=model.reward)  # the reward model's weights, in the trained dtype
        roles.critic = separate_critic(source, kw, roles.tokenizer, roles.reward_model)
    return roles


class PromptStream:
    """Prompts tokenised once, served in shuffled batches; resumable through ``state_dict()``.

    The prompts are ``prompts`` when given (a list of strings, used as they are), else the rows of
    the ``data.prompts`` file; with ``data.on_error: skip`` its bad rows (unreadable, or longer than
    ``data.max_prompt_len``) are left out and their messages kept in ``skipped`` (file order).
    Fewer prompts than one batch is a ConfigError naming ``batch_key``, the batch size's key."""

    def __init__(self, data: PromptDataConfig, tokenizer, batch_size: int, seed: int,
                 prompts: Optional[Sequence[str]] = None, batch_key: str = "rollout_batch_size"):
        on_error = "raise"
        if prompts is not None:
            texts = list(prompts)
            lines, source, self.skipped = None, "prompts", []
        elif data.prompts is not None:
            # chat `messages` are rendered exactly as the SFT and reward stages render them
            loaded = load_prompts(data.prompts, on_error=data.on_error, chat_template=chat_template_renderer(tokenizer))
            texts, lines = [r.prompt for r in loaded], [r.line for r in loaded]
            source, on_error, self.skipped = data.prompts, data.on_error, list(loaded.skipped)
        else:
            raise ConfigError("data.prompts: missing: a prompts file (or prompts passed to the trainer)")
        examples = encode_prompts(texts, tokenizer, data.max_prompt_len, lines=lines, source=source,
                                  on_error=on_error, skipped=self.skipped)
        self.skipped.sort(key=line_of)
        self.texts = [texts[e.index] for e in examples]
        self.ids = [e.input_ids for e in examples]
        if len(self.ids) < batch_size:
            skipped = f" ({len(self.skipped)} bad rows skipped)" if self.skipped else ""
            raise ConfigError(f"{batch_key}: {batch_size} is more than the {len(self.ids)} prompts in {source}{skipped}; "
                              "one batch needs that many different prompts")
        self.pad_id = tokenizer.pad_token_id
        self.sampler = EpochSampler(len(self.texts), batch_size, seed=seed, drop_last=True)
        self._it = self.sampler.batches()

    def warn_skipped(self, logger) -> None:
        """Say on the console and in events.jsonl how many bad rows were skipped, and the first."""
        if self.skipped:
            logger.warn(f"{len(self.skipped)} bad rows skipped (data.on_error=skip); first: {self.skipped[0]}", step=0)

    def next(self, device) -> tuple[list[str], torch.Tensor, torch.Tensor]:
        idx = next(self._it)
        ids, mask = left_pad([self.ids[i] for i in idx], self.pad_id)
        return [self.texts[i] for i in idx], ids.to(device), mask.to(device)

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)
        self._it = self.sampler.batches()


def repeat_prompts(texts: list[str], ids: torch.Tensor, mask: torch.Tensor, k: int
                   ) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """Each prompt ``k`` times on consecutive rows (prompt i on rows i*k ... i*k + k - 1), the
    group of a group-baseline estimator: ``ids``, ``mask`` ``[n, P] -> [n * k, P]``. ``k = 1``
    returns the inputs themselves."""
    if k == 1:
        return texts, ids, mask
    return ([t for t in texts for _ in range(k)], ids.repeat_interleave(k, dim=0),
            mask.repeat_interleave(k, dim=0))


@dataclass
class Collected:
    """A scored rollout plus what the logs need about it."""

    rollout: Rollout
    samples: Samples
    prompts: list[str]
    responses: list[str]
    kl: torch.Tensor  # [B, T] per-token KL estimate used in the reward
    metrics: dict = field(default_factory=dict)


def collect(
    roles: Roles,
    prompts: list[str],
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    gen: GenerationConfig,
    *,
    kl_coef: float,
    kl_estimator: str = "k1",
    probe: Optional[Probe] = None,
    concurrent: bool = False,
    noise: Optional[RowNoise] = None,
    world: World = dist.SINGLE,
    engine: Optional[RolloutEngine] = None,
) -> Collected:
    """Steps 2-4 of an iteration: generate (pi_old), score (reference, critic, reward), token rewards.

    ``prompts``, ``prompt_ids``, ``prompt_mask``: the iteration's global batch (the same on every
    rank). Each rank of ``world`` samples and scores its contiguous slice of the rows
    (:func:`fourfold.dist.shard`), then every rank gathers the whole batch, so what follows
    (rewards, metrics, advantages) is computed on the global batch alike on all ranks. ``noise``:
    the iteration's per-row noise (required with more than one rank; without it tokens come from
    the global torch generator). ``engine``: what generates the responses
    (:class:`~fourfold.rollout.lm.RolloutEngine`; None: :func:`~fourfold.rollout.lm.sample`).

    rewards_t = -kl_coef * KL_t on every valid token, plus the sequence score on the last one.
    Responses are decoded to text only when the reward reads text or a ``probe`` is given; the
    probe's measurements join the metrics under their own names.
    """
    if world.distributed and noise is None:
        raise ValueError("collect: a rollout over several ranks needs per-row noise")
    rows = dist.shard(prompt_ids.shape[0], world)
    # 2. generate with the policy (this rank's rows); its log-probs are pi_old
    t0 = time.perf_counter()
    samples = _generate(roles, prompt_ids[rows], prompt_mask[rows], gen, noise, rows, world, engine or sample)
    t_gen = time.perf_counter() - t0
    # 3. score with the frozen reference and reward model, and the critic (this rank's rows)
    t0 = time.perf_counter()
    need_text = getattr(roles.reward, "needs_text", False) or probe is not None
    responses = decode_responses(roles.tokenizer, samples) if need_text else []
    sc = _score(roles, select_rows(samples, rows), prompts[rows], responses[rows], gen.temperature, concurrent)
    scores = sc.scores
    penalised = torch.zeros_like(samples.finished)
    if gen.missing_eos_score is not None and gen.stop_at_eos:
        penalised = ~samples.finished
        scores = torch.where(penalised, torch.full_like(scores, gen.missing_eos_score), scores)
    # 4. per-token rewards: KL penalty on every token, the score on the last valid one
    mask = samples.response_mask
    rewards, kl = token_rewards(scores, samples.logprobs, sc.ref_logprobs, mask, kl_coef, kind=kl_estimator)
    t_score = time.perf_counter() - t0
    rollout = Rollout(
        actions=samples.responses, mask=mask, logprobs=samples.logprobs, values=sc.values, rewards=rewards,
        ref_logprobs=sc.ref_logprobs, scores=scores,
        context={"input_ids": samples.sequences, "attention_mask": samples.attention_mask},
    )
    metrics = rollout_metrics(samples, sc, rewards, penalised)
    n_tokens = metrics["rollout/tokens"]
    metrics.update({"time/generate_s": t_gen, "time/score_s": t_score,
                    "time/gen_tokens_per_s": n_tokens / max(t_gen, 1e-9)})
    if probe is not None:
        metrics.update(probe(prompts, responses))
    return Collected(rollout, samples, prompts, responses, kl, metrics)


def _generate(roles: Roles, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, gen: GenerationConfig,
              noise: Optional[RowNoise], rows: slice, world: World, engine: RolloutEngine) -> Samples:
    """Sample this rank's ``rows`` of the batch with the policy (in eval mode), then gather every
    rank's rows: the whole batch's :class:`Samples` on every rank."""
    tok = roles.tokenizer
    uniforms = None if noise is None else noise.uniforms(range(rows.start, rows.stop), gen.max_new_tokens)
    roles.policy.eval()
    samples = engine(
        roles.policy, prompt_ids, prompt_mask,
        max_new_tokens=gen.max_new_tokens, temperature=gen.temperature,
        eos_token_id=tok.eos_token_id if gen.stop_at_eos else None, pad_token_id=tok.pad_token_id,
        noise=uniforms, sync_stop=world.distributed,
    )
    roles.policy.train()
    return gather_rows(samples)


def _score(roles: Roles, samples: Samples, prompts: list[str], responses: list[str], temperature: float,
           concurrent: bool) -> Scores:
    """Score this rank's ``samples`` (the critic in eval mode), then gather every rank's scores."""
    if roles.critic is not None:
        roles.critic.eval()
    sc = score(samples, reference=roles.reference, reward=roles.reward, critic=roles.critic,
               temperature=temperature, prompts=prompts, responses=responses, concurrent=concurrent)
    if roles.critic is not None:
        roles.critic.train()
    return gather_rows(sc)


def rollout_metrics(samples: Samples, sc: Scores, rewards: torch.Tensor, penalised: torch.Tensor) -> dict:
    """The rollout's reward, KL, entropy and length metrics over the whole batch (see
    :data:`fourfold.reporting.METRICS`): ``sc.scores`` are the reward model's (before any
    missing-EOS penalty), ``penalised`` the rows whose score the penalty replaced."""
    mask = samples.response_mask
    lengths = mask.sum(1)
    k3 = kl_estimate(samples.logprobs, sc.ref_logprobs, "k3") * mask
    return {
        "reward/score_mean": float(sc.scores.mean()),
        "reward/score_std": float(sc.scores.std()) if sc.scores.numel() > 1 else 0.0,
        "reward/score_min": float(sc.scores.min()),
        "reward/score_max": float(sc.scores.max()),
        "reward/token_reward_sum_mean": float(rewards.sum(1).mean()),
        "reward/no_eos_penalised": float(penalised.float().mean()),
        "kl/k1": float((kl_estimate(samples.logprobs, sc.ref_logprobs, "k1") * mask).sum(1).mean()),
        "kl/k3": float(k3.sum(1).mean()),
        "policy/entropy": float(masked_mean(samples.entropy, mask)) if samples.entropy is not None else float("nan"),
        "rollout/response_length": float(lengths.mean()),
        "rollout/no_eos_share": float((~samples.finished).float().mean()),
        "rollout/tokens": float(lengths.sum()),
    }


def check_world(world: World, concurrent: bool, batch_sizes: dict[str, int]) -> None:
    """What a run over several ranks needs of its config: every global batch size (config key ->
    value) divides by the world size, and no ``run.concurrent_roles`` (two threads issuing
    collectives could pair them differently on each rank). ConfigError naming the key otherwise."""
    for key, value in batch_sizes.items():
        dist.check_divisible(key, value, world)
    if world.distributed and concurrent:
        raise ConfigError("run.concurrent_roles: not with more than one process (the roles' collectives must run "
                          "in one order on every rank); set it to false")


def sum_over_ranks(stats: dict, keys: Sequence[str]) -> dict:
    """``stats`` with the values of ``keys`` (floats: each rank's share of a global statistic)
    summed over every rank in one all-reduce (:func:`~fourfold.trainers.common.global_sums`)."""
    names = sorted(keys)
    return {**stats, **dict(zip(names, global_sums([stats[k] for k in names])))}


def shard_lm_roles(roles: Roles, dist_cfg, device: torch.device) -> None:
    """Under torchrun, place the roles as the run's ``dist`` section says
    (:func:`fourfold.trainers.fsdp.shard_roles`): the policy and the critic sharded with FSDP2, the
    reference and the reward model replicated or sharded. Call it before building the optimizers."""
    shard_roles({"policy": roles.policy, "critic": roles.critic, "reference": getattr(roles.reference, "model", None),
                 "reward": roles.reward_model}, dist_cfg, device)


def sample_rows(col: Collected, tokenizer, probe: Optional[Probe] = None, n: int = SAMPLE_ROWS) -> list[dict]:
    """The first ``n`` completions of a collected batch as ``samples.jsonl`` rows: ``prompt``,
    ``response``, ``score`` (the reward the update used, after any missing-EOS penalty) and the
    probe's ``per_response`` values. Only these ``n`` responses are decoded when ``collect`` did
    not decode the batch."""
    n = min(n, len(col.prompts))
    responses = col.responses[:n] or decode_responses(
        tokenizer, replace(col.samples, sequences=col.samples.sequences[:n], response_mask=col.samples.response_mask[:n]))
    rows = [{"prompt": p, "response": r, "score": float(s)}
            for p, r, s in zip(col.prompts[:n], responses, col.rollout.scores[:n].tolist())]
    per_response = getattr(probe, "per_response", None)
    if per_response is not None:
        for name, values in per_response(col.prompts[:n], responses).items():
            for row, value in zip(rows, values):
                row[name] = value
    return rows
