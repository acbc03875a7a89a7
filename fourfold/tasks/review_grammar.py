"""The review world's grammar: lexicon, clause patterns, sentiment and the recogniser.

Used by :mod:`fourfold.tasks.review` (sampling, gold reward, labelers) and tests.

Grammar
=======
::

    review     := first_sentence sentence*
    sentence   := clause ("," CONN clause)* TERM | STARS TERM        (STARS not first)
    first_sentence := first_clause ("," CONN clause)* TERM
    first_clause   := DET ["new" | "old"] PRODUCT predicate           (this is the prompt + more)
    clause     := "it" predicate
                | "the" PART (cop_pred | perf_pred | fail_pred)
                | "the" ASPECT cop_pred
                | "i" FEEL_VERB ("it" | "the" PART | "the" ASPECT)
                | "i" ("would" | "will") ["not"] REC_PHRASE
                | "i" BUY_VERB "it" BUY_TIME
                | "my" KIN KIN_FEEL "it"
                | "my" KIN "uses" "it" USE_TIME
    predicate  := cop_pred | perf_pred | fail_pred | "arrived" ARRIVE_TIME
                | ("came" | "comes") "with" "a" "spare" PART
    cop_pred   := COP ["not"] [INTENSIFIER] ADJECTIVE
    perf_pred  := PERF_VERB ADVERB
    fail_pred  := FAIL_VERB [FAIL_TIME]
    TERM       := "." | "!"          CONN := and | but | so | yet | although | though

:func:`parse_review` is a real recogniser for exactly this grammar (no heuristics): it returns
``None`` for any text outside the language.

Sentiment
---------
Every clause has a polarity in ``{-1, 0, +1}``, read off its one sentiment-bearing word (the
adjective, the adverb, the feeling verb, the recommendation, the star count) and flipped by
``"not"``; failure verbs (``broke``, ``leaks``, ...) are always ``-1``; purchase, delivery, usage and
"comes with" clauses are ``0``. ``P`` and ``N`` count the positive and negative clauses.
"""
from __future__ import annotations

from typing import Iterator, NamedTuple

# --------------------------------------------------------------------------------------------
# Lexicon
# --------------------------------------------------------------------------------------------

PRODUCTS = (
    "blender toaster kettle lamp backpack jacket laptop phone camera vacuum mixer drill chair "
    "desk mattress pillow blanket watch speaker keyboard mouse monitor printer router microwave "
    "fan heater grill pan knife bottle mug tent bicycle helmet stroller scale charger radio "
    "tablet umbrella wallet suitcase"
).split()
PROMPT_DETS = ("the", "my", "this", "our")
PROMPT_ADJS = ("new", "old")
PARTS = (
    "lid handle motor battery screen button cord strap zipper cover base switch cable remote "
    "blade wheel filter plug display hinge knob latch"
).split()
ASPECTS = "price quality design size color shape weight sound finish packaging manual".split()

POSITIVE_ADJECTIVES = (
    "great good excellent sturdy reliable solid quiet comfortable perfect lovely durable "
    "fantastic wonderful amazing nice handy powerful sleek smooth impressive superb convenient "
    "brilliant terrific affordable"
).split()
NEGATIVE_ADJECTIVES = (
    "bad terrible flimsy noisy awful broken useless disappointing poor fragile clunky horrible "
    "weak loud faulty uncomfortable mediocre dreadful unreliable wobbly sticky slow defective "
    "shoddy overpriced"
).split()
NEUTRAL_ADJECTIVES = (
    "blue black white red green grey silver small large square round plastic metal wooden "
    "standard tall short heavy light ordinary"
).split()
INTENSIFIERS = "very really quite extremely pretty so incredibly fairly rather truly super".split()
COPULAS = "is was seems feels looks".split()

PERF_VERBS = "works worked performs runs".split()
POSITIVE_ADVERBS = "well perfectly flawlessly smoothly nicely beautifully reliably".split()
NEGATIVE_ADVERBS = "poorly badly terribly erratically".split()
FAIL_VERBS = "broke failed leaks rattles overheats squeaks cracked wobbles jams died".split()
FAIL_TIMES = (
    "after a week", "after a month", "after two days", "after one use", "on day one",
    "right away", "within a week", "every time",
)
ARRIVE_TIMES = (
    "yesterday", "today", "last week", "on monday", "on friday", "in two days", "in a box",
    "in a small box",
)
POSITIVE_FEELINGS = "love like adore enjoy".split()
NEGATIVE_FEELINGS = "hate dislike".split()
REC_PHRASES = ("recommend it", "recommend it to anyone", "buy it again", "buy another one")
BUY_VERBS = "bought ordered got received".split()
BUY_TIMES = (
    "last week", "last month", "yesterday", "online", "as a gift", "for my birthday", "on monday",
)
KIN = "wife husband son daughter mother father sister brother friend roommate".split()
KIN_FEELINGS = {"loves": 1, "likes": 1, "hates": -1}
USE_TIMES = ("every day", "daily", "at work", "at home", "on weekends", "for work")
STARS = {"five stars": 1, "four stars": 1, "three stars": 0, "two stars": -1, "one star": -1}
CONNECTIVES = ("and", "but", "so", "yet", "although", "though")
TERMINATORS = (".", "!")
COMMA = ","

_ADJ_POLARITY = {
    **{w: 1 for w in POSITIVE_ADJECTIVES},
    **{w: -1 for w in NEGATIVE_ADJECTIVES},
    **{w: 0 for w in NEUTRAL_ADJECTIVES},
}
_ADV_POLARITY = {**{w: 1 for w in POSITIVE_ADVERBS}, **{w: -1 for w in NEGATIVE_ADVERBS}}
_FEEL_POLARITY = {**{w: 1 for w in POSITIVE_FEELINGS}, **{w: -1 for w in NEGATIVE_FEELINGS}}

# --------------------------------------------------------------------------------------------
# Grammar as data: a clause pattern is a sequence of slots; a slot is a set of alternative
# phrases (tuples of words; the empty tuple makes the slot optional). Generator and recogniser
# both read these tables, so they cannot drift apart.
# --------------------------------------------------------------------------------------------


def _alts(*phrases: str, optional: bool = False) -> tuple[tuple[str, ...], ...]:
    out = tuple(tuple(p.split()) for p in phrases)
    return (((),) + out) if optional else out


class Slot(NamedTuple):
    """One slot of a clause pattern: its name (read by :func:`clause_polarity`) and its phrases."""

    name: str
    alts: tuple[tuple[str, ...], ...]
    p_empty: float = 0.0  # generator: probability of choosing the empty alternative, if allowed


class Pattern(NamedTuple):
    """A clause pattern: the sampler (:mod:`fourfold.tasks.review`) fills it, the recogniser matches it."""

    name: str
    slots: tuple[Slot, ...]
    weight: float  # generator: relative frequency among clauses of its kind


_THE = Slot("the", _alts("the"))
_SUBJ_FIRST = (
    Slot("det", _alts(*PROMPT_DETS)),
    Slot("padj", _alts(*PROMPT_ADJS, optional=True), 0.7),
    Slot("product", _alts(*PRODUCTS)),
)
_SUBJ_IT = (Slot("it", _alts("it")),)
_SUBJ_PART = (_THE, Slot("part", _alts(*PARTS)))
_SUBJ_ASPECT = (_THE, Slot("aspect", _alts(*ASPECTS)))

_COP_PRED = (
    Slot("cop", _alts(*COPULAS)),
    Slot("neg", _alts("not", optional=True), 0.85),
    Slot("int", _alts(*INTENSIFIERS, optional=True), 0.7),
    Slot("adj", _alts(*_ADJ_POLARITY)),
)
_PERF_PRED = (Slot("perf", _alts(*PERF_VERBS)), Slot("adv", _alts(*_ADV_POLARITY)))
_FAIL_PRED = (Slot("fail", _alts(*FAIL_VERBS)), Slot("when", _alts(*FAIL_TIMES, optional=True), 0.5))
_ARRIVE_PRED = (Slot("arrived", _alts("arrived")), Slot("when", _alts(*ARRIVE_TIMES)))
_COMES_PRED = (
    Slot("comes", _alts("came", "comes")),
    Slot("with", _alts("with a spare")),
    Slot("part", _alts(*PARTS)),
)

_PREDICATES = {"cop": _COP_PRED, "perf": _PERF_PRED, "fail": _FAIL_PRED, "arrived": _ARRIVE_PRED, "comes": _COMES_PRED}


def _subject_clauses(subject: str, slots: tuple[Slot, ...], weights: dict[str, float]) -> tuple[Pattern, ...]:
    """``subject`` + each predicate named in ``weights``: patterns ``"<subject>_<predicate>"``."""
    return tuple(Pattern(f"{subject}_{pred}", slots + _PREDICATES[pred], w) for pred, w in weights.items())


FIRST_CLAUSES = _subject_clauses("first", _SUBJ_FIRST, {"cop": 4.0, "perf": 1.5, "fail": 1.0, "arrived": 0.6, "comes": 0.3})
"""The clauses that open a review: the prompt's noun phrase, then a predicate."""
CLAUSES = (
    *_subject_clauses("it", _SUBJ_IT, {"cop": 3.0, "perf": 1.0, "fail": 0.8, "arrived": 0.5, "comes": 0.3}),
    *_subject_clauses("part", _SUBJ_PART, {"cop": 2.0, "perf": 0.5, "fail": 0.8}),
    *_subject_clauses("aspect", _SUBJ_ASPECT, {"cop": 1.5}),
    Pattern(
        "i_feel",
        (
            Slot("i", _alts("i")),
            Slot("feel", _alts(*_FEEL_POLARITY)),
            Slot("obj", _alts("it") + tuple(("the", w) for w in PARTS + ASPECTS)),
        ),
        1.0,
    ),
    Pattern(
        "i_rec",
        (
            Slot("i", _alts("i")),
            Slot("modal", _alts("would", "will")),
            Slot("neg", _alts("not", optional=True), 0.6),
            Slot("rec", _alts(*REC_PHRASES)),
        ),
        1.2,
    ),
    Pattern(
        "i_buy",
        (
            Slot("i", _alts("i")),
            Slot("buy", _alts(*BUY_VERBS)),
            Slot("it", _alts("it")),
            Slot("when", _alts(*BUY_TIMES)),
        ),
        0.6,
    ),
    Pattern(
        "kin_feel",
        (Slot("my", _alts("my")), Slot("kin", _alts(*KIN)), Slot("feel", _alts(*KIN_FEELINGS)),
         Slot("it", _alts("it"))),
        0.5,
    ),
    Pattern(
        "kin_use",
        (Slot("my", _alts("my")), Slot("kin", _alts(*KIN)), Slot("uses", _alts("uses it")),
         Slot("when", _alts(*USE_TIMES))),
        0.4,
    ),
)
"""Every clause but a review's first (which is one of :data:`FIRST_CLAUSES`)."""
_STARS_PATTERN = Pattern("stars", (Slot("stars", _alts(*STARS)),), 1.0)


def clause_polarity(pattern: str, filled: dict[str, tuple[str, ...]]) -> int:
    """Polarity of a recognised clause from its filled slots (see the module docstring)."""
    flip = -1 if filled.get("neg") == ("not",) else 1
    if "adj" in filled:
        return flip * _ADJ_POLARITY[filled["adj"][0]]
    if "adv" in filled:
        return _ADV_POLARITY[filled["adv"][0]]
    if "fail" in filled:
        return -1
    if pattern == "i_feel":
        return _FEEL_POLARITY[filled["feel"][0]]
    if pattern == "i_rec":
        return flip
    if pattern == "kin_feel":
        return KIN_FEELINGS[filled["feel"][0]]
    if pattern == "stars":
        return STARS[" ".join(filled["stars"])]
    return 0


# --------------------------------------------------------------------------------------------
# Recogniser
# --------------------------------------------------------------------------------------------


class Clause(NamedTuple):
    pattern: str
    words: tuple[str, ...]
    polarity: int


class ReviewParse(NamedTuple):
    """The result of :func:`parse_review`: the clauses in order, the polarity counts, and each
    sentence's polarity (the sign of the sum of its clauses' polarities)."""

    clauses: tuple[Clause, ...]
    n_sentences: int
    sentence_polarities: tuple[int, ...] = ()

    @property
    def positives(self) -> int:
        return sum(1 for c in self.clauses if c.polarity > 0)

    @property
    def negatives(self) -> int:
        return sum(1 for c in self.clauses if c.polarity < 0)


def _match_slots(
    slots: tuple[Slot, ...], words: tuple[str, ...], i: int, filled: dict
) -> Iterator[dict]:
    """All ways the slots match exactly ``words[i:]`` (backtracking; clauses are short)."""
    if not slots:
        if i == len(words):
            yield dict(filled)
        return
    slot = slots[0]
    for alt in slot.alts:
        k = len(alt)
        if words[i : i + k] == alt:
            filled[slot.name] = alt
            yield from _match_slots(slots[1:], words, i + k, filled)
            del filled[slot.name]


def _match_clause(words: tuple[str, ...], patterns: tuple[Pattern, ...]) -> Clause | None:
    for pat in patterns:
        for filled in _match_slots(pat.slots, words, 0, {}):
            return Clause(pat.name, words, clause_polarity(pat.name, filled))
    return None


def parse_review(text: str) -> ReviewParse | None:
    """Recognise a full review (prompt and response together); ``None`` if outside the grammar."""
    words = text.split()
    if not words or words[-1] not in TERMINATORS:
        return None
    clauses: list[Clause] = []
    polarities: list[int] = []
    start = 0
    for end, w in enumerate(words):
        if w not in TERMINATORS:
            continue
        sentence = tuple(words[start:end])
        first, before = not polarities, len(clauses)
        start = end + 1
        if not sentence:
            return None
        stars = None if first else _match_clause(sentence, (_STARS_PATTERN,))
        if stars is not None:
            clauses.append(stars)
        elif not _sentence_clauses(sentence, first, clauses):
            return None
        total = sum(c.polarity for c in clauses[before:])
        polarities.append((total > 0) - (total < 0))
    return ReviewParse(tuple(clauses), len(polarities), tuple(polarities))


def _sentence_clauses(sentence: tuple[str, ...], first: bool, clauses: list[Clause]) -> bool:
    """Append the clauses of one sentence (``clause ("," CONN clause)*``); False if it is not one."""
    pieces: list[tuple[str, ...]] = []
    cur: list[str] = []
    for x in sentence:
        if x == COMMA:
            pieces.append(tuple(cur))
            cur = []
        else:
            cur.append(x)
    pieces.append(tuple(cur))
    for j, piece in enumerate(pieces):
        if j > 0:
            if not piece or piece[0] not in CONNECTIVES:
                return False
            piece = piece[1:]
        patterns = FIRST_CLAUSES if (first and j == 0) else CLAUSES
        clause = _match_clause(piece, patterns)
        if clause is None:
            return False
        clauses.append(clause)
    return True


def full_text(prompt: str, response: str) -> str:
    """The text the grammar reads for a prompt and its response: ``prompt + " " + response``."""
    return f"{prompt} {response}"


def is_well_formed(prompt: str, response: str) -> bool:
    """True if ``prompt + " " + response`` is a review of the grammar (repetition not checked)."""
    return parse_review(full_text(prompt, response)) is not None


def has_repetition(text: str) -> bool:
    """True if some word or phrase is immediately repeated (``"great great"``, ``"a b a b"``).

    Checks every n-gram length: ``words[i:i+n] == words[i+n:i+2n]`` for some ``i`` and ``n >= 1``.
    """
    words = text.split()
    L = len(words)
    for n in range(1, L // 2 + 1):
        for i in range(0, L - 2 * n + 1):
            if words[i] == words[i + n] and words[i : i + n] == words[i + n : i + 2 * n]:
                return True
    return False


def vocabulary() -> list[str]:
    """Every word a review can contain (prompts included), sorted."""
    words: set[str] = {COMMA, *CONNECTIVES, *TERMINATORS}
    for pat in FIRST_CLAUSES + CLAUSES + (_STARS_PATTERN,):
        for slot in pat.slots:
            for alt in slot.alts:
                words.update(alt)
    return sorted(words)
