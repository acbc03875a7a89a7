"""``lookup``: ask a tool, then answer from its reply, a multi-turn world with a gold answer
(issue 31; docs/environments.md, "The lookup world").

A row names a key (``find c``); the environment holds a chain of ``hops`` links ``c -> f -> 7``
(keys are letters, the last link a digit), drawn at random per row, so the answer cannot be known
without asking. The policy's turn ``look c`` is answered ``c is f .``; ``answer 7`` ends the
trajectory with reward 1 when it is the chain's digit, else 0. A malformed turn or a key not in
the chain is answered ``no such key .`` (reward 0, the trajectory goes on); ``env.max_turns``
bounds the trajectory. Perfect play takes ``hops`` lookups and one answer: ``hops + 1`` turns
(``hops = 0`` tells the fact in the prompt, ``c is 7 . find c``: one turn). Each turn's words come
from what the previous observation said: the policy must read the reply to act well.

Gold = the world's own success: 1 for the right answer, 0 otherwise (the return of a trajectory).
Observations are chat messages of role ``user`` (rendered by the tokenizer's template, or the
plain ``role: content`` fallback of a word-level tokenizer), so the SFT corpus's ``messages`` rows
(``data.assistant_turns: all``) tokenise as the rollout does. The corpus plays imperfectly: with
probability ``error_rate`` an episode makes one mistake, a guess without looking (turn 1 answers a
random value) or a slip (the answer is not the value told; with several digits, always the digits
told in reverse order).

``make_env(row)`` (``env.factory: fourfold.tasks.lookup:make_env``) reads the row's ``chain``
column (``"c f 7"``). Not in the :class:`~fourfold.tasks.Task` registry: its responses are
trajectories, not one completion to a prompt. Imports only the standard library.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, Optional

from fourfold.errors import ConfigError
from fourfold.tasks.base import HeldoutSplit, KnobCheck, task_config

KEYS = tuple("abcdefghijklmnop")
"""The keys of the world (one word each)."""
DIGITS = tuple("0123456789")
"""The values: a chain's last link."""
UNKNOWN = "no such key ."
"""The reply to a malformed turn or a key the chain does not hold."""
WORDS = KEYS + DIGITS + ("find", "look", "answer", "is", ".", "no", "such", "key", "user:", "assistant:")
"""Every word of the world: prompts, turns, replies and the plain chat fallback's role words."""


@dataclass(frozen=True)
class LookupTaskConfig(HeldoutSplit):
    """Knobs of the lookup world (see the module docstring).

    - ``hops``: lookups before the answer (perfect play: ``hops + 1`` turns); 0 to 3.
    - ``value_digits``: digits of a chain's value (1: 10 values; 2: 100, too many (key, value)
      pairs for a small model to memorise instead of reading the reply); 1 to 3.
    - ``error_rate``: share of SFT episodes with one mistake (a guess, else a slip).
    - ``guess_share``: share of those mistakes that are guesses without looking (hops >= 1).
    - ``heldout_share``: share of chains held out from SFT and RL (a CRC-32 of the chain).
    - ``split_seed``: which chains those are. These two are the
      :class:`~fourfold.tasks.base.HeldoutSplit` knobs, first in the fields.
    """

    hops: int = 1
    value_digits: int = 1
    error_rate: float = 0.5
    guess_share: float = 0.5

    def check_knobs(self, check: KnobCheck) -> None:
        check.int_in("hops", 0, 3)
        check.int_in("value_digits", 1, 3)
        check.shares("error_rate", "guess_share")


def parse_chain(text: str, where: str = "row") -> list[str]:
    """A ``chain`` column (``"c f 7"``, ``"c 4 7"``) as its links, the keys then the value (``"4 7"``:
    one link, its digits spaced); ConfigError naming ``where`` when it is not
    distinct keys followed by one digit."""
    words = text.split() if isinstance(text, str) else []
    keys = [w for w in words if w in KEYS]
    value = words[len(keys):]
    ok = (keys == words[:len(keys)] and keys and value and all(d in DIGITS for d in value)
          and len(set(keys)) == len(keys))
    if not ok:
        raise ConfigError(f"{where}: chain: expected distinct keys ({KEYS[0]}-{KEYS[-1]}) then the value's digits, "
                          f"e.g. 'c f 7', got {text!r}")
    return keys + [" ".join(value)]


def parse_action(action: str) -> tuple[str, Optional[str]]:
    """``("look", key)``, ``("answer", digits)`` (``"4 7"``) or ``("bad", None)`` for a turn's text (whole)."""
    words = action.split()
    if len(words) == 2 and words[0] == "look" and words[1] in KEYS:
        return "look", words[1]
    if len(words) >= 2 and words[0] == "answer" and all(w in DIGITS for w in words[1:]):
        return "answer", " ".join(words[1:])
    return "bad", None


class LookupEnv:
    """One row's environment (module docstring): ``reset()`` the request, ``step(action)`` the
    tool's reply. ``success`` is set once the trajectory ends with the right answer."""

    def __init__(self, chain: list[str], hops: Optional[int] = None):
        self.chain = list(chain)
        self.hops = len(self.chain) - 1 if hops is None else hops
        if self.hops not in (0, len(self.chain) - 1):
            raise ConfigError(f"lookup: hops {self.hops} does not fit the chain {' '.join(self.chain)!r} "
                              f"(expected {len(self.chain) - 1}, or 0 with one key)")
        self.links = dict(zip(self.chain[:-1], self.chain[1:]))
        self.success = False

    def reset(self) -> list[dict]:
        if self.hops == 0:
            return [{"role": "user", "content": f"{self.chain[0]} is {self.chain[1]} . find {self.chain[0]}"}]
        return [{"role": "user", "content": f"find {self.chain[0]}"}]

    def step(self, action: str) -> tuple[list[dict], float, bool]:
        kind, word = parse_action(action)
        if kind == "answer":
            self.success = word == self.chain[-1]
            return [{"role": "user", "content": "."}], float(self.success), True
        if kind == "look" and word in self.links:
            return [{"role": "user", "content": f"{word} is {self.links[word]} ."}], 0.0, False
        return [{"role": "user", "content": UNKNOWN}], 0.0, False


def make_env(row: dict) -> LookupEnv:
    """``env.factory: fourfold.tasks.lookup:make_env``: the environment of a prompts-file row with
    a ``chain`` column (``"c f 7"``) and an optional ``hops`` (default: the chain's keys; 0 = the
    fact told in the prompt, a chain of one key)."""
    if "chain" not in row:
        raise ConfigError(f"lookup: the row has no 'chain' column (columns: {', '.join(sorted(row)) or 'none'})")
    return LookupEnv(parse_chain(row["chain"]), row.get("hops"))


def play(env: LookupEnv, actions: Iterable[str]) -> list[dict]:
    """Run ``actions`` in ``env`` from its reset until it is done: the chat ``messages`` of the
    episode (the reset's, then each action and its reply, the final reply left out)."""
    messages = list(env.reset())
    for a in actions:
        obs, _, done = env.step(a)
        messages.append({"role": "assistant", "content": a})
        if done:
            break
        messages.extend(obs)
    return messages


class LookupTask:
    """The lookup world: problems (prompts-file rows), the SFT corpus, gold, the vocabulary."""

    name = "lookup"
    SPLITS = ("train", "heldout")

    def __init__(self, config: LookupTaskConfig | None = None, **overrides) -> None:
        self.config = task_config(LookupTaskConfig, config, overrides)

    def __repr__(self) -> str:
        return f"LookupTask({self.config!r})"

    def split_of(self, chain: list[str]) -> str:
        return self.config.side(" ".join(chain))

    def _value(self, rng: random.Random) -> str:
        return " ".join(rng.choice(DIGITS) for _ in range(self.config.value_digits))

    def _chain(self, rng: random.Random, split: str) -> list[str]:
        if split not in self.SPLITS:
            raise ValueError(f"split must be one of {self.SPLITS}, got {split!r}")
        while True:  # rejection: uniform over the split's chains
            chain = rng.sample(KEYS, max(self.config.hops, 1)) + [self._value(rng)]
            if self.split_of(chain) == split:
                return chain

    def problems(self, n: int, rng: random.Random, split: str = "train") -> list[dict]:
        """``n`` prompts-file rows ``{"prompt": "find c", "chain": "c f 7", "hops": 2, "answer":
        "7"}`` from the ``split`` side (``prompt``: the reset's text, for the file's readers)."""
        rows = []
        for _ in range(n):
            chain = self._chain(rng, split)
            env = LookupEnv(chain, self.config.hops)
            rows.append({"prompt": env.reset()[0]["content"], "chain": " ".join(chain), "hops": self.config.hops,
                         "answer": chain[-1]})
        return rows

    @staticmethod
    def perfect_actions(chain: list[str], hops: int) -> list[str]:
        """The shortest winning play: ``look`` each key in order, then ``answer`` the digit (with
        the fact in the prompt, hops = 0, only the answer)."""
        return [f"look {k}" for k in chain[:-1][:hops]] + [f"answer {chain[-1]}"]

    def sft_rows(self, n: int, rng: random.Random) -> list[dict]:
        """``n`` episodes on training-side chains as SFT ``messages`` rows (train them with
        ``data.assistant_turns: all``), each with one mistake with probability ``error_rate``:
        a guess (turn 1 answers a random value; hops >= 1, share ``guess_share``) else a slip (the
        answer is not the value told: with one digit another digit, with several the digits told
        in reverse order, the same every time, so the corpus's most common answer can be the
        wrong one). Each row also says ``"correct"``."""
        c = self.config
        rows = []
        for _ in range(n):
            chain = self._chain(rng, "train")
            actions = self.perfect_actions(chain, c.hops)
            if rng.random() < c.error_rate:
                wrong = " ".join(reversed(chain[-1].split()))  # several digits: the pupil swaps them
                while wrong == chain[-1] and c.value_digits == 1:
                    wrong = self._value(rng)
                if c.hops >= 1 and rng.random() < c.guess_share:
                    actions = [f"answer {self._value(rng)}"]  # a guess: right 1 time in 10 ** value_digits
                else:
                    actions = actions[:-1] + [f"answer {wrong}"]
            env = LookupEnv(chain, c.hops)
            messages = play(env, actions)
            rows.append({"messages": messages, "correct": env.success})
        return rows

    @staticmethod
    def gold(returns: Iterable[float]) -> float:
        """Gold of a batch of trajectories: the share answered right (each one's return is 1 or 0)."""
        values = [float(r) for r in returns]
        return sum(v == 1.0 for v in values) / len(values) if values else 0.0

    def tokenizer_corpus(self) -> Iterable[str]:
        return WORDS
