"""Shared pieces of the language-model RL stages (PPO and REINFORCE): the prompt stream, and one call
that turns a batch of prompts into a scored :class:`~fourfold.core.Rollout` (the roles come from
:func:`fourfold.models.build.build_roles`).

A trainer never knows an embedded task: it gets prompts (a file or a list) and an optional
:data:`Probe`, ``probe(prompts, responses) -> {metric name: value}``, logged every iteration. The
CLI and the demo build both from a task (``task_prompts`` and ``task_probe`` in the tasks package).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

import torch

from fourfold.config import GenerationConfig, PromptDataConfig
from fourfold.core import Rollout, kl_estimate, masked_mean, token_rewards
from fourfold.data import (
    EpochSampler,
    chat_template_renderer,
    column_names,
    encode_prompts,
    left_pad,
    line_of,
    load_prompts,
)
from fourfold.errors import ConfigError
from fourfold.models.build import Roles
from fourfold.rollout.engine import Engine
from fourfold.rollout.noise import RowNoise
from fourfold.rollout.sampling import Samples, decode_responses
from fourfold.rollout.score import Scores, score_rollout, select_rows
from fourfold.run.parallel import gather_rows, mean_over_ranks, rank_slice, several_ranks

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


class PromptStream:
    """Prompts tokenised once, served in shuffled batches; resumable through ``state_dict()``.

    The prompts are ``prompts`` when given (a list of strings, used as they are), else the rows of
    the ``data.prompts`` file; with ``data.on_error: skip`` its bad rows (unreadable, longer than
    ``data.max_prompt_len``, or text the tokenizer reads as no tokens) are left out and their
    messages kept in ``skipped`` (file order); ``notes`` holds the warning lines on the prompts as
    a whole (most tokens unknown). Fewer prompts than one batch is a ConfigError naming
    ``batch_key``, the batch size's key."""

    def __init__(self, data: PromptDataConfig, tokenizer, batch_size: int, seed: int,
                 prompts: Optional[Sequence[str]] = None, batch_key: str = "rollout_batch_size"):
        on_error = "raise"
        if prompts is not None:
            texts, rows = list(prompts), [{}] * len(prompts)
            lines, source, self.skipped = None, "prompts", []
        elif data.prompts is not None:
            # chat `messages` are rendered exactly as the SFT and reward stages render them
            loaded = load_prompts(data.prompts, on_error=data.on_error, chat_template=chat_template_renderer(tokenizer))
            texts, lines, rows = [r.prompt for r in loaded], [r.line for r in loaded], [r.columns for r in loaded]
            source, on_error, self.skipped = data.prompts, data.on_error, list(loaded.skipped)
        else:
            raise ConfigError("data.prompts: missing: a prompts file (or prompts passed to the trainer)")
        self.notes: list[str] = []
        examples = encode_prompts(texts, tokenizer, data.max_prompt_len, lines=lines, source=source,
                                  on_error=on_error, skipped=self.skipped, notes=self.notes)
        self.skipped.sort(key=line_of)
        self.texts = [texts[e.index] for e in examples]
        self.ids = [e.input_ids for e in examples]
        self.columns = column_names(rows)
        """The prompts file's other columns (none for prompts passed as a list)."""
        self.rows = [rows[e.index] for e in examples]
        self.wheres = [f"{source}:{lines[e.index]}" if lines else f"{source}[{e.index}]" for e in examples]
        """Where each prompt comes from, for messages: ``file:line`` (``prompts[i]`` for a list)."""
        if len(self.ids) < batch_size:
            skipped = f" ({len(self.skipped)} bad rows skipped)" if self.skipped else ""
            raise ConfigError(f"{batch_key}: {batch_size} is more than the {len(self.ids)} prompts in {source}{skipped}; "
                              "one batch needs that many different prompts")
        self.pad_id = tokenizer.pad_token_id
        self.sampler = EpochSampler(len(self.texts), batch_size, seed=seed, drop_last=True)
        self._it = self.sampler.batches()

    def next(self, device) -> tuple[list[str], torch.Tensor, torch.Tensor]:
        """The next batch: its prompts' texts, ids and mask ``[n, P]`` (left-padded)."""
        return self.next_with_columns(device)[:3]

    def next_with_columns(self, device) -> tuple[list[str], torch.Tensor, torch.Tensor, dict[str, list]]:
        """:meth:`next` and the batch's columns: name -> one value per prompt (None where a row
        lacks the column); {} when the prompts have none."""
        idx = next(self._it)
        ids, mask = left_pad([self.ids[i] for i in idx], self.pad_id)
        columns = {c: [self.rows[i].get(c) for i in idx] for c in self.columns}
        return [self.texts[i] for i in idx], ids.to(device), mask.to(device), columns

    def next_rows(self) -> tuple[list[str], list[dict], list[str]]:
        """The next batch as an environment run reads it (the sampler advanced as by :meth:`next`):
        its prompts' texts, its rows (each a dict of the file's other columns with ``prompt``, the
        prompt's text; chat ``messages`` rendered) and where each comes from (``file:line``)."""
        idx = next(self._it)
        return ([self.texts[i] for i in idx], [{**self.rows[i], "prompt": self.texts[i]} for i in idx],
                [self.wheres[i] for i in idx])

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


def repeat_columns(columns: dict[str, list], k: int) -> dict[str, list]:
    """The batch's columns for :func:`repeat_prompts`' rows: each prompt's value ``k`` times."""
    return {name: [v for v in values for _ in range(k)] for name, values in columns.items()}


@dataclass
class Collected:
    """A scored rollout plus what the logs need about it."""

    rollout: Rollout
    samples: Samples
    prompts: list[str]
    responses: list[str]
    kl: torch.Tensor  # [B, T] per-token KL estimate used in the reward
    metrics: dict = field(default_factory=dict)
    parts: dict = field(default_factory=dict)
    """A weighted reward's parts: name -> scores [B] (before any missing-EOS penalty); {} for one source."""


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

    rewards_t = -kl_coef * KL_t on every valid token, plus the sequence score on the last one.
    Responses are decoded to text only when the reward reads text or a ``probe`` is given; the
    probe's measurements join the metrics under their own names.
    """
    if several_ranks() and noise is None:
        raise ValueError("collect: a rollout over several ranks needs per-row noise")
    rows = rank_slice(prompt_ids.shape[0])
    # 2. generate with the policy (this rank's rows); its log-probs are pi_old
    t0 = time.perf_counter()
    samples = _generate(roles, prompt_ids[rows], prompt_mask[rows], gen, noise, rows, engine)
    t_gen = time.perf_counter() - t0
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
    rewards, kl = token_rewards(scores, samples.logprobs, sc.ref_logprobs, mask, kl_coef, kind=kl_estimator)
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
    return Collected(rollout, samples, prompts, responses, kl, metrics, parts)


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


def sample_rows(col: Collected, tokenizer, probe: Optional[Probe] = None, n: int = SAMPLE_ROWS) -> list[dict]:
    """The first ``n`` completions of a collected batch as ``samples.jsonl`` rows: ``prompt``,
    ``response``, ``score`` (the reward the update used, after any missing-EOS penalty), a weighted
    reward's ``parts`` (name -> that part's score) and the probe's ``per_response`` values. Only
    these ``n`` responses are decoded when ``collect`` did not decode the batch."""
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
