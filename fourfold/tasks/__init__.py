"""fourfold.tasks: synthetic worlds with a known true quality, and their tokenizer.

- :class:`Task`: the protocol a task implements (see :mod:`fourfold.tasks.base`).
- :class:`ReviewTask` / :class:`ReviewTaskConfig`: the embedded product-review world.
- :class:`ArithmeticTask` / :class:`ArithmeticTaskConfig`: column addition whose gold is a verifier
  (its reward function: ``fourfold.tasks.arithmetic:reward``).
- :class:`LookupTask` / :class:`LookupTaskConfig`: ask a tool, then answer from its reply, a
  multi-turn world (its environment: ``fourfold.tasks.lookup:make_env``; not in the registry).
- :func:`get_task`: build a registered task by name; :func:`register_task` adds your own.
- :func:`build_word_tokenizer`: a word-level ``transformers`` tokenizer over a task's words.
- :func:`task_prompts` / :func:`task_probe`: a task as the RL trainers take it (prompts, and a probe
  logging its gold reward).

Nothing here imports torch; the tokenizer builder imports ``transformers`` only when called.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Callable

from fourfold.errors import ConfigError
from fourfold.tasks.arithmetic import ArithmeticTask, ArithmeticTaskConfig
from fourfold.tasks.base import Task, task_probe, task_prompts
from fourfold.tasks.lookup import LookupTask, LookupTaskConfig
from fourfold.tasks.review import ReviewTask, ReviewTaskConfig, has_repetition, is_well_formed
from fourfold.tasks.tokenizer import build_word_tokenizer

_REGISTRY: dict[str, Callable[..., Task]] = {"review": ReviewTask, "arithmetic": ArithmeticTask}


def register_task(name: str, factory: Callable[..., Task]) -> None:
    """Make ``get_task(name, **kwargs)`` call ``factory(**kwargs)``. Re-registering replaces."""
    _REGISTRY[name] = factory


def available_tasks() -> list[str]:
    return sorted(_REGISTRY)


def get_task(name: str, *, options_key: str = "task_options", **kwargs) -> Task:
    """Build the task registered as ``name``; ``kwargs`` go to its factory.

    For ``"review"`` they are :class:`ReviewTaskConfig` fields (or ``config=ReviewTaskConfig(...)``),
    for ``"arithmetic"`` :class:`ArithmeticTaskConfig` fields.
    A factory whose ``config`` parameter is typed with a dataclass gets that dataclass built from
    ``kwargs`` by the config loader's rules, so a misspelt option is ``task_options.x: unknown key
    (did you mean ...?)`` (``options_key``: the config key the options came from).
    """
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown task {name!r}; available: {', '.join(available_tasks())}") from None
    options = _options_class(factory)
    if options is not None and "config" not in kwargs:
        from fourfold.config.loader import build_options

        kwargs = {"config": build_options(options, kwargs, options_key)}
    try:
        return factory(**kwargs)
    except TypeError as e:
        raise ConfigError(f"task {name!r}: {e}") from None


def _options_class(factory: Callable) -> type | None:
    """The dataclass a task factory's ``config`` parameter is typed with (None when there is none)."""
    try:
        tp = typing.get_type_hints(factory.__init__ if isinstance(factory, type) else factory).get("config")
    except Exception:  # unresolvable annotations: the factory takes its kwargs as they are
        return None
    for arg in (tp, *typing.get_args(tp)):
        if dataclasses.is_dataclass(arg) and isinstance(arg, type):
            return arg
    return None


__all__ = [
    "Task",
    "ReviewTask",
    "ReviewTaskConfig",
    "ArithmeticTask",
    "ArithmeticTaskConfig",
    "LookupTask",
    "LookupTaskConfig",
    "get_task",
    "register_task",
    "available_tasks",
    "build_word_tokenizer",
    "is_well_formed",
    "has_repetition",
    "task_prompts",
    "task_probe",
]
