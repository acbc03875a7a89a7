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
