"""Random-init Llama-shaped models built from a config (tests, benchmarks, from-scratch SFT,
``fourfold new-model``).

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


ARCHITECTURES = ("llama", "qwen2", "mistral", "gpt2")
"""The decoder families :func:`causal_lm_config` builds (``fourfold new-model --arch``)."""


def causal_lm_config(arch: str, vocab_size: int, hidden: int = 128, layers: int = 2, heads: int = 4,
                     intermediate: Optional[int] = None, max_positions: int = 256, **token_ids):
    """The transformers config of a decoder of ``arch`` (one of :data:`ARCHITECTURES`) and these
    sizes: llama is :func:`llama_config`; qwen2 and mistral the same sizes in their classes (no
    sliding window); gpt2 its own names for them (``n_embd``, ``n_inner``, ...). No dropout, untied
    embeddings; ``token_ids``: ``pad_token_id``, ``bos_token_id``, ``eos_token_id``."""
    ffn = intermediate or 4 * hidden
    if arch == "llama":
        return llama_config(vocab_size, hidden, layers, heads, ffn, max_positions, **token_ids)
    if arch in ("qwen2", "mistral"):
        from transformers import MistralConfig, Qwen2Config

        cls = Qwen2Config if arch == "qwen2" else MistralConfig
        return cls(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                   num_key_value_heads=heads, intermediate_size=ffn, max_position_embeddings=max_positions,
                   sliding_window=None, tie_word_embeddings=False, attention_dropout=0.0, **token_ids)
    if arch == "gpt2":
        from transformers import GPT2Config

        return GPT2Config(vocab_size=vocab_size, n_embd=hidden, n_layer=layers, n_head=heads, n_inner=ffn,
                          n_positions=max_positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                          tie_word_embeddings=False, **token_ids)
    raise ValueError(f"architecture {arch!r}: expected one of {', '.join(ARCHITECTURES)}")


def random_causal_lm(config, seed: Optional[int] = None, dtype: torch.dtype = torch.float32):
    """The causal LM of ``config`` (``LlamaForCausalLM`` for :func:`llama_config`) with random weights
    (seeded when ``seed`` is given)."""
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
