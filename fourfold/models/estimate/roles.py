"""What each role of a plan holds per device: its parameter counts and the bytes of its weights,
gradients and AdamW state (:class:`RoleCost`, with what the phase model of
:mod:`fourfold.models.estimate.memory` needs to know about it), read off the plan's role specs.

One rule per form of :class:`~fourfold.models.plan.RoleSpec`:

* ``full``: a model of its own from its source's ``config.json``, in the spec's dtype; trained (the
  policy, a critic) with gradients and AdamW state, or frozen (the reference, the reward model);
* ``adapter``: an adapter (+ a score head for a scorer) on the shared LoRA base, trained (the
  policy, a critic) or frozen (a reward adapter); the base's own weights are counted once, with
  the policy;
* ``base``: the shared base with its adapters disabled (the LoRA reference): nothing of its own;
* ``function``: no model.

Sharding follows the spec's placement (a role on the base follows the base's) over more than one
device.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

from fourfold.models.estimate.params import LoraCount, Shape, count_lora, count_model, load_config, shape_of
from fourfold.models.estimate.result import RoleMemory
from fourfold.models.estimate.settings import EstimateInput, dtype_bytes
from fourfold.models.plan import ADAPTER, BASE, FULL, FUNCTION, RoleSpec

ROLES = ("policy", "reference", "reward", "critic")


@dataclass
class RoleCost:
    """A role's memory plus what the phase model needs to know about it."""

    memory: RoleMemory
    shape: Shape
    res_bytes: int  # bytes of the residual stream (the dtype of the model's own weights)
    trained: bool = False
    causal: bool = True  # an LM head (policy, reference) rather than a score head
    full: bool = True  # every weight trained (else LoRA: base frozen)
    cast_params: int = 0  # fp32 Linear parameters autocast casts to bf16 under bf16-mixed
    cast_layer: int = 0  # of which in one decoder layer
    layer_params: int = 0  # FSDP unit size
    sharded: bool = False
    head_grad_params: int = 0  # LM-head parameters whose gradient exists before the layers' (full policy)
    lora: Optional[LoraCount] = None


def shard(n: int, sharded: bool, nproc: int) -> int:
    """``n`` bytes split over ``nproc`` devices when ``sharded`` (rounded up), else whole."""
    return math.ceil(n / nproc) if sharded else n


def _trained_memory(params: int, trainable: int, tensors: int, frozen_params: int, inp: EstimateInput,
                    sharded: bool, master: int) -> RoleMemory:
    """Trainable parameters of ``master`` bytes (and ``frozen_params`` in the frozen dtype: a LoRA
    base's own weights) sharded across devices when ``sharded``, else whole on every device."""
    n = inp.nproc
    return RoleMemory(params=params, trainable_params=trainable,
                      weights_bytes=shard(trainable * master, sharded, n) + shard(frozen_params * inp.frozen, sharded, n),
                      grads_bytes=shard(trainable * master, sharded, n),
                      optimizer_bytes=shard(2 * trainable * master + 4 * tensors, sharded, n))


def _frozen_memory(params: int, stored: int, stored_bytes: int, inp: EstimateInput, sharded: bool) -> RoleMemory:
    """``stored`` frozen parameters of ``stored_bytes`` each, sharded as ``sharded`` says."""
    return RoleMemory(params=params, weights_bytes=shard(stored * stored_bytes, sharded, inp.nproc))


def _casts(inp: EstimateInput, linear: int, layer_linear: int) -> dict:
    """The fp32 Linear parameters bf16 autocast copies (all, and one decoder layer's), as RoleCost kwargs."""
    mixed = inp.precision == "bf16-mixed"
    return {"cast_params": linear if mixed else 0, "cast_layer": layer_linear if mixed else 0}


class _Costs:
    """The costs of one plan's roles; holds the model configs read (each source once) and the
    shared base's counts."""

    def __init__(self, inp: EstimateInput):
        self.inp, self.plan = inp, inp.plan
        self.configs: dict[tuple, object] = {}

    def config(self, source):
        if not isinstance(source, (str, os.PathLike)):
            return source
        if source in self.inp.configs:
            return self.inp.configs[source]
        key = os.fspath(source)
        if key not in self.configs:
            self.configs[key] = load_config(source, self.plan.trust_remote_code)
        return self.configs[key]

    def cost(self, spec: RoleSpec) -> Optional[RoleCost]:
        if spec.form == FUNCTION:
            return None
        if spec.form == FULL:
            return self.trained_full(spec) if spec.trained else self.frozen_full(spec)
        return self.on_base(spec)

    # ---- models of their own ---------------------------------------------------------------------

    def trained_full(self, spec: RoleSpec) -> RoleCost:
        """The policy (causal) or a critic (scorer) trained in full."""
        inp, cfg = self.inp, self.config(spec.source)
        count, shape, master = count_model(cfg, scorer=not spec.causal), shape_of(cfg), dtype_bytes(spec.dtype)
        sharded = inp.sharded(spec)
        return RoleCost(_trained_memory(count.total, count.total, count.tensors, 0, inp, sharded, master), shape,
                        master, trained=True, causal=spec.causal, layer_params=count.layer, sharded=sharded,
                        head_grad_params=shape.vocab * shape.hidden if spec.causal else 0,
                        **_casts(inp, count.linear, count.layer_linear))

    def frozen_full(self, spec: RoleSpec) -> RoleCost:
        """The reference (causal) or the reward model (scorer) of its own."""
        inp, cfg = self.inp, self.config(spec.source)
        count, frozen, sharded = count_model(cfg, scorer=not spec.causal), dtype_bytes(spec.dtype), inp.sharded(spec)
        return RoleCost(_frozen_memory(count.total, count.total, frozen, inp, sharded), shape_of(cfg), frozen,
                        causal=spec.causal, layer_params=count.layer, sharded=sharded)

    # ---- roles on the shared LoRA base -----------------------------------------------------------

    def on_base(self, spec: RoleSpec) -> RoleCost:
        """The policy adapter (with the base's own weights), the reference (the base), a critic
        adapter + value head (trained) or a reward adapter + score head (frozen)."""
        inp, lora = self.inp, self.plan.lora
        bcfg = self.config(self.plan.base_source)
        shape, base, lc = shape_of(bcfg), count_model(bcfg), count_lora(bcfg, lora.r, lora.target_modules, lora.dropout)
        fp32_base = inp.frozen == 4  # autocast casts the base's Linears too
        per_layer = lc.params // max(1, shape.layers)
        casts = _casts(inp, (base.linear if fp32_base else 0) + lc.params,
                       (base.layer_linear if fp32_base else 0) + per_layer)
        common = dict(shape=shape, res_bytes=inp.frozen, full=False, layer_params=base.layer, lora=lc)
        sharded = inp.sharded(spec)  # the base, with every role on it (the frozen weights too)
        if spec.form == BASE:
            return RoleCost(RoleMemory(params=base.total), **common)
        if spec.causal:  # the policy: the base's weights are counted with it
            return RoleCost(_trained_memory(base.total + lc.params, lc.params, lc.tensors, base.total, inp, sharded,
                                            inp.master), trained=True, sharded=sharded, **common, **casts)
        sc = count_model(bcfg, scorer=True)
        if spec.trained:
            return RoleCost(_trained_memory(sc.total + lc.params, lc.params + sc.head, lc.tensors + sc.head_tensors, 0,
                                            inp, sharded, inp.master),
                            trained=True, causal=False, sharded=sharded, **common, **casts)
        return RoleCost(_frozen_memory(sc.total + lc.params, lc.params + sc.head, inp.frozen, inp, sharded),
                        causal=False, **common)


def role_costs(inp: EstimateInput) -> dict[str, Optional[RoleCost]]:
    """Role name -> its :class:`RoleCost` (None for a role the plan lacks or a reward function)."""
    costs = _Costs(inp)
    out: dict[str, Optional[RoleCost]] = dict.fromkeys(ROLES)
    for spec in inp.plan.roles:
        out[spec.name] = costs.cost(spec)
    return out


__all__ = ["ADAPTER", "ROLES", "RoleCost", "role_costs", "shard"]
