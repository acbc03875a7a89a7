"""The review world's horizon knob (``sentences = k``): gold by hand, each sentence's polarity, the
corpus around k sentences, and the default world left exactly as it was."""
import random
from collections import Counter

import pytest

from fourfold.apps.demo.pipeline import sft_stage_settings
from fourfold.config import DemoConfig
from fourfold.errors import ConfigError
from fourfold.tasks import ReviewTask, ReviewTaskConfig, get_task
from fourfold.tasks.review import parse_review

P = "the blender"


def gold(task, response):
    return task.gold_reward([P], [response])[0]


def test_gold_wants_k_positive_sentences_by_hand():
    t = get_task("review", sentences=3)
    assert gold(t, "is great . i love it . it works well .") == 1.0
    # one sentence negative: (1 + 1 - 1) / 3; a neutral one: (1 + 0 + 1) / 3
    assert gold(t, "is great . i hate it . it works well .") == pytest.approx(1 / 3)
    assert gold(t, "is great . it is blue . it works well .") == pytest.approx(2 / 3)
    # a sentence of two clauses counts once, by the sign of their sum
    assert gold(t, "is great , and it is sturdy . i love it . it works well .") == 1.0
    assert gold(t, "is great , but it is flimsy . i love it . it works well .") == pytest.approx(2 / 3)
    # too few sentences: the missing one earns nothing and costs 0.25; too many: the fourth earns
    # nothing, costs 0.25; the penalty stops at max_length_penalty (0.5)
    assert gold(t, "is great . i love it .") == pytest.approx(2 / 3 - 0.25)
    assert gold(t, "is great . i love it . it works well . the lid is good .") == pytest.approx(0.75)
    assert gold(t, "is great .") == pytest.approx(1 / 3 - 0.5)
    six = "is great . i love it . it works well . the lid is good . the motor runs smoothly . five stars ."
    assert gold(t, six) == pytest.approx(0.5)
    # ill formed or repetitive: ill_formed_gold, minus the sentence penalty
    assert gold(t, "is great great . i love it . it works well .") == -1.0
    assert gold(t, "is great .") > gold(t, "great is .") == -1.5
    assert gold(t, "is great . i love it . it works") == -1.0 - 0.25  # truncated: 2 sentences ended
    # words do not count: a long sentence is worth what a short one is
    assert gold(t, "is great . i love it . the handle is not incredibly uncomfortable , and the price is super nice .") == 1.0


def test_one_sentence_horizon_and_the_penalty_knob():
    t = ReviewTask(sentences=1, sentence_penalty=0.1)
    assert gold(t, "is great .") == 1.0
    assert gold(t, "is great . i hate it .") == pytest.approx(0.9)  # only the first sentence counts
    assert gold(t, "is flimsy . i love it .") == pytest.approx(-1.1)
    assert t.sentence_penalty(7) == 0.5  # capped at max_length_penalty


def test_each_sentence_has_a_polarity():
    parsed = parse_review("the blender is very sturdy , but the lid feels flimsy . i would not recommend it . "
                          "five stars . it is blue . my wife loves it , and it works well .")
    assert parsed.sentence_polarities == (0, -1, 1, 0, 1)
    assert parsed.n_sentences == 5 and (parsed.positives, parsed.negatives) == (4, 2)


def test_the_corpus_has_about_k_sentences_and_every_review_scores_by_the_formula():
    for k in (1, 3, 6):
        t = ReviewTask(sentences=k)
        ex = t.sft_examples(600, random.Random(k))
        counts = Counter(parse_review(f"{e['prompt']} {e['completion']}").n_sentences for e in ex)
        assert set(counts) <= {k - 1, k, k + 1} - {0}
        share = 0.6 / (0.8 if k == 1 else 1.0)  # k - 1 = 0 is no review: k and k + 1 share the weight
        assert abs(counts[k] / len(ex) - share) < 0.07
        for e in ex[:100]:
            parsed = parse_review(f"{e['prompt']} {e['completion']}")
            m = parsed.n_sentences
            expected = sum(parsed.sentence_polarities[:k]) / k - min(0.5, 0.25 * abs(m - k))
            assert t.gold_reward([e["prompt"]], [e["completion"]])[0] == pytest.approx(expected)
        words = sum(len(e["completion"].split()) for e in ex) / len(ex)
        assert 5 * k < words < 9 * k + 2  # about 7 words a sentence
        m = t.response_metrics([e["prompt"] for e in ex], [e["completion"] for e in ex])
        assert m["sentences"] == pytest.approx(sum(n * c for n, c in counts.items()) / len(ex))
        assert m["well_formed"] == 1.0
    assert "sentences" not in ReviewTask().response_metrics([P], ["is great ."])


def test_the_knob_is_a_corpus_option_and_validated():
    assert "sentences" in ReviewTaskConfig.CORPUS_FIELDS
    base = sft_stage_settings(DemoConfig())
    assert sft_stage_settings(DemoConfig(task_options={"sentences": 3}))["task"] == {"sentences": 3}
    assert sft_stage_settings(DemoConfig(task_options={"sentence_penalty": 0.5})) == base  # gold only
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="sentences: must be an int >= 0"):
            ReviewTaskConfig(sentences=bad)
    with pytest.raises(ConfigError, match="sentence_penalty"):
        ReviewTaskConfig(sentence_penalty=-0.1)


def test_the_default_world_is_unchanged():
    """sentences = 0: the corpus, gold and metrics of the world without the knob (pinned values)."""
    t = ReviewTask()
    ex = t.sft_examples(3, random.Random(0))
    assert [e["prompt"] for e in ex] == [e["prompt"] for e in ReviewTask(sentences=0).sft_examples(3, random.Random(0))]
    assert gold(t, "is great . i bought it online .") == 0.5
    assert gold(t, "is great . i love it . it works well . the lid is good .") == 1.0  # saturates at 2
    assert set(t.response_metrics([P], ["is great ."])) == {"length", "well_formed", "repetition", "gold",
                                                              "sentiment", "positive"}
