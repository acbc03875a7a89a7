"""FSDP2 placement of a run's models under ``torchrun`` (nothing happens in one process), and the
``replicate`` placement of a trained model (:func:`replicate_model`, :func:`average_gradients`).

A model placed ``fsdp`` (trained or frozen) is sharded with
``torch.distributed.fsdp.fully_shard``: every decoder layer (the classes a Hugging Face model
names in ``_no_split_modules``) becomes its own FSDP unit, then the root takes the rest (embeddings,
final norm, LM or score head). The root is the module the trainer calls: the causal LM itself, or
the :class:`~fourfold.models.roles.ScalarModel` around a reward model or critic (its forward runs
the backbone and the head directly, so the wrapper must be the root for the root's hooks to fire),
or a shared LoRA base's :class:`~fourfold.models.lora.base.BaseRunner`, through which every role on
the base runs (the adapters' weights sit in the base's layers and are sharded with them; the
scalar roles' heads in the root). Parameter names do not change, so a sharded model's state dict
has the same keys as a plain one and checkpoints move between world sizes; a LoRA role's state dict
(its adapter and head) holds the sharded parameters themselves.

On CPU the device mesh is built on ``"cpu"`` explicitly (:func:`fourfold.dist.cpu_mesh`); on CUDA
over ``cuda``. ``dist.mixed_precision`` gives bf16 parameters in the forward and backward with fp32
gradient reduction (fp32 master weights stay in the optimizer); ``dist.cpu_offload`` keeps frozen
``fsdp`` roles in CPU memory between their forwards.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Optional

import torch
from torch import nn

from fourfold import dist
from fourfold.errors import ConfigError

_REPLICATED: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()
"""Trained modules placed ``replicate`` (:func:`replicate_model`)."""


def device_mesh(device: torch.device):
    """The 1-D mesh over every rank of the started group, on ``device``'s type."""
    w = dist.world()
    if torch.device(device).type == "cpu":
        return dist.cpu_mesh(w)
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(torch.device(device).type, (w.world_size,))


def decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The decoder layers inside ``module``: submodules of a class some Hugging Face model in it
    names in ``_no_split_modules`` (e.g. ``LlamaDecoderLayer``), outermost first."""
    names: set[str] = set()
    for sub in module.modules():
        names.update(getattr(sub, "_no_split_modules", None) or ())
    return [sub for sub in module.modules() if type(sub).__name__ in names]


def shard_model(module: nn.Module, device: torch.device, *, mixed_precision: bool = False,
                offload: bool = False) -> nn.Module:
    """``fully_shard`` each decoder layer of ``module``, then ``module`` itself, over every rank
    (in place; returns ``module``). Build the optimizer afterwards: sharding replaces the parameters."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if mixed_precision and torch.device(device).type != "cuda":
        raise ConfigError(f"dist.mixed_precision: bf16 mixed precision needs CUDA, and this run is on {device}; "
                          "set dist.mixed_precision=false")
    kwargs: dict = {"mesh": device_mesh(device)}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.device(device).type == "cuda")
    for layer in decoder_layers(module):
        fully_shard(layer, **kwargs)
    fully_shard(module, **kwargs)
    # A ScalarModel returns a slice of its per-position values; fourfold never changes such an
    # output in place, which is what FSDP2 warns about on every rank's first forward.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    return module


def replicate_model(module: nn.Module) -> nn.Module:
    """Place a trained ``module`` whole on every rank (``replicate``; returns it): its parameters are
    made rank 0's (one broadcast each: every rank starts from the same weights even where a
    from-scratch init or a fresh head drew them) and :func:`average_gradients` averages its gradients
    over the ranks before each optimizer step, so every rank takes the same step and the copies stay
    equal. Nothing happens in one process."""
    if not dist.world().distributed:
        return module
    import torch.distributed as tdist

    with torch.no_grad():
        for p in module.parameters():
            tdist.broadcast(p.data, src=0)
    _REPLICATED.add(module)
    return module


def average_gradients(module: nn.Module) -> None:
    """The gradients of a replicated ``module`` (:func:`replicate_model`) averaged over the ranks, in
    one all-reduce per dtype of the flattened gradients: what FSDP's reduce-scatter does for a sharded
    model, so a loop's :func:`~fourfold.run.parallel.loss_scale` holds for both. Nothing for any
    other module. Every rank must have gradients for the same parameters (every rank runs a forward
    and backward at every step)."""
    if module not in _REPLICATED:
        return
    by_dtype: dict = {}
    for p in module.parameters():
        if p.grad is not None:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    size = dist.world().world_size
    with torch.no_grad():
        for grads in by_dtype.values():
            flat = dist.all_reduce_sum_(torch.cat([g.reshape(-1) for g in grads])).div_(size)  # one buffer, in place
            for g, part in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(part.view_as(g))


def is_sharded(module: nn.Module) -> bool:
    """Whether ``module`` is the root of an FSDP2 sharding (``fully_shard`` was applied to it)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def root_of(module: nn.Module) -> nn.Module:
    """The module a placement shards for ``module``: a LoRA role's shared base runner (its
    ``runs_on``), else ``module`` itself."""
    return getattr(module, "runs_on", module)


def reshard(module: nn.Module) -> None:
    """Put a sharded model's parameters back into their shards. After a forward without a backward
    FSDP2 leaves the root's parameters gathered (the root does not reshard after its forward), and
    an in-place change then (``ScalarModel.set_affine``) would go to the gathered copy and be lost.
    Nothing for a model that is not sharded. A LoRA role: its shared base's root."""
    root = root_of(module)
    if is_sharded(root):
        root.reshard()


def full_state_dict(module: nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """The whole (unsharded) state dict of a sharded ``module``, on the CPU of rank 0 (every rank
    must call it: it gathers; the other ranks get ``{}``). With ``prefix``, only the keys under it,
    without it (``"hf."``: the Hugging Face model inside a ScalarModel)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    reshard(module)
    full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k[len(prefix):]: v for k, v in full.items() if k.startswith(prefix)}


def export_state_dict(model: nn.Module) -> Optional[dict[str, torch.Tensor]]:
    """What the final export of a sharded ``model`` writes (:func:`full_state_dict` of its Hugging
    Face model: ``{}`` off rank 0; for a LoRA role, of its whole shared base runner, from which the
    LoRA writers take the role's tensors); None for a model that is not sharded (it saves itself)."""
    root = root_of(model)
    if not is_sharded(root):
        return None
    if root is not model:
        return full_state_dict(root)
    from fourfold.models.roles import ScalarModel

    return full_state_dict(model, "hf." if isinstance(model, ScalarModel) else "")
