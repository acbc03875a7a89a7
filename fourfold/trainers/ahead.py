"""The sampler that runs ahead of the trainer (``rollout.max_staleness`` k >= 1; docs/engines.md,
"Running ahead"): while the trainer updates on iteration i's batch, a background thread samples
the next ones, each with weights at most k updates old.

The lag is fixed, so a run is the same whatever the threads' timing: iteration i (1-based) is
sampled with the policy of version v(i) = max(0, i - 1 - k), the weights after that many updates
(version 0: the initial weights; the synchronous run, k = 0, samples iteration i with version
i - 1). At the start of iteration i the trainer holds version i - 1, which is what batch i + k
needs: :meth:`RunAhead.next` snapshots it (in the trainer's thread, before the update changes it)
and hands batch i + k to the sampler, then waits for batch i (sampled earlier, or now at the
run's first iteration, where batches 1 .. k + 1 all need version 0). The lag the update sees,
``rollout/version_lag``, is (i - 1) - v(i) = min(i - 1, k).

What makes the batches independent of timing:

* the weights: each batch in flight has its own snapshot, a plain inference copy of the policy
  (:class:`~fourfold.rollout.weights.CopiedWeights`, the ``generation.weights: copy`` seam: a LoRA
  adapter merged, bf16 under a bf16 precision), one of k + 1 slots refreshed in place (slot
  ``i mod (k + 1)``: the batch that used it last was consumed at iteration i - k - 1);
* the prompts: drawn from the prompt stream in the trainer's thread, in batch order;
* the tokens: picked with the batch's own per-row noise, seeded by ``run.seed`` and the batch's
  iteration (:class:`~fourfold.rollout.noise.RowNoise`), never from a shared generator.

Scoring (reference, critic, reward) stays in the trainer's thread when the batch is consumed:
the critic's values are then the critic's of the update, the reward's user code never runs in
the sampler's thread, and the KL coefficient is the one of the iteration that trains on it.

A thread, not a process: torch's kernels release the GIL, so one thread samples while the other
trains; a process would need the weights shipped to it after every update (a copy of the whole
policy through shared memory or a pipe) and its own copy of the tokenizer and engine, for nothing
on CPU, where the cost is the kernels. The sampler's thread runs as many torch threads as the
trainer (``run.threads``).

Resume is exact: the checkpoint holds the k batches in flight (their prompts, columns, token ids,
behaviour log-probs and versions: :meth:`RunAhead.state_dict`, tensors in the checkpoint's
safetensors, the rest JSON), since each was sampled with a version older than the checkpoint's
weights; the batch after them needs exactly the checkpoint's weights and is sampled anew.
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
from fourfold.rollout.sampling import Samples

Draw = Callable[[], tuple[list[str], torch.Tensor, torch.Tensor, dict]]
"""The prompt stream's next batch: (texts, ids [B, P], mask [B, P], columns), each prompt on its
rows (:meth:`fourfold.trainers.rollouts.PromptSource.next_batch`)."""


@dataclasses.dataclass
class Sampled:
    """One batch the sampler produced: the ``iteration`` it is for, the policy ``version`` that
    sampled it, its prompts' ``texts`` and ``columns``, the ``samples`` (behaviour log-probs
    included) and the sampler's seconds on it (``generate_s``); ``wait_s``: how long the trainer
    waited for it (0 for a batch restored from a checkpoint)."""

    iteration: int
    version: int
    texts: list[str]
    columns: dict
    samples: Samples
    generate_s: float
    wait_s: float = 0.0


def require_one_process(world_size: int) -> None:
    """A run-ahead sampler runs in one process: under torchrun the sampler's forwards would be
    collectives (FSDP's gathers, the stop check) racing the trainer's. One ConfigError line."""
    if world_size > 1:
        raise ConfigError(f"rollout.max_staleness: a sampler running ahead works in one process, this run has "
                          f"{world_size}; set rollout.max_staleness=0 under torchrun")


class RunAhead:
    """The sampler of a run with lag ``k`` >= 1 over ``total`` iterations: ``gen`` (the generation
    section: its engine, filters, lengths), the run's ``precision`` and ``max_prompt_len`` (the
    engines' settings, :func:`~fourfold.rollout.engine.make_engine`), ``seed`` (``run.seed``: the
    batches' noise), the tokenizer's ``eos_token_id`` (None: no stop) and ``pad_token_id``."""

    def __init__(self, k: int, gen, *, precision: str, max_prompt_len: int, seed: int, total: int,
                 eos_token_id: Optional[int], pad_token_id: int):
        self.k, self.gen, self.seed, self.total = k, gen, seed, total
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        copy_gen = dataclasses.replace(gen, weights="copy")
        self.slots = [make_engine(copy_gen, precision=precision, max_prompt_len=max_prompt_len) for _ in range(k + 1)]
        self.threads = torch.get_num_threads()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fourfold-sampler")
        self.pending: dict[int, Future] = {}

    def version_for(self, it: int) -> int:
        """The policy version iteration ``it`` samples with: max(0, it - 1 - k)."""
        return max(0, it - 1 - self.k)

    def next(self, it: int, policy: torch.nn.Module, draw: Draw) -> Sampled:
        """At the start of iteration ``it`` (``policy`` holding version it - 1): every batch of
        it .. it + k not yet in flight handed to the sampler with a snapshot of ``policy`` (its
        prompts from ``draw``), then batch ``it``, waited for.

        In a run, only batch it + k is new here (version it - 1 = v(it + k)). A run extended past
        the iterations of the run that wrote its checkpoint (``--resume`` with more iterations)
        finds no batch in flight beyond the old end, which the sampler never runs past: those
        batches are sampled now with the checkpoint's weights, a lag below k for the first k
        iterations of the extension (logged as such), deterministically."""
        for b in range(it, min(it + self.k, self.total) + 1):
            if b in self.pending:
                continue
            texts, ids, mask, columns = draw()
            engine = self.slots[b % (self.k + 1)]
            engine.sync(policy)  # the snapshot: in this thread, before the update changes the policy
            self.pending[b] = self.pool.submit(self._sample, engine, b, it - 1, texts, ids, mask, columns)
        t0 = time.perf_counter()
        got = self.pending.pop(it).result()
        return dataclasses.replace(got, wait_s=time.perf_counter() - t0)

    def _sample(self, engine, it: int, version: int, texts: list[str], ids: torch.Tensor, mask: torch.Tensor,
                columns: dict) -> Sampled:
        """The sampler thread's job: batch ``it`` from the snapshot in ``engine``, with its own noise."""
        torch.set_num_threads(self.threads)
        gen = self.gen
        uniforms = RowNoise(self.seed, it).uniforms(range(ids.shape[0]), gen.max_new_tokens)
        t0 = time.perf_counter()
        samples = engine(engine.weights.copy, ids, mask, max_new_tokens=gen.max_new_tokens,
                         temperature=gen.temperature, eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id,
                         noise=uniforms, sync_stop=False)
        return Sampled(it, version, texts, columns, samples, time.perf_counter() - t0)

    def state_dict(self) -> dict:
        """The batches in flight (waited for), for the checkpoint: per batch its iteration,
        version, texts, columns, the sampler's seconds and every tensor of its samples."""
        batches = []
        for b in sorted(self.pending):
            got = self.pending[b].result()
            batches.append({"iteration": got.iteration, "version": got.version, "texts": list(got.texts),
                            "columns": dict(got.columns), "generate_s": got.generate_s,
                            "samples": {f.name: getattr(got.samples, f.name) for f in dataclasses.fields(Samples)}})
        return {"max_staleness": self.k, "batches": batches}

    def load_state_dict(self, state: Optional[dict]) -> None:
        """The batches in flight of a checkpoint (:meth:`state_dict`); refused when the checkpoint
        was written with another lag (None: by a synchronous run)."""
        written = 0 if state is None else int(state["max_staleness"])
        if written != self.k:
            raise ConfigError(f"rollout.max_staleness: {self.k}, but the checkpoint resumed was written with "
                              f"{written}; resume with rollout.max_staleness={written}")
        for batch in state["batches"]:
            done: Future = Future()
            done.set_result(Sampled(int(batch["iteration"]), int(batch["version"]), list(batch["texts"]),
                                    dict(batch["columns"]), Samples(**batch["samples"]), float(batch["generate_s"])))
            self.pending[int(batch["iteration"])] = done

    def close(self) -> None:
        """Stop the sampler: the batches not started are dropped, the running one finishes."""
        self.pool.shutdown(wait=True, cancel_futures=True)
