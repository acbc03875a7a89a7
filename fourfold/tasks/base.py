"""The ``Task`` protocol: everything the RLHF pipeline needs to know about a task's world.

A task is a small, self-contained world in which the *true* quality of a response is known. The
pipeline uses it in four places:

1. **SFT**: :meth:`Task.sft_examples` gives demonstrations (prompt, completion) to imitate.
2. **Preference labelling**: :meth:`Task.label_pairs` plays the human labelers who compare two
   responses to the same prompt. Their labels train the reward model. Labelers may be noisy and
   biased (that is the point: the reward model learns their flaws).
3. **Rollouts**: :meth:`Task.sample_prompts` gives the prompts that the policy answers during PPO.
4. **Evaluation**: :meth:`Task.gold_reward` is the hidden "true" quality, which no model ever
   trains on; comparing it with the reward model's score shows whether RLHF worked or whether the
   policy learned to exploit the reward model (reward hacking). :meth:`Task.response_metrics`
   summarises a batch of responses for logging.

Conventions shared by every method:

- Texts are plain strings of words separated by single spaces. A *response* is the text that
  follows the prompt (the completion), *without* any end-of-sequence token. The full text of an
  example is ``prompt + " " + response``.
- Every method that draws randomness takes a :class:`random.Random` and uses only that, so results
  are deterministic given the generator's state. No global random state is touched.
- Batched methods take parallel lists (``prompts[i]`` goes with ``responses[i]``) and return one
  value per item.

To add your own task, write a class with these attributes and methods (no base class needed: the
protocol is structural) and register it with :func:`fourfold.tasks.register_task`.

The RL trainers never see a task: :func:`task_prompts` and :func:`task_probe` turn one into what
they take (prompts, and a probe that logs the gold reward); the CLI and the demo use both.
"""
from __future__ import annotations

import dataclasses
import random
import zlib
from typing import Any, Callable, Iterable, Optional, Protocol, TypeVar, runtime_checkable

from fourfold.errors import ConfigError

C = TypeVar("C")


@runtime_checkable
class Task(Protocol):
    """A synthetic world with a known true quality function. See the module docstring."""

    #: Short registry name, e.g. ``"review"``.
    name: str

    def sample_prompts(self, n: int, rng: random.Random) -> list[str]:
        """Return ``n`` prompts drawn from the task's prompt distribution."""
        ...

    def sft_examples(self, n: int, rng: random.Random) -> list[dict]:
        """Return ``n`` demonstrations ``{"prompt": str, "completion": str}``.

        ``completion`` is the response text without the end-of-sequence token; the SFT code appends
        the tokenizer's eos token itself.
        """
        ...

    def gold_reward(self, prompts: list[str], responses: list[str]) -> list[float]:
        """The hidden true quality of each response to its prompt (higher is better).

        Never used for training; only for evaluation and for simulating labelers.
        """
        ...

    def label_pairs(self, prompts: list[str], responses_a: list[str], responses_b: list[str], rng: random.Random) -> list[int]:
        """Simulated labelers' choices: ``0`` where ``responses_a[i]`` is preferred, else ``1``."""
        ...

    def response_metrics(self, prompts: list[str], responses: list[str]) -> dict[str, float]:
        """Summary statistics of a batch of responses, for logging.

        Must contain at least:

        - ``"length"``: mean number of words (whitespace-separated tokens) per response;
        - ``"well_formed"``: share of responses that are well formed for the task;
        - ``"repetition"``: share of responses containing an immediate repetition of a word or
          phrase (``"great great"``, ``"it is good . it is good ."``);
        - ``"gold"``: mean gold reward.

        An empty batch returns ``0.0`` for every key.
        """
        ...

    def tokenizer_corpus(self) -> Iterable[str]:
        """Every word the task can produce (prompts and responses), for building the vocabulary."""
        ...


def task_config(cls: type[C], config: Optional[C], overrides: dict[str, Any]) -> C:
    """A task's config from its constructor's arguments: ``config`` (``cls()`` when None) with the
    keyword ``overrides`` over it (each task's ``__init__(config=None, **overrides)``)."""
    if config is None:
        return cls(**overrides)
    return dataclasses.replace(config, **overrides) if overrides else config


class KnobCheck:
    """The checks of a task config's knobs (its ``__post_init__``), each failure one ConfigError
    '<ConfigClass>.<key>: <why>'."""

    def __init__(self, config: Any):
        self.config, self.name = config, type(config).__name__

    def bad(self, key: str, why: str) -> None:
        raise ConfigError(f"{self.name}.{key}: {why}")

    def int_in(self, key: str, lo: int, hi: int) -> None:
        """``key`` an int (not a bool) in [lo, hi]."""
        v = getattr(self.config, key)
        if not (isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi):
            self.bad(key, f"must be an int in [{lo}, {hi}], got {v!r}")

    def shares(self, *keys: str) -> None:
        """Each of ``keys`` a share in [0, 1]."""
        for key in keys:
            if not 0.0 <= getattr(self.config, key) <= 1.0:
                self.bad(key, f"must be in [0, 1], got {getattr(self.config, key)}")

    def open_share(self, key: str) -> None:
        """``key`` a share in (0, 1) (a held-out share: neither side empty)."""
        if not 0.0 < getattr(self.config, key) < 1.0:
            self.bad(key, f"must be in (0, 1), got {getattr(self.config, key)}")


@dataclasses.dataclass(frozen=True)
class HeldoutSplit:
    """The knobs of a world's held-out split, and the split itself, the same in every world with one
    (arithmetic, lookup): a share ``heldout_share`` of the world's items (problem pairs, chains) is
    held out from SFT and RL, which ones decided by a CRC-32 of the item's text and ``split_seed``.

    A world's config subclasses it (these two knobs, then its own) and checks its own knobs in
    :meth:`check_knobs`; ``heldout_share`` is checked after them, a share in (0, 1).
    """

    heldout_share: float = 0.2
    split_seed: int = 0

    def __post_init__(self) -> None:
        check = KnobCheck(self)
        self.check_knobs(check)
        check.open_share("heldout_share")

    def check_knobs(self, check: KnobCheck) -> None:
        """The subclass's own knobs' checks (none here)."""

    def side(self, item: str) -> str:
        """``"train"`` or ``"heldout"``: the side of the item whose text is ``item``."""
        key = f"{self.split_seed}:{item}".encode()
        return "heldout" if zlib.crc32(key) / 2**32 < self.heldout_share else "train"


def task_prompts(task: Task, batch_size: int, seed: int) -> list[str]:
    """The prompts a PPO or REINFORCE run trains on when it names a task but no prompts file:
    ``max(512, 4 * batch_size)`` of the task's prompts, drawn with ``random.Random(seed + 7919)``."""
    return task.sample_prompts(max(512, 4 * batch_size), random.Random(seed + 7919))


def task_probe(task: Task) -> Callable[[list[str], list[str]], dict[str, float]]:
    """A trainer's probe for ``task``: ``probe(prompts, responses)`` returns the responses' mean
    hidden gold reward as ``{"reward/gold_mean": value}`` (logged, never trained on);
    ``probe.per_response(prompts, responses)`` gives each response's ``{"gold": [...]}`` for the
    sample completions."""

    def probe(prompts: list[str], responses: list[str]) -> dict[str, float]:
        gold = task.gold_reward(prompts, responses)
        return {"reward/gold_mean": float(sum(gold) / len(gold))}

    probe.per_response = lambda prompts, responses: {"gold": task.gold_reward(prompts, responses)}
    return probe
