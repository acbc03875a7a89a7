"""A user's reward function named in a config (``model.reward_fn``): ``fn(prompts, responses) -> scores``.

The boundary with the user's code: a file that does not import (a syntax error, a missing module)
or a function that cannot take two lists is one :class:`~fourfold.errors.ConfigError` line; what the
function returns is checked on every call (:func:`check_scores`: one score per response, each a
real number); an exception raised inside the user's code becomes a
:class:`~fourfold.errors.UserCodeError` that says whose code it was and keeps the original (with its
traceback) as its cause.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import numbers
from pathlib import Path
from typing import Any, Callable

from fourfold.errors import ConfigError, UserCodeError


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
    except ConfigError:  # ours (no such file): not the user's code
        raise
    except ImportError as e:
        raise ConfigError(f"model.reward_fn: cannot import {target!r} ({e})") from None
    except SyntaxError as e:
        raise ConfigError(f"model.reward_fn: {e.filename}:{e.lineno}: syntax error ({e.msg})") from None
    except Exception as e:  # the user's module raised while it was imported
        raise UserCodeError(f"model.reward_fn: importing {target} raised {type(e).__name__}: {_first_line(e)} "
                            "(the traceback of the user's code follows)") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"model.reward_fn: {target} has no function {name!r}")
    try:
        inspect.signature(fn).bind([], [])
    except TypeError:
        raise ConfigError(f"model.reward_fn: {spec} must take two lists (prompts, responses); "
                          f"its signature is {name}{inspect.signature(fn)}") from None
    except ValueError:  # no signature to read (a builtin): the call will tell
        pass
    return fn


def _shown(value: Any, limit: int = 80) -> str:
    """``value`` as one short line: its type and (shortened) repr."""
    if value is None:
        return "None"
    text = " ".join(repr(value).split())
    return f"{type(value).__name__} {text if len(text) <= limit else text[: limit - 3] + '...'}"


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else ""


def check_scores(scores: Any, n: int, name: str) -> list[float]:
    """``scores``, what the reward function ``name`` returned for ``n`` responses, as ``n`` floats;
    a ConfigError naming the function and what it returned when it is not a list (tuple, 1-D tensor
    or array) of ``n`` real numbers (bools count as 0/1; NaN passes: the non-finite guard reports it)."""
    expected = f"expected a list of {n} numbers, one per response"
    if hasattr(scores, "ndim") and hasattr(scores, "tolist"):  # a torch tensor or numpy array
        if scores.ndim != 1:
            raise ConfigError(f"model.reward_fn: {name} returned an array of shape {tuple(scores.shape)}; {expected}")
        scores = scores.tolist()
    if not isinstance(scores, (list, tuple)):
        raise ConfigError(f"model.reward_fn: {name} returned {_shown(scores)}; {expected}")
    if len(scores) != n:
        raise ConfigError(f"model.reward_fn: {name} returned {len(scores)} scores for {n} responses: {_shown(scores)}")
    for i, s in enumerate(scores):
        if not isinstance(s, numbers.Real):
            raise ConfigError(f"model.reward_fn: {name} returned {_shown(s)} as score {i}; {expected}")
    return [float(s) for s in scores]


def call_reward_fn(fn: Callable, prompts: list[str], responses: list[str], name: str) -> list[float]:
    """``fn(prompts, responses)`` checked by :func:`check_scores`; an exception inside ``fn`` is
    re-raised as a UserCodeError naming it (the original is the cause, traceback and all)."""
    try:
        scores = fn(prompts, responses)
    except Exception as e:
        raise UserCodeError(f"model.reward_fn: {name} raised {type(e).__name__}: {_first_line(e)} "
                            "(the traceback of the user's code follows)") from e
    return check_scores(scores, len(responses), name)
