"""The one fact a config is checked against before any model loads: how many positions a model
directory's ``config.json`` allows. Read as plain JSON (no weights, no transformers), so a prompt
plus response that cannot fit is a config error naming both keys and the model's limit.

Only local directories with a readable ``config.json`` are checked; anything else (a hub name, a
path that does not exist yet, a broken file) is left to the model loader and its own errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Optional

from fourfold.errors import ConfigError

POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""The names architectures give their longest sequence (Llama/Qwen/Mistral/Phi/Gemma, GPT-2, ...),
looked up in this order, at the top level and then in a nested ``text_config``."""


def position_limit(model_dir: Optional[str]) -> Optional[tuple[str, int]]:
    """``(key, limit)`` from ``model_dir/config.json``, or None when there is no such local file
    or it names no limit."""
    if not model_dir:
        return None
    path = Path(model_dir) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for section in (data, data.get("text_config") if isinstance(data, dict) else None):
        if not isinstance(section, dict):
            continue
        for key in POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return key, value
    return None


def require_fits(length: int, what: str, models: Iterable[tuple[str, Optional[str]]]) -> None:
    """ConfigError unless ``length`` tokens (``what``: the key, or the keys and values it adds up,
    e.g. ``"data.max_prompt_len + generation.max_new_tokens = 64 + 32"``) fit every model of ``models``
    (``(config key, directory)`` pairs, e.g. ``("model.policy", "runs/sft/model")``)."""
    for key, model_dir in models:
        found = position_limit(model_dir)
        if found is not None and length > found[1]:
            name, limit = found
            raise ConfigError(f"{what} = {length} tokens is more than {key}'s {name}={limit} "
                              f"({Path(model_dir) / 'config.json'})")
