"""The environment interface a user writes (``env.factory``; docs/environments.md), and the boundary
with the user's code.

    def make_env(row: dict) -> env          # row: the prompts file's row, all its columns
    env.reset() -> observation              # the first observation
    env.step(action: str) -> (observation, reward: float, done: bool)

An observation is a string or a list of chat messages (``{"role": ..., "content": ...}``).
:func:`load_env_factory` reads ``env.factory`` (``file.py:make_env`` or ``module:make_env``) as
``model.reward_fn`` is read; a Python callable is used as it is. :func:`make_envs` builds one
:class:`BoundEnv` per row: it calls the user's code, checks what it returns (a wrong kind of value
is one ConfigError line naming the environment, the call and the row) and turns an exception
raised inside the user's code into a :class:`~fourfold.errors.UserCodeError` naming the
environment, the call and the row, with the user's exception (and traceback) as its cause.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Optional, Protocol, Sequence, Union

from fourfold.errors import ConfigError, UserCodeError
from fourfold.models.reward_fn import load_user_function

Message = dict[str, Any]
Observation = Union[str, list[Message]]

KEY = "env.factory"


class Environment(Protocol):
    """What ``make_env(row)`` returns (the contract of the module docstring)."""

    def reset(self) -> Observation: ...

    def step(self, action: str) -> tuple[Observation, float, bool]: ...


EnvFactory = Callable[[dict], Environment]


def load_env_factory(factory: Union[str, EnvFactory]) -> tuple[EnvFactory, str]:
    """``(make_env, name)``: ``factory`` loaded from 'file.py:make_env' / 'module:make_env' (named
    by the spec), or a callable used as it is (named by its qualified name). A spec that cannot be
    loaded is one ConfigError line naming ``env.factory``."""
    if callable(factory):
        return factory, getattr(factory, "__qualname__", repr(factory))
    if not isinstance(factory, str):
        raise ConfigError(f"{KEY}: expected 'file.py:make_env', 'module:make_env' or a callable, got {factory!r}")
    return load_user_function(factory, KEY, "env"), factory


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else ""


def _shown(value: Any, limit: int = 60) -> str:
    text = " ".join(repr(value).split())
    return f"{type(value).__name__} {text if len(text) <= limit else text[: limit - 3] + '...'}"


def check_observation(value: Any, what: str) -> Observation:
    """``value`` if it is an observation (a string, or a non-empty list of messages each a dict
    with a string ``role`` and a string ``content``); else a ConfigError saying ``what`` returned it."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value):
        return value
    raise ConfigError(f"{KEY}: {what} returned {_shown(value)}; expected an observation: a string or a list of "
                      "chat messages {'role': str, 'content': str}")


def _as_done(value: Any) -> Optional[bool]:
    """``value`` as a bool when it is one (Python's, numpy's, or the integer 0 or 1); else None."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
        return bool(value)
    return None


class BoundEnv:
    """One row's environment with the checks of the boundary: ``reset()`` and ``step(action)``
    call the user's environment and return checked values (``step``: ``(observation, reward
    float, done bool)``); ``name`` is the factory's, ``where`` the row's (``file:line``)."""

    def __init__(self, env: Any, name: str, where: str):
        self.env, self.name, self.where = env, name, where

    def _call(self, what: str, fn: Callable, *args):
        try:
            return fn(*args)
        except Exception as e:
            raise UserCodeError(f"{KEY}: {self.name}: {what} of the environment of row {self.where} raised "
                                f"{type(e).__name__}: {_first_line(e)} (the traceback of the user's code follows)") from e

    def reset(self) -> Observation:
        return check_observation(self._call("reset()", self.env.reset), f"{self.name}: reset() of row {self.where}")

    def step(self, action: str, turn: int = 0) -> tuple[Observation, float, bool]:
        what = f"step() of turn {turn}"
        out = self._call(what, self.env.step, action)
        said = f"{self.name}: {what} of row {self.where}"
        if not isinstance(out, tuple) or len(out) != 3:
            raise ConfigError(f"{KEY}: {said} returned {_shown(out)}; expected a tuple (observation, reward, done)")
        obs, reward, done = out
        obs = check_observation(obs, f"{said} (its observation)")
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
            raise ConfigError(f"{KEY}: {said} returned reward {_shown(reward)}; expected a real number")
        flag = _as_done(done)
        if flag is None:
            raise ConfigError(f"{KEY}: {said} returned done {_shown(done)}; expected a bool")
        return obs, float(reward), flag


def make_envs(factory: Union[str, EnvFactory], rows: Sequence[dict], wheres: Sequence[str]) -> list[BoundEnv]:
    """One :class:`BoundEnv` per row: ``make_env(row)`` with a copy of each row (the user's code
    cannot change the data); ``wheres[i]`` names row i in messages (``file:line``). What
    ``make_env`` raises is a UserCodeError naming the factory and the row; a returned object
    without ``reset`` and ``step`` methods is a ConfigError."""
    fn, name = load_env_factory(factory)
    envs = []
    for row, where in zip(rows, wheres):
        try:
            env = fn(dict(row))
        except Exception as e:
            raise UserCodeError(f"{KEY}: {name} raised {type(e).__name__} making the environment of row {where}: "
                                f"{_first_line(e)} (the traceback of the user's code follows)") from e
        missing = [m for m in ("reset", "step") if not callable(getattr(env, m, None))]
        if missing:
            raise ConfigError(f"{KEY}: {name} returned {_shown(env)} for row {where}, which has no "
                              f"{' and no '.join(m + '()' for m in missing)}; expected an environment")
        envs.append(BoundEnv(env, name, where))
    return envs
