"""Gold reward and recogniser of the review task on hand-written examples."""
import pytest

from fourfold.errors import ConfigError
from fourfold.tasks import ReviewTask, ReviewTaskConfig, get_task, has_repetition, is_well_formed
from fourfold.tasks.review import parse_review

P = "the blender"
POSITIVE = "is very sturdy . it works well ."
NEGATIVE = "is flimsy . it works poorly ."
TWO_POS = "is great . i love it ."
FIVE_POS = (
    "is great . i love it . the lid feels sturdy , and the motor runs smoothly . "
    "i would recommend it to anyone ."
)


@pytest.fixture(scope="module")
def task():
    return ReviewTask()


def gold(task, response, prompt=P):
    return task.gold_reward([prompt], [response])[0]


def test_positive_beats_negative(task):
    assert gold(task, POSITIVE) == 1.0
    assert gold(task, NEGATIVE) == -1.0
    assert gold(task, "is blue . i bought it last week .") == 0.0
    assert gold(task, "is great , but the lid is flimsy .") == 0.0


def test_positive_beats_broken_and_repetitive(task):
    for hack in [
        "great great great great .",
        "is great great great great .",
        "is great . it is great . it is great .",
        "is great ! i love it . i love it .",
        "is great",  # no terminator: truncated
        "excellent perfect amazing superb .",
    ]:
        assert gold(task, hack) <= -1.0, hack
        assert gold(task, POSITIVE) - gold(task, hack) >= 2.0


def test_sentiment_saturates(task):
    assert len(TWO_POS.split()) >= 6 and len(FIVE_POS.split()) <= 35
    assert task.parse(P, FIVE_POS).positives == 5
    assert gold(task, TWO_POS) == gold(task, FIVE_POS) == 1.0
    # one positive statement is worth half
    assert gold(task, "is great . i bought it online .") == 0.5


def test_negation_flips_polarity(task):
    assert gold(task, "is not good . it arrived today .") == -0.5
    assert gold(task, "is not bad . it arrived today .") == 0.5
    assert gold(task, "is great . i would not recommend it .") == 0.0


def test_length_neutral_in_normal_range(task):
    short = "is great . i love it ."  # 7 words
    long = "is great . i bought it last month . the color is blue . my wife uses it every day ."
    long2 = long + " i love it ."
    assert 6 <= len(short.split()) and len(long2.split()) <= 35
    assert gold(task, short) == gold(task, long2) == 1.0
    # mild penalty outside [6, 35] words
    assert gold(task, "is great !") == pytest.approx(0.5 - 3 * 0.05)  # one positive, 3 words
    very_long = long2 + " the lid is white . the base is round . the price is affordable ."
    n = len(very_long.split())
    assert n > 35 and is_well_formed(P, very_long)
    assert gold(task, very_long) == pytest.approx(1.0 - 0.05 * (n - 35))


@pytest.mark.parametrize(
    "response",
    [
        "",
        ".",
        "is great . .",
        "is very good",
        "is good , it is bad .",  # comma without connective
        "is good and it works well .",  # connective without comma
        "is good . the toaster is bad .",  # another product
        "five stars .",  # stars cannot open the review
        "is great . five stars",
        "is not not good .",
        "is very very good .",
        "works great .",  # great is no adverb
        "is good . , and it is bad .",
        "is good . i love .",
        "is good . my wife uses it .",
        "good is it .",
        "<unk> is good .",
    ],
)
def test_recogniser_rejects_broken(response):
    assert not is_well_formed(P, response), response


@pytest.mark.parametrize(
    "prompt,response",
    [
        ("the blender", "is very sturdy , but the lid feels flimsy . i would recommend it ."),
        ("my new kettle", "leaks after a week . two stars !"),
        ("our lamp", "arrived today , and it looks sleek . my sister loves it ."),
        ("this old tent", "came with a spare zipper . i bought it online , yet it broke ."),
        ("the fan", "runs smoothly . the price was not extremely affordable . three stars ."),
    ],
)
def test_recogniser_accepts_hand_written(prompt, response):
    assert is_well_formed(prompt, response)
    assert parse_review(prompt + " " + response) is not None


def test_parse_counts():
    parsed = parse_review("the blender is very sturdy , but the lid feels flimsy . i would recommend it .")
    assert [c.polarity for c in parsed.clauses] == [1, -1, 1]
    assert (parsed.positives, parsed.negatives, parsed.n_sentences) == (2, 1, 2)


def test_has_repetition():
    assert has_repetition("great great")
    assert has_repetition("is good . it is good . it")
    assert has_repetition("a b c a b c")
    assert not has_repetition("is good . it works well . it is good .")
    assert not has_repetition("")


def test_response_metrics(task):
    prompts = [P] * 4
    responses = [POSITIVE, NEGATIVE, "great great great .", "is good"]
    m = task.response_metrics(prompts, responses)
    assert m["length"] == pytest.approx(sum(len(r.split()) for r in responses) / 4)
    assert m["well_formed"] == 0.5
    assert m["repetition"] == 0.25
    assert m["gold"] == pytest.approx(sum(task.gold_reward(prompts, responses)) / 4)
    assert m["positive"] == 0.25
    assert set(task.response_metrics([], [])) >= {"length", "well_formed", "repetition", "gold"}
    with pytest.raises(ValueError):
        task.gold_reward([P], [])


def test_config_and_registry():
    t = get_task("review", labeler_length_bias=0.0)
    assert isinstance(t, ReviewTask) and t.config.labeler_length_bias == 0.0
    assert get_task("review", config=ReviewTaskConfig(labeler_noise=0.2)).config.labeler_noise == 0.2
    with pytest.raises(ConfigError):
        get_task("nope")
    with pytest.raises(ConfigError):
        get_task("review", no_such_field=1)
    with pytest.raises(ConfigError):
        ReviewTaskConfig(labeler_temperature=0.0)
    with pytest.raises(ConfigError):
        ReviewTaskConfig(labeler_noise=1.5)
