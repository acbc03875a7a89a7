"""The re-posed overoptimization family's runner (fourfold.apps.experiments.goodhart, issue 41): the
job graph of the designed config (one SFT model for both worlds, an RM per world and level, one
best-of-n sampling, the PPO runs with the gold arm's reward and critic), the level helpers by hand,
--quick's settings, and the collection, claims and report from fake run outputs made by the
family's own measures (nothing trains: seconds). The real --quick is in the slow tier."""
import json
import math
import time
from pathlib import Path

import pytest
import torch

from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.goodhart import (
    GOLD_FN,
    Goodhart,
    corpus_key,
    goodhart_quick_config,
    level_demo,
    level_eval_pairs,
    run_name,
)
from fourfold.apps.experiments.goodhart_config import GOODHART_WORLDS
from fourfold.apps.experiments.goodhart_eval import bon_measures, curve_point
from fourfold.apps.experiments.goodhart_sample import schedule_points
from fourfold.config import load_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "overoptimization-goodhart.yaml"


def fam_of(cfg, tmp_path) -> Goodhart:
    return Goodhart(cfg, tmp_path / "out", lambda *a, **k: None, [f"p{i}" for i in range(cfg.eval_prompts)], 7)


def test_level_helpers_by_hand():
    assert [level_eval_pairs(500, p) for p in (100, 300, 1000, 4000)] == [25, 75, 250, 500]
    assert level_eval_pairs(500, 2) == 1 and level_eval_pairs(200, 1000) == 200
    ext, reg = GOODHART_WORLDS["extremal"], GOODHART_WORLDS["regressional"]
    assert corpus_key(ext) == corpus_key(reg) == corpus_key({})  # gold's length terms and the labelers only
    assert corpus_key({"min_review_words": 10}) != corpus_key({})
    assert corpus_key({"length_range": [8, 22]}) != corpus_key({})  # the corpus keeps responses >= its lower end
    ck = [[1, "a"], [2, "b"], [3, "c"], [4, "d"], [5, "e"]]
    assert schedule_points(ck, [1, 2, 4]) == [[1, "a"], [2, "b"], [4, "d"], [5, "e"]]  # and the last, always
    assert schedule_points([], [1]) == []
    assert run_name("extremal", 1000, 0.05, 2) == "ppo/extremal/p1000/kl0.05/seed2"
    assert run_name("regressional", "gold", 0.0, 0) == "ppo/regressional/gold/kl0/seed0"


def test_the_designed_job_graph(tmp_path):
    cfg = load_config(ExperimentsConfig, EXAMPLE)
    fam = fam_of(cfg, tmp_path)
    jobs = {j.name: j for j in fam.jobs()}
    assert len(jobs) == 8 + 1 + 14  # an RM per world and level, one best-of-n sampling, ppo_runs()
    first = next(iter(jobs))
    assert first == "demo/extremal-p100" and jobs[first].deps == ()  # trains the one SFT model
    assert all(j.deps == (first,) for n, j in jobs.items() if n.startswith("demo/") and n != first)
    assert len(fam.corpora()) == 1 and set(jobs["bon/seed0"].deps) == {n for n in jobs if n.startswith("demo/")}
    assert jobs["ppo/regressional/gold/kl0/seed0"].deps == tuple(f"demo/regressional-p{p}" for p in (100, 300, 1000, 4000))
    d = level_demo(cfg, "regressional", 100)
    assert (d.pairs.pairs, d.pairs.eval_pairs) == (100, 25) and d.task_options["labeler_noise"] == 0.3
    assert d.run.output_dir == "runs/demo-goodhart-regressional-p100"
    assert fam.sft_dir("regressional") == fam.sft_dir("extremal") == Path("runs/demo-goodhart-extremal-p100").resolve() / "sft"
    assert fam.schedule() == [1, 2, 3, 4, 5, 6, 12, 18, 24, 30, 36, 42, 48]  # dense 6, then every 6th (budget)


def test_the_run_configs_of_a_proxy_arm_and_the_gold_arm(tmp_path):
    cfg = load_config(ExperimentsConfig, EXAMPLE)
    fam = fam_of(cfg, tmp_path)
    proxy = fam.run_config("extremal", 1000, 0.05, 0)
    assert proxy.model.reward.endswith("demo-goodhart-extremal-p1000/reward") and proxy.ppo.kl_coef == 0.05
    assert not proxy.ppo.adaptive_kl and proxy.ppo.lr == pytest.approx(3e-5) and proxy.ppo.critic_lr == pytest.approx(1e-4)
    assert (proxy.run.save_every, proxy.run.keep_checkpoints, proxy.ppo.iterations) == (1, 49, 48)
    assert proxy.data.task_options["length_range"] == [6, 22]
    gold = fam.run_config("regressional", "gold", 0.0, 1)
    assert gold.model.reward is None and gold.model.critic_init == "policy" and gold.ppo.kl_coef == 0.0
    (fn,) = gold.model.reward_fns
    assert fn.fn == GOLD_FN and fn.options == {"task_options": {"labeler_length_bias": 0.0, "labeler_noise": 0.3}}
    assert gold.ppo.lr == proxy.ppo.lr and gold.run.seed == 1
    from fourfold.config.loader import validate_tree

    validate_tree(gold)
    validate_tree(proxy)


def test_quick_settings():
    cfg = load_config(ExperimentsConfig, EXAMPLE)
    q = goodhart_quick_config(cfg.__class__(**{**cfg.__dict__, "quick": True}))
    g = q.overoptimization.goodhart
    assert (q.run.output_dir, g.demo_dir) == ("runs/overoptimization-goodhart-quick", "runs/demo-goodhart-quick")
    assert list(g.worlds) == ["extremal"] and q.seeds == [0] and q.iterations == 6 and g.sweep_pairs in g.rm_pairs
    g.validate()
    assert cfg.overoptimization.goodhart.worlds.keys() == {"extremal", "regressional"}  # the table did not leak


def _fake_outputs(fam: Goodhart) -> None:
    """The files the jobs write, from synthetic scored samples through the family's own measures:
    a higher level's RM is closer to gold; PPO gold rises then falls with d, the gold arm keeps rising."""
    g, gen = fam.g, torch.Generator().manual_seed(0)
    P, N, A = g.bon_prompts, g.bon_n, g.accuracy_samples
    gold = torch.randn(P, N, generator=gen, dtype=torch.float64)
    noise = torch.randn(P, N, generator=gen, dtype=torch.float64)
    texts = [[f"t{p}-{i}" for i in range(N)] for p in range(P)]
    worlds = {w: bon_measures(texts, gold, {p: gold + noise * 400 / p for p in fam.levels}, g.grid()) for w in g.worlds}
    (fam.out / "bon").mkdir(parents=True, exist_ok=True)
    fam.bon_path(0, 0).write_text(json.dumps({"worlds": worlds}))
    its = [0] + fam.schedule()
    for w, reward, coef in g.ppo_runs():
        points = []
        for it in its:
            d = 0.2 * it / (1 + 10 * coef)
            gain = d if reward == "gold" else d * (0.6 - 0.3 * d)
            g_pa = gain + torch.randn(g.curve_prompts, A, generator=gen, dtype=torch.float64) * 0.3
            proxies = {p: g_pa + torch.randn(g.curve_prompts, A, generator=gen, dtype=torch.float64) * 100 / p
                       for p in fam.levels}
            pt = curve_point(g_pa, torch.full((g.curve_prompts, A), d * d, dtype=torch.float64), proxies,
                             "gold" if reward == "gold" else reward)
            points.append({"iteration": it, **pt})
        rd = fam.run_dir(w, reward, coef, 0)
        rd.mkdir(parents=True, exist_ok=True)
        (rd / "curve.json").write_text(json.dumps({"points": points}))


def test_collection_claims_and_report_from_fake_run_outputs(tmp_path, monkeypatch):
    from fourfold.apps.experiments import family, run

    cfg = load_config(ExperimentsConfig, EXAMPLE, [
        f"run.output_dir={tmp_path / 'out'}", f"overoptimization.goodhart.demo_dir={tmp_path / 'demo'}",
        "overoptimization.goodhart.bon_n=16", "overoptimization.goodhart.bon_prompts=16",
        "overoptimization.goodhart.curve_prompts=32", "overoptimization.goodhart.accuracy_samples=3",
        "iterations=12", "overoptimization.goodhart.claims.bootstrap_reps=20",
        "overoptimization.goodhart.claims.null_draws=10", "run.progress=false"])

    def fake_jobs(cfg_, out, log, jobs):
        _fake_outputs(fam_of(cfg_, tmp_path))
        return {j.name: "done" for j in jobs}, 1.0

    monkeypatch.setattr(family, "run_family_jobs", fake_jobs)
    res = run(cfg)
    rec = json.loads((tmp_path / "out" / "results.json").read_text())
    assert rec["design"] == "goodhart" and set(rec["record"]) == {"extremal", "regressional"}
    w = rec["record"]["extremal"]
    assert set(w["ppo"]) == {"100", "300", "1000", "4000"} and set(w["kl"]) == {"0.01", "0.05"}
    assert len(w["ppo"]["100"]["d"]) == len(rec["schedule"]) + 1 and len(w["ppo"]["100"]["gold_by_prompt"]) == 32
    assert len(w["kl"]["0.05"]["gold_by_prompt"]) == 32 and w["sweep_pairs"] == 1000
    acc = [w["accuracy"][p] for p in ("100", "300", "1000", "4000")]
    assert acc == sorted(acc) and rec["accuracy"]["extremal"]["100"]["points"] == 7 * len(rec["schedule"])  # 7 runs a world
    assert set(rec["runs"]["extremal"]) == {"p100", "p300", "p1000", "p4000", "gold"}
    groups = [c["group"] for c in res["claims"]]
    assert groups.count("peak") == 4 and groups.count("quality-axis") == 2 and groups.count("efficiency") == 2
    assert all(c["kind"] and c["null"] and c["paper"] for c in res["claims"])
    holds = {(c["group"], c["claim"]): c["holds"] for c in res["claims"]}
    assert holds[("quality-axis", "(extremal) more preference pairs give RMs of higher gold accuracy")] == "yes"
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "## Best-of-n" in md and "gold (ceiling)" in md and "| extremal | gold | 0 |" in md and "## Claims" in md
    assert (tmp_path / "out" / "overoptimization.png").read_bytes()[:4] == b"\x89PNG"
    assert "Gold against d" in (tmp_path / "out" / "report.html").read_text()
    assert not math.isnan(rec["accuracy"]["regressional"]["4000"]["accuracy"])


def _tiny(out: Path, demo: Path) -> list[str]:
    g = "overoptimization.goodhart."
    return ["experiments", "--output-dir", str(out), "family=overoptimization", "overoptimization.design=goodhart",
            f"{g}demo_dir={demo}", f"{g}rm_pairs=[8,12,16,20]", f"{g}sweep_pairs=16", f"{g}bon_n=8", f"{g}bon_prompts=4",
            f"{g}curve_prompts=4", f"{g}accuracy_samples=2", f"{g}kl_coefs=[0,0.05]", f"{g}dense_checkpoints=1",
            f"{g}checkpoint_every=1", f"{g}claims.bootstrap_reps=20", f"{g}claims.null_draws=10",
            "demo.model.hidden_size=32", "demo.sft.examples=300", "demo.sft.steps=10", "demo.pairs.eval_pairs=10",
            "demo.pairs.slip_eval_pairs=4", "demo.reward.steps=5", "demo.reward.batch_size=8",
            "demo.ppo.rollout_batch_size=8", "demo.ppo.minibatch_size=4", "iterations=2", "seeds=[0]",
            "eval_prompts=16", "run.progress=false"]


@pytest.mark.slow
def test_tiny_family_end_to_end(tmp_path):
    """Every job kind on a micro model (two worlds over one SFT model, 4 levels each, best-of-8, 12
    PPO runs of 2 iterations), then a rerun that finds everything cached."""
    from fourfold.cli import main

    out, demo = tmp_path / "out", tmp_path / "demo"
    assert main(_tiny(out, demo)) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res["jobs"].values()) == {"done"} and len(res["jobs"]) == 8 + 1 + 12
    assert "seeded_from" in json.loads((tmp_path / "demo-regressional-p20" / "stages" / "sft" / "DONE").read_text())["result"]
    bon = res["record"]["extremal"]["bon"]
    assert bon["n"] == [1, 2, 4, 8] and set(bon["levels"]) == {"8", "12", "16", "20"}
    curve = res["runs"]["regressional"]["gold"]["0"]
    assert curve["iteration"] == [0, 1, 2] and curve["d"][0] < 0.01  # the SFT model itself
    assert not list((out / "runs" / "extremal" / "p8" / "kl0" / "seed0" / "checkpoints").glob("step-*1"))  # pruned
    assert main(_tiny(out, demo)) == 0
    assert set(json.loads((out / "results.json").read_text())["jobs"].values()) == {"cached"}


@pytest.mark.slow
def test_quick_end_to_end(tmp_path):
    """`fourfold experiments --config examples/overoptimization-goodhart.yaml --quick` from nothing."""
    from fourfold.cli import main

    out = tmp_path / "out"
    t0 = time.perf_counter()
    assert main(["experiments", "--config", str(EXAMPLE), "--quick", "--output-dir", str(out),
                 f"overoptimization.goodhart.demo_dir={tmp_path}/demo", "run.progress=false"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res["record"]) == {"extremal"} and set(res["jobs"].values()) == {"done"}
    assert {c["group"] for c in res["claims"]} >= {"peak", "form", "quality-axis", "kl-stop", "efficiency"}
    print(f"overoptimization goodhart --quick took {time.perf_counter() - t0:.0f} s")
