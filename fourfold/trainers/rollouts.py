"""THE rollout of the language-model RL stages (PPO and REINFORCE): a batch of prompts, or of
environments, turned into one scored trajectory batch, :class:`Collected` (a
:class:`~fourfold.core.Rollout` whose ``mask`` is the policy's tokens, and what the logs need).
A single-turn batch is the one-turn case: its response mask is a left-aligned policy mask, on which
the policy-token mapping of :mod:`fourfold.core.turns` is the identity, so the loops run one
advantage path and one returns-to-go over any batch, and one writer gives its sample rows.

:class:`PromptSource` is a run's single-turn rollout (:func:`collect`: generate, score with the
reward role, per-token rewards); :class:`fourfold.trainers.env_rollouts.EnvSource` is the multi-turn
one (``env.factory``: one environment per row, its step the rewards); the loop gets one of them from
:func:`fourfold.trainers.env_rollouts.rollout_source` and never asks which.

A trainer never knows an embedded task: it gets prompts (a file or a list) and an optional
:data:`Probe`, ``probe(prompts, responses) -> {metric name: value}``, logged every iteration. The
CLI and the demo build both from a task (``task_prompts`` and ``task_probe`` in the tasks package).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace
from typing import Callable, Optional

import torch

from fourfold.config import GenerationConfig
from fourfold.core import Rollout, kl_estimate, masked_mean, token_rewards
from fourfold.models.build import Roles
from fourfold.rollout.engine import Engine
from fourfold.rollout.noise import RowNoise
from fourfold.rollout.sampling import Samples, decode_responses
from fourfold.rollout.score import Scores, score_rollout, select_rows
from fourfold.run.parallel import gather_items, gather_rows, mean_over_ranks, rank_slice, several_ranks
from fourfold.trainers.prompts import repeat_columns, repeat_prompts

Probe = Callable[[list[str], list[str]], dict[str, float]]
"""``probe(prompts, responses) -> {metric name: value}``: extra measurements of each batch of
responses (e.g. a task's hidden gold reward as ``reward/gold_mean``), logged every iteration
under the names it returns; it never affects training. Its values are means over the responses
it is given: under torchrun each rank calls it on its own rows and the values are combined as
means weighted by the rows. A probe may also carry
``probe.per_response(prompts, responses) -> {name: [one value per response]}`` (e.g. ``gold``):
the sample completions (``samples.jsonl``) then show those values next to each response."""

KEY_METRICS = ("reward/score_mean", "reward/gold_mean", "kl/k1")
"""The metrics the progress line of a language-model RL run shows."""

SAMPLE_ROWS = 4
"""How many completions of a batch (its first rows) a samples log shows."""


@dataclass
class Collected:
    """A scored trajectory batch plus what the logs need about it: ``rollout`` (``mask`` = the
    policy's tokens; ``scores`` = each row's score, an environment's: its return), the ``samples``
    it came from (``finished``: the row's last turn ended by EOS or a stop string), the texts
    (``prompts``, ``responses``: decoded only when the reward or a probe reads text; [] otherwise
    and for environments), ``kl [B, T]`` (the per-token KL estimate in the rewards, 0 off the policy
    tokens), the ``metrics`` and a weighted reward's ``parts``."""

    rollout: Rollout
    samples: Samples
    prompts: list[str]
    responses: list[str]
    kl: torch.Tensor  # [B, T] per-token KL estimate used in the rewards
    metrics: dict = field(default_factory=dict)
    parts: dict = field(default_factory=dict)
    """A weighted reward's parts: name -> scores [B] (before any missing-EOS penalty); {} for one source."""
    bootstrap: Optional[torch.Tensor] = None
    """[B]: what each row's last policy token bootstraps with (an environment run's cut trajectories
    under ``env.truncation: bootstrap``, :func:`fourfold.core.turns.bootstrap_values`); None: nothing
    (every single-turn row ends where its response ends)."""
    trajectories: list = field(default_factory=list)
    """An environment run's :class:`~fourfold.rollout.turns.Trajectory` per row (turns, rewards,
    observations: the sample rows show them); [] for single turns."""
    length_limit: int = 0
    """The most policy tokens a row can hold (``generation.max_new_tokens`` for a single turn; an
    environment's trajectory budget): what DAPO's overlong punishment measures lengths against."""
    version: Optional[int] = None
    """The policy version (updates done) whose weights sampled the batch, when a sampler ran ahead
    (``rollout.max_staleness`` >= 1, :mod:`fourfold.trainers.ahead`); None: the weights just
    before this iteration's update (the synchronous run)."""


def collect(
    roles: Roles,
    prompts: list[str],
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    gen: GenerationConfig,
    *,
    engine: Engine,
    kl_coef: float,
    kl_estimator: str = "k1",
    probe: Optional[Probe] = None,
    concurrent: bool = False,
    noise: Optional[RowNoise] = None,
    columns: Optional[dict[str, list]] = None,
) -> Collected:
    """Steps 2-4 of an iteration: generate (pi_old), score (reference, critic, reward), token rewards.

    ``prompts``, ``prompt_ids``, ``prompt_mask``: the iteration's global batch (the same on every
    rank). ``engine``: what generates the responses (:class:`~fourfold.rollout.engine.Engine`, e.g.
    :func:`~fourfold.rollout.engine.make_engine`'s), given the policy's weights by its ``sync``
    first. Under torchrun each rank samples and scores its contiguous slice of the rows
    (:func:`~fourfold.run.parallel.rank_slice`), then every rank gathers the whole batch
    (:func:`~fourfold.run.parallel.gather_rows`), so what follows (rewards, metrics, advantages) is
    computed on the global batch alike on all ranks. ``noise``: the iteration's per-row noise
    (required with more than one rank; without it tokens come from the global torch generator).
    ``columns``: the prompts file's other columns, one value per row (:func:`repeat_columns`),
    given to the reward with this rank's rows. A weighted reward's parts are gathered as the scores
    (``Collected.parts``) and logged as ``reward/<name>_mean``.

    rewards_t = -kl_coef * KL_t on every valid token, plus the sequence score on the last one; KL_t
    compares the policy's full-softmax log-prob of the token with the reference's
    (``Samples.policy_logprobs``: under a truncating ``generation`` filter the rollout's own
    log-probs, pi_old from the engine, are the truncated distribution's). Responses are decoded
    to text only when the reward reads text or a ``probe`` is given; the probe's measurements join
    the metrics under their own names.
    """
    if several_ranks() and noise is None:
        raise ValueError("collect: a rollout over several ranks needs per-row noise")
    rows = rank_slice(prompt_ids.shape[0])
    # 2. generate with the policy (this rank's rows); its log-probs are pi_old
    t0 = time.perf_counter()
    samples = _generate(roles, prompt_ids[rows], prompt_mask[rows], gen, noise, rows, engine)
    t_gen = time.perf_counter() - t0
    return score_samples(roles, prompts, samples, gen, t_gen, kl_coef=kl_coef, kl_estimator=kl_estimator,
                         probe=probe, concurrent=concurrent, columns=columns)


def pad_responses(samples: Samples, width: int, pad_token_id: int) -> Samples:
    """``samples`` with its responses padded on the right to ``width`` tokens: pad ids, masks and
    log-probs 0, what the engine writes after a row's EOS (so a batch that ran longer looks the same)."""
    extra = width - samples.n_response
    if extra <= 0:
        return samples
    pad = lambda t, value=0: None if t is None else torch.nn.functional.pad(t, (0, extra), value=value)
    return Samples(pad(samples.sequences, pad_token_id), pad(samples.attention_mask), pad(samples.response_mask),
                   pad(samples.logprobs), samples.finished, pad(samples.entropy), pad(samples.kept_logmass))


def gather_samples(samples: Samples, pad_token_id: int) -> Samples:
    """Every rank's rows of ``samples`` sampled without the stop check's all-reduce (a sampler
    running ahead: each rank's responses as long as its own rows need), each padded to the longest
    rank's (:func:`pad_responses`), concatenated in rank order; ``samples`` itself in one process."""
    if not several_ranks():
        return samples
    parts = gather_items([samples])
    width = max(p.n_response for p in parts)
    parts = [pad_responses(p, width, pad_token_id) for p in parts]
    return Samples(*[None if getattr(parts[0], f.name) is None else torch.cat([getattr(p, f.name) for p in parts])
                     for f in fields(Samples)])


def score_samples(roles: Roles, prompts: list[str], samples: Samples, gen: GenerationConfig, t_gen: float, *,
                  kl_coef: float, kl_estimator: str = "k1", probe: Optional[Probe] = None, concurrent: bool = False,
                  columns: Optional[dict[str, list]] = None) -> Collected:
    """Steps 3-4 of :func:`collect` on the whole batch's ``samples`` (generated in ``t_gen``
    seconds, by :func:`collect` or by a sampler running ahead, :mod:`fourfold.trainers.ahead`):
    score this rank's rows (reference, critic, reward), gather, per-token rewards, metrics."""
    rows = rank_slice(len(prompts))
    # 3. score with the frozen reference and reward model, and the critic (this rank's rows)
    t0 = time.perf_counter()
    need_text = getattr(roles.reward, "needs_text", False) or probe is not None
    responses = decode_responses(roles.tokenizer, samples) if need_text else []
    mine = {k: v[rows] for k, v in columns.items()} if columns else None
    sc = _score(roles, select_rows(samples, rows), prompts[rows], responses[rows], gen.temperature, concurrent, mine)
    scores = sc.scores
    penalised = torch.zeros_like(samples.finished)
    if gen.missing_eos_score is not None and gen.stop_at_eos:
        penalised = ~samples.finished
        scores = torch.where(penalised, torch.full_like(scores, gen.missing_eos_score), scores)
    # 4. per-token rewards: KL penalty on every token, the score on the last valid one
    mask = samples.response_mask
    rewards, kl = token_rewards(scores, samples.policy_logprobs, sc.ref_logprobs, mask, kl_coef, kind=kl_estimator)
    t_score = time.perf_counter() - t0
    rollout = Rollout(
        actions=samples.responses, mask=mask, logprobs=samples.logprobs, values=sc.values, rewards=rewards,
        ref_logprobs=sc.ref_logprobs, scores=scores,
        context={"input_ids": samples.sequences, "attention_mask": samples.attention_mask},
    )
    metrics = rollout_metrics(samples, sc, rewards, penalised)
    names = getattr(roles.reward, "names", None)
    parts = dict(zip(names, sc.parts.unbind(1))) if names and sc.parts is not None else {}
    metrics.update({f"reward/{name}_mean": float(part.mean()) for name, part in parts.items()})
    n_tokens = metrics["rollout/tokens"]
    metrics.update({"time/generate_s": t_gen, "time/score_s": t_score,
                    "time/gen_tokens_per_s": n_tokens / max(t_gen, 1e-9)})
    if probe is not None:  # each rank its rows; the probe's values are means over the responses it gets
        metrics.update(mean_over_ranks(probe(prompts[rows], responses[rows]), len(prompts[rows])))
    return Collected(rollout, samples, prompts, responses, kl, metrics, parts, length_limit=gen.max_new_tokens)


def _generate(roles: Roles, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, gen: GenerationConfig,
              noise: Optional[RowNoise], rows: slice, engine: Engine) -> Samples:
    """Sample this rank's ``rows`` of the batch with the policy (in eval mode), then gather every
    rank's rows: the whole batch's :class:`Samples` on every rank."""
    tok = roles.tokenizer
    uniforms = None if noise is None else noise.uniforms(range(rows.start, rows.stop), gen.max_new_tokens)
    roles.policy.eval()
    samples = engine(
        roles.policy, prompt_ids, prompt_mask,
        max_new_tokens=gen.max_new_tokens, temperature=gen.temperature,
        eos_token_id=tok.eos_token_id if gen.stop_at_eos else None, pad_token_id=tok.pad_token_id,
        noise=uniforms, sync_stop=several_ranks(),
    )
    roles.policy.train()
    return gather_rows(samples)


def _score(roles: Roles, samples: Samples, prompts: list[str], responses: list[str], temperature: float,
           concurrent: bool, columns: Optional[dict[str, list]] = None) -> Scores:
    """Score this rank's ``samples`` (the critic in eval mode), then gather every rank's scores."""
    if roles.critic is not None:
        roles.critic.eval()
    sc = score_rollout(samples, reference=roles.reference, reward=roles.reward, critic=roles.critic,
                       temperature=temperature, prompts=prompts, responses=responses, concurrent=concurrent,
                       columns=columns)
    if roles.critic is not None:
        roles.critic.train()
    return gather_rows(sc)


def score_quantity(col: Collected) -> str:
    """The non-finite guard's name for a batch's scores: ``reward_score``, or with a weighted
    reward ``reward_score (part <name>: not finite)`` naming the parts that returned NaN/inf."""
    bad = [name for name, part in col.parts.items() if not bool(torch.isfinite(part).all())]
    return "reward_score" + (f" (part {', '.join(bad)}: not finite)" if bad else "")


def score_metrics(scores: torch.Tensor) -> dict:
    """``reward/score_mean``, ``_std``, ``_min``, ``_max`` of a batch's scores ``[B]``."""
    return {
        "reward/score_mean": float(scores.mean()),
        "reward/score_std": float(scores.std()) if scores.numel() > 1 else 0.0,
        "reward/score_min": float(scores.min()),
        "reward/score_max": float(scores.max()),
    }


def rollout_metrics(samples: Samples, sc: Scores, rewards: torch.Tensor, penalised: torch.Tensor) -> dict:
    """The rollout's reward, KL, entropy and length metrics over the whole batch (see
    :data:`fourfold.reporting.METRICS`): ``sc.scores`` are the reward model's (before any
    missing-EOS penalty), ``penalised`` the rows whose score the penalty replaced. The KL is the
    policy's full softmax against the reference (``Samples.policy_logprobs``); under a truncating
    filter ``rollout/log_kept_mass`` is the mean over the valid tokens of the log of the mass it kept."""
    mask = samples.response_mask
    lengths = mask.sum(1)
    policy_lp = samples.policy_logprobs
    k3 = kl_estimate(policy_lp, sc.ref_logprobs, "k3") * mask
    kept = {} if samples.kept_logmass is None else {"rollout/log_kept_mass": float(masked_mean(samples.kept_logmass, mask))}
    return {
        **score_metrics(sc.scores),
        "reward/token_reward_sum_mean": float(rewards.sum(1).mean()),
        "reward/no_eos_penalised": float(penalised.float().mean()),
        "kl/k1": float((kl_estimate(policy_lp, sc.ref_logprobs, "k1") * mask).sum(1).mean()),
        "kl/k3": float(k3.sum(1).mean()),
        "policy/entropy": float(masked_mean(samples.entropy, mask)) if samples.entropy is not None else float("nan"),
        "rollout/response_length": float(lengths.mean()),
        "rollout/no_eos_share": float((~samples.finished).float().mean()),
        "rollout/tokens": float(lengths.sum()),
        **kept,
    }


def sample_rows(col: Collected, tokenizer, probe: Optional[Probe] = None, n: int = SAMPLE_ROWS) -> list[dict]:
    """The first ``n`` rows of a collected batch as ``samples.jsonl`` rows, one writer for every
    batch. A single turn: ``prompt``, ``response``, ``score`` (the reward the update used, after any
    missing-EOS penalty), a weighted reward's ``parts`` (name -> that part's score) and the probe's
    ``per_response`` values; only these ``n`` responses are decoded when ``collect`` did not decode
    the batch. An environment's trajectory: :func:`trajectory_rows`, with the ``score`` and its
    ``parts`` when a reward stands beside the environment's."""
    if col.trajectories:
        rows = trajectory_rows(col.trajectories[:n], tokenizer)
        if col.parts:  # a reward beside the environment: the score the update used and its parts
            for i, row in enumerate(rows):
                row["score"] = float(col.rollout.scores[i])
                row["parts"] = {name: float(part[i]) for name, part in col.parts.items()}
        return rows
    n = min(n, len(col.prompts))
    responses = col.responses[:n] or decode_responses(
        tokenizer, replace(col.samples, sequences=col.samples.sequences[:n], response_mask=col.samples.response_mask[:n]))
    rows = [{"prompt": p, "response": r, "score": float(s)}
            for p, r, s in zip(col.prompts[:n], responses, col.rollout.scores[:n].tolist())]
    for name, part in col.parts.items():
        for row, value in zip(rows, part[:n].tolist()):
            row.setdefault("parts", {})[name] = value
    per_response = getattr(probe, "per_response", None)
    if per_response is not None:
        for name, values in per_response(col.prompts[:n], responses).items():
            for row, value in zip(rows, values):
                row[name] = value
    return rows


def trajectory_rows(trajectories: list, tokenizer) -> list[dict]:
    """Trajectories as ``samples.jsonl`` rows: ``prompt`` (the first observation's text), ``turns``
    (per policy turn: its ``action`` text, its ``reward`` when it was stepped, and the
    ``observation`` text appended after it, if any), ``return``, ``done``, ``truncated``."""
    rows = []
    for traj in trajectories:
        turns, pos = [], 0
        for k in range(traj.n_turns):  # turn k's ids, then the observation after it
            action = []
            while pos < len(traj.ids) and traj.turn[pos] == k:
                action.append(traj.ids[pos])
                pos += 1
            after = []
            while pos < len(traj.ids) and traj.turn[pos] < 0:
                after.append(traj.ids[pos])
                pos += 1
            entry = {"action": tokenizer.decode(action, skip_special_tokens=True)}
            if k < len(traj.turn_rewards):
                entry["reward"] = traj.turn_rewards[k]
            if after:
                entry["observation"] = tokenizer.decode(after, skip_special_tokens=True)
            turns.append(entry)
        rows.append({"prompt": tokenizer.decode(traj.prompt, skip_special_tokens=True), "turns": turns,
                     "return": float(sum(traj.turn_rewards)), "done": traj.done, "truncated": traj.truncated})
    return rows


class PromptSource:
    """A run's single-turn rollout: the next batch of the prompt ``stream``, each prompt on
    ``samples_per_prompt`` consecutive rows, through :func:`collect` with the reward role, the
    run's ``probe`` and the iteration's per-row noise (seed ``cfg.run.seed + draw``)."""

    def __init__(self, cfg, stream, probe: Optional[Probe], device: torch.device):
        self.cfg, self.stream, self.probe, self.device = cfg, stream, probe, device

    def next_batch(self, samples_per_prompt: int = 1) -> tuple[list[str], torch.Tensor, torch.Tensor, dict]:
        """The stream's next batch, each prompt on ``samples_per_prompt`` consecutive rows: its
        texts, ids and mask ``[B, P]`` and columns (one value per row)."""
        texts, prompt_ids, prompt_mask, columns = self.stream.next_with_columns(self.device)
        texts, prompt_ids, prompt_mask = repeat_prompts(texts, prompt_ids, prompt_mask, samples_per_prompt)
        return texts, prompt_ids, prompt_mask, repeat_columns(columns, samples_per_prompt)

    def collect(self, roles: Roles, engine: Engine, it: int, *, kl_coef: float, kl_estimator: str,
                samples_per_prompt: int = 1, concurrent: bool = False, draw: int = 0) -> Collected:
        cfg = self.cfg
        texts, prompt_ids, prompt_mask, columns = self.next_batch(samples_per_prompt)
        return collect(roles, texts, prompt_ids, prompt_mask, cfg.generation, engine=engine,
                       kl_coef=kl_coef, kl_estimator=kl_estimator, probe=self.probe, concurrent=concurrent,
                       noise=RowNoise(cfg.run.seed + draw, it), columns=columns)

    def ahead_job(self, roles: Roles, samples_per_prompt: int = 1):
        """A sampler running ahead (:mod:`fourfold.trainers.ahead`): the next batch drawn here (the
        trainer's thread, in batch order), and the job the sampler's thread runs on it: this
        rank's rows sampled with the engine's snapshot and the batch's per-row noise, as
        :func:`collect` samples them (no collective: the rows are gathered when scored); it
        returns the prompts' texts and columns and the samples' tensors (a checkpoint can hold them)."""
        gen, tok = self.cfg.generation, roles.tokenizer
        texts, prompt_ids, prompt_mask, columns = self.next_batch(samples_per_prompt)
        rows = rank_slice(len(texts))
        eos = tok.eos_token_id if gen.stop_at_eos else None

        def job(engine, noise: RowNoise) -> dict:
            samples = engine(engine.weights.copy, prompt_ids[rows], prompt_mask[rows], max_new_tokens=gen.max_new_tokens,
                             temperature=gen.temperature, eos_token_id=eos, pad_token_id=tok.pad_token_id,
                             noise=noise.uniforms(range(rows.start, rows.stop), gen.max_new_tokens), sync_stop=False)
            return {"texts": texts, "columns": columns,
                    "samples": {f.name: getattr(samples, f.name) for f in fields(Samples)}}
        return job

    def gather_ahead(self, result: dict, pad_token_id: int) -> dict:
        """:meth:`ahead_job`'s ``result`` of this rank's rows -> the whole batch's (every rank's
        samples, :func:`gather_samples`; ``result`` itself in one process). A collective."""
        if not several_ranks():
            return result
        samples = gather_samples(Samples(**result["samples"]), pad_token_id)
        return {**result, "samples": {f.name: getattr(samples, f.name) for f in fields(Samples)}}

    def score_ahead(self, roles: Roles, result: dict, t_gen: float, *, kl_coef: float, kl_estimator: str,
                    concurrent: bool = False) -> Collected:
        """Steps 3-4 on a batch a sampler ran ahead (the whole batch's result, :meth:`gather_ahead`,
        sampled in ``t_gen`` seconds): :func:`score_samples` with the run's probe."""
        samples = Samples(**result["samples"])
        return score_samples(roles, list(result["texts"]), samples, self.cfg.generation, t_gen, kl_coef=kl_coef,
                             kl_estimator=kl_estimator, probe=self.probe, concurrent=concurrent,
                             columns=dict(result["columns"]))
