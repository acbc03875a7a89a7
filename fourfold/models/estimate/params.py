"""Exact parameter counts of a role's model from its ``config.json``, on the meta device.

The model is built with ``torch.device("meta")`` (no weights read or allocated) and its parameters
counted: tied embeddings once. LoRA adapters are counted by applying peft's ``get_peft_model`` to
the meta model, so they are exactly what peft creates for a given ``r`` and ``target_modules``.
"""

from __future__ import annotations

import copy
import os
import warnings
from dataclasses import dataclass
from typing import Sequence, Union

import torch

ModelSource = Union[str, os.PathLike, "PretrainedConfig"]  # noqa: F821  (a transformers config object)


@dataclass(frozen=True)
class Shape:
    """A decoder's sizes, read from its config."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


@dataclass
class ModelCount:
    """Counts of one model built on the meta device (tied parameters once)."""

    total: int
    tensors: int
    linear: int  # parameters of Linear/Conv1D modules (what autocast casts to bf16)
    layer: int  # parameters of the largest decoder layer (the FSDP unit)
    layer_linear: int  # Linear/Conv1D parameters of that layer
    head: int = 0  # score head (sequence classifiers)
    head_tensors: int = 0


@dataclass
class LoraCount:
    """What LoRA adds to a model: trainable parameters and tensors, and per decoder layer the sizes
    that set its activations."""

    params: int
    tensors: int
    per_layer_rank_elems: int  # sum of r over the adapted Linears of one layer
    per_layer_in_features: int  # sum of in_features over the adapted Linears of one layer


def load_config(source: ModelSource, trust_remote_code: bool = False):
    """A transformers config from a directory / hub name (config.json only), or the object itself."""
    if not isinstance(source, (str, os.PathLike)):
        return source
    from transformers import AutoConfig

    from fourfold.errors import ModelLoadError
    from fourfold.models.loading import check_source

    path = os.fspath(source)
    check_source(path, trust_remote_code, "model")
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: no usable config.json ({str(e).splitlines()[0][:200]})") from None


def shape_of(config) -> Shape:
    """Sizes of a Llama-style decoder from its config (GPT-2 style names through attribute_map)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    h, a = cfg.hidden_size, cfg.num_attention_heads
    return Shape(hidden=h, layers=cfg.num_hidden_layers, heads=a,
                 kv_heads=getattr(cfg, "num_key_value_heads", None) or a,
                 head_dim=getattr(cfg, "head_dim", None) or h // a,
                 intermediate=getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * h,
                 vocab=cfg.vocab_size)


def _meta_model(config, scorer: bool):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not scorer:
            return AutoModelForCausalLM.from_config(config)
        cfg = copy.deepcopy(config)
        cfg.num_labels = 1
        return AutoModelForSequenceClassification.from_config(cfg)


def _count(model, scorer: bool) -> ModelCount:
    params = list(model.parameters())  # deduplicated: a tied weight appears once
    linear_ids = {id(p) for m in model.modules() if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"
                  for p in m.parameters(recurse=False)}
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    blocks = max(lists, key=len) if lists else []
    layer, layer_linear = max(((sum(p.numel() for p in b.parameters()),
                                sum(p.numel() for p in b.parameters() if id(p) in linear_ids)) for b in blocks),
                              default=(0, 0))
    head = (getattr(model, "score", None) or getattr(model, "classifier", None)) if scorer else None
    head_params = list(head.parameters()) if head is not None else []
    return ModelCount(total=sum(p.numel() for p in params), tensors=len(params),
                      linear=sum(p.numel() for p in params if id(p) in linear_ids), layer=layer,
                      layer_linear=layer_linear,
                      head=sum(p.numel() for p in head_params), head_tensors=len(head_params))


def count_model(config, scorer: bool = False) -> ModelCount:
    """Exact counts of ``AutoModelForCausalLM`` (or the 1-label sequence classifier) of ``config``."""
    return _count(_meta_model(config, scorer), scorer)


def count_lora(config, r: int, target_modules: Union[str, Sequence[str]], dropout: float = 0.0) -> LoraCount:
    """What peft's ``get_peft_model`` adds to the causal LM of ``config`` (built on the meta device)."""
    from peft import LoraConfig, get_peft_model

    model = _meta_model(config, scorer=False)
    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(model, LoraConfig(r=r, target_modules=targets, lora_dropout=dropout))
    trained = [p for p in peft_model.parameters() if p.requires_grad]
    a_mats = [p for n, p in peft_model.named_parameters() if p.requires_grad and ".lora_A." in n]
    layers = max(1, shape_of(config).layers)
    return LoraCount(params=sum(p.numel() for p in trained), tensors=len(trained),
                     per_layer_rank_elems=sum(p.shape[0] for p in a_mats) // layers,
                     per_layer_in_features=sum(p.shape[1] for p in a_mats) // layers)
