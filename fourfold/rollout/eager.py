"""The eager engine (``generation.engine: eager``, the default): batched sampling with Hugging
Face forwards and a KV cache that grows by one position per token, from left-padded prompts; the
loop stops as soon as every row has finished (on every rank, when asked).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from fourfold.rollout.sampling import Samples, all_finished, cache_kwarg, choose, output_cache, prefill, stack_samples
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
) -> Samples:
    """Sample up to ``max_new_tokens`` per row with the KV cache; stop when every row has EOS.

    ``eos_token_id=None`` disables stopping (fixed-length responses, as in the benchmark).
    ``noise``: uniforms ``[B, max_new_tokens]`` (:meth:`fourfold.rollout.noise.RowNoise.uniforms`);
    step ``t`` picks each row's token by the inverse CDF at ``noise[:, t]``, so a row's tokens
    depend on its own uniforms only. Without it tokens come from ``torch.multinomial`` on
    ``generator`` (evaluation's and ``fourfold generate``'s path). ``sync_stop``: the loop stops
    only when every row of every rank has finished (one all-reduce per step): a sharded model's
    forward is a collective, so all ranks must make the same number of calls.
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
        c = choose(out.logits[:, -1, :].float(), finished, temperature, greedy, generator, u, eos_token_id, pad_token_id)
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
    """``generation.engine: eager``: :func:`~fourfold.rollout.eager.sample` over ``weights``."""

    def __init__(self, weights=None):
        self.weights = weights or LiveWeights()

    def sync(self, policy: nn.Module) -> None:
        self.weights.sync(policy)

    def __call__(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, **kw) -> Samples:
        with self.weights.model(model) as m:
            return sample(m, prompt_ids, prompt_mask, **kw)
