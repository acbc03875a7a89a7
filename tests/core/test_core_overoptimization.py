"""Best-of-n math: the analytic KL, the unbiased estimator against brute force over every subset,
and the two overoptimization fits on data with known coefficients."""
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.core.overoptimization import bon_choice_probs, bon_kl, expected_best_of_n, fit_bon, fit_rl


def test_bon_kl_hand_values():
    assert bon_kl(1) == 0.0
    assert bon_kl(2) == pytest.approx(math.log(2) - 0.5)
    assert bon_kl(4) == pytest.approx(math.log(4) - 0.75)
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        bon_kl(0)


def test_choice_probs_hand_case():
    # N = 3: n = 1 picks each rank with 1/3; n = 2 picks rank 1 in 2 of 3 pairs, rank 2 in 1; n = 3 rank 1
    W = bon_choice_probs(3)
    expected = torch.tensor([[1 / 3, 1 / 3, 1 / 3], [2 / 3, 1 / 3, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(W, expected)
    assert torch.allclose(bon_choice_probs(40).sum(1), torch.ones(40, dtype=torch.float64))


def _brute(proxy: list[float], gold: list[float]) -> list[float]:
    """Mean gold of the proxy-best (first on ties) over every n-subset, n = 1..N."""
    N = len(proxy)
    out = []
    for n in range(1, N + 1):
        golds = []
        for sub in itertools.combinations(range(N), n):
            best = max(sub, key=lambda i: (proxy[i], -i))  # highest proxy, the earlier sample on ties
            golds.append(gold[best])
        out.append(sum(golds) / len(golds))
    return out


def test_estimator_hand_case():
    proxy = torch.tensor([0.1, 0.9, 0.5])
    gold = torch.tensor([1.0, -1.0, 2.0])
    # ranks by proxy: sample 1 (gold -1), sample 2 (gold 2), sample 0 (gold 1)
    # n=1: mean 2/3; n=2: (2/3)(-1) + (1/3)(2) = 0; n=3: -1
    assert torch.allclose(expected_best_of_n(proxy, gold), torch.tensor([2 / 3, 0.0, -1.0], dtype=torch.float64))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7).flatmap(lambda N: st.tuples(
    st.lists(st.integers(-3, 3), min_size=N, max_size=N),  # small integers: ties happen
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=N, max_size=N))))
def test_estimator_equals_brute_force_over_subsets(pg):
    proxy, gold = pg
    est = expected_best_of_n(torch.tensor(proxy, dtype=torch.float64), torch.tensor(gold, dtype=torch.float64))
    assert est.tolist() == pytest.approx(_brute([float(p) for p in proxy], gold), abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_estimator_ends_are_the_mean_and_the_argmax(N, P, seed):
    g = torch.Generator().manual_seed(seed)
    proxy, gold = torch.randn(P, N, generator=g), torch.randn(P, N, generator=g)
    est = expected_best_of_n(proxy, gold)
    assert est.shape == (P, N)
    assert torch.allclose(est[:, 0], gold.double().mean(1))
    assert torch.allclose(est[:, -1], gold.double()[torch.arange(P), proxy.argmax(1)])


def test_estimator_when_proxy_is_gold_rises_with_n():
    x = torch.randn(3, 20, generator=torch.Generator().manual_seed(0))
    est = expected_best_of_n(x, x)
    assert bool((est[:, 1:] >= est[:, :-1] - 1e-12).all())


def test_estimator_refuses_other_shapes():
    with pytest.raises(ValueError, match=r"must both be \[P, N\]"):
        expected_best_of_n(torch.zeros(2, 3), torch.zeros(2, 4))


def test_fit_bon_recovers_known_coefficients():
    d = [0.1 * i for i in range(0, 40)]
    r = [x * (1.5 - 0.4 * x) for x in d]
    f = fit_bon(d, r)
    assert (f.alpha, f.beta, f.r2) == (pytest.approx(1.5), pytest.approx(0.4), pytest.approx(1.0))
    assert f.peak == (pytest.approx(1.5 / 0.8), pytest.approx(1.5**2 / 1.6))


def test_fit_rl_recovers_known_coefficients_with_noise():
    g = torch.Generator().manual_seed(1)
    d = torch.linspace(0.05, 6, 200, dtype=torch.float64)
    r = d * (0.8 - 0.5 * torch.log(d)) + 0.01 * torch.randn(200, generator=g, dtype=torch.float64)
    f = fit_rl(d.tolist(), r.tolist())
    assert f.alpha == pytest.approx(0.8, abs=0.01) and f.beta == pytest.approx(0.5, abs=0.01)
    assert 0.99 < f.r2 <= 1.0
    assert f.peak[0] == pytest.approx(math.exp(f.alpha / f.beta - 1))
    assert fit_rl([0.0, 1.0, 2.0], [0.0, 1.0, 1.0]).predict(0.0) == 0.0  # d log d -> 0 at d = 0


def test_fit_r2_is_low_for_the_wrong_form_and_nan_without_spread():
    d = [0.1 * i for i in range(1, 60)]
    r = [math.sin(3 * x) for x in d]
    assert fit_bon(d, r).r2 < 0.5
    assert math.isnan(fit_bon([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]).r2)
    with pytest.raises(ValueError, match="same length >= 2"):
        fit_rl([1.0], [1.0])
