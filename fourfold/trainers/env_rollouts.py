"""A batch of environments -> a scored trajectory batch (:class:`~fourfold.trainers.rollouts.Collected`,
the one result type of :mod:`fourfold.trainers.rollouts`) over the policy's tokens (docs/environments.md).

:func:`collect_turns` resets each row's environment, runs the turns on the rollout engine
(:func:`fourfold.rollout.turns.sample_turns`), scores the whole trajectories with the frozen
reference and the critic, and builds the per-token rewards by the three rules: the KL penalty on
policy tokens only, each turn's reward on its last policy token, ``mask`` = the policy mask. The
critic's value of the state each trajectory ends in (its last position) is kept for truncated
rows (``env.truncation: bootstrap``) as the batch's ``bootstrap``. What follows (shaping,
advantages over the policy's tokens, the update, the sample rows) is the single-turn run's.

:class:`EnvSource` is a run's environment rollout (``env.factory`` set), :func:`rollout_source`
the one place that picks it or the single-turn :class:`~fourfold.trainers.rollouts.PromptSource`.
Under torchrun each rank resets and steps the environments of its contiguous slice of the rows
(their own per-row noise, so a row's trajectory is the one it has in one process), the
trajectories are gathered, and every rank scores its slice of the gathered batch and gathers the
scores, as :func:`~fourfold.trainers.rollouts.collect` does: what follows (rewards, advantages over
whole groups, metrics) is computed on the whole batch alike on every rank.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence, Union

import torch

from fourfold.config import EnvConfig, GenerationConfig
from fourfold.config.rewards import ENV_PART, reward_part_names
from fourfold.core import Rollout
from fourfold.core.turns import bootstrap_values, trajectory_rewards
from fourfold.data.observations import ObservationEncoder
from fourfold.errors import ConfigError
from fourfold.models.build import Roles
from fourfold.rollout.engine import truncation_of
from fourfold.rollout.env import BoundEnv, load_env_factory, make_envs
from fourfold.rollout.noise import RowNoise
from fourfold.rollout.score import Scores, reward_scores
from fourfold.rollout.turns import Trajectory, TurnBatch, TurnSettings, sample_turns, stack_trajectories
from fourfold.run.parallel import gather_items, gather_rows, rank_slice, several_ranks
from fourfold.trainers.rollouts import Collected, Probe, PromptSource, rollout_metrics

FIRST_TOKENS_UNCHECKED = 1 << 30
"""The first observation's length limit handed to the encoder when no ``max_first_tokens`` is
given: none (``env.max_tokens`` bounds it, checked with its own message)."""


def turn_metrics(batch: TurnBatch) -> dict:
    """The ``env/*`` metrics of a batch (:data:`fourfold.reporting.METRICS`): means over its
    trajectories, and ``env/turn_reward_mean`` over its stepped turns (the whole batch's reward
    over its turn count: under torchrun, of the gathered batch, never a mean of the ranks' means)."""
    stepped = sum(len(t.turn_rewards) for t in batch.trajectories)
    return {
        "env/turns_mean": float(batch.n_turns.float().mean()),
        "env/truncated_frac": float(batch.truncated.float().mean()),
        "env/done_frac": float(batch.done.float().mean()),
        "env/observation_tokens_mean": float(batch.observation_tokens.float().mean()),
        "env/policy_tokens_mean": float(batch.samples.response_mask.sum(1).mean()),
        "env/turn_reward_mean": float(batch.turn_rewards.sum()) / max(stepped, 1),
        "env/return_mean": float(batch.turn_rewards.sum(1).mean()),
    }


@torch.no_grad()
def collect_turns(roles: Roles, envs: Union[Sequence[BoundEnv], Callable[[], Sequence[BoundEnv]]], env: EnvConfig,
                  gen: GenerationConfig, *, kl_coef: float, kl_estimator: str = "k1", noise: Optional[RowNoise] = None,
                  max_first_tokens: Optional[int] = None, first_row: int = 0, engine=None,
                  columns: Optional[dict] = None, reward_names: Sequence[str] = ()) -> Collected:
    """Reset ``envs`` (one per row, or a function making them: called here), run their turns with
    ``roles.policy`` (in eval mode) under the ``env`` section's limits and ``gen``'s sampling
    (``max_new_tokens`` per turn, temperature, EOS), then score: reference log-probs and critic
    values over each whole trajectory, the rewards by :func:`fourfold.core.turns.trajectory_rewards`,
    the bootstrap by ``env.truncation`` (:func:`score_trajectories`; with a reward role beside the
    environment, its parts ``reward_names`` and the rows' ``columns``, the whole batch's).
    ``noise``: the iteration's per-row noise (a row's n-th policy token at its n-th uniform);
    ``max_first_tokens``: a limit of the first observation's own (e.g. ``data.max_prompt_len``);
    ``engine``: the rollout engine, already synced with the policy
    (:func:`fourfold.rollout.engine.make_engine`; None: the eager engine over the policy itself).

    Under torchrun ``envs`` are this rank's rows, global rows ``first_row ...`` (its
    :func:`~fourfold.run.parallel.rank_slice` of the batch; every rank as many) and ``noise`` is
    required: the trajectories are gathered in rank order, so the batch, its scores and its
    metrics are the one-process ones on every rank. An error of this rank's environments (making
    them, when ``envs`` is a function, resetting them, stepping them) is raised on every rank at
    the rollout's next all-reduce (:func:`~fourfold.rollout.turns.sample_turns`), with the message
    one process gives: every rank stops at once, none waits in a collective for the one that failed."""
    if several_ranks() and noise is None:
        raise ValueError("collect_turns: a rollout over several ranks needs per-row noise")
    t0 = time.perf_counter()
    roles.policy.eval()
    batch = run_episodes(roles.policy, envs, env, gen, roles.tokenizer, noise=noise, max_first_tokens=max_first_tokens,
                         first_row=first_row, engine=engine, sync_stop=several_ranks())
    roles.policy.train()
    if several_ranks():  # every rank's trajectories, in rank order: the one-process batch's layout
        batch = stack_trajectories(gather_items(batch.trajectories), roles.tokenizer.pad_token_id,
                                   batch.samples.sequences.device)
    return score_turns(roles, batch, env, gen, time.perf_counter() - t0, kl_coef=kl_coef, kl_estimator=kl_estimator,
                       columns=columns, reward_names=reward_names)


@torch.no_grad()
def run_episodes(model, envs: Union[Sequence[BoundEnv], Callable[[], Sequence[BoundEnv]]], env: EnvConfig,
                 gen: GenerationConfig, tok, *, noise: Optional[RowNoise], max_first_tokens: Optional[int],
                 first_row: int, engine, sync_stop: bool) -> TurnBatch:
    """The episodes of :func:`collect_turns` (this rank's rows), unscored: ``envs`` made (when a
    function) and reset, their first observations encoded with ``tok``, the turns run with
    ``model`` on ``engine``. ``sync_stop`` (under torchrun, in the trainer's thread): an error of
    this rank's environments is raised on every rank at the turns' next all-reduce; without it
    (one process, or a sampler running ahead: :mod:`fourfold.trainers.ahead`) it is raised here."""
    encoder = ObservationEncoder(tok, env.observation_role)
    # a first observation too long for env.max_tokens is refused by sample_turns, naming that key
    failed = None
    try:
        envs = list(envs() if callable(envs) else envs)
        first = [encoder.first(e.reset(), e.where, max_first_tokens or FIRST_TOKENS_UNCHECKED) for e in envs]
    except Exception as e:  # under torchrun: raised on every rank at sample_turns' first all-reduce
        if not sync_stop:
            raise
        envs, first, failed = [], [], e
    settings = TurnSettings(
        max_turns=env.max_turns, max_tokens=env.max_tokens, max_new_tokens=gen.max_new_tokens,
        decode=lambda ids: tok.decode(ids, skip_special_tokens=True), temperature=gen.temperature,
        eos_token_id=tok.eos_token_id if gen.stop_at_eos else None, pad_token_id=tok.pad_token_id, stop=tuple(env.stop),
        truncation=truncation_of(gen))
    uniforms = None if noise is None else noise.uniforms(range(first_row, first_row + len(envs)), env.max_tokens)
    return sample_turns(model, envs, first, settings, encoder.next, noise=uniforms, engine=engine,
                        sync_stop=sync_stop, failed=failed)


@torch.no_grad()
def score_turns(roles: Roles, batch: TurnBatch, env: EnvConfig, gen: GenerationConfig, t_gen: float, *,
                kl_coef: float, kl_estimator: str = "k1", columns: Optional[dict] = None,
                reward_names: Sequence[str] = ()) -> Collected:
    """The scoring half of :func:`collect_turns` on the whole batch (sampled in ``t_gen`` seconds,
    there or by a sampler running ahead): :func:`score_trajectories`, the metrics, the Collected."""
    t0 = time.perf_counter()
    s = batch.samples
    rollout, kl, boot, parts = score_trajectories(roles, batch, env, gen.temperature, kl_coef, kl_estimator,
                                                  columns=columns, names=reward_names)
    scores, mask, t_score = rollout.scores, rollout.mask, time.perf_counter() - t0
    metrics = rollout_metrics(s, Scores(rollout.ref_logprobs, rollout.values, scores), rollout.rewards,
                              torch.zeros_like(s.finished))
    metrics.update({f"reward/{name}_mean": float(part.mean()) for name, part in parts.items()})
    metrics.update(turn_metrics(batch))
    metrics.update({"time/generate_s": t_gen, "time/score_s": t_score, "time/gen_tokens_per_s": float(mask.sum()) / max(t_gen, 1e-9)})
    return Collected(rollout, s, [], [], kl, metrics, parts, bootstrap=boot, trajectories=list(batch.trajectories),
                     length_limit=env.policy_token_budget(gen.max_new_tokens))


@dataclass
class TrajectoryScores:
    """One rank's rows of a trajectory batch scored (:func:`_score_rows`): the reference's
    log-probs and the critic's values ``[B, T]``, the critic's value of the state after each
    trajectory ``final [B]``, and, with a reward role beside the environment, its ``reward [B]``
    and a weighted reward's ``parts [B, n]``."""

    ref_logprobs: torch.Tensor
    values: torch.Tensor
    final: torch.Tensor
    reward: Optional[torch.Tensor] = None
    parts: Optional[torch.Tensor] = None


def score_trajectories(roles: Roles, batch: TurnBatch, env: EnvConfig, temperature: float, kl_coef: float,
                       kl_estimator: str, *, columns: Optional[dict] = None, names: Sequence[str] = ()
                       ) -> tuple[Rollout, torch.Tensor, torch.Tensor, dict]:
    """The scored :class:`~fourfold.core.Rollout` of a trajectory batch (every rank its rows, then
    gathered): reference log-probs and critic values over each whole trajectory, the rewards by
    :func:`fourfold.core.turns.trajectory_rewards` with each turn's reward times ``env.reward_weight``,
    the bootstrap by ``env.truncation``. With a reward role beside the environment (``names``: its
    parts' names, in order; ``columns``: the rows' other fields, for a reward that reads text), its
    score of each trajectory (the first observation as the prompt, the rest as the response) is added
    to the trajectory's last turn, so on its last policy token. Returns ``(rollout, kl, bootstrap,
    parts)``: ``parts`` (name -> [B], ``env`` the unweighted returns) when there is more than the
    environment at weight 1, else {}; ``rollout.scores`` is their weighted sum."""
    s = batch.samples
    seq, attn, mask, T = s.sequences, s.attention_mask, s.response_mask, s.n_response
    texts = None
    if getattr(roles.reward, "needs_text", False):
        dec = lambda ids: roles.tokenizer.decode(ids, skip_special_tokens=True)
        texts = ([dec(t.prompt) for t in batch.trajectories], [dec(t.ids) for t in batch.trajectories])
    sc = gather_rows(_score_rows(roles, seq, attn, mask, T, temperature, rank_slice(seq.shape[0]), texts, columns))
    turn_rewards, parts = batch.turn_rewards.to(seq.device), {}
    if sc.reward is not None or env.reward_weight != 1.0:
        parts[ENV_PART] = turn_rewards.sum(1)
        turn_rewards = turn_rewards * env.reward_weight
    if sc.reward is not None:
        last = (batch.n_turns.to(seq.device) - 1).clamp(min=0)
        turn_rewards = turn_rewards.scatter_add(1, last[:, None], sc.reward[:, None].to(turn_rewards.dtype))
        parts.update(dict(zip(names, sc.parts.unbind(1))) if sc.parts is not None else
                     {(list(names) or ["reward"])[0]: sc.reward})
    rewards, kl = trajectory_rewards(turn_rewards, batch.turn_ids.to(seq.device), s.policy_logprobs, sc.ref_logprobs,
                                     kl_coef, kl_estimator)
    rollout = Rollout(actions=s.responses, mask=mask, logprobs=s.logprobs, values=sc.values, rewards=rewards,
                      ref_logprobs=sc.ref_logprobs, scores=turn_rewards.sum(1),
                      context={"input_ids": seq, "attention_mask": attn})
    final = sc.final if roles.critic is not None else None
    return rollout, kl, bootstrap_values(final, batch.truncated.to(seq.device), env.truncation), parts


def _score_rows(roles: Roles, seq: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor, T: int, temperature: float,
                rows: slice, texts: Optional[tuple] = None, columns: Optional[dict] = None) -> TrajectoryScores:
    """This rank's ``rows`` of the batch scored: the reference's log-probs and the critic's values
    on the policy tokens (zeros without a critic), the critic's value of the state after each
    trajectory's last token (zeros without one) and the reward role's score, if any (``texts``:
    the rows' (prompts, responses) when it reads text)."""
    seq, attn, mask = seq[rows], attn[rows], mask[rows]
    ref = roles.reference.logprobs(seq, attn, T, temperature) * mask
    values, final = torch.zeros_like(mask), torch.zeros(seq.shape[0], device=seq.device)
    if roles.critic is not None:
        roles.critic.eval()
        values = roles.critic.response_values(seq, attn, T) * mask
        final = roles.critic.score(seq, attn)  # V of the state after the trajectory's last token
        roles.critic.train()
    if roles.reward is None:
        return TrajectoryScores(ref, values, final)
    prompts, responses = (texts[0][rows], texts[1][rows]) if texts else (None, None)
    mine = {k: v[rows] for k, v in columns.items()} if columns else None
    reward, parts = reward_scores(roles.reward, seq, attn, prompts, responses, mine)
    return TrajectoryScores(ref, values, final, reward, parts)


class EnvSource:
    """A run's environment rollout (``env.factory``): the next batch of the prompt ``stream``'s rows,
    each on ``samples_per_prompt`` consecutive rows with its own environment (``make_env(row)`` per
    trajectory: the group of a group estimator), then :func:`collect_turns` on the run's engine with
    the iteration's per-row noise (seed ``cfg.run.seed + draw``). Under torchrun a rank makes the
    environments of its slice of the rows only (:func:`~fourfold.run.parallel.rank_slice`, as a
    single-turn rollout samples its slice), inside collect_turns, which gathers every rank's
    trajectories and raises an error of one rank's environments on every rank."""

    def __init__(self, cfg, stream, device: Optional[torch.device] = None):
        self.cfg, self.stream, self.device = cfg, stream, device
        self.factory = load_env_factory(cfg.env.factory)[0]
        self.reward_names = [name for name, _ in reward_part_names(cfg.model)]
        """The reward parts beside the environment's (none: the environment alone)."""
        self._sampler_tok = None

    def _next_rows(self, k: int) -> tuple[list, list, dict]:
        """The stream's next rows, each on ``k`` consecutive rows, their where-labels and columns."""
        _, rows, wheres = self.stream.next_rows()
        rows, wheres = [r for r in rows for _ in range(k)], [w for w in wheres for _ in range(k)]
        return rows, wheres, {c: [r.get(c) for r in rows] for c in self.stream.columns}

    def collect(self, roles: Roles, engine, it: int, *, kl_coef: float, kl_estimator: str,
                samples_per_prompt: int = 1, concurrent: bool = False, draw: int = 0) -> Collected:
        cfg = self.cfg
        rows, wheres, columns = self._next_rows(samples_per_prompt)
        mine = rank_slice(len(rows))
        make = lambda: make_envs(self.factory, rows[mine], wheres[mine])  # called by collect_turns
        return collect_turns(roles, make, cfg.env, cfg.generation, kl_coef=kl_coef, kl_estimator=kl_estimator,
                             noise=RowNoise(cfg.run.seed + draw, it), max_first_tokens=cfg.data.max_prompt_len,
                             first_row=mine.start, engine=engine, columns=columns, reward_names=self.reward_names)

    def ahead_job(self, roles: Roles, samples_per_prompt: int = 1):
        """A sampler running ahead (:mod:`fourfold.trainers.ahead`): the next rows drawn here (the
        trainer's thread, in batch order), and the job the sampler's thread runs on them: this
        rank's environments made, reset and stepped through their episodes (:func:`run_episodes`)
        with the engine's snapshot, with a tokenizer of the sampler's own (a copy: a fast
        tokenizer is not to be shared between threads); it returns the episodes as plain data
        (their trajectories, a checkpoint can hold them) with the rows' columns."""
        cfg = self.cfg
        rows, wheres, columns = self._next_rows(samples_per_prompt)
        mine = rank_slice(len(rows))
        if self._sampler_tok is None:
            self._sampler_tok = copy.deepcopy(roles.tokenizer)
        tok = self._sampler_tok

        def job(engine, noise: RowNoise) -> dict:
            batch = run_episodes(engine.weights.copy, lambda: make_envs(self.factory, rows[mine], wheres[mine]),
                                 cfg.env, cfg.generation, tok, noise=noise, max_first_tokens=cfg.data.max_prompt_len,
                                 first_row=mine.start, engine=engine, sync_stop=False)
            return {"columns": columns, "trajectories": [asdict(t) for t in batch.trajectories]}
        return job

    def gather_ahead(self, result: dict, pad_token_id: int) -> dict:
        """:meth:`ahead_job`'s ``result`` of this rank's rows -> the whole batch's: every rank's
        trajectories, in rank order (``result`` itself in one process). A collective."""
        return {**result, "trajectories": gather_items(list(result["trajectories"]))}

    def score_ahead(self, roles: Roles, result: dict, t_gen: float, *, kl_coef: float, kl_estimator: str,
                    concurrent: bool = False) -> Collected:
        """Steps 3-4 on a batch a sampler ran ahead (the whole batch's result, :meth:`gather_ahead`,
        sampled in ``t_gen`` seconds): its trajectories stacked and scored here."""
        trajs = [Trajectory(**t) for t in result["trajectories"]]
        batch = stack_trajectories(trajs, roles.tokenizer.pad_token_id, self.device)
        return score_turns(roles, batch, self.cfg.env, self.cfg.generation, t_gen, kl_coef=kl_coef,
                           kl_estimator=kl_estimator, columns=result["columns"], reward_names=self.reward_names)


def rollout_source(cfg, stream, probe: Optional[Probe], device: torch.device) -> Union[PromptSource, EnvSource]:
    """A run's rollout: an environment per row when ``env.factory`` is set (:class:`EnvSource`;
    a task's ``probe`` measures single responses, so it is refused there), else the prompts'
    single turns (:class:`~fourfold.trainers.rollouts.PromptSource`)."""
    if cfg.env.factory is None:
        return PromptSource(cfg, stream, probe, device)
    if probe is not None:
        raise ConfigError("data.task: a task's probe measures single responses, and env.factory is set; "
                          "an environment run's measure is its returns (env/return_mean): unset data.task")
    return EnvSource(cfg, stream, device)
