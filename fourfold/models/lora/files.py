"""LoRA files: adapter directories, merged HF directories, and the LoRA reward-model format.

**Adapter directory** (peft's own): ``adapter_config.json`` + ``adapter_model.safetensors`` (+ peft's
``README.md``); tensors keyed ``base_model.model.<module path>.lora_A.weight`` etc., without the
adapter's name. ``PeftModel.from_pretrained(base_model, dir)`` loads it, and so does
``AutoPeftModelForCausalLM.from_pretrained(dir)`` from any directory (``base_model_name_or_path`` is
recorded absolute, :func:`resolvable_base`). The base model it goes on is
the SFT directory as fourfold loads it: when the tokenizer had no pad token, fourfold added one and
resized the embeddings, and so must whoever loads the adapter (``resize_token_embeddings(len(tok))``
with the tokenizer saved beside it).

**Merged directory**: the base's weights with ``W + (alpha / r) * B @ A`` folded into every adapted
layer, written by ``save_pretrained`` (safetensors, ``config.json``): plain
``AutoModelFor*.from_pretrained`` loads it, with no peft. Computed without touching the weights in
memory (peft's in-place merge and unmerge would change the shared base by rounding).

**LoRA reward model** (and an adapter critic): a scalar role
(:class:`~fourfold.models.lora.roles.AdapterScalarModel`) is written as

* an **adapter directory** of a SEQ_CLS peft model whose score head is in ``modules_to_save`` (peft
  names it ``base_model.model.score.weight``), plus ``fourfold_score.json`` =
  ``{"fourfold_score_shift": x}`` when the reward normalisation left a shift. It is what
  :func:`load_reward_adapter` loads as an adapter on a shared causal-LM base, and what
  ``PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(base, num_labels=1), dir)``
  and ``AutoPeftModelForSequenceClassification.from_pretrained(dir, num_labels=1)`` load (the base is
  a causal LM's directory, whose config says nothing of labels, so transformers would build a
  two-label head; the shift of ``fourfold_score.json`` is added by fourfold, not by peft);
* a **merged directory**: a plain one-label ``AutoModelForSequenceClassification`` (the shift in
  ``config.json`` as ``fourfold_score_shift``, as a full reward model keeps it).

Both are built from the adapter's tensors by renaming the causal LM's backbone prefix to the sequence
classifier's (both ``model`` for Llama and Qwen2: only the head differs), and read back by the
inverse renaming; nothing in memory changes.

Writers here write into a given directory; the trainers make them atomic
(:func:`fourfold.run.export.save_trained`).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Iterator, Optional

import torch
from torch import nn

from fourfold.dist import full_tensor
from fourfold.errors import ModelLoadError
from fourfold.models.lora.base import SharedBase, adapter_keys
from fourfold.models.lora.roles import AdapterLM, AdapterScalarModel
from fourfold.models.plan import ADAPTER_CONFIG, is_adapter_dir, resolvable_base

SCORE_FILE = "fourfold_score.json"
__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "PEFT_PREFIX", "SCORE_FILE", "is_adapter_dir", "save_adapter",
           "save_merged", "load_reward_adapter", "merged_state_dict", "merged_tensors", "backbone_prefixes", "split_reward_state",
           "rename_target_modules"]

ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


def save_adapter_dir(peft_model, adapter: str, path, state: Optional[dict] = None) -> None:
    """Adapter ``adapter`` of ``peft_model`` as a peft adapter directory at ``path`` (safetensors).
    ``state``: the inner model's whole state dict to take the adapter from (gathered from a sharded
    model), else the model's own.

    peft writes a non-default adapter into ``path/<adapter>/``; its files are moved up so that
    ``PeftModel.from_pretrained(base, path)`` finds them.
    """
    path = Path(path)
    given = {} if state is None else {"state_dict": {PEFT_PREFIX + k: t for k, t in state.items()}}
    config = peft_model.peft_config[adapter]
    config.base_model_name_or_path = resolvable_base(config.base_model_name_or_path)
    peft_model.save_pretrained(str(path), selected_adapters=[adapter], safe_serialization=True, **given)
    if adapter != "default":
        sub = path / adapter
        for f in sub.iterdir():
            os.replace(f, path / f.name)
        sub.rmdir()


def lora_delta(module, adapter: str, lora_a: torch.Tensor, lora_b: torch.Tensor) -> torch.Tensor:
    """What peft's ``Linear.get_delta_weight(adapter)`` computes, from the tensors ``lora_a`` and
    ``lora_b`` (gathered whole) instead of the layer's own: ``(B @ A) * scaling`` (transposed for
    ``fan_in_fan_out``), in float32 on the CPU for 16-bit weights, as peft does."""
    from peft.tuners.lora import Linear

    if type(module) is not Linear:
        raise ModelLoadError(f"{type(module).__name__}: a LoRA layer of this kind is exported in one process only "
                             "(target linear layers, e.g. target_modules: all-linear)")
    dtype = lora_b.dtype
    cast = lora_b.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16)
    a, b = (lora_a.float(), lora_b.float()) if cast else (lora_a, lora_b)
    delta = b @ a
    delta = (delta.T if module.fan_in_fan_out else delta) * module.scaling[adapter]
    return delta.to(dtype) if cast else delta


@torch.no_grad()
def merged_tensors(peft_model, adapter: str, state: Optional[dict] = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the inner model's state dict as the plain architecture names it, with
    ``adapter`` merged, one tensor at a time (a merged weight exists only until the caller drops it).

    Adapted layers: ``weight + get_delta_weight(adapter)`` (new tensors; nothing in memory changes);
    ``modules_to_save`` (a SEQ_CLS score head): the adapter's trained copy; every other adapter dropped.
    ``state``: the peft model's state dict gathered whole (an FSDP-sharded base), read instead of the
    live modules; the delta is then :func:`lora_delta` of its tensors. A live layer whose tensors are
    sharded (DTensor) is gathered one layer at a time the same way; the other tensors are yielded as
    they are (the caller gathers them).
    """
    from peft.tuners.lora import LoraLayer
    from peft.utils import ModulesToSaveWrapper

    lm = peft_model.get_base_model()
    source = lm.state_dict() if state is None else state
    adapted, saved = {}, {}
    for name, module in lm.named_modules():
        if isinstance(module, LoraLayer) and adapter in module.r:
            adapted[name] = module
        elif isinstance(module, ModulesToSaveWrapper) and adapter in module.modules_to_save:
            prefix = f"{name}.modules_to_save.{adapter}."
            saved[name] = {k[len(prefix):]: t for k, t in source.items() if k.startswith(prefix)}
    for key, tensor in source.items():
        parts = key.split(".")
        if "modules_to_save" in parts or any(p.startswith("lora_") for p in parts):
            continue
        plain = ".".join(p for p in parts if p not in ("base_layer", "original_module"))
        owner, _, leaf = plain.rpartition(".")
        if owner in adapted and leaf == "weight":
            yield plain, _merged_weight(adapted[owner], owner, adapter, source, live=state is None)
        elif owner in saved:
            yield plain, saved[owner][leaf]
        else:
            yield plain, tensor


def _merged_weight(module, name: str, adapter: str, source: dict, live: bool) -> torch.Tensor:
    """One adapted layer's ``weight + delta``: peft's own delta on the live layer when its tensors
    are plain, else :func:`lora_delta` of the tensors in ``source``, gathered whole."""
    weight = source[f"{name}.base_layer.weight"]
    lora_a, lora_b = source[f"{name}.lora_A.{adapter}.weight"], source[f"{name}.lora_B.{adapter}.weight"]
    if live and not any(hasattr(t, "full_tensor") for t in (weight, lora_a, lora_b)):
        return weight.detach() + module.get_delta_weight(adapter).to(weight.dtype)
    weight = full_tensor(weight).detach()
    return weight + lora_delta(module, adapter, full_tensor(lora_a), full_tensor(lora_b)).to(weight.dtype)


def merged_state_dict(peft_model, adapter: str, state: Optional[dict] = None) -> dict[str, torch.Tensor]:
    """The inner model's state dict as the plain architecture names it, with ``adapter`` merged
    (:func:`merged_tensors`, all at once)."""
    return dict(merged_tensors(peft_model, adapter, state))


def save_merged_dir(peft_model, adapter: str, path, state: Optional[dict] = None) -> None:
    """The base with ``adapter`` merged, as a plain HF directory (safetensors) at ``path``
    (``state``: as for :func:`merged_state_dict`)."""
    lm = peft_model.get_base_model()
    lm.save_pretrained(str(path), state_dict=merged_state_dict(peft_model, adapter, state), safe_serialization=True)


def backbone_prefixes(lm: nn.Module) -> tuple[str, str]:
    """(backbone attribute of the sequence classifier of ``lm``'s architecture, that of ``lm``)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING,
    )

    try:
        seq_cls = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(lm.config)]
    except KeyError:
        raise ModelLoadError(f"{type(lm.config).__name__}: transformers has no sequence classifier for it, "
                             f"so a LoRA reward model cannot exist for this base") from None
    return seq_cls.base_model_prefix, type(lm).base_model_prefix


def split_reward_state(state: dict[str, torch.Tensor], source: str, target: str
                       ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A SEQ_CLS adapter file's tensors -> (backbone LoRA weights renamed ``source.*`` -> ``target.*``,
    head tensors by their name under the classifier, e.g. ``score.weight``); peft's
    ``base_model.model.`` prefix is dropped from both."""
    backbone, head = {}, {}
    for key, tensor in state.items():
        if not key.startswith(PEFT_PREFIX):
            raise ModelLoadError(f"unexpected tensor {key!r} in a peft adapter file")
        key = key[len(PEFT_PREFIX):]
        if key.startswith(source + "."):
            backbone[target + key[len(source):]] = tensor
        else:
            head[key] = tensor
    return backbone, head


def rename_target_modules(targets, source: str, target: str):
    """Full module paths in ``target_modules`` (peft resolves 'all-linear' to them) moved to the causal
    LM's backbone prefix; plain names and a regex string stay as they are."""
    if isinstance(targets, str):
        return targets
    return sorted(target + t[len(source):] if t.startswith(source + ".") else t for t in targets)


def _head_from(head_state: dict[str, torch.Tensor], hidden: int, where: str) -> nn.Linear:
    modules = {key.rsplit(".", 1)[0] for key in head_state}
    weight = next((head_state[f"{m}.weight"] for m in modules if f"{m}.weight" in head_state), None)
    if len(modules) != 1 or weight is None or tuple(weight.shape) != (1, hidden):
        raise ModelLoadError(f"{where}: expected one score head of shape (1, {hidden}) beside the LoRA weights, "
                             f"found {sorted(head_state)[:4]}")
    (module,) = modules
    bias = head_state.get(f"{module}.bias")
    head = nn.Linear(hidden, 1, bias=bias is not None, dtype=torch.float32)
    with torch.no_grad():
        head.weight.copy_(weight)
        if bias is not None:
            head.bias.copy_(bias)
    return head


def _copy_exact(params: dict[str, nn.Parameter], state: dict[str, torch.Tensor], where: str) -> None:
    missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
    if missing or unexpected:
        raise ModelLoadError(f"{where}: the LoRA weights do not fit this base (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}); was the reward model trained on the same base model?")
    with torch.no_grad():
        for key, p in params.items():
            if p.shape != state[key].shape:
                raise ModelLoadError(f"{where}: {key}: shape {tuple(state[key].shape)}, "
                                     f"the base needs {tuple(p.shape)}")
            p.copy_(state[key])


def load_reward_adapter(base: SharedBase, path, name: str = "reward") -> AdapterScalarModel:
    """A LoRA reward-model directory (module docstring) as frozen adapter ``name`` on ``base``, with
    its score head and shift: scores equal those of the SEQ_CLS peft model that wrote it."""
    import safetensors.torch
    from peft import LoraConfig

    path = Path(path)
    config = LoraConfig.from_pretrained(str(path))
    if config.task_type != "SEQ_CLS":
        raise ModelLoadError(f"{path}: a LoRA reward model is a SEQ_CLS adapter, this one is {config.task_type}")
    source, target = backbone_prefixes(base.lm)
    backbone, head_state = split_reward_state(safetensors.torch.load_file(str(path / ADAPTER_WEIGHTS)), source, target)
    config.task_type = "CAUSAL_LM"
    config.modules_to_save = None
    config.target_modules = rename_target_modules(config.target_modules, source, target)
    base.add_adapter(name, config, trainable=False)
    _copy_exact(base.parameters_of(name), backbone, str(path))
    head = _head_from(head_state, base.lm.config.hidden_size, str(path)).to(base.device())
    shift_file = path / SCORE_FILE
    shift = json.loads(shift_file.read_text())["fourfold_score_shift"] if shift_file.is_file() else None
    return AdapterScalarModel(base, name, head.requires_grad_(False), shift)


def _sequence_classifier(role: AdapterScalarModel):
    """A one-label sequence classifier of the base's architecture on the meta device (no memory):
    its class and config are what the saved directories declare. Returns (model, head name)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

    config = copy.deepcopy(role.base.lm.config)
    config.num_labels = 1
    config.architectures = None
    if role.score_shift:
        config.fourfold_score_shift = float(role.score_shift)
    with torch.device("meta"):
        model = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(config)](config)
    head = next((n for n in ("score", "classifier") if isinstance(getattr(model, n, None), nn.Linear)), None)
    if head is None:
        raise TypeError(f"{type(model).__name__}: no linear score/classifier head to write the role's head into")
    return model, head


class Gathered:
    """A LoRA role's tensors gathered whole from a sharded base (the state dict of its
    :class:`~fourfold.models.lora.base.BaseRunner`, on rank 0): ``lm``, the base model's state dict,
    and ``head``, the role's head's (None for a causal role)."""

    def __init__(self, role, runner_state: dict):
        self.lm = {k[3:]: t for k, t in runner_state.items() if k.startswith("lm.")}
        prefix = f"heads.{role.adapter}."
        self.head = {k[len(prefix):]: t for k, t in runner_state.items() if k.startswith(prefix)} or None


def _head_state(role: AdapterScalarModel, head: str, gathered: Optional[Gathered] = None) -> dict[str, torch.Tensor]:
    own = role.head.state_dict() if gathered is None else gathered.head
    return {f"{head}.{k}": t.detach() for k, t in own.items()}


def _adapter_tensors(role, gathered: Optional[Gathered]) -> dict[str, torch.Tensor]:
    """The role's adapter's tensors by their adapter-file names (:func:`adapter_keys`)."""
    if gathered is None:
        return {key: p.detach() for key, p in role.base.parameters_of(role.adapter).items()}
    return {key: gathered.lm[name] for key, name in adapter_keys(role.base.lm, role.adapter).items()}


def save_scalar_adapter(role: AdapterScalarModel, path, gathered: Optional[Gathered] = None) -> None:
    """``role``'s adapter and head as a LoRA reward-model directory at ``path`` (module docstring)."""
    import safetensors.torch

    path = Path(path)
    source, target = backbone_prefixes(role.base.lm)
    _, head = _sequence_classifier(role)
    config = copy.deepcopy(role.base.peft.peft_config[role.adapter])
    config.task_type = "SEQ_CLS"
    config.modules_to_save = [head]
    config.inference_mode = True
    config.target_modules = rename_target_modules(config.target_modules, target, source)
    config.base_model_name_or_path = resolvable_base(config.base_model_name_or_path)
    tensors = {PEFT_PREFIX + source + key[len(target):]: t.contiguous()
               for key, t in _adapter_tensors(role, gathered).items()}
    tensors.update({PEFT_PREFIX + k: t.contiguous() for k, t in _head_state(role, head, gathered).items()})
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(path))
    safetensors.torch.save_file(tensors, str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    if role.score_shift:
        (path / SCORE_FILE).write_text(json.dumps({"fourfold_score_shift": float(role.score_shift)}) + "\n")


def save_scalar_merged(role: AdapterScalarModel, path, gathered: Optional[Gathered] = None) -> None:
    """``role`` with its adapter merged into the base, as a plain sequence-classifier directory."""
    source, target = backbone_prefixes(role.base.lm)
    model, head = _sequence_classifier(role)
    merged = merged_state_dict(role.base.peft, role.adapter, None if gathered is None else gathered.lm)
    state = {source + key[len(target):]: t for key, t in merged.items()
             if key.startswith(target + ".")}  # the causal LM's output head is not the classifier's
    state.update(_head_state(role, head, gathered))
    model.save_pretrained(str(path), state_dict=state, safe_serialization=True)


def save_adapter(role, path, runner_state: Optional[dict] = None) -> None:
    """A LoRA role's adapter directory at ``path``: a policy's peft adapter (loads with
    ``PeftModel.from_pretrained(causal LM, path)``), a scalar role's LoRA reward-model directory.
    ``runner_state``: the base runner's state dict gathered whole from a sharded base (rank 0;
    :func:`fourfold.run.fsdp.export_state_dict`), else None: the role's own tensors."""
    gathered = None if runner_state is None else Gathered(role, runner_state)
    if isinstance(role, AdapterScalarModel):
        save_scalar_adapter(role, path, gathered)
    else:
        save_adapter_dir(role.base.peft, role.adapter, path, None if gathered is None else gathered.lm)


def save_merged(role, path, runner_state: Optional[dict] = None) -> None:
    """A LoRA role with its adapter merged into the base, as a plain HF directory (a causal LM, or
    a one-label sequence classifier for a scalar role); ``runner_state`` as for :func:`save_adapter`."""
    gathered = None if runner_state is None else Gathered(role, runner_state)
    if isinstance(role, AdapterScalarModel):
        save_scalar_merged(role, path, gathered)
    else:
        save_merged_dir(role.base.peft, role.adapter, path, None if gathered is None else gathered.lm)


def is_lora_role(model) -> bool:
    """A role over a shared base (its export is a merged directory and an adapter directory)."""
    return isinstance(model, (AdapterLM, AdapterScalarModel))
