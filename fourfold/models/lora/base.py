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
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from fourfold.errors import FourfoldError, ModelLoadError
from fourfold.models.plan import LoraSettings

POLICY, CRITIC, REWARD = "policy", "critic", "reward"

__all__ = ["POLICY", "CRITIC", "REWARD", "LoraSettings", "AdapterConcurrencyError", "SharedBase",
           "adapter_parameters", "adapter_dropouts"]


class AdapterConcurrencyError(FourfoldError, RuntimeError):
    """Two roles over one shared base ran at the same time (adapter switching is not thread-safe)."""


def adapter_parameters(lm: nn.Module, adapter: str) -> dict[str, nn.Parameter]:
    """The parameters of ``adapter`` in a model with peft layers injected, keyed as peft's adapter
    file names them without the ``base_model.model.`` prefix (``model.layers.0.self_attn.q_proj.lora_A.weight``)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    out: dict[str, nn.Parameter] = {}
    for name, module in lm.named_modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        for layer_name in module.adapter_layer_names:
            container = getattr(module, layer_name)
            if adapter not in container:
                continue
            item = container[adapter]
            if isinstance(item, nn.Parameter):
                out[f"{name}.{layer_name}"] = item
            else:
                out.update({f"{name}.{layer_name}.{k}": p for k, p in item.named_parameters()})
    return out


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
        self._params: dict[str, dict[str, nn.Parameter]] = {}
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
