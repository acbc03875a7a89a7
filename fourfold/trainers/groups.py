"""DAPO's dynamic sampling (``ppo.filter_groups``; Yu et al. 2025): the groups of a rollout whose
scores are all equal give a group estimator nothing to learn from (every advantage 0), so they are
dropped and the batch refilled from rollouts of further prompts, at most
``ppo.filter_groups_max_batches`` rollouts an iteration. When the bound is reached with too few
groups of some spread, the batch is completed with dropped groups (advantage 0: no policy
gradient, only the KL and entropy terms), so its size stays ``rollout_batch_size``.

Several rollouts join into one by padding: prompts on the left, responses on the right, to the
widest of them (:func:`concat_collected`); the loop's minibatches trim the padding again. An
environment run's batches join alike (first observations on the left, the rest of the trajectory
on the right), with their trajectories and bootstrap values.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn.functional as F

from fourfold.config import PPOAlgoConfig
from fourfold.core import Rollout, frac_zero_std, group_keep, zero_std_groups
from fourfold.trainers.rollouts import Collected, score_metrics


def _pad_steps(x: torch.Tensor, T: int, value=0) -> torch.Tensor:
    return F.pad(x, (0, T - x.shape[1]), value=value)


def _pad_context(x: torch.Tensor, t: int, P: int, T: int, value) -> torch.Tensor:
    """A ``[B, p + t]`` prompt + response column block as ``[B, P + T]``: prompt left-padded."""
    prompt, response = x[:, : x.shape[1] - t], x[:, x.shape[1] - t:]
    return torch.cat([F.pad(prompt, (P - prompt.shape[1], 0), value=value), _pad_steps(response, T, value)], 1)


def concat_collected(parts: list[Collected], pad_id: int) -> Collected:
    """The rows of ``parts`` as one :class:`Collected` (in order): per-step tensors right-padded
    with 0 to the longest response, prompt + response columns padded with ``pad_id`` (attention 0)
    on the prompt's left and the response's right. The metrics are the first part's."""
    if len(parts) == 1:
        return parts[0]
    T = max(p.rollout.mask.shape[1] for p in parts)
    P = max(p.rollout.context["input_ids"].shape[1] - p.rollout.mask.shape[1] for p in parts)

    def rollout_of(p: Collected) -> Rollout:
        t = p.rollout.mask.shape[1]
        r = p.rollout.map(lambda x: x, steps=lambda x: _pad_steps(x, T))
        r.context = {"input_ids": _pad_context(p.rollout.context["input_ids"], t, P, T, pad_id),
                     "attention_mask": _pad_context(p.rollout.context["attention_mask"], t, P, T, 0)}
        return r

    rolls = [rollout_of(p) for p in parts]
    fields = {f.name: [getattr(r, f.name) for r in rolls] for f in dataclasses.fields(Rollout)}
    joined = Rollout(**{k: (None if v[0] is None else {c: torch.cat([d[c] for d in v]) for c in v[0]}
                            if k == "context" else torch.cat(v)) for k, v in fields.items()})
    s0 = parts[0].samples
    samples = dataclasses.replace(
        s0, sequences=joined.context["input_ids"], attention_mask=joined.context["attention_mask"],
        response_mask=joined.mask, logprobs=joined.logprobs,
        finished=torch.cat([p.samples.finished for p in parts]),
        entropy=None if s0.entropy is None else torch.cat([_pad_steps(p.samples.entropy, T) for p in parts]))
    responses = [r for p in parts for r in p.responses] if all(p.responses for p in parts) else []
    named = {k: torch.cat([p.parts[k] for p in parts]) for k in parts[0].parts}  # a weighted reward's parts
    boot = None if parts[0].bootstrap is None else torch.cat([p.bootstrap for p in parts])
    return Collected(joined, samples, [t for p in parts for t in p.prompts], responses,
                     torch.cat([_pad_steps(p.kl, T) for p in parts]), dict(parts[0].metrics), named,
                     bootstrap=boot, trajectories=[t for p in parts for t in p.trajectories],
                     length_limit=parts[0].length_limit)


def select_collected(col: Collected, rows: torch.Tensor) -> Collected:
    """Rows ``rows`` (long indices) of a :class:`Collected`."""
    samples = dataclasses.replace(col.samples, **{f.name: getattr(col.samples, f.name)[rows]
                                                  for f in dataclasses.fields(col.samples)
                                                  if getattr(col.samples, f.name) is not None})
    idx = rows.tolist()
    return Collected(col.rollout.select(rows), samples, [col.prompts[i] for i in idx] if col.prompts else [],
                     [col.responses[i] for i in idx] if col.responses else [], col.kl[rows], col.metrics,
                     {k: v[rows] for k, v in col.parts.items()},
                     bootstrap=None if col.bootstrap is None else col.bootstrap[rows],
                     trajectories=[col.trajectories[i] for i in idx] if col.trajectories else [],
                     length_limit=col.length_limit)


def fill_groups(first: Collected, draw: Callable[[int], Collected], group_size: int, max_batches: int,
                pad_id: int) -> tuple[Collected, dict]:
    """The batch of an iteration under ``filter_groups``: ``first``'s groups of some spread, then
    those of ``draw(1)``, ``draw(2)``, ... (rollouts of new prompts) until the batch's number of
    groups is reached or ``max_batches`` rollouts were drawn; completed, when short, with the
    first dropped groups. Returns the batch and ``reward/filtered_groups`` (groups dropped over
    every rollout drawn) and ``reward/filter_batches`` (rollouts drawn)."""
    need = first.rollout.batch_size // group_size
    parts = [first]
    while True:
        have = sum(int((~zero_std_groups(p.rollout.scores, group_size)).sum()) for p in parts)
        if have >= need or len(parts) >= max_batches:
            break
        parts.append(draw(len(parts)))
    col = concat_collected(parts, pad_id)
    dropped = zero_std_groups(col.rollout.scores, group_size)
    keep = group_keep(col.rollout.scores, group_size, need).reshape(-1, group_size)[:, 0]
    short = need - int(keep.sum())
    if short > 0:  # the bound reached: complete the batch with dropped groups
        keep |= dropped & (torch.cumsum(dropped.long(), 0) <= short)
    groups = keep.nonzero().squeeze(1)
    rows = (groups[:, None] * group_size + torch.arange(group_size)).reshape(-1)
    metrics = {"reward/filtered_groups": float(dropped.sum()), "reward/filter_batches": float(len(parts))}
    return select_collected(col, rows), metrics


def collect_groups(rl, it: int, algo: PPOAlgoConfig, kl_ctl, concurrent: bool) -> tuple:
    """Steps 1-4 of iteration ``it`` (the loop's :meth:`~fourfold.trainers.rl.RLSteps.rollout`, ``rl``)
    and, with ``filter_groups``, DAPO's dynamic sampling (:func:`fill_groups`): ``(collected, metrics)``.
    The metrics' ``reward/score_*`` are then the kept batch's (what the update trains on), the first
    rollout's mean is ``reward/first_score_mean``; the batch's other rollout metrics (KL, lengths,
    entropy, ``env/*``) stay the first rollout's."""
    def draw(d: int):
        return rl.rollout(it, kl_coef=kl_ctl.value if algo.kl_in == "reward" else 0.0, kl_estimator=algo.kl_estimator,
                          samples_per_prompt=algo.samples_per_prompt, concurrent=concurrent, draw=d)

    col = draw(0)
    if not algo.filter_groups:
        return col, {}
    batch, metrics = fill_groups(col, draw, algo.samples_per_prompt, algo.filter_groups_max_batches,
                                 rl.roles.tokenizer.pad_token_id)
    # the scores logged are the kept batch's, the one the update trains on (the first rollout's mean beside)
    kept = score_metrics(batch.rollout.scores) if len(batch.rollout.scores) else {}
    return batch, {**metrics, "reward/frac_zero_std": frac_zero_std(col.rollout.scores, algo.samples_per_prompt),
                   "reward/first_score_mean": col.metrics["reward/score_mean"], **kept}
