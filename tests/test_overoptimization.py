"""The overoptimization family: its summaries and claims on hand-made curves, its config, and a
tiny family end to end (then a rerun that skips everything); the real `--quick` is in the slow marks."""
import dataclasses
import json
import math
import time
from pathlib import Path

import pytest

from fourfold.apps.experiments.config import ExperimentsConfig, OveroptimizationClaimsConfig, OveroptimizationConfig
from fourfold.apps.experiments.overopt import OVEROPT_QUICK, overopt_quick_config, size_demo
from fourfold.apps.experiments.overopt_claims import compute_overopt_claims, mean_curve, summarize_curves
from fourfold.config import load_config
from fourfold.core.overoptimization import bon_kl
from fourfold.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CC = OveroptimizationClaimsConfig()


def _curve(alpha, beta, form, ds, proxy_slope=1.0, base=-0.2):
    f = (lambda d: d) if form == "bon" else (lambda d: math.log(d) if d > 0 else 0.0)
    return {"d": list(ds), "gold": [base + d * (alpha - beta * f(d)) for d in ds],
            "proxy": [proxy_slope * d for d in ds]}


BON_D = [math.sqrt(bon_kl(n)) for n in range(1, 65)]  # up to 1.79
PPO_D = [0.0] + [0.4 * i for i in range(1, 26)]  # up to 10


def _healthy():
    """Larger RMs: higher peaks, smaller beta; every curve peaks inside its range and falls."""
    summaries = {"bon": {}, "ppo": {}}
    for p, (ab, bb, ar, br) in {500: (1.0, 0.8, 0.3, 0.25), 1500: (1.2, 0.7, 0.4, 0.22), 4000: (1.4, 0.6, 0.5, 0.2)}.items():
        summaries["bon"][p] = summarize_curves([_curve(ab, bb, "bon", BON_D), _curve(ab + 0.02, bb, "bon", BON_D)], "bon", 0.5)
        summaries["ppo"][p] = summarize_curves([_curve(ar, br, "rl", PPO_D)], "ppo", 0.5)
    return summaries


def test_summary_of_a_known_curve():
    s = summarize_curves([_curve(1.0, 0.5, "bon", BON_D)], "bon", 0.5)
    assert s["alpha"] == pytest.approx(1.0) and s["beta"] == pytest.approx(0.5) and s["r2"] == pytest.approx(1.0)
    peak = max(range(64), key=lambda i: BON_D[i] * (1 - 0.5 * BON_D[i]))
    assert s["peak_index"] == peak and s["peak_d"] == BON_D[peak]
    assert s["peak_gain_sd"] == pytest.approx(BON_D[peak] * (1 - 0.5 * BON_D[peak]) / 0.5)
    assert s["last_gain_sd"] == pytest.approx(BON_D[-1] * (1 - 0.5 * BON_D[-1]) / 0.5)
    assert s["proxy_last"] == pytest.approx(BON_D[-1]) and math.isnan(s["alpha_sd"])  # one seed: no spread
    m = mean_curve([{"d": [0, 1, 2], "gold": [0, 2, 4], "proxy": [1, 1, 1]}, {"d": [0, 1], "gold": [2, 0], "proxy": [3, 3]}])
    assert m == {"d": [0, 1], "gold": [1, 1], "proxy": [2, 2]}


def test_every_claim_holds_on_healthy_curves():
    default = {p: [{"kl": 0.5, "gold": 0.0}] for p in (500, 1500, 4000)}  # d = 0.71, before every PPO peak
    rows, notes = compute_overopt_claims(_healthy(), default, CC, expected_sizes=[4000, 500, 1500])
    assert [r["group"] for r in rows] == ["peak", "fit", "size-peak", "size-beta"] * 2 + ["default-kl"]
    assert all(r["holds"] == "yes" for r in rows), [r for r in rows if r["holds"] != "yes"]
    assert notes == []


def test_claims_that_do_not_hold():
    s = _healthy()
    s["bon"][4000] = summarize_curves([_curve(0.3, 0.05, "bon", BON_D)], "bon", 0.5)  # still rising: no peak, lower peak
    s["ppo"][500] = summarize_curves([{"d": PPO_D, "gold": [math.sin(3 * d) for d in PPO_D],
                                       "proxy": [-d for d in PPO_D]}], "ppo", 0.5)  # wrong form, proxy falls
    default = {p: [{"kl": 9.0, "gold": 0.0}] for p in (500, 1500, 4000)}  # d = 3: past the peaks
    rows, _ = compute_overopt_claims(s, default, CC, expected_sizes=[500, 1500, 4000])
    holds = {(r["group"], r["claim"].split(":")[0]): r["holds"] for r in rows}
    assert holds[("peak", "best-of-n")] == "no" and holds[("size-peak", "best-of-n")] == "no"
    assert holds[("size-beta", "best-of-n")] == "yes"  # 0.8, 0.7, 0.05 still decreases
    assert holds[("peak", "PPO")] == "no" and holds[("fit", "PPO")] == "no"
    assert holds[("default-kl", "the demo's default KL coefficient stops PPO at or before the unpenalised run's gold peak")] == "no"


def test_a_curve_that_never_rises_has_no_peak_and_missing_sizes_fail():
    s = _healthy()
    s["bon"][500] = summarize_curves([{"d": BON_D, "gold": [-d for d in BON_D], "proxy": BON_D}], "bon", 0.5)
    del s["ppo"][1500]
    rows, notes = compute_overopt_claims(s, {}, CC, expected_sizes=[500, 1500, 4000])
    by = {(r["group"], r["claim"][:3]): r["holds"] for r in rows}
    assert by[("peak", "bes")] == "no"  # falls from the start: it never peaked
    assert by[("peak", "PPO")] == "no" and by[("fit", "PPO")] == "no"  # a size is missing
    assert any("PPO: no results at 1500 pairs" in n for n in notes)
    assert "default-kl" not in {r["group"] for r in rows}


def test_config_example_quick_and_errors():
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "overoptimization.yaml")
    assert cfg.family == "overoptimization" and cfg.overoptimization == OveroptimizationConfig()
    assert cfg.seeds == [0, 1, 2] and cfg.run.output_dir == "runs/overoptimization"
    d = size_demo(cfg, 1500)
    assert d.pairs.pairs == 1500 and d.run.output_dir == "runs/demo-overopt-p1500" and cfg.demo.pairs.pairs == 4000
    quick = overopt_quick_config(dataclasses.replace(cfg, quick=True))
    assert quick.overoptimization.bon_n == OVEROPT_QUICK["overoptimization.bon_n"] and quick.seeds == [0]
    assert (quick.run.output_dir, quick.overoptimization.demo_dir) == ("runs/overoptimization-quick",
                                                                      "runs/demo-overopt-quick")
    for bad, msg in ((["overoptimization.rm_pairs=[500, 500]"], "a size is listed twice"),
                     (["overoptimization.bon_n=1"], "overoptimization.bon_n: must be >= 2"),
                     (["overoptimization.curve_prompts=600"], "must be <= eval_prompts"),
                     (["overoptimization.rm_pairs=[8]"], "at least demo.reward.batch_size=32 pairs"),
                     (["overoptimization.claims.r2_min=0"], "overoptimization.claims.r2_min")):
        with pytest.raises(ConfigError, match=msg.replace("[", r"\[")):
            load_config(ExperimentsConfig, ROOT / "examples" / "overoptimization.yaml", bad)


def _tiny(out: Path, demo: Path) -> list[str]:
    return ["experiments", "--output-dir", str(out), "family=overoptimization", f"overoptimization.demo_dir={demo}",
            "overoptimization.rm_pairs=[20,40]", "overoptimization.bon_n=4", "overoptimization.bon_prompts=8",
            "overoptimization.curve_prompts=8", "overoptimization.eval_every=1", "overoptimization.default_kl=false",
            "demo.model.hidden_size=32", "demo.sft.examples=300", "demo.sft.steps=10", "demo.pairs.eval_pairs=10",
            "demo.pairs.slip_eval_pairs=4", "demo.reward.steps=5", "demo.reward.batch_size=8",
            "demo.ppo.rollout_batch_size=8", "demo.ppo.minibatch_size=4", "iterations=2", "seeds=[0]",
            "eval_prompts=16", "run.progress=false"]


def test_tiny_family_end_to_end(tmp_path):
    """Every piece at a tiny budget: two RM sizes over one SFT model (the second's SFT stage copied),
    the best-of-n curves, PPO's checkpoints evaluated, the claims, the report; then a cached rerun."""
    from fourfold.cli import main

    out, demo = tmp_path / "out", tmp_path / "demo"
    assert main(_tiny(out, demo)) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res["jobs"].values()) == {"done"} and len(res["jobs"]) == 2 + 1 + 2
    assert "seeded_from" in json.loads((demo.parent / "demo-p40" / "stages" / "sft" / "DONE").read_text())["result"]
    bon = res["curves"]["bon"]["20"][0]
    assert bon["n"] == [1, 2, 3, 4] and bon["d"][1] == pytest.approx(math.sqrt(math.log(2) - 0.5))
    ppo = res["curves"]["ppo"]["40"][0]
    assert ppo["iteration"] == [0, 1, 2] and ppo["d"][0] < 0.01  # the SFT model itself (KL 0 up to float noise)
    assert [c["group"] for c in res["claims"]] == ["peak", "fit", "size-peak", "size-beta"] * 2
    assert (out / "overoptimization.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## Claims" in (out / "summary.md").read_text()
    t0 = time.perf_counter()
    assert main(_tiny(out, demo)) == 0
    assert set(json.loads((out / "results.json").read_text())["jobs"].values()) == {"cached"}
    assert time.perf_counter() - t0 < 30

    from fourfold.apps import publish

    record = publish.collect_overopt(out)
    assert set(publish.REQUIRED_KEYS["overoptimization"]) <= set(record)
    block = publish.BLOCKS["docs/experiments.md"]["overoptimization"]({"overoptimization": record})
    assert publish.overopt_headline(record)[0].startswith("| reward hacking as a law")
    assert "| best-of-n | 20 |" in block and "| PPO | 40 |" in block and record["provenance"]["commit"] in block
    assert "img/overoptimization.png" in block and "No results published yet" in publish.BLOCKS["docs/experiments.md"]["overoptimization"]({})


@pytest.mark.slow
def test_quick_end_to_end(tmp_path):
    """`fourfold experiments --config examples/overoptimization.yaml --quick` from nothing."""
    from fourfold.cli import main

    out = tmp_path / "out"
    t0 = time.perf_counter()
    assert main(["experiments", "--config", str(ROOT / "examples" / "overoptimization.yaml"), "--quick",
                 "--output-dir", str(out), f"overoptimization.demo_dir={tmp_path}/demo", "run.progress=false"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert len(res["claims"]) == 9 and set(res["curves"]["bon"]) == {"500", "1500", "4000"}
    print(f"overoptimization --quick took {time.perf_counter() - t0:.0f} s")
