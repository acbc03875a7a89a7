"""The static engine (``generation.engine: static``): the prompt's forward as the eager engine makes
it, its keys and values copied into a KV cache preallocated for ``cache_len`` positions, then one
fixed-shape step per token that ``torch.compile`` can capture (see :mod:`fourfold.rollout.engine`).

Multi-turn rollouts (:meth:`StaticEngine.turns`, :class:`StaticTurnCache`): a cache of
``env.max_tokens`` + 1 slots kept across turns in which each row writes at its own positions
(slot = position: the first observation at 0.., then every token the row is fed), so the cache's
length is fixed before the rollout by ``env.max_tokens`` whatever the turns do; the observations'
chunks (and the first observations) are prefilled into it by plain forwards, the tokens of a
turn by one fixed-shape step (``[B]`` tokens against ``[B, L]`` slots), compiled once per shape.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch import nn

from fourfold import dist
from fourfold.errors import ConfigError
from fourfold.models.decoding import RowSlots, attention_for_decoding, decode_mask, fill_static_cache, static_cache
from fourfold.rollout.sampling import (
    NO_TRUNCATION,
    Choice,
    Samples,
    Truncation,
    all_finished,
    cache_kwarg,
    choose,
    default_generator,
    output_cache,
    prefill,
    stack_samples,
)
from fourfold.rollout.weights import LiveWeights, fsdp_units

CACHE_BUCKET = 64
"""Without a ``cache_len``, the static cache holds prompt + response rounded up to a multiple of this."""
MAX_COMPILED_SHAPES = 4
"""At most this many (rows, cache length) shapes get a compiled step; others run the plain step."""


class StaticEngine:
    """``generation.engine: static``: a preallocated KV cache and a fixed-shape one-token step.

    ``weights``: where the forwards take the weights from (default: the policy module itself);
    ``compile``: ``torch.compile`` the step (``reduce-overhead`` on CUDA, inductor's default on
    CPU; the first call of a shape compiles it); ``check_every``: tokens between two "every row
    finished?" reads; ``cache_len``: positions of the cache (``data.max_prompt_len +
    generation.max_new_tokens``: one cache shape for the whole run), prompt + response rounded up
    to a multiple of :data:`CACHE_BUCKET` when None or too short; ``truncation``: the filters of
    every pick (:class:`~fourfold.rollout.sampling.Truncation`, the eager engine's
    :func:`~fourfold.rollout.sampling.truncate_logits`; off by default).
    """

    def __init__(self, weights=None, *, compile: bool = False, check_every: int = 8, cache_len: Optional[int] = None,
                 truncation: Truncation = NO_TRUNCATION):
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.weights = weights or LiveWeights()
        self.truncation = truncation
        self.compile, self.check_every, self.cache_len = compile, check_every, cache_len
        self._cache = None  # (key, StaticCache): the last rollout's, reused when the shape repeats
        self._compiled: dict = {}  # step name -> its compiled version
        self._compiled_shapes: set = set()

    def sync(self, policy: nn.Module) -> None:
        self.weights.sync(policy)

    @property
    def cache_positions(self) -> Optional[int]:
        """Positions of the static cache the last rollout used (None before the first)."""
        return None if self._cache is None else self._cache[0][2]

    @property
    def compiled_shapes(self) -> frozenset:
        """The (rows, cache positions) shapes the compiled step has been called with."""
        return frozenset(self._compiled_shapes)

    @torch.no_grad()
    def __call__(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, max_new_tokens: int,
                 temperature: float = 1.0, eos_token_id: Optional[int] = None, pad_token_id: int = 0,
                 noise: Optional[torch.Tensor] = None, sync_stop: bool = False, greedy: bool = False,
                 generator: Optional[torch.Generator] = None) -> Samples:
        """Sample as :func:`~fourfold.rollout.eager.sample` does (same arguments, same tokens).
        Without ``noise`` (and not ``greedy``) each token is drawn by ``torch.multinomial`` on
        ``generator`` (the device's default generator when None) outside the compiled step, as the
        eager engine draws it, and the generator is left where the eager engine would leave it:
        the draws of the steps past the last row's EOS are taken back."""
        if noise is not None or greedy:
            generator = None
        elif generator is None:
            generator = default_generator(prompt_ids.device)
        with self.weights.model(model) as m:
            return self._decode(m, prompt_ids, prompt_mask, max_new_tokens, noise, sync_stop,
                                dict(temperature=temperature, greedy=greedy, eos_token_id=eos_token_id,
                                     pad_token_id=pad_token_id, truncation=self.truncation), generator)

    @contextlib.contextmanager
    def turns(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *,
              max_tokens: int) -> Iterator["StaticTurnCache"]:
        """The cache of a multi-turn rollout (:func:`fourfold.rollout.turns.sample_turns`) over
        ``weights``: a :class:`StaticTurnCache` of ``max_tokens`` + 1 slots (reused while the shape
        repeats), the first observations prefilled; the model attends with
        :func:`~fourfold.models.decoding.decode_attention` inside."""
        with self.weights.model(model) as m:
            B, device = prompt_ids.shape[0], prompt_ids.device
            L = max_tokens + 1
            dtype = next((p.dtype for p in m.parameters() if p.is_floating_point()), torch.float32)
            key = (id(m), B, L, dtype, device, "rows")
            if self._cache is None or self._cache[0] != key:
                self._cache = None  # the old cache's memory goes before the new one is allocated
                self._cache = (key, RowSlots(m, L))
            step = self._compiled_or_plain(self._turn_logits, m, B, L, device)
            with attention_for_decoding(m):
                yield StaticTurnCache(m, self._cache[1], step, prompt_ids, prompt_mask,
                                      graphs=self.compile and device.type == "cuda",
                                      compiled=step != self._turn_logits)

    def _turn_logits(self, r: "StaticTurnCache", tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """A multi-turn rollout's one-token step: ``tokens [B]`` at ``positions [B, 1]`` (each row's
        keys and values written at slot = its position: :meth:`StaticTurnCache.step`), each query
        attending to its row's slots up to its position; the float32 logits ``[B, V]``."""
        valid = r.slot_index[None, :] <= positions  # (B, L)
        mask = decode_mask(valid, r.model, torch.float32)
        out = r.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions, use_cache=True,
                      logits_to_keep=1, **{cache_kwarg(r.model): r.rows.cache})
        return out.logits[:, -1, :].float()

    def _length(self, P: int, T: int) -> int:
        if self.cache_len is not None and self.cache_len >= P + T:
            return self.cache_len
        return -(-(P + T) // CACHE_BUCKET) * CACHE_BUCKET

    def _static_cache(self, model: nn.Module, B: int, L: int, prefill_cache):
        """The cache of this shape (the last one when it matches: a compiled step keeps reading
        the same tensors), filled with the prefill's keys and values."""
        keys = prefill_cache.layers[0].keys
        key = (id(model), B, L, keys.dtype, keys.device, len(prefill_cache.layers), keys.shape[1], keys.shape[3])
        if self._cache is None or self._cache[0] != key:
            self._cache = None  # the old cache's memory goes before the new one is allocated
            self._cache = (key, static_cache(model, L))
        fill_static_cache(self._cache[1], prefill_cache)
        return self._cache[1]

    def _step_fn(self, model: nn.Module, B: int, L: int, device: torch.device, pick_outside: bool):
        """The one-token step for this shape: compiled (up to :data:`MAX_COMPILED_SHAPES` shapes) or
        plain; the forward alone (:meth:`_logits`) when the pick runs outside it (``pick_outside``)."""
        return self._compiled_or_plain(self._logits if pick_outside else self._step, model, B, L, device)

    def _compiled_or_plain(self, plain, model: nn.Module, B: int, L: int, device: torch.device):
        """``plain`` compiled for this shape (up to :data:`MAX_COMPILED_SHAPES` shapes, every step
        kind together), or ``plain`` itself without ``compile`` or past that many shapes."""
        if not self.compile:
            return plain
        if fsdp_units(model):
            raise ConfigError("generation.compile: the step of an FSDP-sharded policy is not compiled; set "
                              "generation.weights=copy (a plain copy of the policy) or generation.compile=false")
        if (B, L) not in self._compiled_shapes and len(self._compiled_shapes) >= MAX_COMPILED_SHAPES:
            warnings.warn(f"generation.compile: more than {MAX_COMPILED_SHAPES} rollout shapes; ({B} rows, {L} "
                          "positions) runs the plain step", stacklevel=3)
            return plain
        self._compiled_shapes.add((B, L))
        if plain.__name__ not in self._compiled:
            mode = "reduce-overhead" if device.type == "cuda" else None
            self._compiled[plain.__name__] = torch.compile(plain, dynamic=False, mode=mode)
        return self._compiled[plain.__name__]

    def _logits(self, r: "StepState", tokens: torch.Tensor, positions: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """The forward of ``tokens [B]`` at ``positions [B, 1]`` writing cache slot ``slot`` (0-d),
        attending to the prompt's valid slots and the generated ones up to ``slot``: the next
        token's float32 logits ``[B, V]``. Every tensor keeps its shape."""
        valid = r.prompt_valid | (r.generated_slots <= slot)  # (B, L)
        mask = decode_mask(valid, r.model, r.cache.layers[0].keys.dtype)
        out = r.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions, use_cache=True,
                      logits_to_keep=1, **{cache_kwarg(r.model): r.cache})
        return out.logits[:, -1, :].float()

    def _step(self, r: "StepState", tokens: torch.Tensor, positions: torch.Tensor, slot: torch.Tensor,
              u: Optional[torch.Tensor], finished: torch.Tensor) -> Choice:
        """One token for every row: :meth:`_logits`, then the pick at the uniforms ``u [B]`` (or greedy)."""
        return r.choose(self._logits(r, tokens, positions, slot), finished, u)

    def _decode(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, T: int,
                noise: Optional[torch.Tensor], sync_stop: bool, pick: dict,
                generator: Optional[torch.Generator]) -> Samples:
        """The eager engine's prefill into the static cache, then the fixed-shape steps; with a
        ``generator`` the picks run outside the step (``torch.multinomial``) and the generator's
        state after each is kept, to be put back at the step the eager engine stops at."""
        (B, P), device = prompt_ids.shape, prompt_ids.device
        out, pos = prefill(model, prompt_ids, prompt_mask)
        L = self._length(P, T)
        cache = self._static_cache(model, B, L, output_cache(out, cache_kwarg(model)))
        slots = torch.arange(L, device=device)
        prompt_valid = torch.zeros(B, L, dtype=torch.bool, device=device)
        prompt_valid[:, :P] = prompt_mask.bool()
        generated_slots = torch.where(slots >= P, slots, torch.full_like(slots, L))  # prompt slots: never
        r = StepState(model, cache, prompt_valid, generated_slots, None if noise is None else noise.to(device), pick,
                      generator)
        steps = [r.choose(out.logits[:, -1, :].float(), torch.zeros(B, dtype=torch.bool, device=device), r.u(0))]
        states = [] if generator is None else [generator.get_state()]  # the generator after each pick
        del out
        step, graphs = self._step_fn(model, B, L, device, generator is not None), self.compile and device.type == "cuda"
        positions, slot = pos[:, -1:] + 1, torch.full((), P, device=device)
        with attention_for_decoding(model):
            for t in range(1, T):
                checked = pick["eos_token_id"] is not None and t % self.check_every == 0
                if checked and all_finished(steps[-1].finished, sync_stop):
                    break
                if graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                # the first step reads every guard (and compiles a new shape); the later ones run the
                # same step on the same objects and shapes
                with _guards_checked(step in (self._step, self._logits) or t == 1):
                    if generator is None:
                        c = step(r, steps[-1].tokens, positions, slot, r.u(t), steps[-1].finished)
                    else:
                        logits = step(r, steps[-1].tokens, positions, slot)
                if generator is not None:  # the pick on the generator, as the eager engine makes it
                    c = r.choose(logits, steps[-1].finished, None)
                    states.append(generator.get_state())
                elif graphs:
                    c = Choice(*(None if x is None else x.clone() for x in vars(c).values()))  # CUDA graphs reuse their outputs
                steps.append(c)
                positions, slot = positions + 1, slot + 1
        n = _finished_length(steps, sync_stop)
        if generator is not None:
            generator.set_state(states[n - 1])  # the draws past the eager engine's last step taken back
        return stack_samples(prompt_ids, prompt_mask, steps[:n], steps[n - 1].finished)


class StaticTurnCache:
    """The static engine's KV cache of a batch kept across turns (the contract of
    :class:`fourfold.rollout.eager.EagerTurnCache`: ``feed``, ``step``, ``logits``) over ``rows``
    (:class:`~fourfold.models.decoding.RowSlots`, L slots). Row ``b`` writes its n-th real token
    at slot n, so every slot below its ``next_pos[b]`` holds its own tokens and a query at position
    q attends to slots <= q (a causal mask by position: no per-slot bookkeeping). A row fed as
    padding writes nothing it will read: a step's padding row writes at its next slot (written
    again by its next real token before any query reads it), a chunk's padding at the last slot,
    L - 1, which no real token reaches (L = ``max_tokens`` + 1 and a row never feeds more than
    ``max_tokens``). ``step``: the one-token forward (:meth:`StaticEngine._turn_logits`, compiled
    or plain)."""

    def __init__(self, model: nn.Module, rows: RowSlots, step, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                 *, graphs: bool = False, compiled: bool = False):
        B, device = prompt_ids.shape[0], prompt_ids.device
        self.model, self.rows, self._step_fn, self.graphs, self.compiled = model, rows, step, graphs, compiled
        self.slot_index = torch.arange(rows.length, device=device)  # (L,)
        self.next_pos = torch.zeros(B, dtype=torch.long, device=device)  # each row's next slot = position
        self.logits: Optional[torch.Tensor] = None  # (B, V) after the first observations' prefill
        self._steps = 0
        self.feed(prompt_ids, prompt_mask)

    def feed(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        """A left-padded chunk ``ids [B, W]`` (``mask`` 0 = padding) prefilled by one plain forward."""
        mask = mask.bool()
        pos = self.next_pos[:, None] + (mask.long().cumsum(1) - 1).clamp(min=0)  # (B, W)
        slots = torch.where(mask, pos, torch.full_like(pos, self.rows.length - 1))
        valid = self.slot_index[None, None, :] <= slots[:, :, None]  # (B, W, L)
        self.rows.write_at(slots)
        out = self.model(input_ids=ids, attention_mask=decode_mask(valid, self.model, torch.float32), position_ids=pos,
                         use_cache=True, logits_to_keep=1, **{cache_kwarg(self.model): self.rows.cache})
        self.next_pos = self.next_pos + mask.sum(1)
        last_real = mask[:, -1]  # chunks are left-padded: a row with any real token ends with one
        logits = out.logits[:, -1, :].float()
        self.logits = logits if self.logits is None else torch.where(last_real[:, None], logits, self.logits)

    def step(self, tokens: torch.Tensor, alive: torch.Tensor) -> None:
        """One token per row at its next position (the rows not ``alive`` write there too, unread)."""
        positions = self.next_pos[:, None]  # (B, 1)
        self.rows.write_at(positions)
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()
        # the rollout's first step reads every guard (and compiles a new shape); the later ones run
        # the same step on the same objects and shapes
        with _guards_checked(not self.compiled or self._steps == 0):
            logits = self._step_fn(self, tokens, positions)
        if self.graphs:
            logits = logits.clone()  # CUDA graphs reuse their outputs
        self._steps += 1
        self.next_pos = self.next_pos + alive.long()
        self.logits = torch.where(alive[:, None], logits, self.logits)


@dataclass
class StepState:
    """What every step of one static-engine rollout reads: the model and its cache, the prompt's
    valid slots ``prompt_valid [B, L]``, each slot's index when a generated token goes there
    (``generated_slots [L]``, ``L`` for the prompt's slots), the uniforms ``noise [B, T]`` (on the
    model's device: one copy per rollout, not one per token), the pick's settings
    (``temperature``, ``greedy``, ``eos_token_id``, ``pad_token_id``, ``truncation``) and the generator of
    ``torch.multinomial`` when the tokens are drawn with it (None: noise or greedy)."""

    model: nn.Module
    cache: object
    prompt_valid: torch.Tensor
    generated_slots: torch.Tensor
    noise: Optional[torch.Tensor]
    pick: dict
    generator: Optional[torch.Generator] = None

    def u(self, t: int) -> Optional[torch.Tensor]:
        """The uniforms of token ``t`` (None: greedy)."""
        return None if self.noise is None else self.noise[:, t]

    def choose(self, logits: torch.Tensor, finished: torch.Tensor, u: Optional[torch.Tensor]) -> Choice:
        p = self.pick
        return choose(logits, finished, p["temperature"], p["greedy"], self.generator, u, p["eos_token_id"],
                      p["pad_token_id"], p["truncation"])


def _guards_checked(full: bool):
    """Dynamo's guards all read (``full``), or only those that tell compiled versions apart: the
    steps after a rollout's first call the same step on the same objects (reading every guard
    costs more than the step on CPU)."""
    return contextlib.nullcontext() if full else torch.compiler.set_stance(skip_guard_eval_unsafe=True)


def _finished_length(steps: list[Choice], sync_stop: bool) -> int:
    """The steps the eager engine would have made: up to the one after which every row had
    finished (on every rank with ``sync_stop``), all of them otherwise."""
    n = torch.stack([c.alive.any() for c in steps]).sum()  # steps at which some row still counted
    return int(dist.all_reduce_max(n) if sync_stop else n)
