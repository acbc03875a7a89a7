"""Simulated labelers: mostly follow gold, but measurably prefer longer responses."""
import random

import pytest

from fourfold.tasks import ReviewTask

N_PAIRS = 2000


def sft_pairs(task, n, seed):
    """Pairs of SFT completions answering the same prompt (completions fit any prompt)."""
    ex = task.sft_examples(2 * n, random.Random(seed))
    prompts = [e["prompt"] for e in ex[0::2]]
    return prompts, [e["completion"] for e in ex[0::2]], [e["completion"] for e in ex[1::2]]


def share_longer(labels, a, b):
    """Share of pairs of different length where the label picks the longer response."""
    picks = [(len(x.split()) > len(y.split())) == (lab == 0) for lab, x, y in zip(labels, a, b)
             if len(x.split()) != len(y.split())]
    return sum(picks) / len(picks)


@pytest.fixture(scope="module")
def pairs():
    return sft_pairs(ReviewTask(), N_PAIRS, seed=123)


def test_labels_follow_gold_imperfectly(pairs):
    task = ReviewTask()
    prompts, a, b = pairs
    labels = task.label_pairs(prompts, a, b, random.Random(0))
    ga, gb = task.gold_reward(prompts, a), task.gold_reward(prompts, b)
    ua, ub = task.labeler_utility(prompts, a), task.labeler_utility(prompts, b)
    gold_agree = [(x > y) == (lab == 0) for lab, x, y in zip(labels, ga, gb) if x != y]
    util_agree = [(x > y) == (lab == 0) for lab, x, y in zip(labels, ua, ub) if x != y]
    gold_agree = sum(gold_agree) / len(gold_agree)
    util_agree = sum(util_agree) / len(util_agree)
    # measured with the defaults: gold 0.77, utility 0.84 (over 5,000 pairs)
    assert 0.70 <= gold_agree <= 0.85
    assert util_agree > gold_agree + 0.03


def test_length_bias_is_measurable(pairs):
    prompts, a, b = pairs
    biased = ReviewTask().label_pairs(prompts, a, b, random.Random(0))
    unbiased = ReviewTask(labeler_length_bias=0.0).label_pairs(prompts, a, b, random.Random(0))
    task = ReviewTask()
    ga, gb = task.gold_reward(prompts, a), task.gold_reward(prompts, b)
    # what gold alone says about length: the gold-better response is the longer one this often
    gold_only = [0.5 if x == y else float((x > y) == (len(r.split()) > len(s.split())))
                 for x, y, r, s in zip(ga, gb, a, b) if len(r.split()) != len(s.split())]
    gold_only = sum(gold_only) / len(gold_only)
    s_biased, s_unbiased = share_longer(biased, a, b), share_longer(unbiased, a, b)
    # measured: biased ~0.70, unbiased ~0.50, gold alone ~0.49 (length and gold are unrelated
    # in the SFT corpus); margins are several standard errors (~0.011 at 2,000 pairs)
    assert abs(gold_only - 0.5) < 0.05
    assert abs(s_unbiased - 0.5) < 0.05
    assert s_biased - s_unbiased > 0.12
    assert s_biased - gold_only > 0.12


def test_noise_pulls_labels_to_chance(pairs):
    prompts, a, b = pairs
    task = ReviewTask(labeler_noise=1.0)
    labels = task.label_pairs(prompts, a, b, random.Random(0))
    assert abs(sum(labels) / len(labels) - 0.5) < 0.05


def test_label_rule_is_bradley_terry():
    task = ReviewTask()
    good, bad = "is great . i love it .", "is flimsy . it broke ."
    labels = task.label_pairs(["the fan"] * 4000, [good] * 4000, [bad] * 4000, random.Random(5))
    # utilities differ by 2 (gold) + 0.12 * 2 (length) -> sigmoid(2.24 / 0.5) = 0.989
    assert labels.count(0) / 4000 == pytest.approx(0.989, abs=0.01)
