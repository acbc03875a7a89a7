"""The re-posed overoptimization family's worlds (fourfold.apps.experiments.goodhart_config.
GOODHART_WORLDS) have the property each is named for, on SFT samples of the review world:
extremal, gold penalises the top decile's length while the labelers prefer it; regressional, the
labelers are noisy (accuracy against gold well below 1) and unbiased (no length preference where
gold ties). The demo's defaults keep neither property (the published family's world)."""
import random
import statistics

import pytest

from fourfold.apps.experiments.goodhart_config import GOODHART_WORLDS, GoodhartConfig
from fourfold.tasks.review import ReviewTask, ReviewTaskConfig


@pytest.fixture(scope="module")
def sft():
    ex = ReviewTask().sft_examples(4000, random.Random(0))
    prompts, responses = [e["prompt"] for e in ex], [e["completion"] for e in ex]
    lengths = [len(r.split()) for r in responses]
    return prompts, responses, lengths, sorted(lengths)[int(0.9 * len(lengths))]


def _labels(task, prompts, responses):
    a, b = list(range(0, len(prompts), 2)), list(range(1, len(prompts), 2))
    lab = task.label_pairs([prompts[i] for i in a], [responses[i] for i in a], [responses[j] for j in b], random.Random(1))
    return list(zip(a, b, lab))  # lab 0: the first of the pair chosen


def test_worlds_leave_the_corpus_alone_and_the_config_copies_them():
    for opts in GOODHART_WORLDS.values():
        assert not set(opts) & set(ReviewTaskConfig.CORPUS_FIELDS)
        ReviewTask(**opts)  # valid options
    assert GoodhartConfig().worlds == GOODHART_WORLDS and GoodhartConfig().worlds is not GOODHART_WORLDS


def test_extremal_gold_penalises_the_top_decile_the_labelers_prefer(sft):
    prompts, responses, lengths, cut = sft
    assert 22 <= cut <= 26  # gold's range ends at 22: near the SFT samples' 90th percentile
    top = [i for i, n in enumerate(lengths) if n >= cut]
    rest = [i for i, n in enumerate(lengths) if n < cut]
    for name, task in (("demo", ReviewTask()), ("extremal", ReviewTask(**GOODHART_WORLDS["extremal"]))):
        gold, util = task.gold_reward(prompts, responses), task.labeler_utility(prompts, responses)
        g_top, g_rest = statistics.mean(gold[i] for i in top), statistics.mean(gold[i] for i in rest)
        assert statistics.mean(util[i] for i in top) > statistics.mean(util[i] for i in rest) + 0.5  # labelers: longer
        # in pairs of one top-decile and one other sample, who picks the long one
        mixed = [(i, j, lab) for i, j, lab in _labels(task, prompts, responses) if (i in top) != (j in top)]
        long_chosen = statistics.mean(float((lab == 0) == (i in top)) for i, j, lab in mixed)
        gold_long = statistics.mean(float((gold[i] > gold[j]) == (i in top)) for i, j, lab in mixed if gold[i] != gold[j])
        assert long_chosen > 0.6
        if name == "demo":  # the published world: length is gold-neutral on the support
            assert g_top > g_rest - 0.05
        else:
            assert g_top < g_rest - 0.15 and gold_long < 0.5


def test_regressional_labelers_are_noisy_and_unbiased(sft):
    prompts, responses, lengths, _ = sft
    for name, task in (("demo", ReviewTask()), ("regressional", ReviewTask(**GOODHART_WORLDS["regressional"]))):
        gold = task.gold_reward(prompts, responses)
        rows = _labels(task, prompts, responses)
        acc = statistics.mean(float((lab == 0) == (gold[i] > gold[j])) for i, j, lab in rows if gold[i] != gold[j])
        ties = [float((lab == 0) == (lengths[i] > lengths[j])) for i, j, lab in rows
                if gold[i] == gold[j] and lengths[i] != lengths[j]]
        longer = statistics.mean(ties)
        se = (0.25 / len(ties)) ** 0.5
        if name == "demo":
            assert longer > 0.7  # biased: the longer of two gold-equal reviews wins
        else:
            assert 0.6 < acc < 0.9  # noisy: far from gold's own ordering
            assert abs(longer - 0.5) < 3 * se  # unbiased: a coin on length where gold ties


def test_gold_reward_fn_is_the_worlds_gold(sft):
    import functools

    from fourfold.models.reward_fn import load_reward_fn

    prompts, responses, _, _ = sft
    fn = load_reward_fn("fourfold.tasks.review:gold_reward_fn")
    assert fn(prompts[:50], responses[:50]) == ReviewTask().gold_reward(prompts[:50], responses[:50])
    extremal = functools.partial(fn, task_options=GOODHART_WORLDS["extremal"])
    assert extremal(prompts[:200], responses[:200]) == ReviewTask(**GOODHART_WORLDS["extremal"]).gold_reward(
        prompts[:200], responses[:200])
    assert extremal(prompts[:200], responses[:200]) != fn(prompts[:200], responses[:200])  # long ones lose gold
