"""Generated reviews: grammatical, within length, deterministic given the rng."""
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.tasks import ReviewTask, Task, has_repetition, is_well_formed
from fourfold.tasks.review import TERMINATORS, parse_review, vocabulary

TASK = ReviewTask()
seeds = st.integers(min_value=0, max_value=2**32 - 1)


@settings(max_examples=60, deadline=None)
@given(seeds)
def test_recogniser_accepts_every_generated_review(seed):
    cfg = TASK.config
    for ex in TASK.sft_examples(5, random.Random(seed)):
        prompt, completion = ex["prompt"], ex["completion"]
        assert 2 <= len(prompt.split()) <= 3
        assert is_well_formed(prompt, completion), (prompt, completion)
        assert not has_repetition(completion)
        n = len(completion.split())
        assert cfg.min_review_words <= n + len(prompt.split()) <= cfg.max_review_words
        assert cfg.length_range[0] <= n <= cfg.length_range[1]
        g = TASK.gold_reward([prompt], [completion])[0]
        parsed = TASK.parse(prompt, completion)
        expected = (min(parsed.positives, 2) - min(parsed.negatives, 2)) / 2
        assert g == expected and -1.0 <= g <= 1.0


@settings(max_examples=40, deadline=None)
@given(seeds, st.data())
def test_mutations_are_caught(seed, data):
    ex = TASK.sft_examples(1, random.Random(seed))[0]
    prompt, words = ex["prompt"], ex["completion"].split()
    # truncation that loses the last terminator: ill-formed
    cut = data.draw(st.integers(1, len(words) - 1))
    truncated = words[:cut]
    if truncated[-1] not in TERMINATORS:
        assert not is_well_formed(prompt, " ".join(truncated))
    # doubling any word: an immediate repetition, gold at the floor
    i = data.draw(st.integers(0, len(words) - 1))
    doubled = " ".join(words[: i + 1] + words[i:])
    assert has_repetition(doubled)
    assert TASK.gold_reward([prompt], [doubled])[0] <= TASK.config.ill_formed_gold
    # doubling a whole sentence: also repetition
    assert has_repetition(" ".join(words + words))


def test_sft_corpus_is_mixed_and_not_optimal():
    ex = TASK.sft_examples(1000, random.Random(0))
    gold = TASK.gold_reward([e["prompt"] for e in ex], [e["completion"] for e in ex])
    mean = sum(gold) / len(gold)
    assert -0.2 < mean < 0.4  # measured 0.09 over 5,000
    for value in (-1.0, -0.5, 0.0, 0.5, 1.0):
        assert gold.count(value) > 50


def test_prompts_match_sft_prompts():
    prompts = TASK.sample_prompts(300, random.Random(1))
    sft_prompts = {e["prompt"] for e in TASK.sft_examples(300, random.Random(2))}
    assert all(2 <= len(p.split()) <= 3 for p in prompts)
    assert parse_review(prompts[0] + " is great .") is not None
    assert len(set(prompts) & sft_prompts) > 20


def test_deterministic_and_no_global_random():
    state = random.getstate()
    a = TASK.sft_examples(50, random.Random(7))
    b = TASK.sft_examples(50, random.Random(7))
    assert a == b
    assert TASK.sft_examples(50, random.Random(8)) != a
    assert TASK.sample_prompts(20, random.Random(3)) == TASK.sample_prompts(20, random.Random(3))
    p = [e["prompt"] for e in a]
    ra, rb = [e["completion"] for e in a], [e["completion"] for e in reversed(a)]
    assert TASK.label_pairs(p, ra, rb, random.Random(1)) == TASK.label_pairs(p, ra, rb, random.Random(1))
    assert random.getstate() == state


def test_protocol_and_corpus():
    assert isinstance(TASK, Task) and TASK.name == "review"
    vocab = list(TASK.tokenizer_corpus())
    assert 200 <= len(vocab) <= 400 and len(set(vocab)) == len(vocab)
    words = set(vocab)
    for ex in TASK.sft_examples(200, random.Random(4)):
        assert set(ex["prompt"].split()) | set(ex["completion"].split()) <= words
    assert vocab == vocabulary()
