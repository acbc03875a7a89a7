"""TOST and non-inferiority: hand-computed cases and properties (fourfold.apps.claim_stats)."""
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fourfold.apps.claim_stats import Z_ONE_SIDED_5, noninferior, tost

FIN = st.floats(-10, 10, allow_nan=False)
SE = st.floats(0, 5, allow_nan=False)
MARGIN = st.floats(1e-3, 5, allow_nan=False)


def test_hand_computed_cases():
    # beta-high's gold: +0.06 sd, SE 0.025, margin 20% of PPO's +0.5457 sd gain = 0.10914
    b = tost(0.06, 0.025, 0.2 * 0.5457)
    assert b.lower == pytest.approx(0.0188787, abs=1e-6)  # 0.06 - 1.6448536 * 0.025
    assert b.upper == pytest.approx(0.1011213, abs=1e-6) and b.holds
    # grpo's cost: +0.11 sd, SE 0.02: upper 0.11 + 0.0329 = 0.1429 >= 0.10914: not non-inferior
    n = noninferior(0.11, 0.02, 0.2 * 0.5457)
    assert n.upper == pytest.approx(0.1428971, abs=1e-6) and not n.holds
    # a negative cost is non-inferior at once; TOST needs the interval inside on both sides
    assert noninferior(-0.5, 0.1, 0.1).holds and not tost(-0.5, 0.1, 0.1).holds
    assert tost(0.0, 0.0, 0.1).holds and not tost(0.1, 0.0, 0.1).holds  # at the margin: no
    assert Z_ONE_SIDED_5 == pytest.approx(1.6448536, abs=1e-7)


@pytest.mark.parametrize("args", [(0.0, -1.0, 0.1), (0.0, math.nan, 0.1), (0.0, 0.1, 0.0), (0.0, 0.1, -1.0),
                                  (0.0, 0.1, math.inf), (0.0, 0.1, 0.1, 0.0)])
def test_bad_inputs_are_one_clear_error(args):
    with pytest.raises(ValueError, match="expected a finite number"):
        tost(*args)


@given(FIN, SE, MARGIN)
def test_tost_is_symmetric_and_implies_noninferiority(d, se, m):
    assert tost(d, se, m).holds == tost(-d, se, m).holds
    if tost(d, se, m).holds:
        assert noninferior(d, se, m).holds and abs(d) < m


@given(SE, MARGIN, st.floats(1, 3))
def test_a_difference_at_or_beyond_the_margin_never_passes(se, m, k):
    assert not tost(m * k, se, m).holds and not tost(-m * k, se, m).holds
    assert not noninferior(m * k, se, m).holds


@given(FIN, SE, SE, MARGIN)
def test_more_noise_never_helps_a_claim_pass(d, se1, se2, m):
    small, large = sorted((se1, se2))
    assert tost(d, large, m).holds <= tost(d, small, m).holds
    assert noninferior(d, large, m).holds <= noninferior(d, small, m).holds
