"""The sampler that runs ahead of the trainer (``rollout.max_staleness`` k >= 1; docs/engines.md,
"Running ahead", says why a thread, what the lag buys and what is refused): while the trainer
updates on iteration i's batch, a background thread samples the next ones, each with weights at
most k updates old.

The lag is fixed, so a run is the same whatever the threads' timing: iteration i (1-based) is
sampled with the policy of version v(i) = max(0, i - 1 - k), the weights after that many updates.
At the start of iteration i the trainer holds version i - 1, which is what batch i + k needs:
:meth:`RunAhead.next` snapshots it (in the trainer's thread, before the update changes it) and
hands batch i + k to the sampler, then waits for batch i. ``rollout/version_lag`` = min(i - 1, k).

What makes the batches independent of timing: each batch in flight has its own snapshot (a
:class:`~fourfold.rollout.weights.CopiedWeights` copy, one of k + 1 slots, slot ``i mod (k + 1)``:
the batch that used it last was consumed at iteration i - k - 1); its prompts (or an environment
run's rows) are drawn in the trainer's thread in batch order when its job is made (the source's
``ahead_job``); its tokens come from its own per-row noise (:class:`~fourfold.rollout.noise.RowNoise`,
``run.seed`` and the batch's iteration); an environment run's episodes are made, reset and stepped
in the sampler's thread one batch after the other (a tokenizer of its own). Scoring (reference,
critic, reward) stays in the trainer's thread when the batch is consumed (the source's ``score_ahead``).

Resume is exact: the checkpoint holds the k batches in flight (:meth:`RunAhead.state_dict`: each
job's result, token ids and behaviour log-probs or an environment run's trajectories, and its
version), since each was sampled with weights older than the checkpoint's.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional

import torch

from fourfold.errors import ConfigError
from fourfold.rollout.engine import make_engine
from fourfold.rollout.noise import RowNoise
from fourfold.run.parallel import gather_items, several_ranks

Job = Callable[[object, RowNoise], dict]
"""What the sampler's thread runs for one batch, given the batch's engine (its snapshot in
``engine.weights.copy``) and per-row noise: the batch's result as plain data (lists, dicts,
tensors: what a checkpoint holds), scored later in the trainer's thread. A rollout source makes
it (``ahead_job``: :meth:`fourfold.trainers.rollouts.PromptSource.ahead_job`, the single turns;
:meth:`fourfold.trainers.env_rollouts.EnvSource.ahead_job`, the environments' episodes), drawing
the batch's prompts or rows in the trainer's thread when it is made."""


@dataclasses.dataclass
class Sampled:
    """One batch the sampler produced: the ``iteration`` it is for, the policy ``version`` that
    sampled it, the job's ``result`` and the sampler's seconds on it (``generate_s``);
    ``wait_s``: how long the trainer waited for it (0 for a batch restored from a checkpoint)."""

    iteration: int
    version: int
    result: dict
    generate_s: float
    wait_s: float = 0.0
    whole: bool = False
    """The result is the whole batch's (gathered over the ranks, or restored from a checkpoint);
    False: this rank's rows, as the sampler's thread left them."""


def done(got: Sampled) -> Future:
    """A future already holding ``got`` (a batch restored or gathered)."""
    future: Future = Future()
    future.set_result(got)
    return future


class RunAhead:
    """The sampler of a run with lag ``k`` >= 1 over ``total`` iterations: ``gen`` (the generation
    section: its engine, filters, lengths), the run's ``precision`` and ``max_prompt_len`` (the
    engines' settings, :func:`~fourfold.rollout.engine.make_engine`), ``seed`` (``run.seed``: the
    batches' noise); ``gather``: a rank's result -> the whole batch's (the source's ``gather_ahead``,
    a collective under torchrun, called in the trainer's thread only).

    Under torchrun every rank runs its own sampler thread on its rows of each batch, with its own
    snapshots: the sampler's thread makes no collective (no stop check's all-reduce: each rank's
    responses run as long as its own rows need, and are padded when gathered), the trainer's
    thread makes them all in the same order on every rank (the snapshots' FSDP gathers in
    :meth:`next`, the gathers of the results, an error of one rank's sampler raised on every rank)."""

    def __init__(self, k: int, gen, *, precision: str, max_prompt_len: int, seed: int, total: int,
                 gather: Callable[[dict], dict] = lambda result: result):
        self.k, self.seed, self.total, self.gather = k, seed, total, gather
        copy_gen = dataclasses.replace(gen, weights="copy")
        self.slots = [make_engine(copy_gen, precision=precision, max_prompt_len=max_prompt_len) for _ in range(k + 1)]
        self.threads = torch.get_num_threads()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fourfold-sampler")
        self.pending: dict[int, Future] = {}

    def version_for(self, it: int) -> int:
        """The policy version iteration ``it`` samples with: max(0, it - 1 - k)."""
        return max(0, it - 1 - self.k)

    def next(self, it: int, policy: torch.nn.Module, make_job: Callable[[], Job]) -> Sampled:
        """At the start of iteration ``it`` (``policy`` holding version it - 1): every batch of
        it .. it + k not yet in flight handed to the sampler with a snapshot of ``policy`` (its
        job from ``make_job``, which draws its prompts), then batch ``it``, waited for.

        In a run, only batch it + k is new here (version it - 1 = v(it + k)). A run extended past
        the iterations of the run that wrote its checkpoint (``--resume`` with more iterations)
        finds no batch in flight beyond the old end, which the sampler never runs past: those
        batches are sampled now with the checkpoint's weights, a lag below k for the first k
        iterations of the extension (logged as such), deterministically."""
        for b in range(it, min(it + self.k, self.total) + 1):
            if b in self.pending:
                continue
            job = make_job()
            engine = self.slots[b % (self.k + 1)]
            engine.sync(policy)  # the snapshot: in this thread, before the update changes the policy
            self.pending[b] = self.pool.submit(self._sample, engine, b, it - 1, job)
        t0 = time.perf_counter()
        got = self._wait(self.pending.pop(it))
        wait_s = time.perf_counter() - t0
        result = got.result if got.whole else self.gather(got.result)
        return dataclasses.replace(got, result=result, whole=True, wait_s=wait_s)

    @staticmethod
    def _wait(future: Future) -> Sampled:
        """A batch's result; under torchrun an error of any rank's sampler (an environment's, say)
        is raised on every rank here, before any of them enters the gather."""
        try:
            got, error = future.result(), None
        except Exception as e:  # re-raised below, on every rank
            got, error = None, e
        if several_ranks():
            errors = [e for e in gather_items([error]) if e is not None]
            error = error or (errors[0] if errors else None)
        if error is not None:
            raise error
        return got

    def _sample(self, engine, it: int, version: int, job: Job) -> Sampled:
        """The sampler thread's work: batch ``it``'s job on the snapshot in ``engine``, with its own noise."""
        torch.set_num_threads(self.threads)
        t0 = time.perf_counter()
        result = job(engine, RowNoise(self.seed, it))
        return Sampled(it, version, result, time.perf_counter() - t0)

    def state_dict(self) -> dict:
        """The batches in flight (waited for), for the checkpoint: per batch its iteration,
        version, the sampler's seconds and its job's result (tensors in the checkpoint's safetensors)."""
        batches = []
        for b in sorted(self.pending):
            got = self._wait(self.pending[b])
            if not got.whole:  # the whole batch's, which rank 0 writes (a collective, as every rank saves)
                got = dataclasses.replace(got, result=self.gather(got.result), whole=True)
                self.pending[b] = done(got)
            batches.append({"iteration": got.iteration, "version": got.version, "generate_s": got.generate_s,
                            "result": got.result})
        return {"max_staleness": self.k, "batches": batches}

    def load_state_dict(self, state: Optional[dict]) -> None:
        """The batches in flight of a checkpoint (:meth:`state_dict`); refused when the checkpoint
        was written with another lag (None: by a synchronous run)."""
        written = 0 if state is None else int(state["max_staleness"])
        if written != self.k:
            raise ConfigError(f"rollout.max_staleness: {self.k}, but the checkpoint resumed was written with "
                              f"{written}; resume with rollout.max_staleness={written}")
        for batch in state["batches"]:
            self.pending[int(batch["iteration"])] = done(Sampled(int(batch["iteration"]), int(batch["version"]),
                                                                 batch["result"], float(batch["generate_s"]), whole=True))

    def close(self) -> None:
        """Stop the sampler: the batches not started are dropped, the running one finishes."""
        self.pool.shutdown(wait=True, cancel_futures=True)
