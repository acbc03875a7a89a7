"""Rollout engines: what turns a batch of prompts into sampled responses, behind one interface.

An engine has two calls: ``engine.sync(policy)`` once per iteration (it takes the policy's current
weights in the form it samples from fastest: :mod:`fourfold.rollout.weights`), and
``engine(model, prompt_ids, prompt_mask, *, max_new_tokens, temperature, eos_token_id,
pad_token_id, noise, sync_stop, greedy, generator) -> Samples`` (:class:`Engine`: per-row
``noise`` for the training rollouts, else greedy or ``torch.multinomial`` on ``generator``).
:class:`EagerEngine` (``eager``, the default) and :class:`StaticEngine` (``static``, a preallocated
KV cache and one fixed-shape, compilable step per token) give the same tokens. Each engine holds
its ``truncation`` (the generation section's ``top_k``, ``top_p``, ``min_p``:
:class:`~fourfold.rollout.sampling.Truncation`), which every pick applies after the temperature
through the one filter :func:`~fourfold.rollout.sampling.truncate_logits`. A multi-turn
rollout (:func:`fourfold.rollout.turns.sample_turns`) runs its turn loop over ``engine.turns(model,
prompt_ids, prompt_mask, *, max_tokens)``: a context whose turn cache (:class:`TurnCache`) keeps the
KV cache across turns; the picks, stop checks and environments are the loop's, the same code for
every engine. :func:`make_engine`
builds the engine of a generation config; every sampler goes through it: the PPO and REINFORCE
rollouts, the held-out evaluation, the demo's preference pairs and ``fourfold generate``. The
interface in full (what a server engine would implement), the engines, their keys and
guarantees: docs/engines.md.
"""

from __future__ import annotations

from typing import ContextManager, Optional, Protocol

import torch
from torch import nn

from fourfold.rollout.eager import EagerEngine
from fourfold.rollout.sampling import Samples, Truncation
from fourfold.rollout.static import StaticEngine
from fourfold.rollout.weights import make_weights

ENGINES = ("eager", "static")


class TurnCache(Protocol):
    """A batch's KV cache kept across the turns of a multi-turn rollout: ``logits [B, V]`` (each
    row's float32 next-token logits after its last fed token), ``feed(ids [B, W], mask [B, W])``
    (a left-padded chunk: the first observations, then each turn's last token and observation;
    mask 0 = padding, never attended to), ``step(tokens [B], alive [B])`` (one token per row, the
    rows not ``alive`` as padding). :class:`fourfold.rollout.eager.EagerTurnCache`,
    :class:`fourfold.rollout.static.StaticTurnCache`."""

    logits: torch.Tensor

    def feed(self, ids: torch.Tensor, mask: torch.Tensor) -> None: ...

    def step(self, tokens: torch.Tensor, alive: torch.Tensor) -> None: ...


class Engine(Protocol):
    """A rollout engine: ``sync(policy)`` before each rollout, then calls that sample a batch of
    prompts (the contract is the module docstring's); ``truncation``: the filters its picks apply."""

    truncation: Truncation

    def sync(self, policy: nn.Module) -> None: ...

    def __call__(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *,
                 max_new_tokens: int, temperature: float, eos_token_id: Optional[int], pad_token_id: int,
                 noise: Optional[torch.Tensor], sync_stop: bool, greedy: bool = False,
                 generator: Optional[torch.Generator] = None) -> Samples: ...

    def turns(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *,
              max_tokens: int) -> ContextManager[TurnCache]: ...


def truncation_of(gen) -> Truncation:
    """The sampling filters of a generation config (``top_k``, ``top_p``, ``min_p``, read by
    attribute; a section without them samples unfiltered)."""
    return Truncation(top_k=getattr(gen, "top_k", 0), top_p=getattr(gen, "top_p", 1.0), min_p=getattr(gen, "min_p", 0.0))


def make_engine(gen, *, precision: str = "fp32", max_prompt_len: Optional[int] = None):
    """The engine of a generation config (``generation.engine``, ``.weights``, ``.compile``,
    ``.stop_check_every``, and the filters ``.top_k``, ``.top_p``, ``.min_p``: :func:`truncation_of`;
    read by attribute) for a run in ``precision`` (``model.precision``); ``max_prompt_len``
    (``data.max_prompt_len``) fixes the static cache's length. Every sampler builds its engine
    here, so the filters reach them all: PPO, REINFORCE, ``fourfold generate`` and ``bon``, the
    held-out evaluation, the demo's pairs."""
    weights, truncation = make_weights(gen.weights, precision), truncation_of(gen)
    if gen.engine == "eager":
        return EagerEngine(weights, truncation)
    if gen.engine == "static":
        cache_len = None if max_prompt_len is None else max_prompt_len + gen.max_new_tokens
        return StaticEngine(weights, compile=gen.compile, check_every=gen.stop_check_every, cache_len=cache_len,
                            truncation=truncation)
    raise ValueError(f"generation.engine: {gen.engine!r}: expected one of {', '.join(ENGINES)}")
