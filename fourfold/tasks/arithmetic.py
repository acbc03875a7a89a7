"""``arithmetic``: column addition whose gold is a verifier, for RL from verifiable rewards (RLVR).

The world, its text, its split, its SFT corpus, its reward and the measured learnability:
docs/arithmetic.md.
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from fourfold.rewards import final_answer, normalize_answer
from fourfold.tasks.base import HeldoutSplit, KnobCheck, task_config

MARKER = "answer :"
"""What precedes the final answer; :func:`fourfold.rewards.final_answer` reads what follows it."""
FORMAT = re.compile(r"(?:\d \+ \d(?: \+ 1)? = \d(?: \d)? , )+answer : \d(?: \d)*")
"""A well-formed response, whole: column steps ``x + y [+ 1] = s ,``, then ``answer : <digits>``."""
_PROMPT = re.compile(r"what is (\d(?: \d)*) \+ (\d(?: \d)*) \?")
_DIGITS = re.compile(r"\d(?: \d)*")
_MARKED = re.compile(r"(?i)\banswer\s*:")
WORDS = tuple("0123456789") + ("+", "=", ",", ":", "answer", "what", "is", "?")
"""Every word of the world (prompts and responses)."""


@dataclass(frozen=True)
class ArithmeticTaskConfig(HeldoutSplit):
    """Knobs of the arithmetic world (see the module docstring).

    - ``digits``: digits of each operand (2: ``10 + 10`` to ``99 + 99``).
    - ``error_rate``: share of SFT demonstrations with one mistake (a dropped carry, else a slip).
    - ``heldout_share``: share of the (unordered) problem pairs held out from SFT and RL.
    - ``split_seed``: which pairs those are (the split is a CRC-32 of the pair and this seed).
      These two are the :class:`~fourfold.tasks.base.HeldoutSplit` knobs, first in the fields.
    - ``labeler_noise``: probability that a simulated label is a fair coin flip.
    """

    digits: int = 2
    error_rate: float = 0.6
    labeler_noise: float = 0.1

    def check_knobs(self, check: KnobCheck) -> None:
        check.int_in("digits", 1, 6)
        check.shares("error_rate", "labeler_noise")


# ---------------------------------------------------------------------------------------------
# text: numbers as digit words, the worked solution, reading the answer back
# ---------------------------------------------------------------------------------------------


def spell(n: int) -> str:
    """``125`` -> ``"1 2 5"``."""
    return " ".join(str(n))


def prompt_of(a: int, b: int) -> str:
    return f"what is {spell(a)} + {spell(b)} ?"


def parse_prompt(prompt: str) -> Optional[tuple[int, int]]:
    """``(a, b)`` of a prompt written by :func:`prompt_of` (anywhere in the text, the last one:
    a chat template's text around it is ignored); None when there is none."""
    found = _PROMPT.findall(prompt)
    if not found:
        return None
    a, b = found[-1]
    return int(a.replace(" ", "")), int(b.replace(" ", ""))


def read_answer(response: str) -> Optional[str]:
    """The response's final answer in normal form (``"125"``): what
    :func:`fourfold.rewards.final_answer` finds after the last ``answer :``, when it is digit
    words only, joined and normalised (:func:`fourfold.rewards.normalize_answer`); None without
    the marker or with anything else after it."""
    marks = list(_MARKED.finditer(response))
    if not marks:
        return None
    got = final_answer(response[marks[-1].start():])  # on one line final_answer would read from the first
    if got is None or not _DIGITS.fullmatch(got):
        return None
    return normalize_answer(got.replace(" ", ""))


def is_well_formed(response: str) -> bool:
    """Whether the whole response is column steps then ``answer : <digits>`` (:data:`FORMAT`)."""
    return FORMAT.fullmatch(response.strip()) is not None


def has_repetition(prompt: str, response: str) -> bool:
    """Whether the response says more column steps (``x + y ... =``) than its problem has columns:
    a step said again, or one made up (``2 2 + 5 5`` is rightly ``2 + 5 = 7 , 2 + 5 = 7``)."""
    pair = parse_prompt(prompt)
    columns = len(str(max(pair))) if pair else 0
    return len(re.findall(r"(?:^|,)\s*\d \+ \d", response)) > columns


def carry_columns(a: int, b: int) -> list[int]:
    """The columns (0 = units) that receive a carry in ``a + b``."""
    out, carry, i = [], 0, 0
    while a or b:
        if carry:
            out.append(i)
        carry = (a % 10 + b % 10 + carry) // 10
        a, b, i = a // 10, b // 10, i + 1
    return out  # a carry out of the last column is the answer's leading digit: nothing to forget


def worked(a: int, b: int, drop: Optional[int] = None, slip: Optional[tuple[int, int]] = None) -> tuple[str, int]:
    """The worked solution of ``a + b`` (operands of the same number of digits) and the answer it
    reaches; ``drop``: the column whose incoming carry the pupil forgets; ``slip``: ``(column,
    +1 or -1)``, a column sum the pupil gets one off. The carry out of each column is what the
    pupil wrote, so a mistake propagates as it would on paper."""
    xs, ys = [int(c) for c in reversed(str(a))], [int(c) for c in reversed(str(b))]
    steps, out, carry = [], [], 0
    for i, (x, y) in enumerate(zip(xs, ys)):
        plus = carry and drop != i
        s = x + y + (1 if plus else 0)
        if slip is not None and slip[0] == i:
            s += slip[1]
        steps.append(f"{x} + {y}{' + 1' if plus else ''} = {spell(s)}")
        out.append(s % 10)
        carry = s // 10
    answer = int("".join(str(d) for d in reversed(out))) + carry * 10 ** len(out)
    return " , ".join(steps) + f" , {MARKER} {spell(answer)}", answer


# ---------------------------------------------------------------------------------------------
# the task
# ---------------------------------------------------------------------------------------------


class ArithmeticTask:
    """The column-addition world. See the module docstring."""

    name = "arithmetic"
    SPLITS = ("train", "heldout")

    def __init__(self, config: ArithmeticTaskConfig | None = None, **overrides) -> None:
        self.config = config = task_config(ArithmeticTaskConfig, config, overrides)
        self.low, self.high = 10 ** (config.digits - 1), 10 ** config.digits  # operands in [low, high)
        if config.digits == 1:
            self.low = 0

    def __repr__(self) -> str:
        return f"ArithmeticTask({self.config!r})"

    # ---- problems and the split --------------------------------------------------------------

    def split_of(self, a: int, b: int) -> str:
        """``"train"`` or ``"heldout"``: the side of the unordered pair ``{a, b}``."""
        return self.config.side(f"{min(a, b)}+{max(a, b)}")

    def _pair(self, rng: random.Random, split: str) -> tuple[int, int]:
        if split not in self.SPLITS:
            raise ValueError(f"split must be one of {self.SPLITS}, got {split!r}")
        while True:  # rejection: uniform over the split's ordered pairs
            a, b = rng.randrange(self.low, self.high), rng.randrange(self.low, self.high)
            if self.split_of(a, b) == split:
                return a, b

    def problems(self, n: int, rng: random.Random, split: str = "train") -> list[dict]:
        """``n`` rows ``{"prompt": "what is 6 7 + 5 8 ?", "answer": "125"}`` drawn uniformly from
        the ``split`` side (``"train"`` or ``"heldout"``): a prompts file with an answer column."""
        return [{"prompt": prompt_of(a, b), "answer": str(a + b)} for a, b in (self._pair(rng, split) for _ in range(n))]

    @staticmethod
    def reads_prompt(prompt: str) -> bool:
        """Whether ``prompt`` is a sum of this world's (:func:`parse_prompt` reads it)."""
        return parse_prompt(prompt) is not None

    def sample_prompts(self, n: int, rng: random.Random) -> list[str]:
        """Training-side prompts (the held-out problems never appear)."""
        return [row["prompt"] for row in self.problems(n, rng)]

    def sft_examples(self, n: int, rng: random.Random) -> list[dict]:
        """``n`` worked solutions to training-side problems, each wrong with probability
        ``error_rate`` (see the module docstring); each row also says ``"correct"`` (a bool)."""
        out = []
        for _ in range(n):
            a, b = self._pair(rng, "train")
            drop = slip = None
            if rng.random() < self.config.error_rate:
                carries = carry_columns(a, b)
                if carries:
                    drop = carries[rng.randrange(len(carries))]
                else:
                    col = rng.randrange(self.config.digits)
                    s = (a // 10**col) % 10 + (b // 10**col) % 10
                    slip = (col, 1 if s == 0 else rng.choice((-1, 1)))
            text, answer = worked(a, b, drop, slip)
            out.append({"prompt": prompt_of(a, b), "completion": text, "correct": answer == a + b})
        return out

    # ---- the verifier --------------------------------------------------------------------------

    @staticmethod
    def expected(prompt: str) -> str:
        """The right answer to ``prompt``, worked out from its text; ValueError when it is not a
        problem of this world."""
        pair = parse_prompt(prompt)
        if pair is None:
            raise ValueError(f"not an arithmetic prompt ('what is A + B ?'): {prompt[:80]!r}")
        return str(pair[0] + pair[1])

    def gold_reward(self, prompts: list[str], responses: list[str]) -> list[float]:
        _check_parallel(prompts, responses)
        return [1.0 if read_answer(r) == self.expected(p) else 0.0 for p, r in zip(prompts, responses)]

    def label_pairs(self, prompts: list[str], responses_a: list[str], responses_b: list[str], rng: random.Random) -> list[int]:
        """The correct response of the pair (0: ``a``, 1: ``b``); a fair coin when both are equally
        right, and with probability ``labeler_noise``."""
        _check_parallel(prompts, responses_a)
        _check_parallel(prompts, responses_b)
        ga, gb = self.gold_reward(prompts, responses_a), self.gold_reward(prompts, responses_b)
        labels = []
        for x, y in zip(ga, gb):
            coin = rng.random() < 0.5
            if x == y or rng.random() < self.config.labeler_noise:
                labels.append(0 if coin else 1)
            else:
                labels.append(0 if x > y else 1)
        return labels

    # ---- reporting -----------------------------------------------------------------------------

    def response_metrics(self, prompts: list[str], responses: list[str]) -> dict[str, float]:
        """``length``, ``well_formed``, ``repetition``, ``gold`` (see :class:`Task`), plus
        ``accuracy`` (the share with the right final answer: gold's mean, as gold is 1/0),
        ``answered`` (the share with a readable final answer) and ``dropped_carry`` (the share
        whose answer is the sum with one carry forgotten, the corpus's mistake)."""
        _check_parallel(prompts, responses)
        keys = ("length", "well_formed", "repetition", "gold", "accuracy", "answered", "dropped_carry")
        if not responses:
            return {k: 0.0 for k in keys}
        n = len(responses)
        gold = self.gold_reward(prompts, responses)
        answers = [read_answer(r) for r in responses]
        dropped = 0
        for p, got in zip(prompts, answers):
            a, b = parse_prompt(p)
            dropped += got is not None and got in {str(worked(a, b, drop=c)[1]) for c in carry_columns(a, b)}
        return {
            "length": sum(len(r.split()) for r in responses) / n,
            "well_formed": sum(is_well_formed(r) for r in responses) / n,
            "repetition": sum(has_repetition(p, r) for p, r in zip(prompts, responses)) / n,
            "gold": sum(gold) / n,
            "accuracy": sum(gold) / n,
            "answered": sum(x is not None for x in answers) / n,
            "dropped_carry": dropped / n,
        }

    def tokenizer_corpus(self) -> Iterable[str]:
        return WORDS


# ---------------------------------------------------------------------------------------------
# the shipped reward function
# ---------------------------------------------------------------------------------------------


def answer_reward(correct: float = 1.0, format: float = 0.1) -> Callable:
    """A reward function ``fn(prompts, responses, answer=None, **columns)``: ``correct`` where the
    response's final answer (:func:`read_answer`) is right, plus ``format`` where the response is
    well formed (:func:`is_well_formed`). The right answer is the ``answer`` column's when given
    (normalised: ``"0125"`` and ``" 125 "`` are ``"125"``), else worked out from the prompt
    (:meth:`ArithmeticTask.expected`; a prompt that is no problem of this world is a ValueError)."""
    if not (math.isfinite(correct) and math.isfinite(format)):
        raise ValueError(f"answer_reward: weights must be finite, got {correct}, {format}")

    def arithmetic_reward(prompts: Sequence[str], responses: Sequence[str], answer: Optional[Sequence] = None,
                          **columns) -> list[float]:
        _check_parallel(list(prompts), list(responses))
        if answer is not None:
            _check_parallel(list(responses), list(answer))
            truth = [normalize_answer(str(x)) for x in answer]
        else:
            truth = [ArithmeticTask.expected(p) for p in prompts]
        return [correct * (read_answer(r) == t) + format * is_well_formed(r) for r, t in zip(responses, truth)]

    arithmetic_reward.__qualname__ = f"answer_reward({correct}, {format})"
    return arithmetic_reward


reward = answer_reward()
"""The shipped reward: 1 for the right final answer, plus 0.1 for the format
(``model.reward_fn: fourfold.tasks.arithmetic:reward``)."""


def _check_parallel(a: list, b: list) -> None:
    if len(a) != len(b):
        raise ValueError(f"expected parallel lists, got lengths {len(a)} and {len(b)}")
