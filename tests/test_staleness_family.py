"""The staleness family (issue 42, item 5): its per-run statistics on hand-built curves, each claim
on hand-built numbers where it says yes and where it says no, its config and every arm's run config
(no subprocess, no training), its jobs and its report from a hand-made record. Not run: the family itself."""
import dataclasses
import json
import math
from pathlib import Path

import pytest

from fourfold.apps import claim_kinds
from fourfold.apps.experiments.arms import run_key
from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.staleness import (
    OBJECTIVE_PPO,
    STALENESS_QUICK,
    Family,
    read_run_curves,
    staleness_arms,
    staleness_quick_config,
    staleness_run_config,
)
from fourfold.apps.experiments.staleness_claims import (
    compute_staleness_claims,
    entropy_ratio,
    gold_crash,
    grad_spikes,
    lag_matches,
    run_stats,
)
from fourfold.apps.experiments.staleness_config import StalenessConfig
from fourfold.apps.experiments.staleness_report import write_staleness_report
from fourfold.config import RolloutConfig, load_config
from fourfold.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SC = StalenessConfig()
CC = SC.claims
N = 2048


# --- the per-run statistics, by hand --------------------------------------------------------------


def test_gold_crash_by_hand():
    g = [0.0, 1.0, 2.0, 3.0, 2.0, 1.0]
    assert gold_crash(g, 1) == pytest.approx(2.0)  # peak 3, then 1
    assert gold_crash(g, 2) == pytest.approx(1.0)  # smoothed 0.5, 1.5, 2.5, 2.5, 1.5
    assert gold_crash([0.0, 1.0, 2.0, 3.0], 2) == 0.0  # never falls
    assert gold_crash([1.0, math.nan, 0.0], 1) == pytest.approx(1.0)  # nan skipped


def test_grad_spikes_entropy_and_lag_by_hand():
    assert grad_spikes([1.0, 1.0, 1.0, 20.0], 10.0) == (1, pytest.approx(20.0))  # median 1
    assert grad_spikes([1.0, 2.0, 3.0, 9.0], 10.0) == (0, pytest.approx(9.0 / 2.5))
    assert grad_spikes([], 10.0)[0] == 0
    assert entropy_ratio([4, 4, 4, 4, 1, 1, 1, 1]) == pytest.approx(0.25)  # last quarter 1 / first quarter 4
    assert entropy_ratio([4, 4, 4]) != entropy_ratio([4, 4, 4])  # nan: fewer than 4 values
    assert lag_matches([1, 2, 3, 4], [0, 1, 2, 2], 2)
    assert not lag_matches([1, 2, 3, 4], [0, 1, 1, 2], 2)
    assert lag_matches([1, 2], [math.nan, math.nan], 0) and not lag_matches([1, 2], [math.nan, math.nan], 1)
    assert not lag_matches([], [], 0)


def _curves(n=20, gold=None, grad=None, entropy=None, k=0):
    return {"iteration": [float(i) for i in range(1, n + 1)],
            "reward/gold_mean": gold or [0.1 * i / n for i in range(n)],
            "policy/grad_norm": grad or [1.0 + 0.01 * i for i in range(n)],
            "policy/entropy": entropy or [2.0] * n,
            "rollout/version_lag": [float(min(i, k)) for i in range(n)] if k else [math.nan] * n,
            "policy/first_ratio_abs_dev": [2e-7] * n, "mismatch/token_abs_diff_mean": [1e-7] * n,
            "rollout/is_ess": [0.9, 0.8] + [0.95] * (n - 2)}


def test_run_stats_stable_and_unstable():
    s = run_stats(_curves(k=2), 2, 0.5, CC)
    assert s["lag_ok"] and not s["crash"] and s["spikes"] == 0 and not s["collapse"] and s["crash_null"]
    assert s["first_ratio_dev"] == pytest.approx(2e-7) and s["is_ess_min"] == 0.8 and math.isnan(s["is_weight"])
    assert s["crash_drop_sd"] == 0.0 and s["entropy_ratio"] == pytest.approx(1.0)
    bad = run_stats(_curves(gold=[0.5] * 10 + [0.0] * 10, grad=[1.0] * 19 + [50.0], entropy=[2.0] * 15 + [0.5] * 5), 1,
                    0.5, CC)
    assert bad["crash"] and bad["crash_drop_sd"] == pytest.approx(1.0)  # 0.5 of gold = 1 sd of 0.5
    assert bad["spikes"] == 1 and bad["spike_max"] == pytest.approx(50.0) and bad["collapse"] and not bad["lag_ok"]


def test_read_run_curves(tmp_path):
    rows = [{"iteration": 1, "reward/gold_mean": 0.1}, {"iteration": 2, "reward/gold_mean": 0.2},
            {"iteration": 2, "reward/gold_mean": 0.3, "rollout/is_ess": 0.9}, {"step": 5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = read_run_curves(tmp_path)
    assert c["iteration"] == [1.0, 2.0] and c["reward/gold_mean"] == [0.1, 0.3]  # a repeated iteration: the last
    assert math.isnan(c["rollout/is_ess"][0]) and c["rollout/is_ess"][1] == 0.9


# --- the claims on hand-built numbers: yes, then no ----------------------------------------------


def _stat(**kw):
    base = {"first_ratio_dev": 1e-7, "token_diff": 1e-7, "is_ess": math.nan, "is_ess_min": math.nan, "is_weight": math.nan,
            "truncated_share": math.nan, "log_kept_mass": math.nan, "clipfrac": 0.1, "approx_kl": 0.01, "kl": 1.0,
            "lag_ok": True, "crash_drop_sd": 0.1, "crash": False, "crash_null": True, "spikes": 0, "spike_max": 2.0,
            "entropy_ratio": 0.9, "collapse": False}
    return {**base, **kw}


def _world(golds: dict, stats: dict):
    """finals and stats of one world (SFT gold 0, sd 1): each arm's gold, +-0.01 over 3 seeds."""
    finals = {a: [{"seed": s, "n": N, "gold": g + 0.01 * (s - 1), "gold_std": 1.0} for s in range(3)] for a, g in golds.items()}
    return finals, {a: {s: _stat(**stats.get(a, {})) for s in range(3)} for a in golds}


GOOD_GOLD = {"k0-engine": 1.0, "k0-recompute": 1.0, "k0-decoupled": 1.0,
             "k1-engine": 0.95, "k1-recompute": 0.9, "k1-decoupled": 0.99,
             "k2-engine": 0.8, "k2-recompute": 0.7, "k2-decoupled": 0.98,
             "k4-engine": 0.5, "k4-recompute": 0.3, "k4-decoupled": 0.9,
             "topp-engine": 0.8, "topp-recompute": 0.85, "topp-decoupled": 1.0}
GOOD_STATS = {"k0-decoupled": {"is_weight": 1.0 - 1e-7, "truncated_share": 0.0},
              "topp-engine": {"first_ratio_dev": 0.03, "token_diff": 0.03},
              "topp-recompute": {"first_ratio_dev": 0.0, "token_diff": 0.03},
              "topp-decoupled": {"first_ratio_dev": 0.0, "token_diff": 0.03, "is_weight": 0.97, "truncated_share": 0.0}}
BAD_GOLD = {**GOOD_GOLD, "k0-recompute": 0.6, "k0-decoupled": 1.3, "k1-engine": 0.9, "k4-engine": 0.9, "k1-recompute": 0.5,
            "k4-recompute": 0.5, "k1-decoupled": 0.5, "k2-decoupled": 0.9, "topp-decoupled": 0.85, "topp-engine": 0.85}
BAD_STATS = {"k0-engine": {"first_ratio_dev": 1e-3}, "k0-decoupled": {"is_weight": 1.01, "truncated_share": 0.0},
             "k1-engine": {"lag_ok": False},
             "topp-engine": {"first_ratio_dev": 1e-5, "token_diff": 1e-5},
             "topp-recompute": {"first_ratio_dev": 0.0, "token_diff": 1e-4},
             "topp-decoupled": {"first_ratio_dev": 0.01, "is_weight": 0.97, "truncated_share": 0.0},
             **{f"k4-{o}": {"crash": True, "spikes": 1, "collapse": True} for o in ("engine", "recompute", "decoupled")}}
GROUP_ROWS = {"lag": 1, "ratio": 3, "agree": 2, "stale-cost": 2, "decoupled": 2, "top-p": 2, "stability": 3}


def _claims(golds, stats, quick=False, sc=SC):
    finals, st = _world(golds, stats)
    return compute_staleness_claims({"demo": finals}, {"demo": {"gold": 0.0, "gold_std": 1.0}}, {"demo": st}, sc,
                                    quick=quick)


def test_every_claim_holds_on_healthy_numbers():
    rows, notes = _claims(GOOD_GOLD, GOOD_STATS)
    assert {g: sum(r["group"] == g for r in rows) for g in GROUP_ROWS} == GROUP_ROWS and not notes
    assert [r["claim"] for r in rows if r["holds"] != "yes"] == []
    kinds = {r["group"]: r["kind"] for r in rows}
    assert kinds == {"lag": "check", "ratio": "check", "agree": "finding", "stale-cost": "finding", "decoupled": "finding",
                     "top-p": "finding", "stability": "finding"}
    assert all(r["null"] == claim_kinds.CHECK_NULL for r in rows if r["kind"] == "check")
    assert all(r["null"].startswith("no (") for r in rows if r["group"] in ("stale-cost", "top-p", "stability", "agree"))
    cost = next(r for r in rows if r["claim"].startswith("the engine objective's cost"))
    assert "cost at k = 4 minus at k = 1 (gold at k = 1 minus at k = 4) per seed +0.45, +0.45, +0.45" in cost["measured"]  # 0.95 - 0.5 in every seed


def test_every_claim_fails_on_broken_numbers():
    rows, _ = _claims(BAD_GOLD, BAD_STATS)
    assert {g: sum(r["group"] == g for r in rows) for g in GROUP_ROWS} == GROUP_ROWS
    assert [r["claim"] for r in rows if r["holds"] != "no"] == []
    assert "off: demo/k1-engine" in next(r for r in rows if r["group"] == "lag")["measured"]


def test_a_margin_claim_at_the_margin_fails():
    """decoupled at k = 1 exactly 20% of ppo's gain (1.0 sd) below its k = 0 run: TOST cannot pass."""
    rows, _ = _claims({**GOOD_GOLD, "k1-decoupled": 0.8}, GOOD_STATS)
    k1, k2 = (r for r in rows if r["group"] == "decoupled")
    assert k1["holds"] == "no" and k2["holds"] == "yes" and "+-0.200 sd" in k1["threshold"]


def test_the_stability_null_says_yes_when_the_rule_cannot_see_a_drop():
    stats = {**GOOD_STATS, "k4-engine": {"crash_null": False}}
    row = next(r for r in _claims(GOOD_GOLD, stats)[0] if r["claim"].startswith("the engine objective stays"))
    assert row["holds"] == "yes" and row["null"].startswith("yes")


def test_quick_states_only_the_checks_and_missing_arms_are_notes():
    rows, notes = _claims(GOOD_GOLD, GOOD_STATS, quick=True)
    assert sorted({r["group"] for r in rows}) == ["lag", "ratio"] and all(r["holds"] == "yes" for r in rows)
    assert notes == [f"needs the full family: claims '{g}'" for g in ("agree", "stale-cost", "decoupled", "top-p", "stability")]
    gold = {a: g for a, g in GOOD_GOLD.items() if a != "k4-recompute"}
    rows, notes = _claims(gold, GOOD_STATS)
    assert "claims 'stale-cost' not checked for recompute at demo: needs k = 0, 1 and 4" in notes
    assert sum(r["group"] == "stale-cost" for r in rows) == 1
    no_topp = dataclasses.replace(SC, top_p=1.0)
    rows, _ = _claims({a: g for a, g in GOOD_GOLD.items() if not a.startswith("topp")}, GOOD_STATS, sc=no_topp)
    assert not [r for r in rows if r["group"] == "top-p" or "top-p" in r["claim"]]


# --- the config, the arms' run configs, the jobs ------------------------------------------------


def test_config_example_defaults_and_errors():
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "staleness.yaml")
    assert cfg.family == "staleness" and cfg.staleness == StalenessConfig() and cfg.seeds == [0, 1, 2]
    claims_cfg = load_config(ExperimentsConfig, ROOT / "examples" / "experiments.yaml")
    assert cfg.demo == claims_cfg.demo  # the demo's world is the claims family's: the same cached stages
    for bad, msg in ((["staleness.ks=[1, 2]"], "staleness.ks: must list lags >= 0 including 0"),
                     (["staleness.ks=[0, 1, 1]"], "staleness.ks: a lag is listed twice"),
                     (["staleness.objectives=[engine, decoupeld]"], "staleness.objectives: unknown objective 'decoupeld'"),
                     (["staleness.top_p=0"], "staleness.top_p: must be in (0, 1]"),
                     (["staleness.demo_world=false", "staleness.horizon_config=null"], "staleness.demo_world: no world"),
                     (["staleness.claims.margin_share=1"], "staleness.claims.margin_share"),
                     (["staleness.claims.spike_ratio=1"], "staleness.claims.spike_ratio: must be > 1")):
        with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace("(", r"\(")):
            load_config(ExperimentsConfig, ROOT / "examples" / "staleness.yaml", bad)
    quick = staleness_quick_config(dataclasses.replace(cfg, quick=True))
    assert quick.staleness.ks == [0, 1] and quick.staleness.horizon_config is None and quick.seeds == [0]
    assert quick.iterations == STALENESS_QUICK["iterations"] and quick.eval_prompts == 128
    assert (quick.run.output_dir, quick.demo.run.output_dir) == ("runs/staleness-quick", "runs/demo-quick")
    assert quick.demo.sft.steps < cfg.demo.sft.steps and cfg.staleness.ks == [0, 1, 2, 4]  # the original untouched


def test_each_arms_run_config_has_its_rollout_ppo_and_generation_keys(tmp_path):
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "staleness.yaml")
    arms = staleness_arms(cfg.staleness)
    assert len(arms) == 15 and [a.name for a in arms][-3:] == ["topp-engine", "topp-recompute", "topp-decoupled"]
    ref = staleness_run_config(cfg, "demo", "k0-engine", 0, tmp_path)
    keys = {}
    for a in arms:
        rc = staleness_run_config(cfg, "demo", a.name, 0, tmp_path)
        k = int(a.name[1]) if a.name[0] == "k" else 0
        objective = a.name.split("-", 1)[1]
        assert rc.rollout == RolloutConfig(max_staleness=k), a.name
        assert (rc.ppo.old_logprobs, rc.ppo.rollout_correction) == (
            OBJECTIVE_PPO[objective]["old_logprobs"], OBJECTIVE_PPO[objective].get("rollout_correction", "none"))
        assert rc.generation.top_p == (0.9 if a.name.startswith("topp") else 1.0), a.name
        assert rc.ppo.rollout_correction_cap is None  # token TIS at its preset cap
        same = {f.name for f in dataclasses.fields(rc.ppo)} - {"old_logprobs", "rollout_correction"}
        assert {f: getattr(rc.ppo, f) for f in same} == {f: getattr(ref.ppo, f) for f in same}, a.name
        assert rc.ppo.iterations == cfg.iterations and rc.ppo.use_critic and rc.run.seed == 0
        keys[a.name] = run_key(rc, "ppo", {})
    assert len(set(keys.values())) == len(arms)  # every arm its own cached result
    assert run_key(dataclasses.replace(ref, rollout=RolloutConfig(max_staleness=0)), "ppo", {}) == keys["k0-engine"]
    # k0-engine is the claims family's ppo arm with old_logprobs said (auto = engine in fp32)
    from fourfold.apps.experiments.arms import Arm, run_config

    claims_ppo = run_config(Family(cfg, tmp_path, lambda *a, **k: None, ["x"], 0).worlds()[0].sweep.cfg,
                            Arm("ppo", "ppo", ""), 0, sft=tmp_path / "sft", rm=tmp_path / "rm", run_dir=tmp_path / "run")
    assert claims_ppo.ppo.old_logprobs == "auto" and dataclasses.replace(claims_ppo, ppo=dataclasses.replace(
        claims_ppo.ppo, old_logprobs="engine", rollout_correction="none")) == ref
    h6 = staleness_run_config(cfg, "h6", "k4-decoupled", 2, tmp_path)
    assert h6.rollout.max_staleness == 4 and h6.generation.max_new_tokens == 84 and h6.run.seed == 2
    assert h6.data.task_options == {"labeler_length_bias": 0.0, "sentences": 6}
    hcfg = load_config(ExperimentsConfig, ROOT / "examples" / "horizon.yaml")
    assert h6.ppo.kl_coef == hcfg.demo.ppo.kl_coef and h6.ppo.rollout_batch_size == hcfg.demo.ppo.rollout_batch_size


def test_family_worlds_and_jobs(tmp_path):
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "staleness.yaml")
    fam = Family(cfg, tmp_path / "out", lambda *a, **k: None, ["the blender"] * 4, 7)
    worlds = fam.worlds()
    assert [w.label for w in worlds] == ["demo", "h6"]
    assert worlds[0].sweep.demo_dir == Path("runs/demo").resolve()
    assert worlds[1].sweep.demo_dir == Path("runs/demo-horizon-h6").resolve()  # the horizon family's cache
    jobs = {j.name: j for j in fam.jobs(worlds)}
    assert len(jobs) == 2 + 2 * (1 + 15 * 3)
    assert jobs["h6/k2-recompute/seed1"].deps == ("stages/h6",) and jobs["demo/sft/biased-rm"].deps == ("stages/demo",)
    assert [w.label for w in Family(staleness_quick_config(dataclasses.replace(cfg, quick=True)), tmp_path / "q",
                                    lambda *a, **k: None, ["x"], 0).worlds()] == ["demo"]


def test_every_arms_config_is_validated_before_any_job(tmp_path):
    from fourfold.apps.experiments.staleness import check_runs

    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "staleness.yaml")
    check_runs(Family(cfg, tmp_path, lambda *a, **k: None, ["x"], 0).worlds())  # the example's: every arm valid
    # a correction the engine arms' explicit old_logprobs refuses (filter_groups, the first example, is no longer refused)
    bad = load_config(ExperimentsConfig, ROOT / "examples" / "staleness.yaml", ["demo.ppo.rollout_correction=token_tis"])
    with pytest.raises(ConfigError, match=r"^staleness arm k0-engine \(demo\): ppo.rollout_correction: weights pi_train / pi_engine"):
        check_runs(Family(bad, tmp_path, lambda *a, **k: None, ["x"], 0).worlds())


def test_report_from_a_hand_made_record(tmp_path):
    finals, st = _world(GOOD_GOLD, GOOD_STATS)
    rows, notes = _claims(GOOD_GOLD, GOOD_STATS)
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "staleness.yaml")
    rec = {"worlds": {"demo": {"what": "the demo's review task"}}, "sft": {"demo": {"gold": 0.0, "gold_std": 1.0}},
           "finals": {"demo": finals}, "stats": json.loads(json.dumps({"demo": st})), "claims": rows, "notes": notes,
           "wall_s": 10.0, "jobs_s": 8.0}
    write_staleness_report(tmp_path, cfg, rec)
    md = (tmp_path / "summary.md").read_text()
    assert "| demo | k4-recompute | 3 | +0.30 | 1.00 | 1.0e-07 | 1.0e-07 |" in md and "## Claims" in md
    assert (tmp_path / "report.html").read_text().count("<tr>") >= len(rows) + 15


def test_a_k1_arms_config_runs_one_iteration_on_a_tiny_model(tiny_lm, tmp_path):
    """k1-decoupled's own config (the tiny model, reward model and prompts in place of the demo's;
    one iteration of 8 responses): it trains, and its statistics read what it logged."""
    from fourfold.trainers.ppo import train

    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "staleness.yaml")
    rc = staleness_run_config(cfg, "demo", "k1-decoupled", 0, tmp_path)
    rc = dataclasses.replace(
        rc, model=dataclasses.replace(rc.model, policy=str(tiny_lm / "sft"), reward=str(tiny_lm / "rm")),
        data=dataclasses.replace(rc.data, task=None, task_options={}, prompts=str(tiny_lm / "prompts.jsonl")),
        generation=dataclasses.replace(rc.generation, max_new_tokens=8),
        ppo=dataclasses.replace(rc.ppo, iterations=1, rollout_batch_size=8, minibatch_size=4),
        run=dataclasses.replace(rc.run, output_dir=str(tmp_path / "run"), overwrite=True, resume=False))
    train(rc)
    s = run_stats(read_run_curves(tmp_path / "run"), 1, 1.0, CC)
    assert s["lag_ok"] and s["first_ratio_dev"] == 0.0 and s["token_diff"] < 1e-5  # recompute: the first ratio is 1
    assert s["is_ess"] == pytest.approx(1.0, abs=1e-6) and s["is_weight"] == pytest.approx(1.0, abs=1e-5)


def _fake_outputs(cfg, out, golds, n_its=20):
    """What the jobs would leave: the SFT evaluation and, per world, arm and seed, a final
    evaluation and a metrics.jsonl (healthy curves, the lag as asked, the top-p gap)."""
    fam = Family(cfg, out, lambda *a, **k: None, ["p"], 0)
    base = {"proxy": 0.0, "proxy_std": 1.0, "gold": 0.0, "gold_std": 1.0, "kl": 0.0, "length": 15.0, "well_formed": 0.9,
            "repetition": 0.0, "n": N, "length_std": 3.0}
    for w in fam.worlds():
        sw = w.sweep
        (sw.out / "baseline").mkdir(parents=True, exist_ok=True)
        (sw.out / "baseline" / "sft-biased-rm.json").write_text(json.dumps({"summary": base, "rows": []}))
        for arm in sw.arms:
            k, topp = arm.rollout.get("max_staleness", 0), arm.name.startswith("topp")
            st = {**_stat(), **GOOD_STATS.get(arm.name, {})}
            for seed in cfg.seeds:
                d = sw.run_dir(arm, seed)
                d.mkdir(parents=True, exist_ok=True)
                gold = golds[arm.name] + 0.01 * (seed - 1)
                (d / "final_eval.json").write_text(json.dumps({"summary": {**base, "gold": gold, "kl": 2.0}, "rows": []}))
                rows = [{"iteration": i, "reward/gold_mean": gold * i / n_its, "policy/grad_norm": 1.0, "policy/entropy": 2.0,
                         "policy/first_ratio_abs_dev": st["first_ratio_dev"], "mismatch/token_abs_diff_mean": st["token_diff"],
                         "time/iteration_s": 1.0, "kl/k1": 1.0,
                         **({"rollout/version_lag": min(i - 1, k), "rollout/is_ess": 0.99} if k else {}),
                         **({"mismatch/is_weight_mean": st["is_weight"], "mismatch/is_truncated_share": 0.0}
                            if arm.name.endswith("decoupled") else {}),
                         **({"rollout/log_kept_mass": -0.03} if topp else {})} for i in range(1, n_its + 1)]
                (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_family_collects_claims_and_reports_from_fake_run_outputs(tmp_path, monkeypatch):
    """run_staleness with the job pool replaced by fake outputs (nothing trains): every world's
    results, statistics and claims, results.json and the reports. Healthy numbers: every claim holds."""
    from fourfold.apps.experiments import family, run

    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "staleness.yaml",
                      [f"run.output_dir={tmp_path / 'out'}", "eval_prompts=8", "run.progress=false"])

    def fake_jobs(cfg_, out, log, jobs):
        _fake_outputs(cfg_, out, {**GOOD_GOLD, "k0-decoupled": 1.0})
        return {j.name: "done" for j in jobs}, 1.0

    monkeypatch.setattr(family, "run_family_jobs", fake_jobs)
    res = run(cfg)
    assert [c["claim"] for c in res["claims"] if c["holds"] != "yes"] == [] and not res["notes"]
    assert len(res["claims"]) == 1 + 2 * (sum(GROUP_ROWS.values()) - 1)  # one lag row; the rest per world
    rec = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(rec["worlds"]) == {"demo", "h6"} and len(rec["stats"]["h6"]) == 15
    assert rec["stats"]["demo"]["k4-engine"]["0"]["lag_ok"] and rec["stats"]["demo"]["k4-engine"]["0"]["is_ess"] == pytest.approx(0.99)
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| h6 | topp-decoupled | 3 | +1.00 |" in md and (tmp_path / "out" / "h6" / "summary.md").is_file()


def test_publish_collects_renders_and_checks_a_demo_world_run(tmp_path, monkeypatch, capsys):
    """The family's results.json (fake run outputs, the demo's world alone: staleness.horizon_config=null)
    -> results/staleness.json -> its docs/experiments.md block and README row; publish check passes after render."""
    import shutil

    from fourfold.apps import publish
    from fourfold.apps.experiments import family, run
    from fourfold.apps.provenance import write_provenance
    from fourfold.apps.publish_staleness import NOT_YET, staleness_headline, staleness_text

    assert staleness_text(None, str) == NOT_YET and "\n" not in NOT_YET and staleness_headline(None) == []
    out = tmp_path / "out"
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "staleness.yaml",
                      [f"run.output_dir={out}", "eval_prompts=8", "run.progress=false", "staleness.horizon_config=null"])

    def fake_jobs(cfg_, out_, log, jobs):
        _fake_outputs(cfg_, out_, {**GOOD_GOLD, "k0-decoupled": 1.0})
        return {j.name: "done" for j in jobs}, 1.0

    monkeypatch.setattr(family, "run_family_jobs", fake_jobs)
    run(cfg)
    cmd = "fourfold experiments --config examples/staleness.yaml staleness.horizon_config=null"
    write_provenance(out, command=cmd)
    root = tmp_path / "repo"
    for f in ("README.md", "docs/demo.md", "docs/experiments.md", "docs/arithmetic.md", "docs/correction.md"):
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / f, root / f)
    shutil.copytree(ROOT / "results", root / "results")
    (root / "results" / "staleness.json").unlink(missing_ok=True)
    assert publish.main(["render", "--root", str(root)]) == 0 and NOT_YET in (root / "docs" / "experiments.md").read_text()
    assert publish.main(["collect", "--root", str(root), "--staleness", str(out)]) == 0
    assert f"wrote {root / 'results' / 'staleness.json'}" in capsys.readouterr().out
    rec = json.loads((root / "results" / "staleness.json").read_text())
    assert set(publish.REQUIRED_KEYS["staleness"]) <= set(rec) and list(rec["worlds"]) == ["demo"]
    assert rec["provenance"]["command"] == cmd and rec["ks"] == [0, 1, 2, 4] and len(rec["stats"]["demo"]) == 15
    assert all(c["kind"] in ("finding", "check") and c["null"] for c in rec["claims"])
    assert publish.main(["check", "--root", str(root)]) == 1
    assert publish.main(["render", "--root", str(root)]) == 0 and publish.main(["check", "--root", str(root)]) == 0
    doc = (root / "docs" / "experiments.md").read_text()
    body = doc[doc.index("<!-- publish:staleness -->"):doc.index("<!-- /publish:staleness -->")]
    assert NOT_YET not in body and "| demo | k4-recompute | 3 | +0.30 |" in body
    n_find = sum(c["kind"] == "finding" for c in rec["claims"])
    assert f"**Staleness claims: {n_find} of {n_find} findings hold;" in body
    row = staleness_headline(rec)[0]
    assert row in (root / "README.md").read_text().splitlines() and "stale-cost: 2/2 hold" in row
