"""Verifiable checks on response text: the final answer, its normal form, a format rule, a length
penalty. See :mod:`fourfold.rewards` for how a config names them."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Callable, Optional, Sequence

ANSWER_MARKERS = (r"\\boxed\{([^{}]*)\}", r"####\s*((?:(?!####)[^\n])*)",
                  r"(?i)\banswer\s*(?:is|:|=)\s*((?:(?!\banswer\s*(?:is|:|=))[^\n])*)")
"""Where a response states its answer, most explicit first: LaTeX's ``\\boxed{...}``, GSM8K's
``#### ...`` and ``answer: ...`` / ``answer is ...`` / ``answer = ...`` (each up to the end of its
line or the next marker); the last occurrence of the first marker present counts."""
NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")


def final_answer(text: str) -> Optional[str]:
    """The answer a response gives: what follows its last answer marker (:data:`ANSWER_MARKERS`),
    else its last number; None when it has neither. Not normalised (:func:`normalize_answer`)."""
    for marker in ANSWER_MARKERS:
        found = re.findall(marker, text)
        if found:
            return found[-1].strip()
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else None


def normalize_answer(text: Optional[str]) -> Optional[str]:
    """The form answers are compared in: surrounding space, ``$``, a trailing period and enclosing
    ``\\text{}`` dropped, case folded, inner white space collapsed; a number (thousands separators,
    a sign, leading zeros, a decimal point, a fraction) becomes its exact value: an integer as
    digits, any other value as a reduced fraction, so ``1,000`` = ``1000``, ``+007`` = ``7``,
    ``3.0`` = ``3``, ``0.5`` = ``2/4`` = ``1/2``. None stays None."""
    if text is None:
        return None
    t = text.strip().strip("$").strip()
    t = re.sub(r"^\\text\{(.*)\}$", r"\1", t).strip()
    t = t.rstrip(".").strip()
    if re.fullmatch(NUMBER.pattern, t):
        value = _exact(t.replace(",", "").lstrip("+"))
        if value is not None:
            return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    return " ".join(t.casefold().split())


def _exact(t: str) -> Optional[Fraction]:
    try:
        if "/" in t:
            num, den = t.split("/")
            return Fraction(Fraction(num), Fraction(den)) if Fraction(den) != 0 else None
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def answer_match(prompts: Sequence[str], responses: Sequence[str], answer: Sequence[str], **columns) -> list[float]:
    """1.0 where a response's final answer (:func:`final_answer`) equals the row's ``answer`` column
    once both are normalised (:func:`normalize_answer`), else 0.0 (a response without an answer
    included). Named in a config as ``fourfold.rewards:answer_match``; the prompts file needs an
    ``answer`` column."""
    return [1.0 if _same(final_answer(r), a) else 0.0 for r, a in zip(responses, answer)]


def _same(got: Optional[str], expected) -> bool:
    return got is not None and normalize_answer(got) == normalize_answer(str(expected))


def format_match(pattern: str, *, hit: float = 1.0, miss: float = 0.0, whole: bool = False) -> Callable:
    """A reward function: ``hit`` where the response matches the regular expression ``pattern``
    (anywhere; the whole response, stripped, with ``whole``), else ``miss``. The pattern is compiled
    here, so a bad one fails when the config is read, not mid-run."""
    rx = re.compile(pattern)
    find = rx.fullmatch if whole else rx.search

    def format_reward(prompts: Sequence[str], responses: Sequence[str], **columns) -> list[float]:
        return [hit if find(r.strip() if whole else r) else miss for r in responses]

    format_reward.__qualname__ = f"format_match({pattern!r})"
    return format_reward


def length_penalty(max_words: int, coef: float = 0.1) -> Callable:
    """A reward function: ``-coef`` per word past ``max_words`` (0 up to it): the overlong shaping
    that keeps a rule reward from being gamed by length."""
    if max_words < 0 or coef < 0:
        raise ValueError(f"length_penalty: max_words and coef must be >= 0, got {max_words}, {coef}")

    def length_reward(prompts: Sequence[str], responses: Sequence[str], **columns) -> list[float]:
        return [-coef * max(0, len(r.split()) - max_words) for r in responses]

    length_reward.__qualname__ = f"length_penalty({max_words}, {coef})"
    return length_reward
