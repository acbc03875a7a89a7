"""The warm-up family (issue 39, item 5): its per-run statistics on hand-built curves, each claim on
hand-built numbers where it says yes and where it says no (and its null, which must say no), its
config and every arm's run config (no subprocess, no training), its report and its publishing from
a hand-made record. The family itself runs only in the slow tier (--quick)."""
import dataclasses
import math
from pathlib import Path

import pytest

from fourfold.apps import claim_kinds
from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.warmup import WARMUP_QUICK, warmup_arms, warmup_quick_config, warmup_run_config
from fourfold.apps.experiments.warmup_claims import (
    ARMS,
    EV_KEY,
    EV_LAM_KEY,
    compute_warmup_claims,
    gain_verdict,
    run_stats,
    share_verdict,
    window_mean,
)
from fourfold.apps.experiments.warmup_config import WarmupClaimsConfig, WarmupConfig
from fourfold.apps.experiments.warmup_report import write_warmup_report
from fourfold.apps.publish_warmup import NOT_YET, warmup_headline, warmup_record, warmup_text
from fourfold.config import load_config
from fourfold.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CC = WarmupClaimsConfig()
N = 1024


# --- the per-run statistics, by hand --------------------------------------------------------------


def test_window_mean_and_verdicts_by_hand():
    assert window_mean({1: 0.2, 2: 0.4, 3: 0.9}, 1, 2) == pytest.approx(0.3)
    assert math.isnan(window_mean({1: 0.2, 3: 0.9}, 1, 2))  # iteration 2 missing
    assert share_verdict([0.7, 0.8], 0.8, 0.8, above=True) is True  # 0.8 x 0.8 = 0.64
    assert share_verdict([0.7, 0.6], 0.8, 0.8, above=True) is False
    assert share_verdict([0.1, 0.3], 0.8, 0.5, above=False) is True and share_verdict([0.1, 0.5], 0.8, 0.5, above=False) is False
    assert share_verdict([0.1], math.nan, 0.5, above=False) is False and share_verdict([], 0.8, 0.5, above=True) is False
    m, se, ok = gain_verdict([0.2, 0.3, 0.4], 0.1, 2.0)
    assert (m, se, ok) == (pytest.approx(0.3), pytest.approx(0.1 / math.sqrt(3)), True)
    assert gain_verdict([0.2, -0.2, 0.0], 0.1, 2.0)[-1] is False


def _curves(n, ev, lam=None):
    return {"iteration": [float(i) for i in range(1, n + 1)], EV_KEY: ev, EV_LAM_KEY: lam or [0.5] * n}


def test_run_stats_reads_the_points_of_a_warm_up():
    c = dataclasses.replace(CC, plateau_iterations=2, early_iterations=2)
    ev = [0.1, 0.3, 0.5, 0.6, 0.62, 0.64, 0.7, 0.72]  # 4 warm-up iterations, then 4 policy ones
    s = run_stats(_curves(8, ev), 4, c)
    assert s["ev_iter1"] == 0.1 and s["ev_first"] == 0.62 and s["ev_last_warmup"] == 0.6
    assert s["ev_early"] == pytest.approx(0.63) and s["ev_plateau"] == pytest.approx(0.55)
    assert s["ev_before"] == pytest.approx(0.2) and s["drift"] == pytest.approx(0.35)
    assert s["ev"] == ev and s["ev_lam_first"] == 0.5 and s["ev_tail"] == pytest.approx(sum(ev) / 8)
    s0 = run_stats(_curves(3, [0.0, 0.2, 0.4]), 0, c)
    assert s0["ev_first"] == 0.0 and math.isnan(s0["ev_last_warmup"]) and math.isnan(s0["ev_plateau"])


def test_run_stats_from_a_runs_metrics_file(tmp_path):
    import json

    from fourfold.apps.experiments.staleness import read_run_curves
    from fourfold.apps.experiments.warmup_claims import CURVE_METRICS

    rows = [{"iteration": i, EV_KEY: 0.1 * i, EV_LAM_KEY: 0.5} for i in range(1, 5)] + [{"step": 9}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = run_stats(read_run_curves(tmp_path, CURVE_METRICS), 2, dataclasses.replace(CC, plateau_iterations=1,
                                                                                   early_iterations=2))
    assert s["ev_first"] == pytest.approx(0.3) and s["ev_plateau"] == pytest.approx(0.2)
    assert s["drift"] == pytest.approx(0.1) and s["ev_early"] == pytest.approx(0.35)


# --- the claims on hand-built numbers: yes, then no ----------------------------------------------


def _stat(w=0, iter1=0.2, first=None, early=0.5, last=0.75, plateau=0.75, drift=0.01):
    first = iter1 if first is None else first
    return {"warmup": w, "ev_iter1": iter1, "ev_first": first, "ev_early": early, "ev_last_warmup": last,
            "ev_plateau": plateau, "ev_before": plateau - drift, "drift": drift, "ev_tail": 0.7,
            "ev_lam_iter1": 0.3, "ev_lam_first": 0.6, "ev": [iter1, first], "ev_lam": [0.3, 0.6]}


GOOD_STATS = {"rm": dict(iter1=0.2, early=0.4), "rm-warmup": dict(w=10, iter1=0.2, first=0.7, early=0.7),
              "policy": dict(iter1=0.0, early=0.3), "policy-warmup": dict(w=10, iter1=0.0, first=0.65, early=0.68),
              "ceiling": dict(w=30, iter1=0.2, plateau=0.75, last=0.74, drift=0.01)}
GOOD_GOLD = {"rm": 1.0, "rm-warmup": 1.2, "policy": 0.9, "policy-warmup": 1.1, "ceiling": 0.0, "ppo-no-critic": 0.7}


def _claims(golds, stats, quick=False, spread=0.01, stat_spread=0.01, extra=None):
    """finals (SFT gold 0, sd 1, each arm's gold +- spread over 3 seeds, plus ``extra`` {arm: per-seed
    offsets}) and stats (EVs +- stat_spread)."""
    extra = extra or {}
    finals = {a: [{"seed": s, "n": N, "gold": g + spread * (s - 1) + extra.get(a, [0.0] * 3)[s], "gold_std": 1.0}
                  for s in range(3)] for a, g in golds.items()}
    st = {}
    for a, kw in stats.items():
        st[a] = {}
        for s in range(3):
            r = _stat(**kw)
            for k in ("ev_first", "ev_early"):
                r[k] += stat_spread * (s - 1)
            st[a][s] = r
    return compute_warmup_claims(finals, {"gold": 0.0, "gold_std": 1.0}, st, CC, quick=quick)


GROUP_ROWS = {"same-start": 1, "ceiling": 1, "rm-start": 1, "closes": 2, "early-ev": 2, "warmup-gold": 2,
              "warmup-keeps": 2, "critic-pays": 1}


def test_every_claim_holds_on_healthy_numbers_and_every_null_says_no():
    rows, notes = _claims(GOOD_GOLD, GOOD_STATS)
    assert {g: sum(r["group"] == g for r in rows) for g in GROUP_ROWS} == GROUP_ROWS and not notes
    assert [r["claim"] for r in rows if r["holds"] != "yes"] == []
    kinds = {r["group"]: r["kind"] for r in rows}
    assert kinds == {**{g: "finding" for g in GROUP_ROWS}, "same-start": "check", "ceiling": "check"}
    assert all(r["null"] == claim_kinds.CHECK_NULL for r in rows if r["kind"] == "check")
    assert all(r["null"].startswith("no (computed: ") for r in rows if r["kind"] == "finding"), \
        [(r["group"], r["null"]) for r in rows if r["kind"] == "finding"]
    start = next(r for r in rows if r["group"] == "rm-start")
    assert "+0.200, +0.200, +0.200" in start["measured"] and "0.27, 0.27, 0.27 of the ceiling 0.750" in start["measured"]
    gold = next(r for r in rows if r["group"] == "warmup-gold" and "rm-warmup" in r["claim"])
    assert "per seed +0.20, +0.20, +0.20 sd, mean +0.20" in gold["measured"]  # 1.2 - 1.0 in every seed


def test_each_claim_says_no_where_it_should():
    bad_stats = {"rm": dict(iter1=0.5, early=0.6), "rm-warmup": dict(w=10, iter1=0.49, first=0.5, early=0.62),
                 "policy": dict(iter1=0.01, early=0.3), "policy-warmup": dict(w=10, iter1=0.0, first=0.55, early=0.35),
                 "ceiling": dict(w=30, iter1=0.5, plateau=0.9, last=0.9, drift=0.1)}  # converged it is not
    bad_gold = {**GOOD_GOLD, "rm-warmup": 0.7, "policy-warmup": 0.6, "ppo-no-critic": 1.0}
    rows, _ = _claims(bad_gold, bad_stats)
    held = {(r["group"], r["holds"]) for r in rows}
    assert all((g, "no") in held for g in GROUP_ROWS), held
    keeps = [r for r in rows if r["group"] == "warmup-keeps"]
    assert [r["holds"] for r in keeps] == ["no", "no"]  # costs of 0.3 sd against a 1.0 sd gain (margin 0.2)


def test_tost_is_non_inferiority_at_the_margin_of_ppos_gain():
    near = {**GOOD_GOLD, "rm-warmup": 0.9, "policy-warmup": 0.9}  # rm-warmup costs 0.1 sd < 0.2 x 1.0
    rows, _ = _claims(near, GOOD_STATS)
    rm = next(r for r in rows if r["group"] == "warmup-keeps" and "rm-warmup" in r["claim"])
    assert rm["holds"] == "yes" and "(0.200 sd)" in rm["threshold"] and rm["null"].startswith("no (computed")
    noisy = _claims(near, GOOD_STATS, extra={"rm-warmup": [-0.3, 0.0, 0.3]})[0]  # a larger SE never helps it pass
    assert next(r for r in noisy if r["group"] == "warmup-keeps" and "rm-warmup" in r["claim"])["holds"] == "no"


def test_quick_states_only_the_same_start_and_missing_arms_are_noted():
    rows, notes = _claims(GOOD_GOLD, GOOD_STATS, quick=True)
    assert [r["group"] for r in rows] == ["same-start"] and any("'closes'" in n for n in notes)
    some = {a: v for a, v in GOOD_STATS.items() if a in ("rm", "policy")}
    rows, notes = _claims({a: GOOD_GOLD[a] for a in ("rm", "policy")}, some)
    assert {r["group"] for r in rows} <= {"same-start", "early-ev"} and any("ceiling" in n for n in notes)


def test_same_start_fails_when_the_first_batches_differ():
    st = {**GOOD_STATS, "rm-warmup": dict(w=10, iter1=0.21, first=0.7, early=0.7)}
    row = next(r for r in _claims(GOOD_GOLD, st)[0] if r["group"] == "same-start")
    assert row["holds"] == "no" and "1.0e-02" in row["measured"]


# --- the config and every arm's run config --------------------------------------------------------


def test_config_example_and_arms():
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "warmup.yaml")
    assert cfg.family == "warmup" and cfg.warmup == WarmupConfig() and cfg.seeds == [0, 1, 2] and cfg.iterations == 40
    arms = warmup_arms(cfg)
    assert tuple(a.name for a in arms) == ARMS
    by = {a.name: a for a in arms}
    assert by["rm-warmup"].ppo == {"critic_warmup": 10, "iterations": 50} and by["ceiling"].ppo == {"critic_warmup": 30,
                                                                                                   "iterations": 31}
    assert by["policy-warmup"].model == {"critic_init": "policy"} and by["ppo-no-critic"].ppo == {"use_critic": False}
    assert len(warmup_arms(dataclasses.replace(cfg, warmup=dataclasses.replace(cfg.warmup, no_critic=False)))) == 5


def test_every_arm_takes_the_same_policy_updates(tmp_path):
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "warmup.yaml")
    got = {a: warmup_run_config(cfg, a, 1, tmp_path) for a in ARMS}
    for a, rc in got.items():
        policy_its = rc.ppo.iterations - rc.ppo.critic_warmup
        assert policy_its == (1 if a == "ceiling" else 40), a
        assert rc.generation.max_new_tokens == 84 and rc.data.task_options["sentences"] == 6 and rc.run.seed == 1
    assert got["rm"].model.critic_init is None and got["policy"].model.critic_init == "policy"
    assert got["ppo-no-critic"].ppo.use_critic is False


def test_config_validation_and_quick():
    with pytest.raises(ConfigError, match="warmup.ceiling_warmup"):
        load_config(ExperimentsConfig, ROOT / "examples" / "warmup.yaml", ["warmup.ceiling_warmup=15"])  # < 2 x 10
    with pytest.raises(ConfigError, match="warmup.warmup"):
        load_config(ExperimentsConfig, ROOT / "examples" / "warmup.yaml", ["warmup.warmup=0"])
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "warmup.yaml")
    q = warmup_quick_config(dataclasses.replace(cfg, quick=True))
    assert q.iterations == WARMUP_QUICK["iterations"] and q.seeds == [0] and q.run.output_dir == "runs/warmup-quick"


# --- the report and publishing from a hand-made record --------------------------------------------


def _record():
    golds, stats = GOOD_GOLD, GOOD_STATS
    finals = {a: [{"seed": s, "n": N, "gold": g, "gold_std": 1.0, "kl": 2.0} for s in range(3)] for a, g in golds.items()}
    st = {a: {s: _stat(**kw) for s in range(3)} for a, kw in stats.items()}
    claims, notes = compute_warmup_claims(finals, {"gold": 0.0, "gold_std": 1.0}, st, CC)
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "warmup.yaml")
    from fourfold.config import config_to_dict

    return cfg, {"config": config_to_dict(cfg), "world": {"label": "h6", "what": "h6", "demo": "runs/demo-horizon-h6"},
                 "arms": {a: a for a in ARMS}, "sft": {"gold": 0.0, "gold_std": 1.0}, "finals": finals, "stats": st,
                 "claims": claims, "notes": notes, "wall_s": 1200.0, "jobs_s": 1100.0,
                 "rollout_batch_size": 64}


def test_report_and_publishing(tmp_path):
    cfg, rec = _record()
    write_warmup_report(tmp_path, cfg, rec)
    md = (tmp_path / "summary.md").read_text()
    assert "| rm-warmup | 3 | +1.20 |" in md and "the ceiling arm's mean over its last 10 warm-up iterations, 0.750" in md
    assert "## Claims" in md and (tmp_path / "report.html").is_file()
    r = warmup_record(rec, {"command": "fourfold experiments --config examples/warmup.yaml", "commit": "abc"})
    assert r["ceiling"] == pytest.approx(0.75) and r["warmup"] == 10 and r["seeds"] == [0, 1, 2]
    assert all(len(s["ev"]) == 2 for arm in r["stats"].values() for s in arm.values())
    text = warmup_text(r, lambda p: f"commit {p['commit']}")
    assert "20.0 minutes" in text and "commit abc" in text and "| rm-warmup |" in text and "12 of 12" not in text
    assert warmup_text(None, lambda p: "") == NOT_YET and warmup_headline(None) == []
    head = warmup_headline(r)
    assert len(head) == 1 and head[0].startswith("| the critic's start and warm-up") and "examples/warmup.yaml" in head[0]


@pytest.mark.slow
def test_quick_family_end_to_end(tmp_path):
    """--quick on the quick demo's h6 stages (trained in the test's directory): every job finishes and
    the 'same-start' check is stated."""
    from fourfold.apps.experiments import run

    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "warmup.yaml",
                      [f"run.output_dir={tmp_path / 'out'}", "quick=true", "workers=2"])
    h = load_config(ExperimentsConfig, ROOT / "examples" / "horizon.yaml", [f"horizon.demo_dir={tmp_path / 'demo'}"])
    from fourfold.config import save_config

    save_config(h, tmp_path / "horizon.yaml")
    cfg = dataclasses.replace(cfg, warmup=dataclasses.replace(cfg.warmup, horizon_config=str(tmp_path / "horizon.yaml")))
    res = run(cfg)
    assert [c["group"] for c in res["claims"]] == ["same-start"]
    assert set(res["summaries"]) == set(ARMS)
