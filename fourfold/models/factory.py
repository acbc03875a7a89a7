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
