"""LoRA files: adapter directories and merged HF directories.

**Adapter directory** (peft's own): ``adapter_config.json`` + ``adapter_model.safetensors`` (+ peft's
``README.md``); tensors keyed ``base_model.model.<module path>.lora_A.weight`` etc., without the
adapter's name. ``PeftModel.from_pretrained(base_model, dir)`` loads it. The base model it goes on is
the SFT directory as fourfold loads it: when the tokenizer had no pad token, fourfold added one and
resized the embeddings, and so must whoever loads the adapter (``resize_token_embeddings(len(tok))``
with the tokenizer saved beside it).

**Merged directory**: the base's weights with ``W + (alpha / r) * B @ A`` folded into every adapted
layer, written by the base model's own ``save_pretrained`` (safetensors, ``config.json``): plain
``AutoModelFor*.from_pretrained`` loads it, with no peft. Computed without touching the weights in
memory (peft's in-place merge and unmerge would change the shared base by rounding).

The LoRA reward-model format builds on the adapter directory: see :mod:`fourfold.models.lora`.

Writers here write into a given directory; trainers make them atomic with
``fourfold.checkpoint.save_pretrained_atomic`` (as ``trainers.common.save_hf`` does).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


def is_adapter_dir(path) -> bool:
    """A directory holding a peft adapter (``adapter_config.json``)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def save_adapter_dir(peft_model, adapter: str, path) -> None:
    """Adapter ``adapter`` of ``peft_model`` as a peft adapter directory at ``path`` (safetensors).

    peft writes a non-default adapter into ``path/<adapter>/``; its files are moved up so that
    ``PeftModel.from_pretrained(base, path)`` finds them.
    """
    path = Path(path)
    peft_model.save_pretrained(str(path), selected_adapters=[adapter], safe_serialization=True)
    if adapter != "default":
        sub = path / adapter
        for f in sub.iterdir():
            os.replace(f, path / f.name)
        sub.rmdir()


@torch.no_grad()
def merged_state_dict(peft_model, adapter: str) -> dict[str, torch.Tensor]:
    """The inner model's state dict as the plain architecture names it, with ``adapter`` merged.

    Adapted layers: ``weight + get_delta_weight(adapter)`` (new tensors; nothing in memory changes);
    ``modules_to_save`` (a SEQ_CLS score head): the adapter's trained copy; every other adapter dropped.
    """
    from peft.tuners.lora import LoraLayer
    from peft.utils import ModulesToSaveWrapper

    lm = peft_model.get_base_model()
    state: dict[str, torch.Tensor] = {}
    for key, tensor in lm.state_dict().items():
        parts = key.split(".")
        if "modules_to_save" in parts or any(p.startswith("lora_") for p in parts):
            continue
        state[".".join(p for p in parts if p not in ("base_layer", "original_module"))] = tensor
    for name, module in lm.named_modules():
        if isinstance(module, LoraLayer) and adapter in module.r:
            weight = module.get_base_layer().weight
            state[f"{name}.weight"] = weight.detach() + module.get_delta_weight(adapter).to(weight.dtype)
        elif isinstance(module, ModulesToSaveWrapper) and adapter in module.modules_to_save:
            state.update({f"{name}.{k}": t for k, t in module.modules_to_save[adapter].state_dict().items()})
    return state


def save_merged_dir(peft_model, adapter: str, path) -> None:
    """The base with ``adapter`` merged, as a plain HF directory (safetensors) at ``path``."""
    lm = peft_model.get_base_model()
    lm.save_pretrained(str(path), state_dict=merged_state_dict(peft_model, adapter), safe_serialization=True)
