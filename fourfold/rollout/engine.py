"""Rollout engines: what turns a batch of prompts into sampled responses, behind one interface.

**The interface** (what a server engine, e.g. vLLM or SGLang holding its own copy of the weights,
would implement to plug in; none ships here). An engine has two calls:

1. ``engine.sync(policy)``: once per iteration, after the previous update and before the rollout,
   every rank. The engine takes the policy's current weights in whatever form it samples from
   fastest (:mod:`fourfold.rollout.weights`): nothing (it reads the training module), a plain
   copy refreshed in place, or, for a server, a push of
   :func:`~fourfold.models.decoding.current_weights` (name, tensor) pairs: the policy's weights as
   the plain transformers architecture names them, a LoRA adapter merged, FSDP shards gathered.
2. ``engine(model, prompt_ids, prompt_mask, *, max_new_tokens, temperature, eos_token_id,
   pad_token_id, noise, sync_stop) -> Samples`` (:class:`fourfold.rollout.lm.RolloutEngine`): given
   this rank's rows of left-padded prompts ``[B, P]`` (mask 1 on tokens), the policy module (an
   engine with its own weights may ignore it), per-row uniforms ``noise [B, max_new_tokens]``
   (token t of row r is the inverse CDF of the temperature-scaled distribution at ``noise[r, t]``,
   so a row's tokens do not depend on the engine, the batch or the rank), it returns
   :class:`~fourfold.rollout.lm.Samples`: the response tokens ``[B, T]`` (pad after a row's EOS),
   the log-probs of the sampled tokens under ``temperature`` (pi_old, 0 where masked), the
   entropies, the finished flags ``[B]`` and the masks, with ``T`` the step at which every row had
   finished (every rank's rows with ``sync_stop``), else ``max_new_tokens``.

**The engines** (``generation.engine``):

* :class:`EagerEngine` (``eager``, the default): :func:`~fourfold.rollout.lm.sample`, Hugging
  Face forwards with a cache that grows by one position per token and a host-device sync per
  token (the "every row finished?" check).
* :class:`StaticEngine` (``static``): the prompt's forward as the eager engine makes it, its keys
  and values copied into a KV cache preallocated for ``cache_len`` positions
  (:func:`~fourfold.models.decoding.static_cache`, transformers' ``StaticCache``), then one
  fixed-shape step per token (the token, its position, the cache slot it writes, the valid key
  slots as a 4-D mask: no tensor changes shape from token to token; the attention over the slots
  is :func:`~fourfold.models.decoding.decode_attention`), which ``torch.compile`` can capture
  (``generation.compile``: CUDA graphs with ``mode="reduce-overhead"`` on CUDA, inductor on CPU;
  after a rollout's first step only the guards that tell compiled versions apart are read).
  Finished rows keep stepping and emit pad, masked; "every row finished?" is read every
  ``generation.stop_check_every`` tokens and the steps past the last row's EOS are cut off, so the
  result has the eager engine's shape. Same tokens as the eager engine, log-probs equal up to
  float rounding (the attention sums over the fixed slots in another order).

Either engine takes its weights from a :mod:`~fourfold.rollout.weights` object
(``generation.weights``). :func:`make_engine` builds the engine of a generation config.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Optional, Protocol

import torch
from torch import nn

from fourfold import dist
from fourfold.errors import ConfigError
from fourfold.models.decoding import attention_for_decoding, decode_mask, fill_static_cache, static_cache
from fourfold.rollout.lm import (
    Choice,
    Samples,
    all_finished,
    cache_kwarg,
    choose,
    output_cache,
    prefill,
    sample,
    stack_samples,
)
from fourfold.rollout.weights import LiveWeights, fsdp_units, make_weights

ENGINES = ("eager", "static")
CACHE_BUCKET = 64
"""Without a ``cache_len``, the static cache holds prompt + response rounded up to a multiple of this."""
MAX_COMPILED_SHAPES = 4
"""At most this many (rows, cache length) shapes get a compiled step; others run the plain step."""


class Engine(Protocol):
    """A rollout engine with its weight sync: ``sync(policy)`` before each rollout, then calls as
    :class:`~fourfold.rollout.lm.RolloutEngine` (see the module docstring)."""

    def sync(self, policy: nn.Module) -> None: ...

    def __call__(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *,
                 max_new_tokens: int, temperature: float, eos_token_id: Optional[int], pad_token_id: int,
                 noise: Optional[torch.Tensor], sync_stop: bool) -> Samples: ...


class EagerEngine:
    """``generation.engine: eager``: :func:`~fourfold.rollout.lm.sample` over ``weights``."""

    def __init__(self, weights=None):
        self.weights = weights or LiveWeights()

    def sync(self, policy: nn.Module) -> None:
        self.weights.sync(policy)

    def __call__(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, **kw) -> Samples:
        with self.weights.model(model) as m:
            return sample(m, prompt_ids, prompt_mask, **kw)


class StaticEngine:
    """``generation.engine: static``: a preallocated KV cache and a fixed-shape one-token step.

    ``weights``: where the forwards take the weights from (default: the policy module itself);
    ``compile``: ``torch.compile`` the step (``reduce-overhead`` on CUDA, inductor's default on
    CPU; the first call of a shape compiles it); ``check_every``: tokens between two "every row
    finished?" reads; ``cache_len``: positions of the cache (``data.max_prompt_len +
    generation.max_new_tokens``: one cache shape for the whole run), prompt + response rounded up
    to a multiple of :data:`CACHE_BUCKET` when None or too short.
    """

    def __init__(self, weights=None, *, compile: bool = False, check_every: int = 8, cache_len: Optional[int] = None):
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.weights = weights or LiveWeights()
        self.compile, self.check_every, self.cache_len = compile, check_every, cache_len
        self._cache = None  # (key, StaticCache): the last rollout's, reused when the shape repeats
        self._compiled = None
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
        """Sample as :func:`~fourfold.rollout.lm.sample` does (same arguments). Without ``noise``
        (and not ``greedy``) the uniforms are drawn from ``generator`` up front (float64, ``[B,
        max_new_tokens]``), not through ``torch.multinomial``."""
        B, T = prompt_ids.shape[0], max_new_tokens
        if noise is None and not greedy:
            noise = torch.rand(B, T, generator=generator, dtype=torch.float64)
        with self.weights.model(model) as m:
            return self._decode(m, prompt_ids, prompt_mask, T, noise, sync_stop,
                                dict(temperature=temperature, greedy=greedy, eos_token_id=eos_token_id,
                                     pad_token_id=pad_token_id))

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

    def _step_fn(self, model: nn.Module, B: int, L: int, device: torch.device):
        """The one-token step for this shape: compiled (up to :data:`MAX_COMPILED_SHAPES` shapes) or plain."""
        if not self.compile:
            return self._step
        if fsdp_units(model):
            raise ConfigError("generation.compile: the step of an FSDP-sharded policy is not compiled; set "
                              "generation.weights=copy (a plain copy of the policy) or generation.compile=false")
        if (B, L) not in self._compiled_shapes and len(self._compiled_shapes) >= MAX_COMPILED_SHAPES:
            warnings.warn(f"generation.compile: more than {MAX_COMPILED_SHAPES} rollout shapes; ({B} rows, {L} "
                          "positions) runs the plain step", stacklevel=3)
            return self._step
        self._compiled_shapes.add((B, L))
        if self._compiled is None:
            mode = "reduce-overhead" if device.type == "cuda" else None
            self._compiled = torch.compile(self._step, dynamic=False, mode=mode)
        return self._compiled

    def _step(self, r: "Rollout", tokens: torch.Tensor, positions: torch.Tensor, slot: torch.Tensor,
              u: Optional[torch.Tensor], finished: torch.Tensor) -> Choice:
        """One token for every row: the forward of ``tokens [B]`` at ``positions [B, 1]`` writing
        cache slot ``slot`` (0-d), attending to the prompt's valid slots and the generated ones up
        to ``slot``; then the pick at the uniforms ``u [B]``. Every tensor keeps its shape."""
        valid = r.prompt_valid | (r.generated_slots <= slot)  # (B, L)
        mask = decode_mask(valid, r.model, r.cache.layers[0].keys.dtype)
        out = r.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions, use_cache=True,
                      logits_to_keep=1, **{cache_kwarg(r.model): r.cache})
        return r.choose(out.logits[:, -1, :].float(), finished, u)

    def _decode(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, T: int,
                noise: Optional[torch.Tensor], sync_stop: bool, pick: dict) -> Samples:
        """The eager engine's prefill into the static cache, then the fixed-shape steps."""
        (B, P), device = prompt_ids.shape, prompt_ids.device
        out, pos = prefill(model, prompt_ids, prompt_mask)
        L = self._length(P, T)
        cache = self._static_cache(model, B, L, output_cache(out, cache_kwarg(model)))
        slots = torch.arange(L, device=device)
        prompt_valid = torch.zeros(B, L, dtype=torch.bool, device=device)
        prompt_valid[:, :P] = prompt_mask.bool()
        generated_slots = torch.where(slots >= P, slots, torch.full_like(slots, L))  # prompt slots: never
        r = Rollout(model, cache, prompt_valid, generated_slots, None if noise is None else noise.to(device), pick)
        steps = [r.choose(out.logits[:, -1, :].float(), torch.zeros(B, dtype=torch.bool, device=device), r.u(0))]
        del out
        step, graphs = self._step_fn(model, B, L, device), self.compile and device.type == "cuda"
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
                with _guards_checked(step is self._step or t == 1):
                    c = step(r, steps[-1].tokens, positions, slot, r.u(t), steps[-1].finished)
                steps.append(Choice(*(x.clone() for x in vars(c).values())) if graphs else c)  # graphs reuse outputs
                positions, slot = positions + 1, slot + 1
        n = _finished_length(steps, sync_stop)
        return stack_samples(prompt_ids, prompt_mask, steps[:n], steps[n - 1].finished)


@dataclass
class Rollout:
    """What every step of one static-engine rollout reads: the model and its cache, the prompt's
    valid slots ``prompt_valid [B, L]``, each slot's index when a generated token goes there
    (``generated_slots [L]``, ``L`` for the prompt's slots), the uniforms ``noise [B, T]`` (on the
    model's device: one copy per rollout, not one per token) and the pick's settings
    (``temperature``, ``greedy``, ``eos_token_id``, ``pad_token_id``)."""

    model: nn.Module
    cache: object
    prompt_valid: torch.Tensor
    generated_slots: torch.Tensor
    noise: Optional[torch.Tensor]
    pick: dict

    def u(self, t: int) -> Optional[torch.Tensor]:
        """The uniforms of token ``t`` (None: greedy)."""
        return None if self.noise is None else self.noise[:, t]

    def choose(self, logits: torch.Tensor, finished: torch.Tensor, u: Optional[torch.Tensor]) -> Choice:
        p = self.pick
        return choose(logits, finished, p["temperature"], p["greedy"], None, u, p["eos_token_id"], p["pad_token_id"])


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


def make_engine(gen, *, precision: str = "fp32", max_prompt_len: Optional[int] = None):
    """The engine of a generation config (``generation.engine``, ``.weights``, ``.compile``,
    ``.stop_check_every``; read by attribute) for a run in ``precision`` (``model.precision``);
    ``max_prompt_len`` (``data.max_prompt_len``) fixes the static cache's length."""
    weights = make_weights(gen.weights, precision)
    if gen.engine == "eager":
        return EagerEngine(weights)
    if gen.engine == "static":
        cache_len = None if max_prompt_len is None else max_prompt_len + gen.max_new_tokens
        return StaticEngine(weights, compile=gen.compile, check_every=gen.stop_check_every, cache_len=cache_len)
    raise ValueError(f"generation.engine: {gen.engine!r}: expected one of {', '.join(ENGINES)}")
