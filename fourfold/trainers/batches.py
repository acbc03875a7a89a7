"""How PPO's update cuts a rollout: minibatches of every epoch (this rank's share of each), the
micro-batches a minibatch is accumulated over (by rows, or by a token budget), and the trim that
drops the columns a micro-batch's rows all pad. The pre-update forward of pi_old
(:func:`fourfold.trainers.practice.trainer_logprobs`) runs over the very same micro-batches, so
that the first minibatch's ratio is exactly 1. :class:`GradSNR` measures the signal-to-noise ratio
of an update's minibatch gradients (``policy/grad_snr``), for PPO and REINFORCE alike."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from fourfold.config import PPOAlgoConfig
from fourfold.core import GradMoments, Rollout, aggregation_units, flat_grad
from fourfold.run.parallel import global_sums, rank_slice


def trim(mb: Rollout) -> Rollout:
    """Drop columns that are padding in every row of a minibatch (left of the prompts, right of the
    longest response): same result, less compute."""
    ids, attn = mb.context["input_ids"], mb.context["attention_mask"]
    T = mb.mask.shape[1]
    P = ids.shape[1] - T
    t_keep = int(mb.mask.sum(0).nonzero().max()) + 1 if bool(mb.mask.any()) else 1
    p_first = int(attn[:, :P].sum(0).nonzero().min()) if bool(attn[:, :P].any()) else 0
    cols = slice(p_first, P + t_keep)
    return mb.map(lambda x: x, steps=lambda x: x[:, :t_keep], context=lambda x: x[:, cols])


@dataclass
class Minibatch:
    """This rank's share of one global minibatch: its rows (a contiguous 1/W of the minibatch) and
    the whole minibatch's counts, which normalise every rank's loss alike."""

    where: str  # for the non-finite guard's events, e.g. "iteration 3 epoch 0 minibatch 1"
    rows: Rollout
    units: float  # aggregation units of the whole minibatch under ppo.loss_agg (aggregation_units)
    tokens: float  # valid tokens of the whole minibatch


def minibatches(rollout: Rollout, algo: PPOAlgoConfig, perms: list[torch.Tensor], iteration: int) -> list[Minibatch]:
    """The minibatches of ``ppo_epochs`` passes: epoch ``e`` takes rows ``perms[e]`` in slices of
    ``minibatch_size``, and this rank the contiguous 1/W of each slice
    (:func:`~fourfold.run.parallel.rank_slice`; ``perms`` and ``rollout`` are the same on every rank)."""
    out = []
    for e, perm in enumerate(perms):
        for i in range(0, len(perm), algo.minibatch_size):
            idx = perm[i : i + algo.minibatch_size]
            mask = rollout.mask[idx]
            out.append(Minibatch(f"iteration {iteration} epoch {e} minibatch {i // algo.minibatch_size}",
                                 rollout.select(idx[rank_slice(len(idx))]),
                                 float(aggregation_units(mask, algo.loss_agg)), float(mask.sum())))
    return out


def micro_groups(rows: Rollout, algo: PPOAlgoConfig) -> list:
    """How a minibatch's rows split into micro-batches: slices of ``micro_batch_size`` rows in order
    (all of them when null), or with ``micro_batch_tokens`` the rows sorted by length and grouped so
    that each group, padded to its own longest row, holds at most that many tokens (a row longer
    than the budget alone): no compute on padding beyond each group's longest row."""
    n = rows.batch_size
    if algo.micro_batch_tokens is None:
        size = algo.micro_batch_size or n
        return [slice(i, i + size) for i in range(0, n, size)]
    lengths = rows.context["attention_mask"].sum(1)  # (n,) valid prompt + response tokens
    order = torch.argsort(lengths, stable=True).tolist()
    groups, group = [], []
    for i in order:  # ascending: the row joining a group is its longest
        if group and (len(group) + 1) * int(lengths[i]) > algo.micro_batch_tokens:
            groups.append(torch.tensor(group))
            group = []
        group.append(i)
    return groups + [torch.tensor(group)]


def micro_batches(rows: Rollout, algo: PPOAlgoConfig, agg: str, total_units: float):
    """The micro-batches of a minibatch's rows (:func:`micro_groups`, each trimmed), each with its
    weight aggregation_units(part) / ``total_units`` (the whole minibatch's, for the loss
    aggregation ``agg``: tokens for token-mean, responses for the seq-mean modes): the weighted sum
    of every rank's parts' aggregates is the minibatch's."""
    total = max(total_units, 1.0)
    for rows_of_part in micro_groups(rows, algo):
        part = trim(rows.select(rows_of_part))
        yield part, float(aggregation_units(part.mask, agg)) / total


class GradSNR:
    """``policy/grad_snr`` of one update: the SNR (:mod:`fourfold.core.gradients`) of each epoch's
    ``per_epoch`` minibatch gradients, averaged over the epochs. The optimizer step passes
    :meth:`on_grads` to :func:`~fourfold.run.optim.guarded_step` (the averaged, unclipped
    gradients) and calls :meth:`commit` with the step's grad norm after it: a skipped step (norm
    None or not finite) adds nothing but still counts as a step of its epoch. Memory: a float32
    copy of the gradient and the running sum (two vectors of the trained parameters' size)."""

    def __init__(self, per_epoch: int) -> None:
        self.per_epoch = max(per_epoch, 1)
        self.epochs: list[GradMoments] = []
        self.pending: Optional[torch.Tensor] = None
        self.steps = 0

    def on_grads(self, params) -> None:
        self.pending = flat_grad(params)

    def commit(self, norm: Optional[float]) -> None:
        """After a step: its gradient joins its epoch's moments when the step went through."""
        if self.steps % self.per_epoch == 0:
            self.epochs.append(GradMoments())
        self.steps += 1
        if self.pending is not None and norm is not None and math.isfinite(norm):
            self.epochs[-1].add(self.pending)
        self.pending = None

    def metrics(self) -> dict:
        """``{"policy/grad_snr": mean over epochs}`` (the moments summed over the ranks), or {}
        when no epoch had 2 steps that went through. The same on every rank."""
        snrs = [s for s in (m.snr(reduce=global_sums) for m in self.epochs) if s is not None]
        return {"policy/grad_snr": sum(snrs) / len(snrs)} if snrs else {}
