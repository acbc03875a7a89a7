"""ReviewTask.slip: one-word edits that make the minimal pairs of the demo's preference data."""
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.tasks import ReviewTask
from fourfold.tasks.review import has_repetition, is_well_formed, vocabulary

TASK = ReviewTask()
EXAMPLES = TASK.sft_examples(300, random.Random(7))


def _diff_positions(a: list[str], b: list[str]) -> list[int]:
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y]


def test_each_kind_is_the_edit_it_names():
    rng = random.Random(0)
    seen = Counter()
    for ex in EXAMPLES:
        before = ex["completion"].split()
        edited, kind = TASK.slip(ex["completion"], rng)
        after = edited.split()
        seen[kind] += 1
        if kind == "substitute":
            assert len(after) == len(before) and len(_diff_positions(before, after)) == 1
            assert set(after) <= set(vocabulary())
        elif kind == "swap":
            d = _diff_positions(before, after)
            assert len(d) == 2 and d[1] == d[0] + 1
            assert (after[d[0]], after[d[1]]) == (before[d[1]], before[d[0]])
        elif kind == "drop":
            assert len(after) == len(before) - 1
            assert any(before[:i] + before[i + 1:] == after for i in range(len(before)))
        else:
            assert kind == "repeat" and has_repetition(edited)
            n = len(after) - len(before)
            assert 1 <= n <= 3
            assert any(after[:i + n] == before[:i + n] and after[i + n:i + 2 * n] == before[i:i + n]
                       and after[i + 2 * n:] == before[i + n:] for i in range(len(before) - n + 1))
    assert set(seen) == set(TASK.SLIPS)
    assert min(seen.values()) > 0.15 * len(EXAMPLES)  # uniform over four kinds: 25% each


def test_slips_almost_always_break_the_review():
    """Measured 95% ill-formed or repetitive on SFT completions (seed 0, 2000 examples); the rest
    are substitutions and drops that happen to stay in the grammar."""
    rng = random.Random(1)
    broken = 0
    for ex in EXAMPLES:
        edited, _ = TASK.slip(ex["completion"], rng)
        broken += not is_well_formed(ex["prompt"], edited) or has_repetition(edited)
    assert broken / len(EXAMPLES) > 0.88


def test_labelers_prefer_the_intact_review_when_it_is_positive():
    """Gold of a broken review is -1, so against a positive intact review the labelers (length
    bias 0.12/word, temperature 0.5) choose the intact one nearly always."""
    rng = random.Random(2)
    good = "is very sturdy . i would recommend it ."
    prompts = ["the kettle"] * 400
    edited = [TASK.slip(good, rng)[0] for _ in prompts]
    labels = TASK.label_pairs(prompts, [good] * 400, edited, random.Random(3))
    assert labels.count(0) / 400 > 0.9


@settings(max_examples=200, deadline=None)
@given(idx=st.integers(0, len(EXAMPLES) - 1), seed=st.integers(0, 2**32 - 1))
def test_slip_changes_the_text_and_is_deterministic(idx, seed):
    text = EXAMPLES[idx]["completion"]
    a = TASK.slip(text, random.Random(seed))
    assert a == TASK.slip(text, random.Random(seed))
    assert a[0] != text and a[1] in TASK.SLIPS
    assert abs(len(a[0].split()) - len(text.split())) <= 3


def test_short_responses_get_a_repeat():
    assert TASK.slip("great", random.Random(0)) == ("great great", "repeat")
