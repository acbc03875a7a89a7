"""Figures README.md and docs/*.md quote that the code recomputes without training: each is parsed
from the page, so a doc edit that drifts from the code fails (issue 40, "What to build" item 5)."""
import math
import re
from pathlib import Path

import pytest

from fourfold.core.overoptimization import bon_kl

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_best_of_n_kl_figures_of_bon_md():
    text = (DOCS / "bon.md").read_text()
    line = re.search(r"best of n=(\d+) \(KL = log n - \(n-1\)/n = ([\d.]+) nats\)", text)
    assert line and f"{bon_kl(int(line.group(1))):.4f}" == line.group(2)
    m = re.search(r"0 at n = 1, log 2 - 1/2 = ([\d.]+) at n = 2, ([\d.]+) at n = (\d+)\)", text)
    assert m and bon_kl(1) == 0.0
    assert f"{bon_kl(2):.3f}" == m.group(1) and f"{bon_kl(int(m.group(3))):.2f}" == m.group(2)


@pytest.mark.parametrize("n", [1, 2, 4, 32])
def test_bon_kl_is_the_closed_form(n):
    assert bon_kl(n) == pytest.approx(math.log(n) - (n - 1) / n, abs=1e-12)
