"""The gradient signal-to-noise ratio (fourfold.core.gradients) against hand-computed values, the
running moments against the definition (hypothesis), and the batch leave-one-out baseline."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.core import GradMoments, flat_grad, grad_snr, leave_one_out_baseline, snr_from_moments


def test_grad_snr_by_hand():
    """g1 = (3, 0), g2 = (1, 2): gbar = (2, 1), ||gbar|| = sqrt 5; deviations (1, -1) and (-1, 1),
    each squared norm 2, mean 2: SNR = sqrt(5) / sqrt(2) = 1.5811."""
    g = torch.tensor([[3.0, 0.0], [1.0, 2.0]])
    assert float(grad_snr(g)) == pytest.approx(math.sqrt(5 / 2), rel=1e-12)
    acc = GradMoments()
    for row in g:
        acc.add(row)
    assert acc.snr() == pytest.approx(math.sqrt(5 / 2), rel=1e-7)
    # opposite gradients: mean 0, SNR 0; equal ones: no noise, inf; all zero: nan
    assert float(grad_snr(torch.tensor([[1.0, -2.0], [-1.0, 2.0]]))) == 0.0
    assert math.isinf(float(grad_snr(torch.tensor([[1.0, 2.0], [1.0, 2.0]]))))
    assert math.isnan(float(grad_snr(torch.zeros(3, 2))))


def test_grad_snr_needs_two_gradients():
    with pytest.raises(ValueError, match="M >= 2"):
        grad_snr(torch.ones(1, 4))
    with pytest.raises(ValueError, match="at least 2"):
        snr_from_moments(16.0, 4.0, 1)
    acc = GradMoments()
    assert acc.snr() is None
    acc.add(torch.ones(3))
    assert acc.snr() is None


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 6), st.integers(1, 8), st.integers(0, 2**16), st.floats(0.0, 3.0))
def test_running_moments_match_the_definition(m, p, seed, shift):
    """The running sum and squared norms give the definition's SNR, and the SNR is scale-free:
    every gradient times 7 leaves it unchanged."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(m, p, generator=gen, dtype=torch.float64) + shift
    acc = GradMoments()
    for row in g:
        acc.add(row.float())
    want = float(grad_snr(g.float().double()))
    # the running sum is float32 (the documented memory choice): the variance, sum ||g_i||^2 / M - ||g||^2,
    # cancels, so its relative rounding grows as ||g||^2 / variance = SNR^2 (float32's 2^-24 a few times over)
    assert acc.snr() == pytest.approx(want, rel=1e-4 + 4 * 2.0**-24 * want**2, abs=1e-6)
    assert float(grad_snr(7 * g)) == pytest.approx(float(grad_snr(g)), rel=1e-9)
    # W ranks holding the same gradients (summed moments) or each its half of the entries
    total_sq, sq_sum = acc.moments()
    assert acc.snr(reduce=lambda ms: [3 * x for x in ms]) == pytest.approx(acc.snr(), rel=1e-12)
    halves = [GradMoments(), GradMoments()]
    for row in g:
        halves[0].add(row[: p // 2].float())
        halves[1].add(row[p // 2 :].float())
    summed = [a + b for a, b in zip(halves[0].moments(), halves[1].moments())]
    assert summed == pytest.approx([total_sq, sq_sum], rel=1e-5, abs=1e-6)


def test_flat_grad_concatenates_the_gradients():
    a, b, c = torch.zeros(2, requires_grad=True), torch.zeros(1, 2, requires_grad=True), torch.zeros(1, requires_grad=True)
    ((a * torch.tensor([1.0, 2.0])).sum() + (b * 3).sum()).backward()
    assert flat_grad([a, b, c]).tolist() == [1.0, 2.0, 3.0, 3.0]  # c has no gradient
    assert flat_grad([c]) is None


def test_leave_one_out_baseline_by_hand():
    """Returns [[1, 2, pad], [4, 0, pad], [6, pad, pad]] (5 valid tokens, sum 13): row 0's others
    sum 10 over 3 tokens, row 1's 9 over 3, row 2's 7 over 4. A single row has no others: 0."""
    G = torch.tensor([[1.0, 2.0, 9.0], [4.0, 0.0, 9.0], [6.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0]])
    assert leave_one_out_baseline(G, mask).tolist() == pytest.approx([10 / 3, 3.0, 7 / 4])
    assert leave_one_out_baseline(G[:1], mask[:1]).tolist() == [0.0]
