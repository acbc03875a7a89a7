"""The eager engine (``generation.engine: eager``, the default): batched sampling with Hugging
Face forwards and a KV cache that grows by one position per token, from left-padded prompts; the
loop stops as soon as every row has finished (on every rank, when asked). :class:`EagerTurnCache` is
its cache kept across the turns of a multi-turn rollout (:meth:`EagerEngine.turns`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from torch import nn

from fourfold.rollout.sampling import (
    NO_TRUNCATION,
    Samples,
    Truncation,
    all_finished,
    cache_kwarg,
    choose,
    output_cache,
    prefill,
    stack_samples,
)
from fourfold.rollout.weights import LiveWeights


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    eos_token_id: Optional[int] = None,
    pad_token_id: int = 0,
    generator: Optional[torch.Generator] = None,
    greedy: bool = False,
    noise: Optional[torch.Tensor] = None,
    sync_stop: bool = False,
    truncation: Truncation = NO_TRUNCATION,
) -> Samples:
    """Sample up to ``max_new_tokens`` per row with the KV cache; stop when every row has EOS.

    ``eos_token_id=None`` disables stopping (fixed-length responses, as in the benchmark).
    ``noise``: uniforms ``[B, max_new_tokens]`` (:meth:`fourfold.rollout.noise.RowNoise.uniforms`);
    step ``t`` picks each row's token by the inverse CDF at ``noise[:, t]``, so a row's tokens
    depend on its own uniforms only. Without it tokens come from ``torch.multinomial`` on
    ``generator`` (evaluation's and ``fourfold generate``'s path). ``sync_stop``: the loop stops
    only when every row of every rank has finished (one all-reduce per step): a sharded model's
    forward is a collective, so all ranks must make the same number of calls. ``truncation``: the
    filters of every pick (top-k, top-p, min-p after the temperature:
    :func:`~fourfold.rollout.sampling.truncate_logits`); off by default.
    """
    B = prompt_ids.shape[0]
    device = prompt_ids.device
    cache_kw = cache_kwarg(model)
    out, pos = prefill(model, prompt_ids, prompt_mask)
    attn = prompt_mask.long()
    next_pos = pos[:, -1:] + 1  # (B, 1)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    steps = []
    for step in range(max_new_tokens):
        u = None if noise is None else noise[:, step].to(device)
        c = choose(out.logits[:, -1, :].float(), finished, temperature, greedy, generator, u, eos_token_id, pad_token_id,
                   truncation)
        steps.append(c)
        finished = c.finished
        if eos_token_id is not None and all_finished(finished, sync_stop):
            break
        if step + 1 == max_new_tokens:
            break
        attn = torch.cat([attn, torch.ones(B, 1, dtype=attn.dtype, device=device)], dim=1)
        out = model(input_ids=c.tokens[:, None], attention_mask=attn, position_ids=next_pos,
                    use_cache=True, **{cache_kw: output_cache(out, cache_kw)})
        next_pos = next_pos + 1
    return stack_samples(prompt_ids, prompt_mask, steps, finished)


class EagerEngine:
    """``generation.engine: eager``: :func:`~fourfold.rollout.eager.sample` over ``weights``, every
    pick under ``truncation`` (the generation section's top-k, top-p, min-p; off by default)."""

    def __init__(self, weights=None, truncation: Truncation = NO_TRUNCATION):
        self.weights = weights or LiveWeights()
        self.truncation = truncation

    def sync(self, policy: nn.Module) -> None:
        self.weights.sync(policy)

    def __call__(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, **kw) -> Samples:
        with self.weights.model(model) as m:
            return sample(m, prompt_ids, prompt_mask, truncation=self.truncation, **kw)

    @contextlib.contextmanager
    def turns(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *,
              max_tokens: int) -> Iterator["EagerTurnCache"]:
        """The cache of a multi-turn rollout (:func:`fourfold.rollout.turns.sample_turns`) over
        ``weights``, the first observations prefilled: an :class:`EagerTurnCache` (``max_tokens``, the
        most tokens of a row, is not needed: the cache grows)."""
        with self.weights.model(model) as m:
            yield EagerTurnCache(m, prompt_ids, prompt_mask)


class EagerTurnCache:
    """The eager engine's KV cache of a batch kept across turns (a transformers ``DynamicCache``
    that grows by a column per fed position, every row alike). ``feed(ids [B, W], mask [B, W])``
    appends a left-padded chunk (mask 0 = padding, never attended to, no position used),
    ``step(tokens [B], alive [B])`` one token per row (the rows not ``alive`` fed as padding), and
    ``logits [B, V]`` holds each row's float32 next-token logits after its last real token.
    A :class:`fourfold.rollout.engine.TurnCache`, as the static engine's (``StaticEngine.turns``)."""

    def __init__(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
        self.model, self.kw = model, cache_kwarg(model)
        out, pos = prefill(model, prompt_ids, prompt_mask)
        self.cache, self.attn = output_cache(out, self.kw), prompt_mask.long()
        self.next_pos = pos[:, -1] + 1  # (B,)
        self.logits = out.logits[:, -1, :].float()

    def feed(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        mask = mask.long()
        self.attn = torch.cat([self.attn, mask], dim=1)
        pos = self.next_pos[:, None] + (mask.cumsum(1) - 1).clamp(min=0)  # (B, W)
        out = self.model(input_ids=ids, attention_mask=self.attn, position_ids=pos, use_cache=True,
                         **{self.kw: self.cache})
        self.cache = output_cache(out, self.kw)
        self.next_pos = self.next_pos + mask.sum(1)
        last_real = mask[:, -1].bool()  # chunks are left-padded: a row with any real token ends with one
        self.logits = torch.where(last_real[:, None], out.logits[:, -1, :].float(), self.logits)

    def step(self, tokens: torch.Tensor, alive: torch.Tensor) -> None:
        self.feed(tokens[:, None], alive[:, None])
