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
   pad_token_id, noise, sync_stop, greedy, generator) -> Samples``
   (:class:`fourfold.rollout.engine.Engine`): given this rank's rows of left-padded prompts
   ``[B, P]`` (mask 1 on tokens), the policy module (an engine with its own weights may ignore
   it), per-row uniforms ``noise [B, max_new_tokens]`` (token t of row r is the inverse CDF of the
   temperature-scaled distribution at ``noise[r, t]``, so a row's tokens do not depend on the
   engine, the batch or the rank; the training rollouts' way), or else ``greedy`` (the argmax) or
   ``torch.multinomial`` on ``generator`` (the device's default generator when None; the held-out
   evaluation's, the demo's pairs' and ``fourfold generate``'s way: the generator ends where the
   eager engine leaves it, so the next batch's tokens are the same too), it returns
   :class:`~fourfold.rollout.sampling.Samples`: the response tokens ``[B, T]`` (pad after a row's EOS),
   the log-probs of the sampled tokens under ``temperature`` (pi_old, 0 where masked), the
   entropies, the finished flags ``[B]`` and the masks, with ``T`` the step at which every row had
   finished (every rank's rows with ``sync_stop``), else ``max_new_tokens``.

**The engines** (``generation.engine``):

* :class:`EagerEngine` (``eager``, the default): :func:`~fourfold.rollout.eager.sample`, Hugging
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
(``generation.weights``). :func:`make_engine` builds the engine of a generation config; every
sampler goes through it: the PPO and REINFORCE rollouts, the held-out evaluation
(:func:`fourfold.apps.evaluation.sample_texts`, used by the demo's eval stage and the experiments'
final evaluation), the demo's preference pairs and ``fourfold generate``, each reading its own
``generation`` section (docs/engines.md).
"""

from __future__ import annotations

from typing import Optional, Protocol

import torch
from torch import nn

from fourfold.rollout.eager import EagerEngine
from fourfold.rollout.sampling import Samples
from fourfold.rollout.static import StaticEngine
from fourfold.rollout.weights import make_weights

ENGINES = ("eager", "static")


class Engine(Protocol):
    """A rollout engine: ``sync(policy)`` before each rollout, then calls that sample a batch of
    prompts (the contract is the module docstring's)."""

    def sync(self, policy: nn.Module) -> None: ...

    def __call__(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *,
                 max_new_tokens: int, temperature: float, eos_token_id: Optional[int], pad_token_id: int,
                 noise: Optional[torch.Tensor], sync_stop: bool, greedy: bool = False,
                 generator: Optional[torch.Generator] = None) -> Samples: ...


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
