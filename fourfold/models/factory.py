"""Random-init Llama-shaped models built from a config (tests, benchmarks, from-scratch SFT).

No downloads: everything here is built locally from sizes.
"""

from __future__ import annotations

from typing import Optional

import torch


def llama_config(vocab_size: int, hidden: int = 128, layers: int = 2, heads: int = 4,
                 intermediate: Optional[int] = None, max_positions: int = 256, *,
                 pad_token_id: Optional[int] = None, bos_token_id: Optional[int] = None,
                 eos_token_id: Optional[int] = None, tie_word_embeddings: bool = False):
    """A ``LlamaConfig`` of the given sizes (MLP width defaults to 4 x hidden)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads, intermediate_size=intermediate or 4 * hidden,
        max_position_embeddings=max_positions, pad_token_id=pad_token_id, bos_token_id=bos_token_id,
        eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings, attention_dropout=0.0,
    )


def random_causal_lm(config, seed: Optional[int] = None, dtype: torch.dtype = torch.float32):
    """``LlamaForCausalLM`` with random weights (seeded when ``seed`` is given)."""
    from transformers import AutoModelForCausalLM

    if seed is not None:
        torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def random_scalar_model(config, seed: Optional[int] = None, dtype: torch.dtype = torch.float32):
    """1-label ``AutoModelForSequenceClassification`` (reward model / critic) with random weights."""
    from transformers import AutoModelForSequenceClassification

    if seed is not None:
        torch.manual_seed(seed)
    cfg = config.__class__.from_dict(config.to_dict())
    cfg.num_labels = 1
    return AutoModelForSequenceClassification.from_config(cfg, dtype=dtype)


def grow_layers(model, extra: int, seed: Optional[int] = None):
    """A copy of ``model`` with ``extra`` decoder layers appended, computing the same function.

    The new layers are randomly initialised (seeded when ``seed`` is given) except their residual
    output projections (``self_attn.o_proj`` and ``mlp.down_proj``), which are zero: each new layer
    adds nothing to the residual stream until training moves them. Used to give the reward model
    more depth than the SFT model it is initialised from. Needs a Llama-family layout
    (``model.model.layers`` of blocks with ``self_attn.o_proj`` and ``mlp.down_proj``).
    """
    if extra < 0:
        raise ValueError(f"extra must be >= 0, got {extra}")
    cfg = model.config.__class__.from_dict(model.config.to_dict())
    n = cfg.num_hidden_layers
    cfg.num_hidden_layers = n + extra
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types) + [cfg.layer_types[-1]] * extra
    if seed is not None:
        torch.manual_seed(seed)
    grown = type(model)(cfg).to(dtype=next(model.parameters()).dtype)
    missing, unexpected = grown.load_state_dict(model.state_dict(), strict=False)
    new_prefixes = tuple(f"model.layers.{i}." for i in range(n, n + extra))
    if unexpected or any(not k.startswith(new_prefixes) for k in missing):
        raise ValueError(f"grow_layers: {type(model).__name__} does not have the Llama layer layout "
                         f"(unexpected {unexpected[:3]}, missing {[k for k in missing if not k.startswith(new_prefixes)][:3]})")
    with torch.no_grad():
        for layer in grown.model.layers[n:]:
            for proj in (layer.self_attn.o_proj, layer.mlp.down_proj):
                proj.weight.zero_()
                if proj.bias is not None:
                    proj.bias.zero_()
    return grown
