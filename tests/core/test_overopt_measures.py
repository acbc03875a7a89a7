"""The overoptimization measurements (fourfold.core.overopt_measures): best-of-n weights and the
grid estimator against the exact binomials and brute force over subsets (both tie rules), the
empirical best-of-n KL against hand values and the analytic bound, distinct counts, pairwise gold
accuracy and the checkpoint schedule."""
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.core.overopt_measures import (
    bon_kl_empirical,
    bon_weights,
    checkpoint_schedule,
    distinct_ids,
    expected_best_of_n_grid,
    pair_accuracy,
)
from fourfold.core.overoptimization import bon_choice_probs, bon_kl, expected_best_of_n


def test_weights_hand_case_and_binomials():
    W = bon_weights(3, [1, 2, 3])
    expected = torch.tensor([[1 / 3, 1 / 3, 1 / 3], [2 / 3, 1 / 3, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(W, expected, atol=1e-15)
    for N in (1, 7, 40):
        assert torch.allclose(bon_weights(N, list(range(1, N + 1))), bon_choice_probs(N), atol=1e-13)
    W = bon_weights(1024, [1, 2, 16, 256, 1024])
    assert torch.allclose(W.sum(1), torch.ones(5, dtype=torch.float64), atol=1e-12)
    # C(1024 - i, 15) / C(1024, 16) at i = 10, by exact integers
    assert float(W[2, 9]) == pytest.approx(math.comb(1014, 15) / math.comb(1024, 16), rel=1e-12)
    with pytest.raises(ValueError, match="ns must be integers in 1..N"):
        bon_weights(4, [5])


def test_grid_first_matches_the_full_estimator():
    gen = torch.Generator().manual_seed(0)
    proxy = torch.randint(0, 5, (6, 30), generator=gen).double()  # ties
    gold = torch.randn(6, 30, generator=gen, dtype=torch.float64)
    full = expected_best_of_n(proxy, gold)
    ns = [1, 2, 3, 8, 30]
    assert torch.allclose(expected_best_of_n_grid(proxy, gold, ns), full[:, [n - 1 for n in ns]], atol=1e-12)


def test_grid_average_hand_case():
    # proxy ties between samples 0 and 1 (gold 1 and 3), sample 2 below (gold 0)
    proxy, gold = torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0, 3.0, 0.0])
    # n = 3: a uniform choice among the two tied: 2; n = 2: {0,1} -> 2, {0,2} -> 1, {1,2} -> 3: mean 2
    # n = 1: mean 4/3; 'first' gives n = 3: 1 and n = 2: (1 + 1 + 3) / 3
    assert expected_best_of_n_grid(proxy, gold, [1, 2, 3], ties="average").tolist() == pytest.approx([4 / 3, 2.0, 2.0])
    assert expected_best_of_n_grid(proxy, gold, [1, 2, 3]).tolist() == pytest.approx([4 / 3, 5 / 3, 1.0])


def _brute_average(proxy, gold, n):
    vals = []
    for sub in itertools.combinations(range(len(proxy)), n):
        top = max(proxy[i] for i in sub)
        tied = [gold[i] for i in sub if proxy[i] == top]
        vals.append(sum(tied) / len(tied))
    return sum(vals) / len(vals)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7).flatmap(lambda N: st.tuples(
    st.lists(st.integers(-2, 2), min_size=N, max_size=N),
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=N, max_size=N))))
def test_grid_average_equals_brute_force(pg):
    proxy, gold = pg
    N = len(proxy)
    est = expected_best_of_n_grid(torch.tensor(proxy, dtype=torch.float64), torch.tensor(gold, dtype=torch.float64),
                                  list(range(1, N + 1)), ties="average")
    assert est.tolist() == pytest.approx([_brute_average(proxy, gold, n) for n in range(1, N + 1)], abs=1e-9)


def test_empirical_kl_all_distinct_is_the_analytic_bound():
    proxy = torch.randn(1024, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ns = [1, 2, 4, 16, 64, 256, 1024]
    kl = bon_kl_empirical(proxy, ns)
    assert kl.tolist() == pytest.approx([bon_kl(n) for n in ns], abs=1e-9)
    # the discrete (all atoms) KL of the uniform over N distinct is below it and nears it as N grows
    small = bon_kl_empirical(torch.arange(10.0), [4], singletons="atoms")[0]
    big = bon_kl_empirical(torch.arange(10000.0), [4], singletons="atoms")[0]
    assert small < big < bon_kl(4) and bon_kl(4) - big < 1e-3


def test_empirical_kl_hand_values():
    # two atoms of mass 1/2, n = 2: q = (1/4, 3/4)
    two = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert float(bon_kl_empirical(torch.tensor([0.0, 0.0, 1.0, 1.0]), [2])[0]) == pytest.approx(two)
    assert float(bon_kl_empirical(torch.tensor([0.0, 1.0]), [2], singletons="atoms")[0]) == pytest.approx(two)
    # an atom of mass 2/3 below a singleton, n = 2: 5/9 log 2 - 5/18 (the atom's terms cancel)
    assert float(bon_kl_empirical(torch.tensor([1.0, 1.0, 2.0]), [2])[0]) == pytest.approx(5 / 9 * math.log(2) - 5 / 18)
    # one candidate repeated: best-of-n is the policy
    assert bon_kl_empirical(torch.full((50,), 0.3), [1, 10, 50]).tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)


def test_empirical_kl_uses_ids_for_repeats():
    # the same text scored with tiny noise is one candidate when ids say so
    proxy = torch.tensor([[0.5, 0.5 + 1e-9, 2.0, 3.0]], dtype=torch.float64)
    ids = distinct_ids([["a", "a", "b", "c"]])
    with_ids = bon_kl_empirical(proxy, [3], ids=ids)
    same = bon_kl_empirical(torch.tensor([[0.5, 0.5, 2.0, 3.0]], dtype=torch.float64), [3])
    assert torch.allclose(with_ids, same)
    assert float(bon_kl_empirical(proxy, [3])[0, 0]) == pytest.approx(bon_kl(3))  # without ids: all distinct


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=40), st.integers(1, 40))
def test_empirical_kl_is_between_zero_and_the_bound(values, n):
    n = min(n, len(values))
    proxy = torch.tensor(values, dtype=torch.float64)
    cont = float(bon_kl_empirical(proxy, [n])[0])
    disc = float(bon_kl_empirical(proxy, [n], singletons="atoms")[0])
    assert -1e-12 <= disc <= cont + 1e-12
    assert cont <= bon_kl(n) + 1e-9


def test_distinct_ids_and_counts():
    ids = distinct_ids([["x", "y", "x", "z"], ["a", "a", "a", "a"]])
    assert ids.tolist() == [[0, 1, 0, 2], [0, 0, 0, 0]]
    assert (ids.max(1).values + 1).tolist() == [3, 1]
    with pytest.raises(ValueError, match="same number of samples"):
        distinct_ids([["a"], ["a", "b"]])


def test_pair_accuracy_hand_values():
    # pairs (0,1) ordered right, (0,2) and (1,2) reversed
    assert pair_accuracy(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 0.0])) == (pytest.approx(1 / 3), 3)
    assert pair_accuracy(torch.tensor([1.0, 1.0]), torch.tensor([0.0, 1.0])) == (0.5, 1)  # a reward tie: 1/2
    acc, pairs = pair_accuracy(torch.tensor([[1.0, 2.0, 5.0], [0.0, 1.0, 2.0]]), torch.tensor([[0.0, 0.0, 1.0], [3.0, 2.0, 1.0]]))
    assert pairs == 2 + 3 and acc == pytest.approx(2 / 5)  # gold ties dropped; the second prompt all reversed
    assert math.isnan(pair_accuracy(torch.ones(3), torch.ones(3))[0])


def test_pair_accuracy_of_gold_and_of_its_negation():
    gold = torch.randn(4, 20, generator=torch.Generator().manual_seed(2))
    assert pair_accuracy(gold, gold)[0] == 1.0 and pair_accuracy(-gold, gold)[0] == 0.0


def test_checkpoint_schedule():
    assert checkpoint_schedule(20, 6, 3) == [1, 2, 3, 4, 5, 6, 9, 12, 15, 18, 20]
    assert checkpoint_schedule(30, 0, 10) == [10, 20, 30]
    assert checkpoint_schedule(4, 6, 3) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="every must be an integer >= 1"):
        checkpoint_schedule(10, 2, 0)
