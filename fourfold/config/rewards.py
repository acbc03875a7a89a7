"""The reward sources of PPO, REINFORCE and `fourfold score`: a reward model (`model.reward`), reward
functions (`model.reward_fn`, `model.reward_fns`) and a reward server (`model.reward_url`), one or
several; the score is the weighted sum of the parts (docs/rewards.md).

:class:`RewardFnConfig` is one entry of `model.reward_fns`; :func:`require_rewards` checks a model
section's sources (at least one, names distinct, the server's keys); :func:`reward_part_names` is
the one rule for the parts' names (the reward model's is ``rm``, the server's ``remote``, a
function's its own name), which the role plan and the logged ``reward/<name>_mean`` read.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, NamedTuple, Optional, Union

from fourfold.config.loader import require, validate_tree

MODEL_PART, REMOTE_PART, ENV_PART = "rm", "remote", "env"
"""The names of the reward model's part, the reward server's part and an environment's (its turns'
rewards, with ``env.factory``: ``reward/env_mean``)."""

RESERVED_PART_NAMES = ("score", "gold", "token_reward_sum")
"""Names a part cannot take: ``reward/<name>_mean`` would be another metric's name."""

_NAME = re.compile(r"[a-z_][a-z0-9_]*")


@dataclasses.dataclass
class RewardFnConfig:
    """One reward function of `model.reward_fns`: its scores, times `weight`, are one part of the score."""

    fn: Union[str, Callable, None] = None
    """'module:function' or 'path/to/file.py:function' (in Python also the function itself), called as
    fn(prompts, responses, **columns) -> list[float]: keyword parameters named after the prompts
    file's other columns (or `**columns`) get those columns, one value per response."""
    weight: float = 1.0
    """The part's weight in the score (negative: a penalty; 0: logged only)."""
    name: Optional[str] = None
    """The part's name in the logs (reward/<name>_mean) and the samples; null = the function's name."""
    options: dict = dataclasses.field(default_factory=dict)
    """Keyword arguments bound to the function (functools.partial) before it is called, e.g.
    {per_word: 0.5} for fn(prompts, responses, per_word=1.0); never columns; {} = none. (A factory
    such as fourfold.rewards.length_penalty(50) is called in Python and its function given as fn.)"""

    def validate(self, prefix: str = "model.reward_fns[0]") -> None:
        require(self.fn is not None, f"{prefix}.fn", "missing: 'module:function' or 'path/to/file.py:function'")
        require(not isinstance(self.fn, str) or ":" in self.fn.strip(":"), f"{prefix}.fn",
                f"expected 'module:function' or 'file.py:function', got {self.fn!r}")
        require(all(isinstance(k, str) for k in self.options), f"{prefix}.options",
                "expected a mapping of keyword names to values")


def function_name(fn) -> Optional[str]:
    """The name a function part takes by default: what follows the colon of 'module:function', else
    the callable's ``__name__`` (a functools.partial's function's); None when it has none usable."""
    if isinstance(fn, str):
        return fn.rpartition(":")[2] or None
    inner = getattr(fn, "func", fn)  # a functools.partial
    name = getattr(inner, "__name__", None)
    return name if isinstance(name, str) and _NAME.fullmatch(name) else None


@dataclasses.dataclass
class RewardSourcesConfig:
    """The reward sources of a model section, written once: PPO's and REINFORCE's `model`
    (:class:`~fourfold.config.ppo.LMModelConfig`), `fourfold score`'s `model` and `fourfold bon`'s
    `scorer` (:class:`~fourfold.config.inference.ScoreModelConfig`) all take these keys. Set one or
    several; the score is the weighted sum of the parts (:func:`reward_sources`, in this order)."""

    reward: Optional[str] = None
    """Reward-model directory (written by `fourfold reward`, or a 1-label sequence classifier)."""
    reward_weight: float = 1.0
    """The reward model's weight in the score when other parts are set (its part is logged as
    reward/rm_mean)."""
    reward_fn: Union[str, Callable, None] = None
    """A reward function, alone or beside the reward model: 'module:function' or
    'path/to/file.py:function' (in Python also the function itself), called as fn(prompts: list[str],
    responses: list[str], **columns) -> list[float]; keyword parameters named after the prompts file's
    other columns get them (docs/rewards.md). Weight 1; for weights or several use reward_fns."""
    reward_fns: list[RewardFnConfig] = dataclasses.field(default_factory=list)
    """Several weighted reward functions: [{fn: 'file.py:name', weight: 1.0, name: null, options: {}}]
    (fourfold.config.RewardFnConfig); the score is the weighted sum of every part (reward model,
    functions, server), each logged as reward/<name>_mean. Not with reward_fn."""
    reward_url: Optional[str] = None
    """A reward server's base URL, http://host:port (fourfold serve-reward): it gets the prompts,
    the responses and the prompts file's columns and answers the scores; its part is 'remote'."""
    reward_url_weight: float = 1.0
    """The server's weight in the score when other parts are set."""
    reward_timeout_s: float = 60.0
    """Seconds one request to reward_url may take before it is tried again."""
    reward_retries: int = 3
    """Tries after the first when a request to reward_url fails (no connection, a timeout, a 5xx
    answer); then the run stops with one line naming the URL and its last checkpoint."""
    reward_backoff_s: float = 1.0
    """The wait before the first retry, doubled before each next one."""


MODEL_KIND, FUNCTION_KIND, REMOTE_KIND = "model", "function", "remote"
"""Kinds of reward source: the reward model (the reward role's model), a function, a reward server."""


class RewardSource(NamedTuple):
    """One source of a model section's score: ``weight`` x the scores of a reward model, a function
    or a server, as :func:`reward_sources` reads it from the config (the plan's
    :func:`~fourfold.models.plan.reward_parts` are these)."""

    name: Optional[str]
    """Its name in the logs (``reward/<name>_mean``) and the samples (``rm``, ``remote``, a
    function's); None for an unnamed function (refused when the score is a weighted sum)."""
    kind: str
    """MODEL_KIND, FUNCTION_KIND or REMOTE_KIND."""
    source: Any
    """A model directory, 'module:function' or the function itself, or the server's URL."""
    key: str
    """The config key that names it, for messages (``model.reward_fns[1].fn``)."""
    weight: float = 1.0
    options: tuple = ()
    """``(name, value)`` pairs bound to a function (``model.reward_fns[i].options``)."""
    settings: tuple = ()
    """``(name, value)`` pairs of a server's client (timeout_s, retries, backoff_s)."""

    @property
    def entry(self) -> str:
        """The key of the whole entry (``model.reward_fns[1]``, not its ``.fn``)."""
        return self.key[:-len(".fn")] if self.key.endswith("].fn") else self.key


def reward_sources(model, prefix: str = "model") -> list[RewardSource]:
    """THE list of a model section's reward sources, in the order the score sums them: the reward
    model (``rm``), `reward_fn` or each `reward_fns` entry (its `name`, else its function's), the
    server (``remote``). The parts' names, the weighted-sum rule and the run's plan all read it."""
    out = []
    if model.reward is not None:
        out.append(RewardSource(MODEL_PART, MODEL_KIND, model.reward, f"{prefix}.reward", float(model.reward_weight)))
    if model.reward_fn is not None:
        out.append(RewardSource(function_name(model.reward_fn) or "reward_fn", FUNCTION_KIND, model.reward_fn,
                                f"{prefix}.reward_fn"))
    for i, entry in enumerate(model.reward_fns):
        out.append(RewardSource(entry.name or function_name(entry.fn), FUNCTION_KIND, entry.fn,
                                f"{prefix}.reward_fns[{i}].fn", float(entry.weight),
                                tuple(sorted(entry.options.items()))))
    if model.reward_url is not None:
        settings = (("timeout_s", float(model.reward_timeout_s)), ("retries", int(model.reward_retries)),
                    ("backoff_s", float(model.reward_backoff_s)))
        out.append(RewardSource(REMOTE_PART, REMOTE_KIND, model.reward_url, f"{prefix}.reward_url",
                                float(model.reward_url_weight), settings=settings))
    return out


def reward_part_names(model, prefix: str = "model") -> list[tuple[str, str]]:
    """``(name, config key)`` of each reward source (:func:`reward_sources`), the key naming the
    whole entry (``model.reward_fns[1]``)."""
    return [(s.name, s.entry) for s in reward_sources(model, prefix)]


def require_rewards(model, prefix: str = "model") -> None:
    """At least one reward source in the model section of PPO, REINFORCE or `fourfold score`; each
    `reward_fns` entry checked (``model.reward_fns[i].key``); `reward_fn`, the one-function form, is
    neither beside `reward` (a placeholder reward model left in an example is the usual cause; a
    function beside a reward model goes in `reward_fns`) nor beside `reward_fns`; with several
    parts (or a weight), each logged, every part's name usable and its own;
    the server's URL and settings."""
    for i, entry in enumerate(model.reward_fns):
        where = f"{prefix}.reward_fns[{i}]"
        require(isinstance(entry, RewardFnConfig), where, f"expected a mapping with fn, weight, name, options; got {entry!r}")
        validate_tree(entry, where)
    require(model.reward is None or model.reward_fn is None, f"{prefix}.reward",
            f"{prefix}.reward (a reward-model directory) and {prefix}.reward_fn are both set; keep one "
            f"({prefix}.reward=null to score with the reward_fn)")
    require(model.reward_fn is None or not model.reward_fns, f"{prefix}.reward_fn",
            f"set, and so is {prefix}.reward_fns: list the function in {prefix}.reward_fns (with its weight) instead")
    server = f", {prefix}.reward_fns or {prefix}.reward_url"
    require(bool(reward_part_names(model, prefix)), f"{prefix}.reward",
            f"no reward: set {prefix}.reward (a reward-model directory), {prefix}.reward_fn{server}")
    seen: dict[str, str] = {}
    for name, key in reward_part_names(model, prefix) if weighted(model) else ():  # one source: no part logged
        field = key + (".name" if "[" in key else "")
        require(name is not None, field, "the function has no usable name (a lambda?): set its name")
        require(bool(_NAME.fullmatch(name)), field, f"{name!r}: a part's name (in reward/<name>_mean) is lower-case letters, digits and _")
        require(name not in RESERVED_PART_NAMES, field,
                f"{name!r}: reward/{name}_mean is another metric's name; give the part another name")
        require(name not in seen, field, f"{name!r} is already the name of {seen.get(name)}; give each part its own name")
        seen[name] = key
    require(model.reward_weight == 1.0 or model.reward is not None, f"{prefix}.reward_weight",
            f"set, but {prefix}.reward is null (no reward model to weigh)")
    url = model.reward_url
    require(url is None or url.startswith(("http://", "https://")), f"{prefix}.reward_url",
            f"expected http://host:port of a reward server (fourfold serve-reward), got {url!r}")
    require(model.reward_timeout_s > 0, f"{prefix}.reward_timeout_s", f"must be > 0, got {model.reward_timeout_s}")
    require(model.reward_retries >= 0, f"{prefix}.reward_retries", f"must be >= 0, got {model.reward_retries}")
    require(model.reward_backoff_s >= 0, f"{prefix}.reward_backoff_s", f"must be >= 0, got {model.reward_backoff_s}")
    require(model.reward_url_weight == 1.0 or url is not None, f"{prefix}.reward_url_weight",
            f"set, but {prefix}.reward_url is null")


def is_weighted_sum(weights) -> bool:
    """THE rule: more than one part, or one whose weight is not 1, makes the score a weighted sum
    whose parts are logged; one part of weight 1 is the reward role itself, as it always was."""
    weights = list(weights)
    return len(weights) > 1 or any(w != 1.0 for w in weights)


def weighted(model) -> bool:
    """:func:`is_weighted_sum` of a model section's sources."""
    return is_weighted_sum(s.weight for s in reward_sources(model))
