"""bon_measures (fourfold.apps.experiments.goodhart_eval) on hand-made scored samples: the grid's
curves, the empirical d below the analytic bound when texts repeat (equal when none does), the
distinct counts, the RMs' pair accuracy and best-of-n by gold as the ceiling."""
import math

import pytest
import torch

from fourfold.apps.experiments.goodhart_eval import bon_measures
from fourfold.core.overoptimization import bon_kl


def test_hand_case():
    texts = [["a", "b", "a", "c"], ["x", "y", "z", "w"]]
    gold = torch.tensor([[0.0, 1.0, 0.0, 0.5], [1.0, 0.0, 0.0, 0.0]])
    good = gold + 0.01 * torch.arange(4.0)  # orders as gold (ties in gold broken)
    bad = -gold
    m = bon_measures(texts, gold, {100: bad, 4000: good}, [1, 2, 4])
    assert m["n"] == [1, 2, 4] and m["distinct"]["by_prompt"] == [3, 4] and m["distinct"]["mean"] == 3.5
    assert m["d_analytic"] == pytest.approx([math.sqrt(bon_kl(n)) for n in (1, 2, 4)])
    hi, lo = m["levels"]["4000"], m["levels"]["100"]
    assert hi["accuracy"] == 1.0 and lo["accuracy"] == 0.0
    assert hi["gold"][0] == pytest.approx(float(gold.mean()))  # n = 1: the SFT mean
    assert hi["gold"][-1] == pytest.approx(1.0) and lo["gold"][-1] == pytest.approx(0.0)
    # best-of-4 by a gold-faithful proxy is best-of-4 by gold
    assert m["gold_ceiling"]["gold"] == pytest.approx(hi["gold"])
    # prompt 0 repeats 'a' and the bad RM ties in both prompts: atoms, so below the bound
    assert lo["kl_empirical"][-1] < bon_kl(4)
    assert len(hi["gold_by_prompt"]) == 2 and len(hi["gold_by_prompt"][0]) == 3


def test_all_distinct_samples_give_the_analytic_d():
    gen = torch.Generator().manual_seed(0)
    P, N = 3, 64
    texts = [[f"t{p}-{i}" for i in range(N)] for p in range(P)]
    gold = torch.randn(P, N, generator=gen, dtype=torch.float64)
    m = bon_measures(texts, gold, {1: gold + torch.randn(P, N, generator=gen, dtype=torch.float64)}, [1, 8, 64])
    assert m["levels"]["1"]["d"] == pytest.approx(m["d_analytic"], abs=1e-9)
    assert 0.5 < m["levels"]["1"]["accuracy"] < 1.0


def test_errors():
    with pytest.raises(ValueError, match="must start at n = 1"):
        bon_measures([["a", "b"]], torch.zeros(1, 2), {}, [2])
    with pytest.raises(ValueError, match="differ from gold"):
        bon_measures([["a", "b"]], torch.zeros(1, 2), {1: torch.zeros(1, 3)}, [1, 2])


def test_curve_point_by_hand():
    from fourfold.apps.experiments.goodhart_eval import curve_point

    gold = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    kl = torch.tensor([[0.5, 1.5], [1.0, 1.0]])
    proxies = {100: torch.tensor([[2.0, 1.0], [0.0, 3.0]]), 400: torch.tensor([[0.0, 1.0], [1.0, 1.0]])}
    pt = curve_point(gold, kl, proxies, trained_on=400)
    assert pt["kl"] == 1.0 and pt["d"] == 1.0 and pt["gold"] == 0.5 and pt["gold_by_prompt"] == [0.5, 0.5]
    # prompt 0 is the only pair whose gold differs: RM 100 orders it as gold, RM 400 reverses it
    assert pt["accuracy"] == {"100": 1.0, "400": 0.0} and pt["pairs"] == {"100": 1, "400": 1}
    assert pt["proxy"] == 0.75  # the trained-on RM's mean score
    assert curve_point(gold, kl, proxies, trained_on="gold")["proxy"] == 0.5  # the gold arm: gold itself
    assert curve_point(gold, -kl, proxies)["d"] == 0.0  # a negative plug-in KL clamps to d = 0
    with pytest.raises(ValueError, match="not among the proxies"):
        curve_point(gold, kl, proxies, trained_on=1000)
    with pytest.raises(ValueError, match=r"\[P, A\]"):
        curve_point(gold, kl[0], proxies)


def test_ppo_curve_mean_curve_and_pooled_accuracy_by_hand():
    from fourfold.apps.experiments.goodhart_eval import mean_curve, pooled_accuracy, ppo_curve

    pts = [{"iteration": 2, "d": 1.0, "kl": 1.0, "gold": 2.0, "proxy": 5.0, "gold_by_prompt": [2.0, 4.0]},
           {"iteration": 0, "d": 0.0, "kl": 0.0, "gold": 1.0, "proxy": 3.0, "gold_by_prompt": [1.0, 3.0]}]
    c = ppo_curve(pts)
    assert c["iteration"] == [0, 2] and c["d"] == [0.0, 1.0] and c["gold_by_prompt"] == [[1.0, 2.0], [3.0, 4.0]]
    other = {**c, "d": [0.0, 3.0], "gold_by_prompt": [[3.0, 4.0], [5.0, 6.0]]}
    m = mean_curve([c, other])
    assert m["d"] == [0.0, 2.0] and m["gold_by_prompt"] == [[2.0, 3.0], [4.0, 5.0]] and m["seeds"] == 2
    assert m["iteration"] == [0, 2]
    with pytest.raises(ValueError, match="differ in shape"):
        mean_curve([c, {**c, "d": [0.0]}])
    acc = pooled_accuracy([{"accuracy": {"100": 1.0}, "pairs": {"100": 1}},
                           {"accuracy": {"100": 0.25}, "pairs": {"100": 4}}])
    assert acc == {"100": {"accuracy": pytest.approx(0.4), "pairs": 5, "points": 2}}  # (1 + 1) / 5
    none = pooled_accuracy([{"accuracy": {"100": math.nan}, "pairs": {"100": 0}}])
    assert math.isnan(none["100"]["accuracy"]) and none["100"]["pairs"] == 0
