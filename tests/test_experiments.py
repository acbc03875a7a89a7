"""`fourfold experiments`: the claims computed from hand-made numbers (including claims that do not
hold), the arms' configs, the job runner, the unbiased demo's copied SFT stage, and `--quick` end to
end (a fresh quick demo, four arms, the report, then a rerun that skips everything and one that
resumes a run)."""
import base64
import dataclasses
import json
import math
import shutil
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from fourfold.apps.claim_kit import counts_text
from fourfold.apps.experiments import (
    QUICK_CLAIMS,
    Job,
    build_arms,
    compute_claims,
    models_in_memory,
    quick_config,
    run_config,
    run_jobs,
    run_key,
    summarize_arm,
)
from fourfold.apps.experiments.claims import GROUP_CLAIMS
from fourfold.apps.experiments.config import (
    CLAIM_GROUPS,
    DEFAULT_CLAIM_GROUPS,
    ExperimentsClaimsConfig,
    ExperimentsConfig,
)
from fourfold.apps.experiments.results import summarize_costs, train_seconds
from fourfold.config import DemoConfig, DPOConfig, PPOConfig, load_config, save_config
from fourfold.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
N = 256
SFT = {"proxy": 0.0, "proxy_std": 1.0, "gold": 0.0, "gold_std": 0.5, "kl": 0.0, "length": 15.0, "length_std": 5.0,
       "well_formed": 0.9, "repetition": 0.01, "n": N}


def row(seed, **kw):
    base = {"seed": seed, "n": N, "proxy_std": 1.0, "gold_std": 0.5, "length_std": 5.0, "kl_std": 1.0,
            "proxy": 0.0, "gold": 0.0, "kl": 0.0, "length": 15.0, "well_formed": 0.9, "repetition": 0.01}
    base.update(kw)
    return base


def arm(values, **const):
    """One row per seed; ``values`` maps a key to one value per seed (lists) or a constant."""
    n = max((len(v) for v in values.values() if isinstance(v, list)), default=3)
    return [row(s, **{k: (v[s] if isinstance(v, list) else v) for k, v in {**values, **const}.items()}) for s in range(n)]


def healthy_finals():
    """Numbers under which every claim holds (gold sd 0.5: 0.3 sd = 0.15 gold)."""
    return {
        "ppo": arm({"proxy": 1.2, "gold": [0.30, 0.35, 0.28], "kl": [6.0, 7.0, 5.5], "length": 22.0,
                    "well_formed": 0.88}),
        "ppo-beta0": arm({"proxy": 1.3, "gold": [-0.6, -0.5, -0.7], "kl": [60.0, 45.0, 50.0], "length": 30.0,
                          "well_formed": 0.2, "repetition": 0.4}),
        # beta-high: at SFT within TOST's margin (20% of ppo's 0.62 sd gain: 0.124 sd; 1.645 SE = 0.118 sd at 256 prompts)
        "ppo-beta-high": arm({"proxy": 0.05, "gold": [0.0, 0.0, 0.0], "kl": [0.05, 0.08, 0.04], "length": 15.2}),
        "ppo-1epoch": arm({"proxy": 0.6, "gold": [0.10, 0.12, 0.05], "kl": 2.0}),
        "ppo-no-critic": arm({"proxy": 0.9, "gold": [0.1, 0.0, 0.15], "kl": 5.0}),
        "reinforce-lr1x": arm({"proxy": 0.05, "gold": [0.0, 0.01, -0.01], "kl": 0.1}),
        "reinforce-lr10x": arm({"proxy": 0.4, "gold": [0.05, -0.2, 0.1], "kl": 8.0}),
        "ppo-unbiased-rm": arm({"proxy": 1.0, "gold": 0.3, "kl": 5.0, "length": 15.5}),
        # critic-free: within 0.02 sd of ppo (non-inferior at 20% of its gain: upper bound 0.02 + 1.645 x 0.051 <
        # 0.124 sd), 0.5-0.7 sd above SFT and above REINFORCE
        "grpo": arm({"proxy": 1.1, "gold": [0.30, 0.34, 0.28], "kl": 5.0, "length": 21.0}),
        "rloo": arm({"proxy": 1.1, "gold": [0.31, 0.35, 0.28], "kl": 5.0, "length": 21.0}),
        "reinforce-pp": arm({"proxy": 1.0, "gold": [0.30, 0.35, 0.27], "kl": 6.0, "length": 22.0}),
        # dpo: above SFT on gold (0.24-0.4 sd) and 4 words longer (2 SE of the difference: 0.88 words)
        "dpo": arm({"proxy": 0.8, "gold": [0.15, 0.20, 0.12], "kl": 3.0, "length": 19.0}),
    }


def claims_of(finals, groups=None, sft=SFT):
    cfg = ExperimentsClaimsConfig() if groups is None else ExperimentsClaimsConfig(groups=groups)
    return compute_claims(finals, sft, cfg, kl_coef=0.05, ppo_epochs=4)


def test_every_claim_holds_on_healthy_numbers():
    rows, notes = claims_of(healthy_finals())
    assert notes == []
    groups = {r["group"] for r in rows}
    assert groups == {"ppo", "beta0", "beta-high", "epochs", "reinforce", "critic", "length", "critic-free",
                      "baseline", "dpo"}
    assert len(rows) == 3 + 4 + 3 + 1 + 2 + 1 + 1 + 3 * 2 + 2 + 2
    bad = [r for r in rows if r["holds"] != "yes"]
    assert bad == [], bad
    for r in rows:
        assert set(r) == {"group", "claim", "measured", "threshold", "holds", "kind", "why", "null"}
    assert [r["kind"] for r in rows].count("check") == 5  # ppo's KL bound, beta0's drift and fooled RM, reinforce-pp x2
    best = [r for r in rows if "best learning rate" in r["claim"]][0]
    assert "reinforce-lr10x" in best["claim"]  # the better of the two learning rates (mean gold)
    assert "3/3 seeds" in best["measured"]


def test_one_seed_has_no_spread():
    """A single seed's sd over seeds is undefined (the sample sd needs two): the claims say 'n/a',
    never '+- 0.00', and the arm's summary holds nan (the results table then shows no '±')."""
    finals = {"ppo": [row(0, gold=0.3)], "ppo-1epoch": [row(0, gold=0.1)]}
    (epochs,), _ = claims_of(finals, groups=["epochs"])
    assert "ppo +0.60 +- n/a sd, ppo-1epoch +0.20 +- n/a sd" in epochs["measured"], epochs["measured"]
    two = {"ppo": arm({"gold": [0.3, 0.2]}), "ppo-1epoch": arm({"gold": [0.1, 0.1]})}
    assert "ppo +0.50 +- 0.14 sd" in claims_of(two, groups=["epochs"])[0][0]["measured"]
    one = summarize_arm(finals["ppo"], [], SFT, SFT)
    assert one["gold"] == 0.3 and math.isnan(one["gold_sd"]) and math.isnan(one["gold_delta_sd_sd"])


def test_claims_that_do_not_hold():
    f = healthy_finals()
    # ppo gains 0.3 sd in two seeds but only 0.1 sd in the third: "in every seed" fails
    f["ppo"][2]["gold"] = 0.05
    # beta-high drifted: KL 0.5 nats in one seed, and its gold is far from SFT's
    f["ppo-beta-high"][1]["kl"] = 0.5
    for r in f["ppo-beta-high"]:
        r["gold"] = 0.3
    # one epoch as good as four
    for r, p in zip(f["ppo-1epoch"], f["ppo"]):
        r["gold"] = p["gold"]
    # beta0's KL only 3x ppo's in seed 0
    f["ppo-beta0"][0]["kl"] = 18.0
    rows, _ = claims_of(f)
    holds = {r["claim"]: r["holds"] for r in rows}

    def find(text):
        matches = [c for c in holds if text in c]
        assert len(matches) == 1, (text, list(holds))
        return holds[matches[0]]

    assert find("ppo raises gold") == "no"
    assert find("(KL)") == "no"
    assert find("(gold)") == "no"
    assert find("(length)") == "yes"
    assert find("beat 1 epoch") == "no"
    assert find("drifts far") == "no"
    assert find("hacks the reward model") == "yes"
    assert find("well formed") == "yes"


def test_degeneration_needs_either_metric_and_proxy_margin():
    f = healthy_finals()
    for r in f["ppo-beta0"]:
        r["well_formed"], r["repetition"], r["proxy"] = 0.85, 0.05, 0.5  # barely degenerate, RM not fooled
    rows, _ = claims_of(f, groups=["beta0"])
    holds = {r["claim"]: r["holds"] for r in rows}
    assert [v for k, v in holds.items() if "degenerates" in k] == ["no"]
    assert [v for k, v in holds.items() if "proxy" in k] == ["no"]
    assert {r["group"] for r in rows} == {"beta0"}


def test_kl_bound_and_single_seed_and_missing_arms():
    f = {"ppo": [row(0, proxy=0.2, gold=0.4, kl=30.0)]}  # KL 30 > proxy gain 0.2 / beta 0.05 = 4 nats
    rows, notes = claims_of(f)
    holds = {r["claim"]: r["holds"] for r in rows}
    assert [v for k, v in holds.items() if "bounded" in k] == ["no"]
    assert [v for k, v in holds.items() if "raises gold" in k] == ["yes"]
    assert {r["group"] for r in rows} == {"ppo"}
    assert any("'beta0' not checked" in n and "ppo-beta0" in n for n in notes)
    assert any("'reinforce' not checked" in n for n in notes)


def test_reinforce_at_same_lr_must_be_beaten_clearly():
    f = healthy_finals()
    for r in f["reinforce-lr1x"]:
        r["gold"] = 0.2  # ppo ahead by only ~0.2 sd: not "clearly" (0.5 sd)
    rows, _ = claims_of(f, groups=["reinforce"])
    same = [r for r in rows if "same learning rate" in r["claim"]]
    assert same and same[0]["holds"] == "no"


def find_claim(rows, text):
    matches = [r for r in rows if text in r["claim"]]
    assert len(matches) == 1, (text, [r["claim"] for r in rows])
    return matches[0]


def test_critic_free_cost_is_measured_either_way():
    f = healthy_finals()
    for r, p in zip(f["grpo"], f["ppo"]):
        r["gold"] = p["gold"] - 0.2  # 0.4 sd below ppo in every seed (gold sd 0.5)
    del f["reinforce-pp"]
    rows, notes = claims_of(f, groups=["critic-free"])
    assert notes == ["claims 'critic-free' not checked: arm reinforce-pp did not run or has no results"]
    grpo = find_claim(rows, "less than 20% of its gold gain (grpo)")
    assert grpo["holds"] == "no" and "mean +0.40 sd" in grpo["measured"]  # the cost, reported either way
    assert find_claim(rows, "grpo raises gold")["holds"] == "no"  # +0.16 sd in seed 2: within 2 SE (0.18 sd)
    # rloo costs -0.02, 0, 0 sd: mean -0.007; SE of the mean: the evaluation's sqrt(3 x 0.0884^2) / 3 = 0.051
    # (above the seeds' 0.0067); upper bound -0.007 + 1.645 x 0.051 = +0.08 < 20% of ppo's 0.62 sd gain = 0.124
    rloo = find_claim(rows, "less than 20% of its gold gain (rloo)")
    assert rloo["holds"] == "yes" and "mean -0.01 sd (SE 0.051; 90% interval -0.09 to +0.08 sd)" in rloo["measured"]
    assert find_claim(rows, "rloo raises gold")["holds"] == "yes"
    assert rloo["threshold"] == "upper 95% bound < 20% of ppo's mean gold gain (0.124 sd): non-inferiority"
    assert rloo["null"].startswith("no (by construction: a difference exactly at the margin")
    # a cost of 0.1 sd passed the old fixed bar (< 0.3 sd); its upper bound 0.1 + 0.084 is beyond the margin
    for r, p in zip(f["rloo"], f["ppo"]):
        r["gold"] = p["gold"] - 0.05
    assert find_claim(claims_of(f, groups=["critic-free"])[0], "(rloo)")["holds"] == "no"


def test_group_baseline_against_reinforce_at_its_best_learning_rate():
    f = healthy_finals()
    f["rloo"] = [dict(r) for r in f["reinforce-lr1x"]]  # rloo no better than REINFORCE
    rows, notes = claims_of(f, groups=["baseline"])
    assert notes == [] and [r["holds"] for r in rows] == ["yes", "no"]
    # the better REINFORCE by mean gold: lr1x (0.0) over lr10x (-0.02)
    assert all(r["claim"].endswith("(REINFORCE at its best learning rate tried, reinforce-lr1x)") for r in rows)
    for a in ("reinforce-lr1x", "reinforce-lr10x"):
        del f[a]
    assert claims_of(f, groups=["baseline"]) == ([], ["claims 'baseline' not checked: no reinforce arm has results"])


def test_dpo_claims_gold_and_length_beyond_noise():
    f = healthy_finals()
    rows, _ = claims_of(f, groups=["dpo"])
    assert [r["holds"] for r in rows] == ["yes", "yes"]
    for r in f["dpo"]:
        r["length"] = 15.5  # +0.5 words: within 2 SE of the difference (0.88 words)
    f["dpo"][1]["gold"] = 0.05  # +0.1 sd in seed 1: within 2 SE (0.18 sd)
    rows, _ = claims_of(f, groups=["dpo"])
    gold, length = find_claim(rows, "DPO raises gold"), find_claim(rows, "length bias")
    assert gold["holds"] == "no" and "2/3 seeds" in gold["measured"]
    assert length["holds"] == "no" and "0/3 seeds" in length["measured"]


def test_quick_states_only_its_claims_against_its_own_noise():
    """A single seed whose beta0 effects clear 2 evaluation standard errors but not the full sweep's
    fixed bars (0.5 sd, 5x KL, 0.1 share): quick says yes, the full claims say no; quick lists the
    rest as needing the full sweep."""
    f = {a: rows[:1] for a, rows in healthy_finals().items() if a in ("ppo", "ppo-beta0", "grpo", "dpo")}
    f["ppo-beta0"][0].update(gold=-0.15, kl=18.0, well_formed=0.8, repetition=0.01)  # 0.3 sd, 3x, -0.08
    quick = ExperimentsClaimsConfig(groups=["beta0", "dpo"], quick=True)
    rows, notes = compute_claims(f, SFT, quick, kl_coef=0.05)
    assert [r["group"] for r in rows] == ["beta0"] * 3 + ["dpo"]
    assert all(r["holds"] == "yes" and "2 evaluation standard errors" in r["threshold"] for r in rows), rows
    full, _ = compute_claims(f, SFT, dataclasses.replace(quick, quick=False), kl_coef=0.05)
    assert [r["holds"] for r in full[:3]] == ["no", "no", "no"]
    later = [n for n in notes if n.startswith("needs the full sweep: ")]
    # the default groups quick leaves out, and 2 claims of its own groups ('practice' is no default group)
    assert later == notes and len(later) == len(DEFAULT_CLAIM_GROUPS) - 2 + 2
    assert any("'critic-free'" in n for n in later) and any("'ppo'" in n for n in later)
    assert any("the RM is fooled" in n for n in later) and any("DPO raises gold" in n for n in later)
    assert len(QUICK_CLAIMS) == len(rows) and set(GROUP_CLAIMS) == set(CLAIM_GROUPS)


def test_critic_free_and_dpo_arms_configs(tmp_path):
    cfg = ExperimentsConfig()
    arms = {a.name: a for a in build_arms(cfg)}
    sft, rm, data = tmp_path / "demo" / "sft", tmp_path / "demo" / "reward", tmp_path / "demo" / "data"
    base = run_config(cfg, arms["ppo"], 0, sft=sft, rm=rm, run_dir=tmp_path / "ppo")
    for name, adv, k in (("grpo", "grpo", 4), ("rloo", "rloo", 4), ("reinforce-pp", "reinforce_pp", 1)):
        rc = run_config(cfg, arms[name], 0, sft=sft, rm=rm, run_dir=tmp_path / name)
        assert (rc.ppo.advantage, rc.ppo.samples_per_prompt, rc.ppo.loads_critic) == (adv, k, False)
        # only the estimator and its group differ from ppo: same responses per iteration, KL in the
        # reward, token-mean loss, epochs, clip, lr
        assert dataclasses.replace(rc.ppo, advantage="gae", samples_per_prompt=1) == base.ppo
        assert models_in_memory(cfg, arms[name]) == (1, 2)
        save_config(rc, tmp_path / f"{name}.yaml")
        assert load_config(PPOConfig, tmp_path / f"{name}.yaml") == rc
    assert models_in_memory(cfg, arms["ppo"]) == (2, 2) and models_in_memory(cfg, arms["reinforce-lr1x"]) == (1, 2)
    dpo = run_config(cfg, arms["dpo"], 1, sft=sft, rm=rm, run_dir=tmp_path / "dpo")
    assert isinstance(dpo, DPOConfig) and dpo.model.path == str(sft) and dpo.dpo.reference is None
    assert (dpo.data.train, dpo.data.eval) == (str(data / "preferences.jsonl"), str(data / "preferences_eval.jsonl"))
    assert (dpo.train.max_steps, dpo.train.batch_size) == (cfg.demo.reward.steps, cfg.demo.reward.batch_size)
    assert (dpo.train.lr, dpo.dpo.beta, dpo.train.max_len) == (cfg.dpo_lr, cfg.dpo_beta, cfg.demo.model.max_positions)
    assert dpo.run.seed == 1 and dpo.run.save_every == 100  # 6 checkpoints, as ppo's 60 / 10
    assert (dpo.run.resume, dpo.run.overwrite) == (False, True)  # nothing to resume: start over there
    (tmp_path / "dpo" / "checkpoints" / "step-00000001").mkdir(parents=True)  # a killed sweep's run
    again = run_config(cfg, arms["dpo"], 1, sft=sft, rm=rm, run_dir=tmp_path / "dpo")
    assert (again.run.resume, again.run.overwrite) == (True, False)
    assert (arms["dpo"].model_dir, arms["grpo"].model_dir) == ("model", "policy")
    assert models_in_memory(cfg, arms["dpo"]) == (1, 1)
    save_config(dpo, tmp_path / "dpo.yaml")
    assert load_config(DPOConfig, tmp_path / "dpo.yaml") == dpo
    key = run_key(dpo, "dpo", {"pairs": "a"})
    assert key != run_key(dpo, "dpo", {"pairs": "b"})
    assert key != run_key(dataclasses.replace(dpo, dpo=dataclasses.replace(dpo.dpo, beta=0.2)), "dpo", {"pairs": "a"})
    assert key == run_key(dataclasses.replace(dpo, run=dataclasses.replace(dpo.run, output_dir="x")), "dpo", {"pairs": "a"})
    quick = quick_config(ExperimentsConfig())
    assert {"ppo", "grpo", "dpo"} <= set(quick.arms) and quick.claims.quick


def test_train_seconds_and_costs(tmp_path):
    def write(d, rows):
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    # a resumed run repeats iteration 3: it counts once
    write(tmp_path / "rl", [{"step": i, "iteration": i, "time/iteration_s": 2.0} for i in (1, 2, 3, 3)])
    assert train_seconds(tmp_path / "rl") == 6.0
    # rows every 10 steps (means over the window), the last one after 5 steps, and an eval-only row
    write(tmp_path / "dpo", [{"step": 10, "time/step_s": 0.5}, {"step": 20, "time/step_s": 0.25},
                             {"step": 20, "dpo/eval_loss": 0.6}, {"step": 25, "time/step_s": 1.0}])
    assert train_seconds(tmp_path / "dpo") == 5.0 + 2.5 + 5.0
    assert math.isnan(train_seconds(tmp_path / "none"))
    c = summarize_costs([{"peak_rss_mb": 100.0, "train_s": 10.0}, {"peak_rss_mb": None, "train_s": 14.0}])
    assert (c["peak_rss_mb"], c["train_s"]) == (100.0, 12.0)
    assert math.isnan(c["peak_rss_mb_sd"])  # one value: no spread (the sample sd needs two)


def test_config_defaults_example_and_errors():
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "experiments.yaml")
    assert cfg == ExperimentsConfig()
    assert cfg.demo == DemoConfig() and cfg.demo.run.output_dir == "runs/demo"
    assert cfg.seeds == [0, 1, 2] and cfg.workers == 2 and cfg.run.output_dir == "runs/experiments"
    names = [a.name for a in build_arms(cfg)]
    assert names == ["ppo", "ppo-beta0", "ppo-beta-high", "ppo-1epoch", "ppo-no-critic", "grpo", "rloo",
                     "reinforce-pp", "reinforce-lr1x", "reinforce-lr3x", "reinforce-lr10x", "dpo", "ppo-unbiased-rm"]
    hi = [a for a in build_arms(cfg) if a.name == "ppo-beta-high"][0]
    assert math.isclose(hi.ppo["kl_coef"], 100 * cfg.demo.ppo.kl_coef)
    for bad, msg in ((["arms=[ppo, ppo-beta1]"], "did you mean 'ppo-beta0'"), (["seeds=[]"], "seeds"),
                     (["workers=0"], "workers"), (["claims.groups=[betazero]"], "claims.groups"),
                     (["demo.ppo.kl_coeff=1"], "did you mean 'demo.ppo.kl_coef'")):
        with pytest.raises(ConfigError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            load_config(ExperimentsConfig, None, bad)


def test_run_jobs_dependencies_failures_and_cache(tmp_path):
    py = sys.executable
    marker = tmp_path / "order.txt"

    def cmd(text, rc=0):
        return [py, "-c", f"open({str(marker)!r}, 'a').write({text!r} + '\\n'); raise SystemExit({rc})"]

    jobs = [
        Job("a", lambda: [cmd("a1"), cmd("a2")]),
        Job("b", lambda: [cmd("b", rc=3), cmd("never")]),
        Job("c", lambda: [cmd("c")], deps=("b",)),
        Job("d", lambda: [cmd("d")], deps=("a",)),
        Job("e", lambda: []),
        Job("f", lambda: (_ for _ in ()).throw(ValueError("bad config"))),
    ]
    state = run_jobs(jobs, workers=2, log_dir=tmp_path / "logs", threads=1, log=lambda *a, **k: None)
    assert state["a"] == "done" and state["d"] == "done" and state["e"] == "cached"
    assert state["b"].startswith("failed: exit status 3")
    assert state["c"].startswith("skipped")
    assert state["f"].startswith("failed: ValueError")
    lines = marker.read_text().split()
    assert "never" not in lines and "c" not in lines
    assert lines.index("a1") < lines.index("a2") < lines.index("d")
    assert (tmp_path / "logs" / "b.log").read_text().count("$ ") == 1


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="peak memory is read from /proc")
def test_run_jobs_reports_each_commands_peak_memory(tmp_path):
    """Each command's own peak RSS, not the parent's (this test process holds torch: a forked
    child's rusage would report that)."""
    import torch  # noqa: F401 - makes this process big

    small = [sys.executable, "-c", "import time; time.sleep(0.8)"]
    big = [sys.executable, "-c", "import time; b = b'x' * (150 * 2**20); time.sleep(0.8)"]  # 150 MB touched
    seen = []

    def broken(cmd, fin):
        raise RuntimeError("bookkeeping")

    jobs = [Job("j", lambda: [small, big, [sys.executable, "-c", "raise SystemExit(4)"]],
                finished=lambda cmd, fin: seen.append((cmd, fin))),
            Job("k", lambda: [small], finished=broken)]
    state = run_jobs(jobs, workers=1, log_dir=tmp_path, threads=1, log=lambda *a, **k: None)
    assert state["j"].startswith("failed: exit status 4") and state["k"] == "done"
    (c1, f1), (c2, f2), (_, f3) = seen
    assert (c1, c2) == (small, big) and (f1.returncode, f2.returncode, f3.returncode) == (0, 0, 4)
    assert f2.peak_rss_mb > 150 > f1.peak_rss_mb > 1 and f2.seconds > 0


def test_unbiased_demo_reuses_the_sft_stage(tmp_path, monkeypatch):
    """The copied SFT stage carries the key fourfold.apps.demo.pipeline computes, so demo.run skips SFT."""
    from fourfold.apps.demo import pipeline as demo
    from fourfold.apps.demo.pipeline import sft_stage_key
    from fourfold.apps.experiments import seed_sft_stage, unbiased_demo_config

    src = DemoConfig()
    src.run.output_dir = str(tmp_path / "demo")
    src.quick = True
    s = Path(src.run.output_dir)
    for d in ("sft", "tokenizer", "data", "stages/sft"):
        (s / d).mkdir(parents=True)
    (s / "sft" / "config.json").write_text("{}")
    (s / "data" / "sft_train.jsonl").write_text("")
    (s / "data" / "sft_eval.jsonl").write_text("")
    (s / "stages" / "sft" / "DONE").write_text(json.dumps({"key": sft_stage_key(src), "result": {"eval_loss": 1.5}}))
    cfg = ExperimentsConfig(demo=src)
    dst = unbiased_demo_config(cfg)
    assert dst.run.output_dir == str(tmp_path / "demo") + "-unbiased"
    assert dst.task_options == {"labeler_length_bias": 0.0}
    assert seed_sft_stage(src, dst)
    assert (Path(dst.run.output_dir) / "sft" / "config.json").is_file()

    class Stop(Exception):
        pass

    def no_sft(*a, **k):
        raise AssertionError("the SFT stage was not taken from the cache")

    original = demo.Stages.run

    def stages_run(self, name, settings, fn, log):
        if name != "sft":
            raise Stop(name)
        return original(self, name, settings, fn, log)

    monkeypatch.setattr("fourfold.trainers.sft.train", no_sft)
    monkeypatch.setattr(demo.Stages, "run", stages_run)
    with pytest.raises(Stop, match="pairs"):
        demo.run(dataclasses_replace_progress(dst), stop_after="reward")
    # a task option that changes the corpus: no copy
    other = unbiased_demo_config(ExperimentsConfig(demo=src, unbiased_task_options={"min_review_words": 5}))
    assert not seed_sft_stage(src, other)


def dataclasses_replace_progress(cfg):
    import dataclasses

    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, progress=False))


class _Html(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.tables, self.stack = [], 0, []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.imgs.append(dict(attrs).get("src", ""))
        if tag == "table":
            self.tables += 1
        if tag not in ("img", "meta", "br"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
        self.stack.pop()


def _claims_table(md: str) -> list[list[str]]:
    lines = md.rstrip("\n").split("\n")
    start = max(i for i, line in enumerate(lines) if line.startswith("| claim |"))
    table = lines[start:]
    assert all(line.startswith("|") for line in table), "summary.md must end with the claims table"
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header == ["claim", "kind", "measured", "threshold", "holds", "null"]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in table[2:]]


@pytest.mark.slow  # about 300 s on 2 cores: CI's 15-minute bound (the jobs' cache and resume logic: test_run_jobs_*)
def test_quick_end_to_end(tmp_path):
    """`fourfold experiments --quick` from nothing: its claims, report, publish table; a rerun is cached; an
    unfinished run resumes from its last checkpoint."""
    from fourfold.cli import main
    from fourfold.reporting import read_metrics

    out, demo_dir = tmp_path / "exp", tmp_path / "demo"
    argv = ["experiments", "--quick", "--output-dir", str(out), f"demo.run.output_dir={demo_dir}", "run.progress=false"]
    t0 = time.perf_counter()
    assert main(argv) == 0
    first_s = time.perf_counter() - t0
    md = (out / "summary.md").read_text()
    rows = _claims_table(md)
    assert len(rows) == 4  # quick: what its budget settles (3 beta0 claims, DPO's length), nothing else
    assert all(r[4] in ("yes", "no") and r[1] in ("finding", "check") for r in rows)
    assert sum("beta = 0" in r[0] for r in rows) == 3 and any("DPO inherits" in r[0] for r in rows)
    assert all("evaluation standard errors" in r[3] for r in rows)
    assert md.count("needs the full sweep") >= 8 + 2  # the groups quick leaves out, then 2 of its groups' claims
    for a in ("ppo", "ppo-beta0", "grpo", "dpo", "SFT (reference)"):
        assert f"| {a} |" in md
    # the cost columns: models in memory, and every arm's peak RSS and training seconds measured
    cells = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in md.splitlines()
             if line.startswith("| ")]
    table = {c[0]: c for c in cells}
    header = table["arm"]
    for a, models in (("ppo", "4 (2+2)"), ("ppo-beta0", "4 (2+2)"), ("grpo", "3 (1+2)"), ("dpo", "2 (1+1)")):
        row = dict(zip(header, table[a]))
        assert row["models (trained+frozen)"] == models
        assert float(row["peak RSS (MB)"]) > 50 and float(row["train s"]) > 0
    assert dict(zip(header, table["dpo"]))["s / iteration"] == "n/a"
    page = (out / "report.html").read_text()
    p = _Html()
    p.feed(page)
    p.close()
    assert p.stack == [] and p.tables >= 3
    pngs = [s for s in p.imgs if s.startswith("data:image/png;base64,")]
    assert len(pngs) >= 2
    for s in pngs:
        assert base64.b64decode(s.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    res = json.loads((out / "results.json").read_text())
    assert set(res["jobs"].values()) == {"done"} and len(res["jobs"]) == 5
    assert (out / "runs" / "dpo" / "seed0" / "model" / "config.json").is_file()
    assert "--config" in (out / "logs" / "dpo_seed0.log").read_text()
    assert (demo_dir / "reward" / "config.json").is_file()  # the quick demo's stages, in their own directory
    # the published table of a sweep, from this sweep's outputs (fourfold.apps.publish)
    from fourfold.apps import publish

    rec = publish.collect_experiments(out)
    assert set(rec["summaries"]) == {"ppo", "ppo-beta0", "grpo", "dpo"} and rec["provenance"]["commit"]
    table = publish.experiments_table({"experiments": rec})
    assert f"| grpo (K = 4) | {rec['summaries']['grpo']['proxy_delta_sd']:+.2f} |" in table
    assert f"**{counts_text(rows)}, in" in table and table.index("| ppo-beta0 |") < table.index("| grpo (K = 4) |")
    assert not (demo_dir / "policy").exists()  # the experiments stop the demo after the reward model
    cfg = (out / "configs" / "ppo-beta0-seed0.yaml").read_text()
    assert "kl_coef: 0.0" in cfg and "resume: false" in cfg and "overwrite: true" in cfg  # started afresh

    # a rerun skips every finished run and evaluation
    t0 = time.perf_counter()
    assert main(argv) == 0
    assert set(json.loads((out / "results.json").read_text())["jobs"].values()) == {"cached"}
    assert time.perf_counter() - t0 < first_s / 2
    assert _claims_table((out / "summary.md").read_text()) == rows

    # an unfinished run (no final policy yet) resumes from its last checkpoint
    run_dir = out / "runs" / "grpo" / "seed0"
    before = {r["iteration"]: r["time/iteration_s"] for r in read_metrics(run_dir / "metrics.jsonl")}
    shutil.rmtree(run_dir / "policy")
    assert main(argv) == 0
    jobs = json.loads((out / "results.json").read_text())["jobs"]
    assert jobs["grpo/seed0"] == "done"
    assert sum(v == "cached" for v in jobs.values()) == 4
    its = [r["iteration"] for r in read_metrics(run_dir / "metrics.jsonl") if "iteration" in r]
    assert its == list(range(1, 17))
    after = {r["iteration"]: r["time/iteration_s"] for r in read_metrics(run_dir / "metrics.jsonl")}
    # the run's last step is checkpointed (fourfold.run.scaffold): it resumes there, trains nothing
    # again and writes the policy anew from that checkpoint
    assert after == before and (run_dir / "policy" / "config.json").is_file()
    log = (out / "logs" / "grpo_seed0.log").read_text()
    assert log.count("fourfold.cli ppo") == 2


def test_subprocess_entry_point_usage():
    """`python -m fourfold.apps.experiments` is the jobs' entry point; anything but its two commands is a
    usage error (status 2)."""
    import subprocess

    for argv in ([], ["evaluate"], ["train", "x.json"]):
        p = subprocess.run([sys.executable, "-m", "fourfold.apps.experiments", *argv], capture_output=True, text=True,
                           cwd=ROOT, timeout=120)
        assert p.returncode == 2 and "usage: python -m fourfold.apps.experiments evaluate" in p.stderr, p.stderr
