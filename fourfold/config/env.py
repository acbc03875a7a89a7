"""The ``env`` section: a multi-turn environment the policy acts in (docs/environments.md).

A section of ``fourfold ppo`` and ``fourfold reinforce`` (``RolloutStageConfig.env``): with
``factory`` set, their loops roll out against one environment per prompts-file row (K per row with
``ppo.samples_per_prompt``) instead of scoring single responses. Imports only the standard library.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

from fourfold.config.loader import require
from fourfold.names import TRUNCATION_MODES  # env.truncation's values, written once there


@dataclasses.dataclass
class EnvConfig:
    """A multi-turn environment: ``make_env(row)`` per prompts-file row, then turns of the policy's
    text and the environment's answers until it is done or a limit cuts the trajectory."""

    factory: Optional[str] = None
    """'path/to/file.py:make_env' or 'package.module:make_env': called with each prompts-file row
    (a dict of all its columns), it returns an environment with reset() -> the first observation
    (a string, or chat messages) and step(action: str) -> (observation, reward: float, done: bool).
    null = no environment (one response per prompt, scored by the reward model or reward_fn)."""
    max_turns: int = 4
    """The most policy turns of one trajectory; a trajectory still running after this many is
    truncated (see truncation)."""
    max_tokens: int = 256
    """The most tokens of one whole trajectory: the first observation, every policy turn and every
    later observation. A turn is cut where the budget ends, and the trajectory is truncated."""
    stop: list[str] = dataclasses.field(default_factory=list)
    """Strings that end a policy turn as soon as its text ends with one of them (kept in the
    action); a turn always ends at EOS and after generation.max_new_tokens tokens. [] = EOS only."""
    truncation: Literal[TRUNCATION_MODES] = "bootstrap"
    """A trajectory cut by max_turns or max_tokens did not end. 'bootstrap': its last policy token
    bootstraps with the critic's value of the state it was cut in (without a critic there is none:
    the same as terminal). 'terminal': with 0, as if the environment had said done."""
    observation_role: Optional[str] = None
    """How a string observation enters the trajectory: null = as text, tokenised on its own; a role
    ('user', 'tool') = as one chat message of that role, through the tokenizer's chat template
    (observations given as message lists always go through it)."""

    reward_weight: float = 1.0
    """The environment's part of the score: each turn's reward times this weight (logged as
    reward/env_mean, unweighted). With model.reward, reward_fn(s) or reward_url beside env.factory the
    score is this part plus theirs, weighted, on the trajectory's last policy token; the environment
    alone with weight 1 is its plain returns."""

    def policy_token_budget(self, max_new_tokens: int) -> int:
        """The most policy tokens one trajectory can hold: ``max_new_tokens`` (the generation's, per
        turn) over ``max_turns`` turns, never more than ``max_tokens`` (the whole trajectory's). DAPO's
        overlong punishment (ppo.overlong_buffer) measures an environment run's lengths against it."""
        return min(max_new_tokens * self.max_turns, self.max_tokens)

    def validate(self, prefix: str = "env") -> None:
        if self.factory is not None:
            target, _, name = self.factory.rpartition(":")
            require(bool(target) and bool(name), f"{prefix}.factory",
                    f"{self.factory!r}: expected 'file.py:make_env' or 'module:make_env'")
        require(self.max_turns >= 1, f"{prefix}.max_turns", f"must be >= 1, got {self.max_turns}")
        require(self.max_tokens >= 2, f"{prefix}.max_tokens", f"must be >= 2, got {self.max_tokens}")
        for i, s in enumerate(self.stop):
            require(isinstance(s, str) and s != "", f"{prefix}.stop[{i}]", f"must be a non-empty string, got {s!r}")
        require(self.observation_role is None or self.observation_role.strip() != "", f"{prefix}.observation_role",
                "must be a role name such as 'user' or 'tool', or null")
