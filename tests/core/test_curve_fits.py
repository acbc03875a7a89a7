"""fourfold.core.curve_fits: the law's forms against peak-free ones, and a peak test whose null says no."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.core.curve_fits import FORMS, beta_bootstrap, compare_forms, fit_form, peak_test

D = torch.linspace(0, 3, 21, dtype=torch.float64)


def _noisy(mean: torch.Tensor, seed: int, prompts: int = 128, sd: float = 0.5) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return mean[None] + sd * torch.randn(prompts, mean.numel(), generator=gen, dtype=torch.float64)


def test_linear_fit_and_aic_by_hand():
    # a = <d, r> / <d, d> = (1*2 + 2*3) / (1 + 4) = 1.6; SSE = 0.4^2 + 0.2^2 = 0.2
    fit = fit_form([1.0, 2.0], [2.0, 3.0], "linear")
    assert fit.params == pytest.approx((1.6,), abs=1e-15)
    assert fit.sse == pytest.approx(0.2, abs=1e-15)
    # n log(SSE / n) + 2 (k + 1), k = 1 parameter
    assert fit.aic == pytest.approx(2 * math.log(0.1) + 4, abs=1e-12)
    assert fit.predict([3.0]).tolist() == pytest.approx([4.8])


@settings(max_examples=40, deadline=None)
@given(alpha=st.floats(-2, 2), beta=st.floats(-1, 1), form=st.sampled_from(["bon", "rl"]))
def test_the_law_recovers_its_own_parameters(alpha, beta, form):
    d = torch.tensor([0.25, 0.5, 1.0, 1.5, 2.0, 2.5], dtype=torch.float64)
    f = d if form == "bon" else torch.log(d)
    fit = fit_form(d, d * (alpha - beta * f), form)
    assert fit.params == pytest.approx((alpha, beta), abs=1e-9)
    assert fit.sse < 1e-20


@pytest.mark.parametrize("form", ["saturating", "hyperbolic"])
def test_tau_forms_recover_amplitude_and_tau_to_the_grid(form):
    d = torch.linspace(0.1, 3, 12, dtype=torch.float64)
    r = 2.0 * (-torch.expm1(-d / 0.7) if form == "saturating" else d / (1 + d / 0.7))
    fit = fit_form(d, r, form)
    assert fit.params[1] == pytest.approx(0.7, rel=0.04)  # 400 taus over 6 decades: 3.5% apart
    assert fit.params[0] == pytest.approx(2.0, rel=0.04)


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown form 'quadratic'"):
        fit_form([1, 2], [1, 2], "quadratic")
    with pytest.raises(ValueError, match="same length"):
        fit_form([1, 2, 3], [1, 2], "bon")
    with pytest.raises(ValueError, match=">= 0"):
        fit_form([-1, 2], [1, 2], "bon")
    with pytest.raises(ValueError, match="train_share"):
        compare_forms([1, 2, 3], [1, 2, 3], train_share=0.2)
    with pytest.raises(ValueError, match="peak_test"):
        peak_test(torch.zeros(3, 5))


def test_out_of_sample_the_law_wins_only_on_a_curve_that_peaks():
    peaked = compare_forms(D, D * (1 - 0.4 * D))
    assert min(peaked, key=lambda f: peaked[f]["heldout_rmse"]) == "bon"
    assert set(peaked) == set(FORMS) and peaked["bon"]["test_points"] == 8
    # a saturating curve: its own form extrapolates it exactly, best-of-n's law does not
    flat_top = compare_forms(D, 1 - torch.exp(-D))
    assert flat_top["saturating"]["heldout_rmse"] < 0.02 < flat_top["bon"]["heldout_rmse"]
    decline = compare_forms(D, -0.3 * D)
    assert decline["linear"]["heldout_rmse"] < 1e-12


def test_peak_test_finds_a_real_peak():
    res = peak_test(_noisy(D * (1 - 0.4 * D), seed=0))
    assert res.peaks
    assert all(0 < j < 20 for j in res.peak_index)
    assert all(f > 10 * se for f, se in zip(res.fall, res.fall_se))


@pytest.mark.parametrize("curve", ["flat", "saturating", "decline"])
def test_peak_test_null_says_no_where_picking_on_the_same_data_says_yes(curve):
    mean = {"flat": 0 * D, "saturating": 0.5 * (1 - torch.exp(-D)), "decline": -0.3 * D}[curve]
    said = [peak_test(_noisy(mean, seed=s), seed=s).peaks for s in range(20)]
    assert sum(said) == 0
    if curve == "flat":
        # the naive form (choose the best point and measure it on the same prompts) calls a peak in
        # pure noise: that is the selection the halves remove
        naive = 0
        for s in range(40):
            g = _noisy(mean, seed=s)
            j = int(torch.argmax(g.mean(0)))
            rise, fall = g[:, j] - g[:, 0], g[:, j] - g[:, -1]
            se = lambda x: float(x.std()) / math.sqrt(x.numel())  # noqa: E731
            naive += 0 < j < 20 and float(rise.mean()) > 2 * se(rise) and float(fall.mean()) > 2 * se(fall)
        assert naive >= 2  # measured: 4 of 40


def test_beta_sign_alone_does_not_say_peak():
    # a saturating curve fits best-of-n's law with beta > 0 in every resample, yet it has no peak:
    # the reason the family judges the peak with peak_test, not with the fit's beta
    gold = _noisy(0.8 * (1 - torch.exp(-D)), seed=3)
    boot = beta_bootstrap(D, gold, "bon", reps=60, seed=0)
    assert boot["share_positive"] == 1.0 and boot["low"] > 0
    assert not peak_test(gold, seed=3).peaks
    flat = beta_bootstrap(D, _noisy(0 * D, seed=4), "bon", reps=60, seed=0)
    assert flat["low"] < 0 < flat["high"]
