"""FSDP2 placement of a run's models under ``torchrun`` (nothing happens in one process).

A trained model (and a frozen one placed ``fsdp``) is sharded with
``torch.distributed.fsdp.fully_shard``: every decoder layer (the classes a Hugging Face model
names in ``_no_split_modules``) becomes its own FSDP unit, then the root takes the rest (embeddings,
final norm, LM or score head). The root is the module the trainer calls: the causal LM itself, or
the :class:`~fourfold.models.roles.ScalarModel` around a reward model or critic (its forward runs
the backbone and the head directly, so the wrapper must be the root for the root's hooks to fire).
Parameter names do not change, so a sharded model's state dict has the same keys as a plain one
and checkpoints move between world sizes.

On CPU the device mesh is built on ``"cpu"`` explicitly (:func:`fourfold.dist.cpu_mesh`); on CUDA
over ``cuda``. ``dist.mixed_precision`` gives bf16 parameters in the forward and backward with fp32
gradient reduction (fp32 master weights stay in the optimizer); ``dist.cpu_offload`` keeps frozen
``fsdp`` roles in CPU memory between their forwards.
"""

from __future__ import annotations

import warnings
from typing import Mapping, Optional

import torch
from torch import nn

from fourfold import dist
from fourfold.errors import ConfigError

TRAINED_ROLES = ("model", "policy", "critic")
"""Roles that train: always sharded (the config refuses ``replicate`` for them)."""


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


def shard_roles(roles: Mapping[str, Optional[nn.Module]], dist_cfg, device: torch.device) -> dict:
    """Place a run's models as its ``dist`` section says, when torchrun started a group (else
    return them as they are). ``roles``: role name (a field of ``dist_cfg``: ``model``,
    ``policy``, ``critic``, ``reference``, ``reward``) -> module or None (absent). Trained roles and
    frozen roles placed ``fsdp`` are sharded (frozen ones offloaded to CPU with
    ``dist.cpu_offload``); ``replicate`` leaves a frozen role a full copy on every rank. Returns
    the same mapping (the modules are sharded in place)."""
    if not dist.started():
        return dict(roles)
    for name, module in roles.items():
        if module is None or getattr(dist_cfg, name) == "replicate":
            continue
        frozen = name not in TRAINED_ROLES
        shard_model(module, device, mixed_precision=dist_cfg.mixed_precision,
                    offload=frozen and getattr(dist_cfg, "cpu_offload", False))
    return dict(roles)


def is_sharded(module: nn.Module) -> bool:
    """Whether ``module`` is the root of an FSDP2 sharding (``fully_shard`` was applied to it)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def reshard(module: nn.Module) -> None:
    """Put a sharded model's parameters back into their shards. After a forward without a backward
    FSDP2 leaves the root's parameters gathered (the root does not reshard after its forward), and
    an in-place change then (``ScalarModel.set_affine``) would go to the gathered copy and be lost.
    Nothing for a model that is not sharded."""
    if is_sharded(module):
        module.reshard()


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
    Face model: ``{}`` off rank 0); None for a model that is not sharded (it saves itself)."""
    if not is_sharded(model):
        return None
    from fourfold.models.roles import ScalarModel

    return full_state_dict(model, "hf." if isinstance(model, ScalarModel) else "")
