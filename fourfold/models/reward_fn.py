"""A user's reward function named in a config (``model.reward_fn``): ``fn(prompts, responses) -> scores``."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Callable

from fourfold.errors import ConfigError


def load_reward_fn(spec: str) -> Callable[[list[str], list[str]], list[float]]:
    """'package.module:function' or 'path/to/file.py:function' -> the function."""
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ConfigError(f"model.reward_fn: {spec!r}: expected 'module:function' or 'file.py:function'")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise ConfigError(f"model.reward_fn: {target}: no such file")
            mod_spec = importlib.util.spec_from_file_location(f"fourfold_user_reward_{path.stem}", path)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ImportError as e:
        raise ConfigError(f"model.reward_fn: cannot import {target!r} ({e})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"model.reward_fn: {target} has no function {name!r}")
    return fn
