"""``review``: a synthetic product-review world whose true quality is known exactly.

A prompt is a review's opening noun phrase (``"the blender"``), the response the rest; the hidden
gold reward wants a positive, well-formed review of a normal length (or, with ``sentences = k``, of
exactly k positive sentences), and simulated labelers compare two responses by gold plus a bias
toward longer ones. The world, the gold formulas, the horizon knob and the labelers are documented
in docs/review.md; the grammar and its recogniser are in :mod:`fourfold.tasks.review_grammar`.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Iterable

from fourfold.tasks.base import KnobCheck, task_config
from fourfold.tasks.review_grammar import (  # noqa: F401  (re-exported: tests and tasks import them from here)
    CLAUSES,
    COMMA,
    CONNECTIVES,
    FIRST_CLAUSES,
    PRODUCTS,
    PROMPT_ADJS,
    PROMPT_DETS,
    STARS,
    TERMINATORS,
    Pattern,
    ReviewParse,
    clause_polarity,
    full_text,
    has_repetition,
    is_well_formed,
    parse_review,
    vocabulary,
)

# --------------------------------------------------------------------------------------------
# Config and task
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReviewTaskConfig:
    """Knobs of the review world. Defaults are tuned so that RLHF both works and can be hacked.

    Labelers (see the module docstring):

    - ``labeler_length_bias``: utility per response word added to gold by the labelers (the
      "longer is better" flaw). ``0`` gives unbiased labelers.
    - ``labeler_temperature``: Bradley-Terry temperature of their choices; lower is more decisive.
    - ``labeler_noise``: probability that a label is a fair coin flip instead.

    Gold reward:

    - ``sentiment_saturation``: positive (and negative) statements count up to this many.
    - ``length_range``: ``(lo, hi)`` response lengths in words with no length penalty.
    - ``length_penalty_per_word``, ``max_length_penalty``: the mild penalty outside that range.
    - ``ill_formed_gold``: gold of a response that does not parse or repeats itself.

    SFT corpus:

    - ``stance_weights``: relative frequency of (positive, negative, mixed, neutral) reviews.
    - ``min_review_words``, ``max_review_words``: total length (prompt included) of SFT reviews.

    The horizon knob (see the module docstring):

    - ``sentences``: ``k >= 1``: gold wants k sentences, each positive, and the SFT corpus has
      reviews of about k sentences; ``0`` (default): the world described first.
    - ``sentence_penalty``: gold lost per sentence more or fewer than k (capped at
      ``max_length_penalty``).
    """

    labeler_length_bias: float = 0.12
    labeler_temperature: float = 0.5
    labeler_noise: float = 0.0
    sentiment_saturation: int = 2
    length_range: tuple[int, int] = (6, 35)
    length_penalty_per_word: float = 0.05
    max_length_penalty: float = 0.5
    ill_formed_gold: float = -1.0
    stance_weights: tuple[float, float, float, float] = (0.35, 0.25, 0.25, 0.15)
    min_review_words: int = 8
    max_review_words: int = 30
    sentences: int = 0
    sentence_penalty: float = 0.25

    CORPUS_FIELDS = ("stance_weights", "min_review_words", "max_review_words", "sentences")
    """The fields that change the SFT corpus (and prompts); the others only change labels and gold."""

    def __post_init__(self) -> None:
        check = KnobCheck(self)
        bad = check.bad
        if not self.labeler_temperature > 0:
            bad("labeler_temperature", f"must be > 0, got {self.labeler_temperature}")
        check.shares("labeler_noise")
        if not (isinstance(self.sentiment_saturation, int) and self.sentiment_saturation >= 1):
            bad("sentiment_saturation", f"must be an int >= 1, got {self.sentiment_saturation!r}")
        lo, hi = self.length_range
        if not 0 <= lo <= hi:
            bad("length_range", f"must be (lo, hi) with 0 <= lo <= hi, got {self.length_range}")
        if self.length_penalty_per_word < 0 or self.max_length_penalty < 0:
            bad("length_penalty_per_word", "penalties must be >= 0")
        if len(self.stance_weights) != 4 or min(self.stance_weights) < 0 or sum(self.stance_weights) <= 0:
            bad("stance_weights", f"must be 4 non-negative weights, not all 0, got {self.stance_weights}")
        if not 4 <= self.min_review_words <= self.max_review_words:
            bad("min_review_words", "must satisfy 4 <= min_review_words <= max_review_words")
        if not (isinstance(self.sentences, int) and not isinstance(self.sentences, bool) and self.sentences >= 0):
            bad("sentences", f"must be an int >= 0 (0: off), got {self.sentences!r}")
        if self.sentence_penalty < 0:
            bad("sentence_penalty", f"must be >= 0, got {self.sentence_penalty}")


# stance -> probabilities of clause polarity (+1, 0, -1)
_STANCES = {
    "positive": (0.75, 0.20, 0.05),
    "negative": (0.05, 0.20, 0.75),
    "mixed": (0.40, 0.20, 0.40),
    "neutral": (0.15, 0.70, 0.15),
}
_N_SENTENCES = ((1, 2, 3, 4), (0.15, 0.35, 0.30, 0.20))


def _n_sentences_around(k: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The corpus's sentence counts when gold wants ``k``: k (3 in 5), k - 1 and k + 1 (1 in 5
    each; never fewer than 1)."""
    counts = [n for n in (k - 1, k, k + 1) if n >= 1]
    return tuple(counts), tuple(0.6 if n == k else 0.2 for n in counts)


class ReviewTask:
    """The product-review world. See the module docstring for the grammar and the gold formula."""

    name = "review"

    def __init__(self, config: ReviewTaskConfig | None = None, **overrides) -> None:
        self.config = config = task_config(ReviewTaskConfig, config, overrides)
        self._clause_weights = [p.weight for p in CLAUSES]
        self._first_weights = [p.weight for p in FIRST_CLAUSES]

    def __repr__(self) -> str:
        return f"ReviewTask({self.config!r})"

    # ---- generation ------------------------------------------------------------------------

    @staticmethod
    def _fill(pattern: Pattern, rng: random.Random, fixed: dict | None = None) -> tuple[list[str], int]:
        filled: dict[str, tuple[str, ...]] = {}
        for slot in pattern.slots:
            if fixed and slot.name in fixed:
                filled[slot.name] = fixed[slot.name]
                continue
            alts = slot.alts
            if alts[0] == ():
                alt = () if rng.random() < slot.p_empty else alts[1 + rng.randrange(len(alts) - 1)]
            else:
                alt = alts[rng.randrange(len(alts))]
            filled[slot.name] = alt
        words = [w for s in pattern.slots for w in filled[s.name]]
        return words, clause_polarity(pattern.name, filled)

    def _clause(
        self, rng: random.Random, polarity: int, first: bool, subject: dict | None
    ) -> list[str]:
        patterns = FIRST_CLAUSES if first else CLAUSES
        weights = self._first_weights if first else self._clause_weights
        for _ in range(200):
            pat = rng.choices(patterns, weights)[0]
            words, pol = self._fill(pat, rng, subject if first else None)
            if pol == polarity:
                return words
        raise RuntimeError("review grammar cannot realise the requested polarity")  # unreachable

    def _sample_subject(self, rng: random.Random) -> dict[str, tuple[str, ...]]:
        det = PROMPT_DETS[rng.randrange(len(PROMPT_DETS))]
        padj = PROMPT_ADJS[rng.randrange(len(PROMPT_ADJS))] if rng.random() < 0.3 else None
        product = PRODUCTS[rng.randrange(len(PRODUCTS))]
        return {"det": (det,), "padj": (padj,) if padj else (), "product": (product,)}

    @staticmethod
    def _prompt_of(subject: dict) -> str:
        return " ".join(subject["det"] + subject["padj"] + subject["product"])

    def _review(self, rng: random.Random, subject: dict) -> list[str]:
        cfg = self.config
        stance = rng.choices(list(_STANCES), cfg.stance_weights)[0]
        probs = _STANCES[stance]
        n_prompt = len(self._prompt_of(subject).split())
        n_sentences = _n_sentences_around(cfg.sentences) if cfg.sentences else _N_SENTENCES
        for _ in range(1000):
            words: list[str] = []
            n_sent = rng.choices(*n_sentences)[0]
            for s in range(n_sent):
                pol = rng.choices((1, 0, -1), probs)[0]
                if s > 0 and rng.random() < 0.08:
                    stars = [k for k, v in STARS.items() if v == pol]
                    words += stars[rng.randrange(len(stars))].split()
                else:
                    words += self._clause(rng, pol, s == 0, subject)
                    if rng.random() < 0.3:
                        pol2 = rng.choices((1, 0, -1), probs)[0]
                        conn = CONNECTIVES[rng.randrange(len(CONNECTIVES))]
                        words += [COMMA, conn] + self._clause(rng, pol2, False, None)
                words.append("." if rng.random() < 0.88 else "!")
            n_resp = len(words) - n_prompt
            in_bounds = cfg.sentences or (cfg.min_review_words <= len(words) <= cfg.max_review_words
                                          and n_resp >= cfg.length_range[0])
            if in_bounds and not has_repetition(" ".join(words)):
                return words
        raise RuntimeError("could not generate a review within the configured length")

    def sample_prompts(self, n: int, rng: random.Random) -> list[str]:
        return [self._prompt_of(self._sample_subject(rng)) for _ in range(n)]

    @staticmethod
    def reads_prompt(prompt: str) -> bool:
        """Whether ``prompt`` is one of this world's (a determiner, an optional adjective, a
        product: what :meth:`sample_prompts` writes): the gold reads only reviews of those."""
        words = prompt.split()
        return (2 <= len(words) <= 3 and words[0] in PROMPT_DETS and words[-1] in PRODUCTS
                and all(w in PROMPT_ADJS for w in words[1:-1]))

    def sft_examples(self, n: int, rng: random.Random) -> list[dict]:
        out = []
        for _ in range(n):
            subject = self._sample_subject(rng)
            prompt = self._prompt_of(subject)
            words = self._review(rng, subject)
            k = len(prompt.split())
            out.append({"prompt": prompt, "completion": " ".join(words[k:])})
        return out

    # ---- the hidden truth ------------------------------------------------------------------

    def parse(self, prompt: str, response: str) -> ReviewParse | None:
        """Parse ``prompt + " " + response``; ``None`` if it is not a review of the grammar."""
        return parse_review(full_text(prompt, response))

    is_well_formed = staticmethod(is_well_formed)
    has_repetition = staticmethod(has_repetition)

    def length_penalty(self, n_words: int) -> float:
        cfg = self.config
        lo, hi = cfg.length_range
        return min(cfg.max_length_penalty, cfg.length_penalty_per_word * max(0, lo - n_words, n_words - hi))

    def _sentiment(self, parsed: ReviewParse) -> float:
        s = self.config.sentiment_saturation
        return (min(parsed.positives, s) - min(parsed.negatives, s)) / s

    def sentence_penalty(self, n_sentences: int) -> float:
        """The horizon mode's penalty for a response of ``n_sentences`` sentences (``sentences`` = k)."""
        cfg = self.config
        return min(cfg.max_length_penalty, cfg.sentence_penalty * abs(n_sentences - cfg.sentences))

    def _gold_one(self, prompt: str, response: str) -> tuple[float, bool, bool, float]:
        """(gold, well_formed, repetition, sentiment) of one response."""
        k = self.config.sentences
        words = response.split()
        parsed = self.parse(prompt, response)
        rep = has_repetition(response)
        pen = self.sentence_penalty(_sentences_of(words)) if k else self.length_penalty(len(words))
        if parsed is None or rep:
            return self.config.ill_formed_gold - pen, parsed is not None, rep, 0.0
        sent = sum(parsed.sentence_polarities[:k]) / k if k else self._sentiment(parsed)
        return sent - pen, True, False, sent

    def gold_reward(self, prompts: list[str], responses: list[str]) -> list[float]:
        _check_parallel(prompts, responses)
        return [self._gold_one(p, r)[0] for p, r in zip(prompts, responses)]

    # ---- simulated labelers ----------------------------------------------------------------

    def labeler_utility(self, prompts: list[str], responses: list[str]) -> list[float]:
        """What the simulated labelers value: gold plus their length bias."""
        b = self.config.labeler_length_bias
        gold = self.gold_reward(prompts, responses)
        return [g + b * len(r.split()) for g, r in zip(gold, responses)]

    def label_pairs(self, prompts: list[str], responses_a: list[str], responses_b: list[str], rng: random.Random) -> list[int]:
        _check_parallel(prompts, responses_a)
        _check_parallel(prompts, responses_b)
        cfg = self.config
        ua = self.labeler_utility(prompts, responses_a)
        ub = self.labeler_utility(prompts, responses_b)
        labels = []
        for a, b in zip(ua, ub):
            z = (a - b) / cfg.labeler_temperature
            p_a = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
            u = rng.random()
            if cfg.labeler_noise > 0 and rng.random() < cfg.labeler_noise:
                p_a = 0.5
            labels.append(0 if u < p_a else 1)
        return labels

    # ---- minimal pairs for the labelers ----------------------------------------------------

    SLIPS = ("substitute", "swap", "drop", "repeat")
    """The one-word slips :meth:`slip` makes (the kinds of error a small LM makes)."""

    def slip(self, response: str, rng: random.Random) -> tuple[str, str]:
        """``(edited, kind)``: ``response`` with one slip, the other words untouched, where
        ``kind`` is one of :attr:`SLIPS`, chosen uniformly:

        - ``substitute``: one word replaced by another word of the vocabulary;
        - ``swap``: two adjacent, different words exchanged;
        - ``drop``: one word deleted;
        - ``repeat``: one word, or a phrase of 2-3 words, said twice in a row.

        The edit does not look at the grammar, so it may leave the text well formed (a
        substituted adjective, say); the labelers then judge the pair on gold as usual. A
        response of fewer than two words is returned with one word repeated."""
        words = response.split()
        vocab = _VOCAB
        kind = self.SLIPS[rng.randrange(len(self.SLIPS))]
        if len(words) < 2:
            kind = "repeat"
        if kind == "substitute":
            i = rng.randrange(len(words))
            w = words[i]
            while w == words[i]:
                w = vocab[rng.randrange(len(vocab))]
            words[i] = w
        elif kind == "swap":
            pairs = [i for i in range(len(words) - 1) if words[i] != words[i + 1]]
            if not pairs:
                return self.slip(response, rng)
            i = pairs[rng.randrange(len(pairs))]
            words[i], words[i + 1] = words[i + 1], words[i]
        elif kind == "drop":
            del words[rng.randrange(len(words))]
        else:
            n = rng.randint(1, min(3, len(words)))
            i = rng.randrange(len(words) - n + 1)
            words[i + n : i + n] = words[i : i + n]
        return " ".join(words), kind

    # ---- reporting -------------------------------------------------------------------------

    def response_metrics(self, prompts: list[str], responses: list[str]) -> dict[str, float]:
        """``length``, ``well_formed``, ``repetition``, ``gold`` (see :class:`Task`), plus
        ``sentiment`` (mean sentiment term, 0 for ill-formed responses) and ``positive`` (share
        of well-formed responses with positive sentiment, out of all responses); in the horizon
        mode (``sentences`` >= 1) also ``sentences``, the mean number of sentences."""
        _check_parallel(prompts, responses)
        keys = ("length", "well_formed", "repetition", "gold", "sentiment", "positive")
        keys += ("sentences",) if self.config.sentences else ()
        if not responses:
            return {k: 0.0 for k in keys}
        rows = [self._gold_one(p, r) for p, r in zip(prompts, responses)]
        n = len(responses)
        extra = {"sentences": sum(_sentences_of(r.split()) for r in responses) / n} if self.config.sentences else {}
        return {**extra,
            "length": sum(len(r.split()) for r in responses) / n,
            "well_formed": sum(wf for _, wf, _, _ in rows) / n,
            "repetition": sum(rep for _, _, rep, _ in rows) / n,
            "gold": sum(g for g, _, _, _ in rows) / n,
            "sentiment": sum(s for _, _, _, s in rows) / n,
            "positive": sum(1 for _, wf, rep, s in rows if wf and not rep and s > 0) / n,
        }

    def tokenizer_corpus(self) -> Iterable[str]:
        return vocabulary()


def gold_reward_fn(prompts: list[str], responses: list[str], *, task_options: dict | None = None) -> list[float]:
    """The review world's gold as a reward function, for PPO trained on gold itself (the re-posed
    overoptimization family's gold arm): ``model.reward_fns: [{fn: 'fourfold.tasks.review:gold_reward_fn',
    options: {task_options: {...}}}]``, ``task_options`` the world's (:class:`ReviewTaskConfig` keys)."""
    return ReviewTask(**(task_options or {})).gold_reward(list(prompts), list(responses))


def _sentences_of(words: list[str]) -> int:
    """A response's number of sentences: its terminators (``.`` and ``!``), whether or not it parses."""
    return sum(w in TERMINATORS for w in words)


def _check_parallel(a: list, b: list) -> None:
    if len(a) != len(b):
        raise ValueError(f"expected parallel lists, got lengths {len(a)} and {len(b)}")


_VOCAB = tuple(vocabulary())
