"""The reports' numbers and their text (fourfold.apps.report_kit): one std rule, 'n/a' for missing."""
import math

from fourfold.apps.report_kit import duration, esc, fmt, html_table, mean, pct, signed, std


def test_mean_and_std_take_the_finite_values_and_std_needs_two():
    assert mean([1.0, None, float("nan"), 3.0, float("inf")]) == 2.0
    assert math.isnan(mean([])) and math.isnan(mean([None, float("nan")]))
    assert std([1.0, 3.0]) == math.sqrt(2.0)  # n - 1
    assert std([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]) == math.sqrt(32 / 7)
    for one in ([5.0], [5.0, None], [5.0, float("nan")], []):
        assert math.isnan(std(one)), one  # a single value has no spread: nan, never 0


def test_formats_read_na_for_missing_numbers():
    assert (fmt(0.12345), fmt(2, 1), pct(0.256), pct(0.256, 1), signed(0.5), signed(-0.125, 3)) == (
        "0.123", "2.0", "26%", "25.6%", "+0.50", "-0.125")
    for missing in (None, float("nan"), float("inf"), True, "x"):
        assert fmt(missing) == pct(missing) == signed(missing) == "n/a", missing
    assert fmt(std([1.0]), 2) == "n/a"
    assert (fmt(-0.0004), fmt(-0.004, 2), fmt(-0.006, 2)) == ("0.000", "0.00", "-0.01")  # never -0.00
    assert (duration(42.4), duration(150)) == ("42s", "2.5min")


def test_html_table_takes_rendered_cells():
    t = html_table(["a", "b"], [[esc("<x>"), "1.5"]], cls="samples", num_cols=(1,))
    assert t.startswith('<table class="samples">\n<thead><tr><th>a</th><th>b</th></tr></thead>')
    assert '<tr><td>&lt;x&gt;</td><td class="num">1.5</td></tr>' in t
