"""LoRA via peft: one shared base model that every LoRA role runs on.

One causal LM is loaded once and frozen; peft injects LoRA layers into it, and every role is a thin
module over that one base (:mod:`fourfold.models.lora.roles`)::

    base causal LM (frozen)  + adapter "policy"            -> AdapterLM               (policy, trained)
                             , every adapter disabled       -> AdapterDisabledReference (reference)
                             + adapter "critic" + value head -> AdapterScalarModel      (critic, trained)
                             + adapter "reward" + score head -> AdapterScalarModel      (reward, frozen or trained)

The reward stage trains the same ``AdapterScalarModel`` (adapter ``reward`` + its score head) on the
backbone of the model it starts from; the SEQ_CLS peft directory it writes is a file format only
(:mod:`fourfold.models.lora.files`).

**Not thread-safe.** The active adapter (and peft's ``requires_grad`` bookkeeping) is state of the one
base model: two roles must never run at the same time. :attr:`SharedBase.concurrent_safe` is False,
the role plan refuses ``run.concurrent_roles`` with LoRA, and a role entering while another one runs
raises :class:`AdapterConcurrencyError` instead of computing with the wrong adapter.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from torch import nn

from fourfold.errors import FourfoldError, ModelLoadError
from fourfold.models.plan import LoraSettings
from fourfold.models.roles import per_position_scalars

POLICY, CRITIC, REWARD = "policy", "critic", "reward"

__all__ = ["POLICY", "CRITIC", "REWARD", "LoraSettings", "AdapterConcurrencyError", "BaseRunner", "SharedBase",
           "adapter_keys", "adapter_parameters", "adapter_dropouts"]


class AdapterConcurrencyError(FourfoldError, RuntimeError):
    """Two roles over one shared base ran at the same time (adapter switching is not thread-safe)."""


def adapter_keys(lm: nn.Module, adapter: str) -> dict[str, str]:
    """The parameters of ``adapter`` in a model with peft layers injected: their names as peft's
    adapter file has them without the ``base_model.model.`` prefix
    (``model.layers.0.self_attn.q_proj.lora_A.weight``) -> their names in ``lm``'s state dict
    (``model.layers.0.self_attn.q_proj.lora_A.<adapter>.weight``)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    out: dict[str, str] = {}
    for name, module in lm.named_modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        for layer_name in module.adapter_layer_names:
            container = getattr(module, layer_name)
            if adapter not in container:
                continue
            item = container[adapter]
            if isinstance(item, nn.Parameter):
                out[f"{name}.{layer_name}"] = f"{name}.{layer_name}.{adapter}"
            else:
                out.update({f"{name}.{layer_name}.{k}": f"{name}.{layer_name}.{adapter}.{k}"
                            for k, _ in item.named_parameters()})
    return out


def adapter_parameters(lm: nn.Module, adapter: str) -> dict[str, nn.Parameter]:
    """The parameters of ``adapter`` in a model with peft layers injected, keyed as
    :func:`adapter_keys` names them (the names of peft's adapter file, without its prefix)."""
    return {key: lm.get_parameter(name) for key, name in adapter_keys(lm, adapter).items()}


class BaseRunner(nn.Module):
    """The one module every role over a shared base calls: ``runner(...)`` runs the model (``lm``)
    with the adapters as they are set; ``runner(input_ids, attention_mask, keep_last, shift,
    head=name)`` its backbone and the linear head ``heads[name]`` (a critic's or a reward model's) at
    every position (:func:`~fourfold.models.roles.per_position_scalars`).

    Under torchrun it is the root a placement shards (:func:`fourfold.run.parallel.place_roles`):
    FSDP2 gathers a root's own weights (embeddings, final norm, LM head, the scalar heads) in the
    root's forward, so every role's forward goes through this one module. ``forwards_to`` is the
    model whose signature the keywords follow."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm
        self.heads = nn.ModuleDict()

    @property
    def forwards_to(self) -> nn.Module:
        return self.lm

    def forward(self, *args, head: Optional[str] = None, **kwargs):
        if head is None:
            return self.lm(*args, **kwargs)
        return per_position_scalars(self.lm.base_model, self.heads[head], *args, **kwargs)


def adapter_dropouts(lm: nn.Module, adapter: str) -> list[nn.Module]:
    return [m.lora_dropout[adapter] for m in lm.modules()
            if isinstance(getattr(m, "lora_dropout", None), nn.ModuleDict) and adapter in m.lora_dropout]


class SharedBase:
    """One model in memory, wrapped by peft, that every LoRA role runs on.

    ``peft`` is the ``PeftModel``; ``lm`` the model inside it (LoRA layers injected, all its own
    weights frozen): a causal LM, or in the reward stage the sequence classifier the reward model
    starts from, its score head taken out (the role owns it); ``backbone`` its decoder without the
    head (``lm.base_model``). Adapters are
    added with :meth:`add_adapter`, each trained or frozen: peft's ``set_adapter`` and
    ``disable_adapter`` leave only the active adapter trainable, so after each switch the
    ``requires_grad`` flags are set again from that list, and both trained adapters keep theirs.
    """

    concurrent_safe = False
    """Roles over one base must run one at a time (see the module docstring)."""

    def __init__(self, lm: nn.Module, settings: LoraSettings, adapter: str = POLICY):
        from peft import get_peft_model

        lm.requires_grad_(False)
        # a causal LM gets peft's causal-LM wrapper; the backbone of a sequence classifier (the reward
        # stage's base, its head taken out) the plain one: only its backbone ever runs
        task = "CAUSAL_LM" if hasattr(lm, "prepare_inputs_for_generation") else None
        self.peft = get_peft_model(lm, settings.peft_config(task), adapter_name=adapter)
        self.lm = self.peft.get_base_model()
        self.runner = BaseRunner(self.lm)
        self._params: dict[str, dict[str, nn.Parameter]] = {}
        self._holders: list = []  # weak references to the modules that register adapters' parameters
        self._trainable: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._active = adapter
        self._register(adapter, trainable=True)

    @property
    def backbone(self) -> nn.Module:
        return self.lm.base_model

    @property
    def adapters(self) -> list[str]:
        return list(self._params)

    def add_adapter(self, name: str, peft_config, trainable: bool) -> None:
        """A new adapter ``name`` from a ``peft.LoraConfig`` (B zero: it starts as the base model)."""
        self.peft.add_adapter(name, peft_config)
        self._register(name, trainable)

    def parameters_of(self, name: str) -> dict[str, nn.Parameter]:
        """The parameters of adapter ``name`` (see :func:`adapter_parameters`)."""
        return self._params[name]

    def add_head(self, name: str, head: nn.Linear) -> None:
        """Register the scalar head of adapter ``name``'s role in the runner (``runner(..., head=name)``)."""
        self.runner.heads[name] = head

    def hold(self, holder: nn.Module) -> None:
        """``holder`` registers an adapter's parameters (a role's): :meth:`rebind` refreshes it."""
        self._holders.append(weakref.ref(holder))

    def rebind(self) -> None:
        """After the base's parameters were replaced (FSDP2 sharding puts new ones in every module),
        point every adapter's parameter list, and every holder (``holder.refresh()``), at them."""
        for name in self._params:
            self._params[name] = adapter_parameters(self.lm, name)
        for ref in self._holders:
            holder = ref()
            if holder is not None:
                holder.refresh()
        self._restore_grads()

    def dropouts_of(self, name: str) -> list[nn.Module]:
        """The dropout modules on adapter ``name``'s inputs (their train/eval mode is the role's)."""
        return adapter_dropouts(self.lm, name)

    def _register(self, name: str, trainable: bool) -> None:
        params = adapter_parameters(self.lm, name)
        if not params:
            raise ModelLoadError(f"LoRA adapter {name!r}: target_modules matched no module of {type(self.lm).__name__}")
        self._params[name] = params
        self._trainable[name] = trainable
        self._restore_grads()

    def _restore_grads(self) -> None:
        for name, params in self._params.items():
            for p in params.values():
                p.requires_grad_(self._trainable[name])

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        if not self._lock.acquire(blocking=False):
            raise AdapterConcurrencyError(
                "two roles ran at once on one shared LoRA base; adapter switching is not thread-safe "
                "(run the policy, reference, critic and reward one after the other: run.concurrent_roles=false)")
        try:
            yield
        finally:
            self._lock.release()

    @contextmanager
    def activate(self, name: str) -> Iterator[None]:
        """Run the body with adapter ``name`` (alone) active."""
        with self._exclusive():
            if self._active != name:
                self.peft.set_adapter(name)
                self._active = name
                self._restore_grads()
            yield

    @contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """Run the body as the base model: every adapter off (peft's ``disable_adapter``)."""
        with self._exclusive():
            try:
                with self.peft.disable_adapter():
                    yield
            finally:
                self._restore_grads()

    def device(self) -> torch.device:
        return next(self.lm.parameters()).device
