"""The reward role of a run from its plan's reward parts (:class:`~fourfold.config.rewards.RewardSource`):
the reward model's role, each function (loaded, its ``options`` bound, its columns matched against
the prompts file's: :func:`~fourfold.models.reward_fn.column_plan`) and the server's client
(:class:`~fourfold.models.remote.RemoteReward`); one part of weight 1 is the role itself, several
(or a weight) a :class:`~fourfold.models.roles.WeightedReward` (docs/rewards.md).

:func:`load_functions` is what a run calls before any model loads (a named column the file lacks
is one line there); :func:`reward_role` puts the parts together when the roles are built.
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence

from fourfold.config.loader import callable_label
from fourfold.config.rewards import RewardSource as RewardPart
from fourfold.models.plan import FUNCTION_PART, MODEL, REMOTE, is_weighted
from fourfold.models.remote import RemoteReward
from fourfold.models.reward_fn import check_options, column_plan, load_reward_fn, require_two_lists
from fourfold.models.roles import FunctionReward, WeightedReward


def function_label(part: RewardPart) -> str:
    """How messages call a function part: its 'module:function', or ``python:<module>.<name>``."""
    return part.source if isinstance(part.source, str) else callable_label(part.source)


def load_function(part: RewardPart, columns: Sequence[str] = (), source: str = "prompts") -> FunctionReward:
    """The role of a function part: the function (imported, or the callable itself) with its
    ``options`` bound, and the plan of which of ``columns`` (the prompts file ``source``'s) it
    receives; a parameter that is no column and has no default is a ConfigError naming ``part.key``."""
    label = function_label(part)
    fn = load_reward_fn(part.source, part.key) if isinstance(part.source, str) else part.source
    if not isinstance(part.source, str):
        require_two_lists(fn, label, part.key)
    options = dict(part.options)
    check_options(fn, label, tuple(options), part.key.rpartition(".")[0] + ".options")
    plan = column_plan(fn, label, columns, source, key=part.key, bound=tuple(options))
    if options:
        fn = functools.partial(fn, **options)
    return FunctionReward(fn, name=label, plan=plan, key=part.key)


def load_functions(parts: Sequence[RewardPart], columns: Sequence[str] = (), source: str = "prompts"
                   ) -> tuple[dict[str, FunctionReward], list[str]]:
    """Every function part loaded (:func:`load_function`), by name, and one warning line per
    function that cannot receive some of the columns (never dropped without a word)."""
    functions, notes = {}, []
    for part in parts:
        if part.kind != FUNCTION_PART:
            continue
        role = functions[part.name] = load_function(part, columns, source)
        if role.plan.unused:
            notes.append(f"{part.key}: {role.name} does not take the column(s) {', '.join(role.plan.unused)} of "
                         f"{source}: name them as keyword parameters (or take **columns) to receive them")
        if role.plan.held:  # refusing the file would be harsher than the collision deserves: leave them out, say so
            notes.append(f"{part.key}: {role.name} takes **columns, and {source} has the column(s) "
                         f"{', '.join(role.plan.held)}, named like what the call passes already (prompts, responses "
                         "or an option): they are left out of its columns")
    return functions, notes


def reward_role(parts: Sequence[RewardPart], *, model_role=None, functions: Optional[dict] = None,
                eos_token_id: Optional[int] = None, tokenizer=None):
    """The run's reward role: the one part itself when :func:`~fourfold.models.plan.is_weighted`
    says no (``model_role``: the reward model's, already built), else a WeightedReward of them all
    in order. ``functions``: the function parts' roles from :func:`load_functions` (loaded here
    without columns when not given); ``eos_token_id``: the policy's, for a server's ``finished``;
    ``tokenizer``: the run's, whose ids a server with the same tokenizer scores
    (:class:`~fourfold.models.remote.RemoteReward`)."""
    functions = dict(functions) if functions is not None else load_functions(parts)[0]
    roles = []
    for part in parts:
        if part.kind == MODEL:
            role = model_role
        elif part.kind == FUNCTION_PART:
            role = functions[part.name]
        elif part.kind == REMOTE:
            role = RemoteReward(part.source, eos_token_id=eos_token_id, tokenizer=tokenizer, **dict(part.settings))
        else:
            raise ValueError(f"reward_role: no reward part of kind {part.kind!r}")
        roles.append((part.name, role, part.weight))
    if not is_weighted(tuple(parts)):
        return roles[0][1]
    return WeightedReward(roles)
