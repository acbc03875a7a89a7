"""Memory levers for the roles: gradient checkpointing, mixed precision, frozen-role dtype and
chunked log-probs (the config keys ``model.gradient_checkpointing``, ``model.precision``,
``model.frozen_dtype`` and ``model.logits_chunk``).

Each lever changes what is kept in memory, not what is computed: the loss and the gradients are
those of the run without it, up to float rounding (bf16 rounding for the bf16 levers).

* **Gradient checkpointing** (:func:`enable_gradient_checkpointing`): a trained model keeps only
  each decoder layer's input and recomputes the layer in backward (transformers' activation
  checkpointing, non-reentrant ``torch.utils.checkpoint``). With a frozen base (LoRA) the input
  embeddings' output is made to require grad, as reentrant checkpointing needs. A LoRA role over a
  shared base (:mod:`fourfold.models.lora`) puts the base in its own train/eval mode each time it
  runs: checkpointing works only in training mode, and the base is no parameter of the role.
* **Precision** (:func:`role_dtypes`, :func:`autocast_forwards`, :func:`autocast_region`):
  ``fp32`` computes in the weights' dtype (``model.dtype``; the default and the behaviour before
  these levers); ``bf16-mixed`` keeps the trained roles' float32 master weights (gradients and AdamW
  state float32 too) and runs every forward under bf16 autocast; ``bf16`` puts the trained roles'
  weights (and so their gradients and AdamW moments) in bf16. Log-probs, entropies, values and the
  losses are float32 in every mode (:mod:`fourfold.core.logprobs` upcasts block by block).
  Autocast caches the bf16 copy of each trained weight for as long as its region lasts, so a
  region must never span an optimizer step: each forward of a role opens its own region (which
  also carries autocast into the threads of ``run.concurrent_roles``), and only generation and
  scoring, where the weights do not change, run inside one long region that keeps the cache.
* **Frozen dtype** (``model.frozen_dtype``): the reference and the reward model (with LoRA: the
  shared base) are loaded in bf16, fp16 or float32 while the trained roles keep their own dtype;
  unset, they are bf16 under ``bf16-mixed`` and in the trained roles' dtype otherwise.
* **Logits chunk** (:func:`set_logits_chunk`): :func:`~fourfold.models.roles.response_logprobs`
  applies the LM head to that many tokens at a time (with checkpointing in backward), so the full
  ``[tokens x vocab]`` logits never exist at once. Values need no chunking: the value head has one
  output per token.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterable, Optional

import torch
from torch import nn

from fourfold.models.loading import resolve_dtype
from fourfold.models.roles import LOGITS_CHUNK, ScalarModel, inner_model

PRECISIONS = ("fp32", "bf16-mixed", "bf16")
_AUTOCAST_ATTR = "_fourfold_autocast"
_MODE_HOOK_ATTR = "_fourfold_base_mode_hook"
_regions = threading.local()  # per thread: the stack of autocast regions the forward hooks opened


def role_dtypes(dtype: str, precision: str = "fp32", frozen_dtype: Optional[str] = None
                ) -> tuple[torch.dtype, torch.dtype]:
    """(weights dtype of the trained roles, weights dtype of the frozen roles).

    ``fp32``: ``dtype`` (``model.dtype``) for the trained roles; ``bf16-mixed``: float32 (the config
    requires ``model.dtype: float32``); ``bf16``: bfloat16. The frozen roles use ``frozen_dtype``;
    when it is None, bfloat16 under ``bf16-mixed`` (they compute in bf16 anyway, and need no master
    weights) and the trained roles' dtype otherwise (so no ``fp32`` run changes).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    trained = torch.bfloat16 if precision == "bf16" else resolve_dtype(dtype)
    if frozen_dtype is None:
        return trained, torch.bfloat16 if precision == "bf16-mixed" else trained
    return trained, resolve_dtype(frozen_dtype)


def _shared_base(model: nn.Module):
    """The :class:`~fourfold.models.lora.SharedBase` a LoRA role runs on, or None."""
    base = getattr(model, "base", None)
    return base if hasattr(base, "adapters_disabled") and hasattr(base, "lm") else None


def _follow_role_mode(role: nn.Module, args) -> None:
    role.base.lm.train(role.training)


def enable_gradient_checkpointing(model: nn.Module) -> nn.Module:
    """Turn on activation checkpointing (non-reentrant) for a trained role and return it.

    ``model``: a transformers model, a :class:`~fourfold.models.roles.ScalarModel` (also over a peft
    model), a peft ``PeftModel``, or a LoRA role over a shared base (``AdapterLM``,
    ``AdapterScalarModel``). Only forwards in training mode with gradients on are checkpointed, so
    generation and the no-grad scoring passes keep their KV cache and speed.
    """
    base = _shared_base(model)
    hf = base.lm if base is not None else inner_model(model.hf if isinstance(model, ScalarModel) else model)
    kwargs = {"use_reentrant": False}
    if hasattr(hf, "activation_checkpointing_enable"):  # transformers >= 5 (the old name is deprecated there)
        hf.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    embeddings = hf.get_input_embeddings()
    if not embeddings.weight.requires_grad and not hasattr(hf, "_require_grads_hook"):
        hf.enable_input_require_grads()  # frozen base: the checkpointed layers' input must require grad
    if base is not None and not hasattr(model, _MODE_HOOK_ATTR):
        setattr(model, _MODE_HOOK_ATTR, model.register_forward_pre_hook(_follow_role_mode))
    return model


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


def _enter_region(module: nn.Module, args) -> None:
    device_type, dtype = getattr(module, _AUTOCAST_ATTR)
    stack = _regions.__dict__.setdefault("stack", [])
    if _autocast_enabled(device_type):  # inside a region already: keep its settings (and its cache)
        stack.append(None)
        return
    region = torch.autocast(device_type=device_type, dtype=dtype)
    region.__enter__()
    stack.append(region)


def _exit_region(module: nn.Module, args, output) -> None:
    region = _regions.stack.pop()
    if region is not None:
        region.__exit__(None, None, None)  # the outermost region: its cast cache is dropped here


def autocast_forwards(modules: Iterable[Optional[nn.Module]], device_type: str,
                      dtype: torch.dtype = torch.bfloat16) -> None:
    """Run every forward of ``modules`` (None entries skipped) under ``dtype`` autocast.

    A forward pre-hook opens an autocast region unless one is open already, and a forward hook
    (called even when the forward raises) closes it: one region per call, in whatever thread the
    call runs, so no cached bf16 weight outlives a forward. For a causal LM the output head is
    hooked too (:func:`~fourfold.models.roles.chunked_response_logprobs` calls it on its own).
    Calling it again on a hooked module changes nothing.
    """
    for module in modules:
        if module is None:
            continue
        targets = [module]
        if hasattr(inner_model(module), "get_output_embeddings"):
            targets.append(inner_model(module).get_output_embeddings())
        for target in targets:
            if target is None or hasattr(target, _AUTOCAST_ATTR):
                continue
            setattr(target, _AUTOCAST_ATTR, (device_type, dtype))
            target.register_forward_pre_hook(_enter_region)
            target.register_forward_hook(_exit_region, always_call=True)


def autocast_region(precision: str, device_type: str, cache: bool = True):
    """The context of a phase whose weights do not change (generation and scoring): one bf16
    autocast region with its cast cache under ``bf16-mixed`` (each trained weight is cast once for
    all the decoding steps, not once per step); a no-op otherwise. Never around optimizer steps."""
    if precision != "bf16-mixed":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16, cache_enabled=cache)


def set_logits_chunk(model: nn.Module, tokens: Optional[int]) -> None:
    """Make :func:`~fourfold.models.roles.response_logprobs` apply ``model``'s LM head to at most
    ``tokens`` response tokens at a time (None: all at once, the default)."""
    if tokens is not None and tokens < 1:
        raise ValueError(f"logits chunk must be >= 1 tokens, got {tokens}")
    setattr(model, LOGITS_CHUNK, tokens)
