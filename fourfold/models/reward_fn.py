"""A user's reward function named in a config (``model.reward_fn``): ``fn(prompts, responses) -> scores``,
or ``fn(prompts, responses, answer, ...)`` / ``fn(prompts, responses, **columns)`` to see the prompts
file's other columns (:func:`column_plan`).

The boundary with the user's code: a file that does not import (a syntax error, a missing module)
or a function that cannot take two lists is one :class:`~fourfold.errors.ConfigError` line; what the
function returns is checked on every call (:func:`check_scores`: one score per response, each a
real number); an exception raised inside the user's code becomes a
:class:`~fourfold.errors.UserCodeError` that says whose code it was and keeps the original (with its
traceback) as its cause.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import numbers
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from fourfold.errors import ConfigError, UserCodeError


def load_reward_fn(spec: str, key: str = "model.reward_fn") -> Callable[..., list[float]]:
    """'package.module:function' or 'path/to/file.py:function' -> the function (``key``: the config
    key that named it, for messages), checked to take two lists first (:func:`require_two_lists`)."""
    fn = load_user_function(spec, key, "reward")
    require_two_lists(fn, spec, key)
    return fn


def require_two_lists(fn: Callable, label: str, key: str = "model.reward_fn") -> None:
    """``fn`` can be called with two lists (prompts, responses) first; its other parameters are
    the columns' (:func:`column_plan`)."""
    try:
        inspect.signature(fn).bind_partial([], [])
    except TypeError:
        raise ConfigError(f"{key}: {label} must take two lists (prompts, responses) first; "
                          f"its signature is {getattr(fn, '__name__', 'fn')}{inspect.signature(fn)}") from None
    except ValueError:  # no signature to read (a builtin): the call will tell
        pass


def load_user_function(spec: str, key: str, kind: str) -> Callable:
    """'package.module:function' or 'path/to/file.py:function' (the value of config key ``key``)
    -> the callable. A file is imported as module ``fourfold_user_<kind>_<stem>``. A malformed
    spec, a missing file, an import or syntax error, or no such callable is one ConfigError line
    naming ``key``; an exception the user's module raises while imported is a UserCodeError whose
    cause is the original. A file is executed once per process and content: loading the same file
    again (the server's column sets, a reward named twice) returns the module of the first load, as
    ``import`` does, so its import-time work (a model it loads, a counter) happens once; a changed
    file is executed anew."""
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ConfigError(f"{key}: {spec!r}: expected 'module:function' or 'file.py:function'")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise ConfigError(f"{key}: {target}: no such file")
            module = _file_module(path, kind)
        else:
            module = importlib.import_module(target)
    except ConfigError:  # ours (no such file): not the user's code
        raise
    except ImportError as e:
        raise ConfigError(f"{key}: cannot import {target!r} ({e})") from None
    except SyntaxError as e:
        raise ConfigError(f"{key}: {e.filename}:{e.lineno}: syntax error ({e.msg})") from None
    except Exception as e:  # the user's module raised while it was imported
        raise UserCodeError(f"{key}: importing {target} raised {type(e).__name__}: {_first_line(e)} "
                            "(the traceback of the user's code follows)") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"{key}: {target} has no function {name!r}")
    return fn


_FILE_MODULES: dict[tuple[str, str, str], Any] = {}
"""(kind, resolved path, sha256 of the file) -> the module executed from it (:func:`load_user_function`)."""


def _file_module(path: Path, kind: str) -> Any:
    """The module of the file ``path`` as ``fourfold_user_<kind>_<stem>``, executed the first time this
    content is loaded (an import that raises is not kept: the next load tries again)."""
    cache_key = (kind, str(path.resolve()), hashlib.sha256(path.read_bytes()).hexdigest())
    if cache_key not in _FILE_MODULES:
        mod_spec = importlib.util.spec_from_file_location(f"fourfold_user_{kind}_{path.stem}", path)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
        _FILE_MODULES[cache_key] = module
    return _FILE_MODULES[cache_key]


def _shown(value: Any, limit: int = 80) -> str:
    """``value`` as one short line: its type and (shortened) repr."""
    if value is None:
        return "None"
    text = " ".join(repr(value).split())
    return f"{type(value).__name__} {text if len(text) <= limit else text[: limit - 3] + '...'}"


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else ""


def check_scores(scores: Any, n: int, name: str, key: str = "model.reward_fn") -> list[float]:
    """``scores``, what the reward function ``name`` returned for ``n`` responses, as ``n`` floats;
    a ConfigError naming the function and what it returned when it is not a list (tuple, 1-D tensor
    or array) of ``n`` real numbers (bools count as 0/1; NaN passes: the non-finite guard reports it)."""
    expected = f"expected a list of {n} numbers, one per response"
    if hasattr(scores, "ndim") and hasattr(scores, "tolist"):  # a torch tensor or numpy array
        if scores.ndim != 1:
            raise ConfigError(f"{key}: {name} returned an array of shape {tuple(scores.shape)}; {expected}")
        if getattr(scores, "is_meta", False):
            raise ConfigError(f"{key}: {name} returned a tensor on the meta device (shapes, no values); {expected}")
        try:
            scores = scores.tolist()
        except Exception as e:  # an array that holds no readable values
            raise ConfigError(f"{key}: {name} returned a {type(scores).__name__} whose values cannot be read "
                              f"({type(e).__name__}: {_first_line(e)}); {expected}") from None
    if not isinstance(scores, (list, tuple)):
        raise ConfigError(f"{key}: {name} returned {_shown(scores)}; {expected}")
    if len(scores) != n:
        raise ConfigError(f"{key}: {name} returned {len(scores)} scores for {n} responses: {_shown(scores)}")
    for i, s in enumerate(scores):
        if not isinstance(s, numbers.Real):
            raise ConfigError(f"{key}: {name} returned {_shown(s)} as score {i}; {expected}")
    return [float(s) for s in scores]


class ColumnPlan:
    """Which of a prompts file's columns a reward function receives: ``named`` (its keyword
    parameters that are columns), ``rest`` (it takes ``**columns``: every other column too, less
    ``held``, the columns named like its first two parameters or its bound options, which the call
    gives already), and ``unused`` (the file's columns it cannot receive; said once, never dropped
    silently)."""

    def __init__(self, named: tuple[str, ...], rest: bool, unused: tuple[str, ...], held: tuple[str, ...] = ()):
        self.named, self.rest, self.unused, self.held = named, rest, unused, held

    def select(self, columns: dict[str, list]) -> dict[str, list]:
        """The keyword arguments of one call: the named columns and, with ``rest``, all of them but
        the ``held`` ones."""
        if self.rest:
            return {k: v for k, v in columns.items() if k not in self.held}
        return {k: columns[k] for k in self.named if k in columns}


def check_options(fn: Callable, spec: str, options: Sequence[str], key: str) -> None:
    """Each name of a function part's ``options`` (``key``: its config key, e.g.
    ``model.reward_fns[0].options``) must be a keyword parameter of ``fn`` after (prompts,
    responses), or ``fn`` must take ``**kwargs``: a ConfigError naming ``key.<name>`` and the
    parameters it has, before anything runs (a typo would otherwise keep the default silently and
    fail mid-run inside the user's function)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except ValueError:  # no signature to read
        return
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    first = {p.name for p in params[:2]}
    names = [p.name for p in params[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for option in options:
        if option in first:
            raise ConfigError(f"{key}.{option}: {spec}'s {option!r} is what the call passes (prompts, responses); "
                              "an option cannot set it")
        if option not in names:
            raise ConfigError(f"{key}.{option}: {spec} has no parameter {option!r} "
                              f"(its keyword parameters: {', '.join(names) or 'none'})")


def column_plan(fn: Callable, spec: str, columns: Sequence[str], source: str, key: str = "model.reward_fn",
                bound: Sequence[str] = ()) -> ColumnPlan:
    """Match ``fn``'s parameters after (prompts, responses) against ``columns``, the prompts file
    ``source``'s columns other than the prompt. A parameter without a default that is not a column
    is a ConfigError naming the function, the parameter and the file's columns; one with a default
    keeps it when the file has no such column (a warning says so); columns the function can take
    neither by name nor by ``**columns`` are listed in ``unused``. ``bound``: parameters given by
    the config (a part's ``options``), never columns."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except ValueError:  # no signature to read (a builtin): positional only
        return ColumnPlan((), False, tuple(columns))
    keyword = [p for p in params[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in bound]
    rest = any(p.kind is p.VAR_KEYWORD for p in params)
    have = ", ".join(columns) if columns else "none besides the prompt"
    for p in keyword:
        if p.name not in columns and p.default is p.empty:
            raise ConfigError(f"{key}: {spec} takes {p.name!r}, but {source} has no column {p.name!r} "
                              f"(its columns: {have})")
        if p.name not in columns:
            warnings.warn(f"{key}: {spec} takes {p.name!r} but {source} has no such column: it keeps its default "
                          f"{p.default!r}", stacklevel=2)
    named = tuple(p.name for p in keyword if p.name in columns)
    unused = () if rest else tuple(c for c in columns if c not in named)
    held = ()
    if rest:  # **columns: a column named like a parameter the call fills already would collide
        taken = {p.name for p in params[:2]} | set(bound)
        held = tuple(c for c in columns if c in taken)
    return ColumnPlan(named, rest, unused, held)


def call_reward_fn(fn: Callable, prompts: list[str], responses: list[str], name: str,
                   columns: Optional[dict[str, list]] = None, key: str = "model.reward_fn") -> list[float]:
    """``fn(prompts, responses, **columns)`` checked by :func:`check_scores` (``columns``: the
    keyword arguments :meth:`ColumnPlan.select` chose, each a list aligned with the responses); an
    exception inside ``fn`` is re-raised as a UserCodeError naming it (the original is the cause,
    traceback and all). ``key``: the config key that named the function."""
    try:
        scores = fn(prompts, responses, **(columns or {}))
    except Exception as e:
        raise UserCodeError(f"{key}: {name} raised {type(e).__name__}: {_first_line(e)} "
                            "(the traceback of the user's code follows)") from e
    return check_scores(scores, len(responses), name, key)
