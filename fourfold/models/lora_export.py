"""Files of the scalar LoRA roles over a shared base, and what a LoRA run's checkpoint holds.

An adapter role with a head (:class:`~fourfold.models.lora.AdapterScalarModel`: PPO's critic in
``critic_mode: adapter``) is written as

* an **adapter directory** in the LoRA reward-model format (:mod:`fourfold.models.lora`): a SEQ_CLS
  peft adapter whose head is in ``modules_to_save``, plus ``fourfold_score.json`` when it has a
  score shift. It is what :func:`~fourfold.models.lora.load_reward_adapter` loads and what
  ``PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(base), dir)`` loads;
* a **merged directory**: a plain one-label ``AutoModelForSequenceClassification`` (the shift in
  ``config.json`` as ``fourfold_score_shift``, as a full reward model keeps it), which
  :func:`~fourfold.models.loading.load_sequence_scorer` + ``ScalarModel`` score exactly as the role.

Both are built from the adapter's tensors by renaming the causal LM's backbone prefix to the
sequence classifier's (the inverse of what ``load_reward_adapter`` does); nothing in memory changes.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from fourfold.models.lora import SCORE_FILE, AdapterScalarModel, backbone_prefixes, rename_target_modules
from fourfold.models.lora_io import ADAPTER_WEIGHTS, PEFT_PREFIX, merged_state_dict


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


def _head_state(role: AdapterScalarModel, head: str) -> dict[str, torch.Tensor]:
    return {f"{head}.{k}": t.detach() for k, t in role.head.state_dict().items()}


def save_scalar_adapter(role: AdapterScalarModel, path) -> None:
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
    tensors = {PEFT_PREFIX + source + key[len(target):]: p.detach().contiguous()
               for key, p in role.base.parameters_of(role.adapter).items()}
    tensors.update({PEFT_PREFIX + k: t.contiguous() for k, t in _head_state(role, head).items()})
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(path))
    safetensors.torch.save_file(tensors, str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    if role.score_shift:
        (path / SCORE_FILE).write_text(json.dumps({"fourfold_score_shift": float(role.score_shift)}) + "\n")


def save_scalar_merged(role: AdapterScalarModel, path) -> None:
    """``role`` with its adapter merged into the base, as a plain sequence-classifier directory."""
    source, target = backbone_prefixes(role.base.lm)
    model, head = _sequence_classifier(role)
    state = {source + key[len(target):]: t for key, t in merged_state_dict(role.base.peft, role.adapter).items()
             if key.startswith(target + ".")}  # the causal LM's output head is not the classifier's
    state.update(_head_state(role, head))
    model.save_pretrained(str(path), state_dict=state, safe_serialization=True)


class TrainedParameters(nn.Module):
    """The parameters of ``model`` that require a gradient, registered under their names (``/`` for
    ``.``): its ``state_dict()`` is what a LoRA run's checkpoint holds (adapters and heads, never the
    frozen base), and ``load_state_dict`` restores them in place."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.weights = nn.ParameterDict({n.replace(".", "/"): p for n, p in model.named_parameters() if p.requires_grad})
