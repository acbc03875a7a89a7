"""What a decode engine needs of a transformers causal LM: a static KV cache and its attention mask,
and an inference copy of the policy with the policy's current weights.

* :func:`static_cache`: transformers' ``StaticCache`` over the model's config, preallocated for
  ``max_len`` positions (prompt + response). Every layer must attend to the whole sequence: a
  sliding window shorter than ``max_len`` is refused (``sliding_window >= max_len`` attends to
  everything, as the eager forward does). :func:`fill_static_cache` copies a prefill's keys and
  values (a ``DynamicCache``) into its first slots.
* :class:`RowSlots`: the same cache with each row writing at slots of its own (a multi-turn
  rollout's, whose rows stand at different positions: slot = position).
* :func:`decode_mask`: the 4-D mask ``[B, 1, 1, max_len]`` of one decode step from the valid key
  slots ``[B, max_len]``, in the form the model's attention takes (bool for ``sdpa``, additive
  float for ``eager``). A 4-D mask is used by the model as it is (no mask built per step).
* :func:`decode_attention` (used inside :func:`attention_for_decoding`): sdpa's attention for one
  query position as two matmuls around a masked softmax, which ``torch.compile`` fuses.
* :func:`inference_copy` and :func:`load_current_weights`: a plain model of the policy's
  architecture (no peft layers, no FSDP, no autocast hooks, in a dtype of its own) and the
  policy's current weights copied into it in place (the copy's tensors keep their addresses, so a
  compiled or CUDA-graph-captured step stays valid). :func:`current_weights` streams those weights
  one tensor at a time: a LoRA policy's adapter merged into its base
  (:func:`~fourfold.models.lora.files.merged_tensors`), an FSDP-sharded one's shards gathered
  (``DTensor.full_tensor``: a collective every rank makes in the same order).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator, Optional

import torch
from torch import nn

from fourfold.dist import full_tensor
from fourfold.errors import ConfigError
from fourfold.models.roles import inner_model

MASK_FORMS = ("sdpa", "eager")
"""The attention implementations whose 4-D mask :func:`decode_mask` builds."""


def _text_config(model: nn.Module):
    config = model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def static_cache(model: nn.Module, max_len: int, what: str = "prompt + response"):
    """transformers' ``StaticCache`` for ``model`` (a causal LM, or a role over one) holding
    ``max_len`` positions; ConfigError when a layer would not attend to all of them (``what``:
    what the error says those positions are)."""
    from transformers import StaticCache

    config = _text_config(inner_model(model))
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) is not False and window < max_len:
        raise ConfigError(f"generation.engine: static: {type(config).__name__} attends through a sliding window of "
                          f"{window} tokens, shorter than {what} ({max_len}); use generation.engine=eager")
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if not kinds <= {"full_attention", "sliding_attention"}:
        raise ConfigError(f"generation.engine: static: {type(config).__name__} has layers of kind "
                          f"{sorted(kinds - {'full_attention', 'sliding_attention'})}; use generation.engine=eager")
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in MASK_FORMS:
        raise ConfigError(f"generation.engine: static: attention implementation {impl!r} is not supported "
                          f"({', '.join(MASK_FORMS)} are); use generation.engine=eager")
    return StaticCache(config=config, max_cache_len=max_len)


@torch.no_grad()
def fill_static_cache(static, prefill) -> None:
    """Write a prefill's cache (``DynamicCache`` of P positions, every layer) into the first P slots
    of ``static`` (reset first: its next write goes to slot P)."""
    static.reset()
    for layer, source in zip(static.layers, prefill.layers):
        layer.update(source.keys, source.values)


class RowSlots:
    """A static KV cache whose rows each write at slots of their own (the multi-turn rollout's:
    rows of one batch stand at different positions). transformers' ``StaticCache`` (its checks:
    :func:`static_cache`) with every layer's write replaced: the keys and values of a forward's
    query ``j`` of row ``b`` go to slot ``slots[b, j]`` (:meth:`write_at`, before the forward),
    whatever the other rows do. ``cache``: what the model's forward takes; ``length``: its slots."""

    def __init__(self, model: nn.Module, max_len: int):
        self.cache = static_cache(model, max_len, "env.max_tokens + 1")
        layer = _row_slot_layer()
        self.cache.layers = [layer(max_cache_len=max_len) for _ in self.cache.layers]
        self.length = max_len

    def write_at(self, slots: torch.Tensor) -> None:
        """The next forward's queries ``[B, W]`` write their keys and values at ``slots [B, W]``."""
        for layer in self.cache.layers:
            layer.slots = slots


@functools.lru_cache(maxsize=None)
def _row_slot_layer() -> type:
    """transformers' ``StaticLayer`` writing each row's keys and values at its own ``slots [B, W]``
    (built on first use: transformers is imported lazily here)."""
    from transformers.cache_utils import StaticLayer

    class RowSlotLayer(StaticLayer):
        slots: Optional[torch.Tensor] = None

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            # an index_put_ (which inductor does in place; a scatter_ it would make a copy of the
            # whole cache per layer and step): keys[b, :, slots[b, j]] = key_states[b, :, j]
            rows = torch.arange(self.slots.shape[0], device=self.slots.device)[:, None].expand_as(self.slots)
            self.keys[rows, :, self.slots] = key_states.transpose(1, 2)  # (B, W, H, D) at (B, W)
            self.values[rows, :, self.slots] = value_states.transpose(1, 2)
            return self.keys, self.values

    return RowSlotLayer


def decode_mask(valid: torch.Tensor, model: nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """The 4-D attention mask ``[B, 1, 1, L]`` of a one-token step from the valid key slots
    ``valid [B, L]`` (bool), or ``[B, 1, W, L]`` of a chunk of W queries from ``valid [B, W, L]``:
    bool for sdpa, 0 / the dtype's minimum added to the scores for eager."""
    mask = valid[:, None, None, :] if valid.dim() == 2 else valid[:, None]
    if getattr(_text_config(inner_model(model)), "_attn_implementation", None) in ("sdpa", DECODE_ATTENTION):
        return mask
    zero = torch.zeros((), dtype=dtype, device=valid.device)
    return torch.where(mask, zero, torch.full_like(zero, torch.finfo(dtype).min))


DECODE_ATTENTION = "fourfold_decode"
"""The name :func:`decode_attention` is registered under with transformers' ``AttentionInterface``."""


def decode_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """sdpa's attention for one query position, as two matmuls around a masked softmax: under
    ``torch.compile`` the mask and the softmax become one fused kernel, where SDPA's CPU kernel
    costs more than the arithmetic at decode sizes. ``query [B, Hq, 1, D]`` against the cache's
    ``key``/``value [B, Hkv, L, D]`` (each key head serving its ``Hq / Hkv`` consecutive query heads,
    as ``repeat_kv`` does), ``attention_mask [B, 1, 1, L]`` (bool, or added to the scores), ``scaling``
    (None: ``D ** -0.5``, as sdpa). Anything else (a longer query, dropout, a soft cap, a position
    bias) goes to transformers' sdpa."""
    if query.shape[2] != 1 or dropout or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    B, Hq, _, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    q = query.reshape(B, Hkv, Hq // Hkv, D)  # (B, Hkv, G, D)
    scores = torch.matmul(q, key.transpose(-1, -2)) * (scaling if scaling is not None else D ** -0.5)  # (B, Hkv, G, L)
    if attention_mask is not None:
        mask = attention_mask[..., :L]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(probs, value)  # (B, Hkv, G, D)
    return out.reshape(B, Hq, 1, D).transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def attention_for_decoding(model: nn.Module) -> Iterator[None]:
    """``model`` attends with :func:`decode_attention` inside the block (registered with
    transformers' ``AttentionInterface`` on first use; the config's implementation restored after)."""
    from transformers import AttentionInterface

    AttentionInterface.register(DECODE_ATTENTION, decode_attention)  # idempotent
    config = _text_config(inner_model(model))
    before = config._attn_implementation
    config._attn_implementation = DECODE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before


def _plain_class(lm: nn.Module) -> type:
    """The transformers class of ``lm`` (FSDP2 puts a class of its own in front of it)."""
    from transformers import PreTrainedModel

    return next(c for c in type(lm).__mro__ if issubclass(c, PreTrainedModel) and not c.__name__.startswith("FSDP"))


def _weights_dtype(lm: nn.Module) -> torch.dtype:
    return next((p.dtype for p in lm.parameters() if p.is_floating_point()), torch.float32)


def inference_copy(policy: nn.Module, dtype: Optional[torch.dtype] = None,
                   device: Optional[torch.device] = None) -> nn.Module:
    """A plain causal LM of ``policy``'s architecture and config in ``dtype`` (None: the policy's
    weights dtype) on ``device`` (None: the policy's), in eval mode with no gradients. Its weights
    are uninitialised until :func:`load_current_weights`; its buffers (e.g. RoPE's inverse
    frequencies, which the state dict does not hold) are the policy's."""
    import copy as copy_module

    lm = inner_model(policy)
    dtype = dtype or _weights_dtype(lm)
    device = torch.device(device) if device is not None else next(lm.parameters()).device
    with torch.device("meta"):
        plain = _plain_class(lm)._from_config(copy_module.deepcopy(lm.config), dtype=dtype)
    plain.to_empty(device=device)
    sources = dict(lm.named_buffers())
    for name, _ in list(plain.named_buffers()):
        owner_name, _, leaf = name.rpartition(".")
        if name not in sources:
            raise ConfigError(f"generation.weights: copy: the policy has no buffer {name!r} to copy")
        plain.get_submodule(owner_name)._buffers[leaf] = sources[name].detach().clone().to(device)
    if getattr(plain.config, "tie_word_embeddings", False):
        plain.tie_weights()
    plain.eval().requires_grad_(False)
    return plain


def current_weights(policy: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's current weights, (name as the plain architecture names it, tensor), one at a
    time: a LoRA role's base with its adapter merged, otherwise its causal LM's state dict, with
    FSDP shards gathered."""
    from fourfold.models.lora import is_lora_role, merged_tensors

    if is_lora_role(policy):
        for name, tensor in merged_tensors(policy.base.peft, policy.adapter):
            yield name, full_tensor(tensor)
        return
    for name, tensor in inner_model(policy).state_dict().items():
        yield name, full_tensor(tensor)


@torch.no_grad()
def load_current_weights(copy: nn.Module, policy: nn.Module) -> None:
    """Copy ``policy``'s current weights (:func:`current_weights`) into ``copy`` in place, cast to
    the copy's dtype; every tensor of the copy's state dict must be written once."""
    targets = copy.state_dict(keep_vars=True)
    missing = set(targets)
    for name, tensor in current_weights(policy):
        if name not in targets:
            raise ConfigError(f"generation.weights: copy: the policy's weight {name!r} has no place in the copy")
        targets[name].copy_(tensor)
        missing.discard(name)
    if missing:
        raise ConfigError(f"generation.weights: copy: the policy gave no weight for {sorted(missing)[:3]}")
