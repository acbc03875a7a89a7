"""The re-posed overoptimization family's claims (fourfold.apps.experiments.goodhart_claims) on
synthetic curves: a real peak says yes and its computed null no; a saturating curve says no; the
quality orderings, the KL stop and frontier, and the efficiency rule on hand-made inputs; every row
carries a kind, a null and the paper's finding."""
import math

import pytest
import torch

from fourfold.apps.experiments.goodhart_claims import (
    PAPER,
    efficiency_rows,
    form_rows,
    interp_rows,
    kl_rows,
    null_curves,
    peak_rows,
    quality_axis_rows,
    quality_rows,
)
from fourfold.apps.experiments.goodhart_config import GoodhartClaimsConfig, GoodhartConfig
from fourfold.core.overoptimization import bon_kl

CC = GoodhartClaimsConfig(null_draws=10, bootstrap_reps=20)
BON_D = [math.sqrt(bon_kl(n)) for n in GoodhartConfig().grid()]  # n = 1, 2, 4, ..., 1024: d up to 2.44
PPO_D = [3.0 * i / 20 for i in range(21)]


def curve(d, gain, prompts=64, noise=0.3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    d_t = torch.tensor(d, dtype=torch.float64)
    base = torch.randn(prompts, 1, generator=gen, dtype=torch.float64) * 0.5
    eps = torch.randn(prompts, len(d), generator=gen, dtype=torch.float64) * noise
    return d, base + torch.tensor([gain(x) for x in d_t.tolist()], dtype=torch.float64) + eps


def peaked_bon(d):
    return d * (0.5 - 0.2 * d)  # the law, peak at d = 1.25


def saturating(d):
    return 0.35 * (1 - math.exp(-d / 0.7))


def test_the_grid_is_powers_of_two():
    assert GoodhartConfig().grid() == [2**k for k in range(11)]
    assert GoodhartConfig(bon_n=100).grid()[-2:] == [64, 100]


def test_a_real_peak_says_yes_and_its_null_no():
    levels = {100: curve(BON_D, peaked_bon, seed=1), 1000: curve(BON_D, peaked_bon, seed=2)}
    (row,) = peak_rows("extremal", "bon", levels, CC)
    assert row["holds"] == "yes" and row["null"].startswith("no (computed")
    assert row["kind"] == "finding" and row["paper"] == PAPER["peak"]
    (row,) = form_rows("extremal", "bon", levels, CC)
    assert row["holds"] == "yes" and row["null"].startswith("no (computed")


def test_a_saturating_curve_says_no():
    levels = {100: curve(BON_D, saturating, seed=3), 1000: curve(BON_D, saturating, seed=4)}
    (row,) = peak_rows("regressional", "bon", levels, CC)
    assert row["holds"] == "no" and "no peak" in row["measured"]
    (row,) = form_rows("regressional", "bon", levels, CC)
    assert row["holds"] == "no"


def test_ppo_law_on_a_peaked_rl_curve():
    def rl(d):
        return d * (0.4 - 0.5 * math.log(d)) if d > 0 else 0.0  # peak at d = exp(-0.2) = 0.82
    (row,) = peak_rows("extremal", "ppo", {300: curve(PPO_D, rl, prompts=128, seed=5)}, CC)
    assert row["holds"] == "yes"


def test_null_curves_have_no_peak_and_keep_the_shape():
    d, g = curve(BON_D, peaked_bon, seed=6)
    draws = list(null_curves(d, g, 5))
    assert len(draws) == 5 and all(x.shape == g.shape for x in draws)
    for x in draws:
        m = x.mean(0)
        assert float(m[-1]) >= float(m.max()) - 0.1  # the saturating mean does not fall (noise aside)


def test_quality_rows():
    acc = {100: 0.60, 300: 0.66, 1000: 0.70, 4000: 0.74}
    (row,) = quality_axis_rows("regressional", acc, CC)
    assert row["holds"] == "yes" and row["null"].startswith("no (by construction")
    assert quality_axis_rows("regressional", {**acc, 4000: 0.69}, CC)[0]["holds"] == "no"
    assert quality_axis_rows("regressional", {100: 0.6, 300: 0.7, 1000: 0.8}, CC)[0]["holds"] == "no"  # 3 levels
    levels = {p: {"accuracy": a, "peak_gain": 0.1 + a, "beta": 1 - a} for p, a in acc.items()}
    rows = quality_rows("regressional", "bon", levels, CC)
    assert [r["holds"] for r in rows] == ["yes", "yes"]
    # ordered by measured accuracy, not by pairs: 4000 pairs below 1000 in accuracy
    levels[4000]["accuracy"] = 0.65
    rows = quality_rows("regressional", "bon", levels, CC)
    assert [r["holds"] for r in rows] == ["no", "no"]
    levels[4000].update(peak_gain=0.1 + 0.655, beta=1 - 0.655)  # monotone in accuracy again
    assert [r["holds"] for r in quality_rows("regressional", "bon", levels, CC)] == ["yes", "yes"]


def test_interp_rows():
    g = torch.tensor([[0.0, 1.0, 3.0]], dtype=torch.float64)
    assert interp_rows([0.0, 1.0, 2.0], g, 1.5).tolist() == [2.0]
    assert interp_rows([0.0, 2.0, 1.0], torch.tensor([[0.0, 3.0, 1.0]]), 1.5).tolist() == [2.0]  # sorted by d
    assert interp_rows([0.0, 1.0, 2.0], g, 5.0).tolist() == [3.0]


def rl_peaked(d):
    return d * (0.4 - 0.5 * math.log(d)) if d > 0 else 0.0


def test_kl_stop_and_frontier():
    d, g = curve(PPO_D, rl_peaked, prompts=128, seed=7)
    gen = torch.Generator().manual_seed(8)
    on = interp_rows(d, g, 0.6) + torch.randn(128, generator=gen, dtype=torch.float64) * 0.05
    off = interp_rows(d, g, 2.5) + 0.4 + torch.randn(128, generator=gen, dtype=torch.float64) * 0.05
    rows = kl_rows("extremal", (d, g), {0.05: (0.6, on.tolist()), 0.01: (2.5, off.tolist())}, CC)
    by = {(r["group"], r["claim"].split("kl_coef ")[1].split(" ")[0]): r for r in rows}
    assert by[("kl-stop", "0.05")]["holds"] == "yes" and by[("kl-stop", "0.01")]["holds"] == "no"
    assert by[("kl-frontier", "0.05")]["holds"] == "yes" and by[("kl-frontier", "0.01")]["holds"] == "no"
    assert by[("kl-stop", "0.05")]["null"].startswith("no (computed")
    assert by[("kl-frontier", "0.05")]["null"].startswith("no (by construction")
    # no peak in the unpenalised curve: nothing to stop at
    d2, g2 = curve(PPO_D, lambda x: 0.1 * x, prompts=128, seed=9)
    rows = kl_rows("extremal", (d2, g2), {0.05: (0.6, interp_rows(d2, g2, 0.6).tolist())}, CC)
    assert rows[0]["group"] == "kl-stop" and rows[0]["holds"] == "no"


def test_efficiency():
    bon = curve(BON_D, saturating, seed=10)
    ppo = curve(PPO_D, lambda x: 0.05 * x, prompts=128, seed=11)
    (row,) = efficiency_rows("extremal", bon, ppo, CC)
    assert row["holds"] == "yes" and row["null"].startswith("no (computed")
    (row,) = efficiency_rows("extremal", curve(BON_D, lambda x: 0.02 * x, seed=12), curve(PPO_D, saturating, prompts=128, seed=13), CC)
    assert row["holds"] == "no"


def test_claims_config_validates():
    with pytest.raises(ValueError):
        GoodhartClaimsConfig(null_rate=0).validate()
    with pytest.raises(ValueError):
        GoodhartConfig(rm_pairs=[100, 300, 1000]).validate()
    with pytest.raises(ValueError):
        GoodhartConfig(kl_coefs=[0.01, 0.05]).validate()


def test_the_example_config_is_the_design_and_runs_by_its_own_runner(monkeypatch):
    from pathlib import Path

    from fourfold.apps.experiments import goodhart
    from fourfold.apps.experiments.config import ExperimentsConfig, OveroptimizationConfig
    from fourfold.apps.experiments.overopt import run_overopt
    from fourfold.config import load_config

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(ExperimentsConfig, root / "examples" / "overoptimization-goodhart.yaml")
    assert cfg.overoptimization.design == "goodhart" and cfg.overoptimization.goodhart.rm_pairs == [100, 300, 1000, 4000]
    assert OveroptimizationConfig().design == "sizes"  # the published family's default is unchanged
    monkeypatch.setattr(goodhart, "run_goodhart", lambda c: {"ran": c.overoptimization.design})
    assert run_overopt(cfg) == {"ran": "goodhart"}  # design goodhart: fourfold.apps.experiments.goodhart


def test_the_ppo_runs_of_a_seed():
    runs = GoodhartConfig().ppo_runs()
    assert len(runs) == 2 * (4 + 2 + 1)  # per world: kl 0 at 4 levels, 0.01 and 0.05 at 1000 pairs, the gold arm
    assert ("extremal", 1000, 0.05) in runs and ("regressional", "gold", 0.0) in runs
    assert ("extremal", 100, 0.05) not in runs
    with pytest.raises(ValueError, match="sweep_pairs"):
        GoodhartConfig(sweep_pairs=50).validate()


def test_compute_goodhart_claims_on_a_synthetic_record():
    from fourfold.apps.experiments.goodhart_claims import compute_goodhart_claims

    accs = {100: 0.60, 300: 0.64, 1000: 0.68, 4000: 0.72}

    def bon_level(k, p):  # higher quality: a higher, later peak
        d, g = curve(BON_D, lambda x: x * (0.5 - (0.25 - 0.03 * k) * x), seed=20 + k)
        return {"d": d, "gold_by_prompt": g.tolist()}

    def ppo_level(k, p):
        d, g = curve(PPO_D, lambda x: x * (0.4 + 0.05 * k - 0.5 * math.log(x)) if x > 0 else 0.0, prompts=128, seed=30 + k)
        return {"d": d, "gold_by_prompt": g.tolist()}

    ppo = {str(p): ppo_level(k, p) for k, p in enumerate(accs)}
    d1000, g1000 = ppo["1000"]["d"], torch.tensor(ppo["1000"]["gold_by_prompt"])
    record = {"extremal": {
        "bon": {"levels": {str(p): bon_level(k, p) for k, p in enumerate(accs)}},
        "ppo": ppo, "accuracy": {str(p): a for p, a in accs.items()}, "sweep_pairs": 1000,
        "kl": {"0.05": {"d": 0.5, "gold_by_prompt": interp_rows(d1000, g1000, 0.5).tolist()}}},
        "regressional": {"accuracy": {"100": 0.6}}}
    rows, notes = compute_goodhart_claims(record, CC)
    groups = [r["group"] for r in rows]
    assert groups.count("peak") == 2 and groups.count("form") == 2 and groups.count("quality") == 4
    assert {"quality-axis", "kl-stop", "kl-frontier", "efficiency"} <= set(groups)
    held = {(r["group"], r["claim"][:4]): r["holds"] for r in rows if r["claim"].startswith(("best", "PPO"))}
    assert held[("peak", "best")] == "yes" and held[("peak", "PPO ")] == "yes"
    assert all(r["kind"] == "finding" and r["null"] and r["paper"] for r in rows)
    assert any(n.startswith("regressional: no best-of-n curves") for n in notes)
