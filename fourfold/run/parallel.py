"""The data-parallel seam of the training loops: with it a loop reads as one-process code.

Under ``torchrun`` every rank runs the same loop over its own share of each global batch, and the
trained models are FSDP2-sharded (:mod:`fourfold.run.fsdp`) or replicated, both of which
*average* the ranks' gradients. So that a run is the same at any world size (up to float rounding), a loop needs only:

* :func:`shard_rows`: this rank's rows of a global batch of example indices (:class:`Part`), and
  :func:`rank_slice`: this rank's contiguous slice of a global batch of ``n`` rows (a rollout's, a
  minibatch's);
* :func:`gather_rows`: every rank's rows of a rollout's samples or scores, the whole batch on every
  rank (:func:`gather_items`: of a list of objects, an environment run's trajectories);
  :func:`several_ranks`: whether the ranks must stop their token loops together (an engine's
  ``sync_stop``);
* :meth:`Figures.global_`: a step's figures summed over the ranks (the one ``if distributed``);
* :func:`loss_scale`: what this rank backpropagates, given its share of the global mean (the rule
  that undoes FSDP's averaging, written once);
* :func:`sum_over_ranks`: per-rank shares of statistics summed into the global ones, and
  :func:`global_sum`: a tensor summed over the ranks (a loss's global mean from each rank's share,
  what the non-finite guard reads, so every rank skips the same steps);
* :func:`map_batches`: a pass over a list in batches (a held-out evaluation, the reward
  normalisation, DPO's reference log-probs), each rank computing its share of the batches and every
  rank getting all the results in order; :func:`mean_over_ranks`: means over each rank's share of a
  batch (a probe's) made the means over the whole batch;
* :func:`place_roles`: the roles placed on the ranks as the role plan says (sharded, or replicated
  with one gradient all-reduce per step);
* :func:`check_world`: what a multi-rank run needs of a config.

In one process every one of these is an identity (no collective runs).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Callable, Optional, Sequence, TypeVar

import torch

from fourfold import dist
from fourfold.errors import ConfigError
from fourfold.models.plan import ADAPTER, BASE
from fourfold.run.fsdp import replicate_model, shard_model

T = TypeVar("T")


@dataclass(frozen=True)
class Part:
    """This rank's share of a global batch: ``rows`` (example indices) and whether they count. A
    rank left without rows (the last batch of an epoch smaller than the world) takes the batch's
    first row and counts none of it: its forward and backward still run, which FSDP's collectives
    need from every rank."""

    rows: list
    counted: bool


def shard_rows(indices: Sequence[int], world: Optional[dist.World] = None) -> Part:
    """This rank's contiguous part of a global batch of example ``indices`` (as even as can be:
    :func:`fourfold.dist.shard`); all of them in one process."""
    world = dist.world() if world is None else world
    part = list(indices)[dist.shard(len(indices), world)]
    return Part(part, True) if part else Part(list(indices)[:1], False)


def rank_slice(n: int) -> slice:
    """This rank's contiguous slice of ``n`` global rows (:func:`fourfold.dist.shard`: ``n / W``
    each when it divides, else as even as can be; ``slice(0, n)`` in one process)."""
    return dist.shard(n, dist.world())


def several_ranks() -> bool:
    """True when more than one process runs the loop: an engine's token loop must then stop only
    when every rank's rows have finished (its ``sync_stop``), and a rollout needs per-row noise."""
    return dist.world().distributed


def _gather(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.bool:  # gloo gathers no bool: as bytes
        return dist.all_gather_rows(t.to(torch.uint8)).bool()
    return dist.all_gather_rows(t)


def gather_rows(batch):
    """Every rank's rows of a :class:`~fourfold.rollout.sampling.Samples` or
    :class:`~fourfold.rollout.score.Scores` (any dataclass of tensors), concatenated in rank order
    (``batch`` itself in one process). Each rank's tensors must have the same shapes: the same
    number of rows, prompts padded to the same width, responses of the same (synced) length."""
    if not several_ranks():
        return batch
    return replace(batch, **{f.name: _gather(getattr(batch, f.name)) for f in fields(batch)
                             if getattr(batch, f.name) is not None})


def gather_items(items: list) -> list:
    """Every rank's ``items`` (a list of small picklable objects, e.g. an environment run's
    trajectories) concatenated in rank order (``items`` itself in one process): ranks may hold
    lists of different lengths and objects of different sizes, which :func:`gather_rows` cannot take."""
    if not several_ranks():
        return items
    return [x for part in dist.all_gather_objects(list(items)) for x in part]


def loss_scale(share: float, world: Optional[dist.World] = None) -> float:
    """The factor on this rank's loss when it holds ``share`` of the global mean: FSDP averages the
    ranks' gradients, so a rank backpropagates ``share * world_size`` of its own mean (``share`` in
    one process). ``world``: this process's (default: the started group's)."""
    return share * (dist.world() if world is None else world).world_size


def global_sums(values: list) -> list:
    """``values`` summed over every rank, in float64 (``values`` themselves in one process)."""
    if not dist.world().distributed:
        return values
    return dist.all_reduce_sum(torch.tensor(values, dtype=torch.float64)).tolist()


def global_sum(t: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of ``t`` over every rank (a new tensor; ``t`` itself in one process):
    a loss's global mean from each rank's share of it."""
    return dist.all_reduce_sum(t)


def sum_over_ranks(stats: dict, keys: Sequence[str]) -> dict:
    """``stats`` with the values of ``keys`` (each rank's share of a global statistic) summed over
    every rank in one all-reduce; the other values are already the same on every rank."""
    names = sorted(keys)
    return {**stats, **dict(zip(names, global_sums([stats[k] for k in names])))}


def mean_over_ranks(means: dict, count: int) -> dict:
    """Means over this rank's ``count`` items made the means over every rank's items (weighted by
    each rank's count; a rank without items adds nothing); ``means`` itself in one process. Every
    rank gives the same keys."""
    if not dist.world().distributed:
        return means
    names = list(means)
    totals = global_sums([float(means[k]) * count if count else 0.0 for k in names] + [float(count)])
    return {k: (s / totals[-1] if totals[-1] else float("nan")) for k, s in zip(names, totals)}


def map_batches(fn: Callable[[list], T], items: Sequence, batch_size: int) -> list[T]:
    """``[fn(items[0:b]), fn(items[b:2b]), ...]`` (``b = batch_size``; the last batch may be shorter):
    a pass over ``items`` in batches, in one process exactly that loop.

    Under torchrun rank r computes batches r, r + W, r + 2W, ... (W ranks: 1/W of the work, the
    long batches of a length-sorted list spread over the ranks) and every rank gets every result,
    in order (all-gathered as Python objects: return small CPU tensors or numbers). Each batch is
    the one-process batch, so the results are the one-process results up to float rounding. A rank
    with one batch fewer than another runs ``fn`` on the first batch once more and drops the result:
    a sharded model's forward is a collective every rank must join."""
    batches = [list(items[i : i + batch_size]) for i in range(0, len(items), batch_size)]
    w = dist.world()
    if not w.distributed:
        return [fn(batch) for batch in batches]
    mine = [fn(batch) for batch in batches[w.rank :: w.world_size]]
    for _ in range(-(-len(batches) // w.world_size) - len(mine)):
        fn(batches[0])  # the collectives of the ranks that have one more batch
    out: list = [None] * len(batches)
    for rank, results in enumerate(dist.all_gather_objects(mine)):
        out[rank :: w.world_size] = results
    return out


@dataclass
class Figures:
    """A step's figures on this rank's rows: ``means`` over them (a loss, an accuracy), each weighted
    by ``sums[weight]`` (tokens, pairs) when made global, and ``sums`` (counts and totals)."""

    means: dict
    sums: dict
    weight: str

    def global_(self, part: Part) -> tuple["Figures", float]:
        """(the figures of the whole global batch, this rank's share of its weight: what
        :func:`loss_scale` takes). A rank whose rows do not count adds nothing."""
        if not dist.world().distributed:
            return self, 1.0
        n = self.sums[self.weight] if part.counted else 0
        local = [v * n for v in self.means.values()] + [v * part.counted for v in self.sums.values()]
        totals = global_sums(local)
        k = len(self.means)
        sums = dict(zip(self.sums, totals[k:]))
        total = sums[self.weight]
        means = {key: (s / total if total else 0.0) for key, s in zip(self.means, totals[:k])}
        return Figures(means, sums, self.weight), (n / total if total else 0.0)

    def flat(self) -> dict:
        """Means and sums in one dict (a metrics window adds it up)."""
        return {**self.means, **self.sums}


def check_world(world: dist.World, concurrent: bool, batch_sizes: dict) -> None:
    """What a run over several ranks needs of its config: every global batch size (config key ->
    value) divides by the world size, and no ``run.concurrent_roles`` (two threads issuing
    collectives could pair them differently on each rank). ConfigError naming the key otherwise."""
    for key, value in batch_sizes.items():
        dist.check_divisible(key, value, world)
    if world.distributed and concurrent:
        raise ConfigError("run.concurrent_roles: not with more than one process (the roles' collectives must run "
                          "in one order on every rank); set it to false")


def place_roles(roles, plan, device: torch.device) -> None:
    """Under torchrun, place the roles as the role plan says (nothing in one process): a role placed
    ``fsdp`` is sharded with FSDP2 (a frozen one offloaded to CPU memory between forwards with
    ``dist.cpu_offload``); a trained role placed ``replicate`` keeps a full copy on every rank with
    its gradients averaged before each step, a frozen one just its copy. A shared LoRA base is placed
    once, as :attr:`~fourfold.models.plan.RolePlan.base_placement` says, with every role on it: its
    runner sharded (the roles' adapters and heads with it; they are then pointed at the sharded
    parameters), or its trained roles replicated. Call it before building the optimizers: sharding
    replaces the parameters."""
    if not dist.started():
        return
    modules = roles.modules()
    if roles.base is not None:
        if plan.base_placement == "fsdp":
            shard_model(roles.base.runner, device, mixed_precision=plan.mixed_precision)
            roles.base.rebind()
        else:
            for spec in plan.roles:
                if spec.trained and spec.form == ADAPTER:
                    replicate_model(modules[spec.name])
    for spec in sorted(plan.roles, key=lambda s: not s.trained):  # the trained roles first
        module: Optional[torch.nn.Module] = modules.get(spec.name)
        if module is None or spec.form in (ADAPTER, BASE):  # none, or placed with the shared base
            continue
        if spec.placement == "replicate":
            if spec.trained:
                replicate_model(module)
            continue
        shard_model(module, device, mixed_precision=plan.mixed_precision,
                    offload=not spec.trained and plan.cpu_offload)
