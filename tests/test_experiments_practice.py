"""The practice arms of `fourfold experiments` (issue 32, docs/correction.md "Sweep arms"): their
configs (model and generation sections carried by the Arm), the run keys of the older arms unchanged
(their cached results stay valid), examples/practice.yaml, the curves the claims read, and the six
'practice' claims on hand-made numbers, each holding and failing."""
import dataclasses
import json
import math
from pathlib import Path

import pytest

from fourfold.apps.experiments import build_arms, compute_claims, models_in_memory, read_curves, run_config, run_key
from fourfold.apps.experiments.arms import PRACTICE_ARMS, critic_warmup_iterations
from fourfold.apps.experiments.claims import PRACTICE
from fourfold.apps.experiments.config import (
    CLAIM_GROUPS,
    DEFAULT_CLAIM_GROUPS,
    EXPERIMENT_ARMS,
    ExperimentsClaimsConfig,
    ExperimentsConfig,
)
from fourfold.config import PPOConfig, load_config, save_config, validate_tree
from fourfold.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

MAIN_KEYS = {  # run_key of each arm at commit 01a2e02 (before Arm carried model/generation changes)
    "ppo": "264aa5055c11ced0", "ppo-beta0": "bfee352bfa24ff9c", "ppo-beta-high": "b8240f1cdd9c3214",
    "ppo-1epoch": "b4f4dd618926a58c", "ppo-no-critic": "294e71502ecdc59f", "grpo": "3503c91558c55c8b",
    "rloo": "f0015acddbadcb7e", "reinforce-pp": "2383a98919d56a78", "reinforce-lr1x": "1c753bf452bec6eb",
    "reinforce-lr3x": "822bce36262d006c", "reinforce-lr10x": "4da4f729c3d526c6", "dpo": "2d151dc83f76973b",
    "ppo-unbiased-rm": "264aa5055c11ced0", "ppo-adaptive-kl": "2b67091902c554c3",
}


def _keys(cfg, tmp=Path("/tmp/nokeys")):
    out = {}
    for a in build_arms(cfg):
        rc = run_config(cfg, a, 1, sft=tmp / "sft", rm=tmp / "rm", run_dir=tmp / a.name)
        out[a.name] = run_key(rc, a.stage, {"sft": "s", "reward": "r"})
    return out


def test_older_arms_keep_their_run_keys():
    """The model section counts in run_key only by the keys an arm changes: every arm that changes
    none has the key it had on main, so the sweep's cache of its results stays valid."""
    keys = _keys(ExperimentsConfig(arms=list(EXPERIMENT_ARMS)))
    assert {a: keys[a] for a in MAIN_KEYS} == MAIN_KEYS
    practice = [keys[a] for a in PRACTICE_ARMS]
    assert len(set(practice)) == 6 and not set(practice) & set(MAIN_KEYS.values())


def test_practice_arms_configs(tmp_path):
    cfg = ExperimentsConfig(arms=["ppo", *PRACTICE_ARMS])
    arms = {a.name: a for a in build_arms(cfg)}
    sft, rm = tmp_path / "sft", tmp_path / "rm"
    rc = {n: run_config(cfg, a, 0, sft=sft, rm=rm, run_dir=tmp_path / n) for n, a in arms.items()}
    base = rc["ppo"]
    # critic_init unset: the validated run starts its critic from the RM (run_key counts it as 'reward')
    assert (base.model.precision, base.model.critic_init, base.generation.weights) == ("fp32", None, "auto")

    def changed(n):
        c = rc[n]
        return ({k: v for k, v in dataclasses.asdict(c.ppo).items() if v != getattr(base.ppo, k)},
                {k: v for k, v in dataclasses.asdict(c.model).items() if v != getattr(base.model, k)},
                {k: v for k, v in dataclasses.asdict(c.generation).items() if v != getattr(base.generation, k)})

    bf16 = ({"precision": "bf16-mixed"}, {"weights": "copy"})
    assert changed("ppo-critic-policy-init") == ({}, {"critic_init": "policy"}, {})
    assert changed("ppo-critic-warmup") == ({"critic_warmup": 6}, {"critic_init": "policy"}, {})
    assert critic_warmup_iterations(cfg) == 6 == cfg.iterations // 10
    assert changed("ppo-beta0-dual-clip") == ({"kl_coef": 0.0, "dual_clip": 3.0}, {}, {})  # adaptive_kl already off
    assert rc["ppo-beta0-dual-clip"].ppo.adaptive_kl is False
    assert changed("ppo-bf16-copy") == ({"old_logprobs": "engine"}, *bf16)
    assert changed("ppo-bf16-copy-recompute") == ({"old_logprobs": "recompute"}, *bf16)
    assert changed("ppo-bf16-copy-tis") == ({"old_logprobs": "recompute", "rollout_correction": "token_tis"}, *bf16)
    for n in PRACTICE_ARMS:
        assert models_in_memory(cfg, arms[n]) == (2, 2)
        save_config(rc[n], tmp_path / f"{n}.yaml")
        validate_tree(rc[n])  # as the trainer's start does: critic_init resolved
        assert load_config(PPOConfig, tmp_path / f"{n}.yaml") == rc[n]
    # precision counts in the key; the run directory does not
    key = run_key(rc["ppo-bf16-copy"], "ppo", {"sft": "s"})
    fp32 = dataclasses.replace(rc["ppo-bf16-copy"], model=dataclasses.replace(rc["ppo-bf16-copy"].model,
                                                                              precision="fp32"))
    assert run_key(fp32, "ppo", {"sft": "s"}) != key
    moved = run_config(cfg, arms["ppo-bf16-copy"], 0, sft=sft, rm=rm, run_dir=tmp_path / "elsewhere")
    assert run_key(moved, "ppo", {"sft": "s"}) == key
    with pytest.raises(ConfigError, match=r"iterations: must be >= 10 with arm ppo-critic-warmup"):
        load_config(ExperimentsConfig, None, ["arms=[ppo, ppo-critic-warmup]", "iterations=9"])


def test_practice_example_config():
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "practice.yaml")
    assert [a.name for a in build_arms(cfg)] == ["ppo", "ppo-beta0", *PRACTICE_ARMS]
    assert cfg.seeds == [0, 1, 2] and cfg.iterations == 60 and cfg.claims.groups == ["practice"]
    default = ExperimentsConfig()
    assert cfg.demo == default.demo  # the default sweep's demo stages (cached, shared)
    assert cfg.run.output_dir != default.run.output_dir  # its own report: never the default sweep's
    assert _keys(cfg)["ppo"] == MAIN_KEYS["ppo"]  # the same ppo as the default sweep's
    assert "practice" in CLAIM_GROUPS and "practice" not in DEFAULT_CLAIM_GROUPS
    assert default.claims.groups == list(DEFAULT_CLAIM_GROUPS) and set(PRACTICE_ARMS).isdisjoint(default.arms)


def test_curves_keep_the_practice_metrics(tmp_path):
    rows = [{"iteration": 1, "value/explained_variance": -0.5, "mismatch/token_abs_diff_mean": 1e-3,
             "mismatch/is_truncated_share": 0.0},
            {"iteration": 2, "value/explained_variance": 0.4, "mismatch/token_abs_diff_mean": 2e-3,
             "policy/first_ratio_abs_dev": 0.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = read_curves(tmp_path)
    assert c["iteration"] == [1.0, 2.0]
    assert c["value/explained_variance"] == [-0.5, 0.4] and c["mismatch/token_abs_diff_mean"] == [1e-3, 2e-3]
    assert math.isnan(c["policy/first_ratio_abs_dev"][0]) and c["policy/first_ratio_abs_dev"][1] == 0.0
    assert c["mismatch/is_truncated_share"][0] == 0.0 and math.isnan(c["mismatch/is_truncated_share"][1])


# --- the six claims on hand-made numbers (gold sd 0.5: 0.1 sd = 0.05 gold) ---

SFT = {"proxy": 0.0, "proxy_std": 1.0, "gold": 0.0, "gold_std": 0.5, "kl": 0.0, "length": 15.0, "length_std": 5.0,
       "well_formed": 0.9, "repetition": 0.01, "n": 256}
IT = 60
WARMUP = 6


def _finals(**gold_kl):
    return {a: [{"seed": s, "n": 256, "gold": g, "gold_std": 0.5, "kl": k} for s, (g, k) in enumerate(v)]
            for a, v in gold_kl.items()}


def _curve(**series):
    """One run's curves: each key a constant, a list of IT values, or {iteration: value} over a constant."""
    out = {"iteration": [float(i) for i in range(1, IT + 1)]}
    for k, v in series.items():
        if isinstance(v, dict):
            fill = v.pop("rest")
            out[k] = [float(v.get(i, fill)) for i in range(1, IT + 1)]
        else:
            out[k] = list(v) if isinstance(v, list) else [float(v)] * IT
    return out


def healthy():
    finals = _finals(**{
        "ppo": [(0.30, 6.0), (0.35, 7.0), (0.28, 5.5)],
        "ppo-beta0": [(-0.6, 60.0), (-0.5, 45.0), (-0.7, 50.0)],
        "ppo-critic-policy-init": [(0.2, 6.0)] * 3,
        "ppo-critic-warmup": [(0.27, 6.0), (0.35, 6.0), (0.30, 6.0)],  # -0.06, 0, +0.04 sd from ppo
        "ppo-beta0-dual-clip": [(-0.5, 40.0), (-0.4, 30.0), (-0.6, 40.0)],  # KL 0.67, 0.67, 0.8 x beta0's
        "ppo-bf16-copy": [(0.20, 6.0), (0.25, 6.0), (0.20, 6.0)],
        "ppo-bf16-copy-recompute": [(0.20, 6.0), (0.22, 6.0), (0.25, 6.0)],  # 0, -0.06, +0.1 sd from copy
        "ppo-bf16-copy-tis": [(0.19, 6.0), (0.25, 6.0), (0.20, 6.0)],  # -0.02, 0, 0 sd from copy
    })
    ev = "value/explained_variance"
    curves = {
        "ppo-critic-policy-init": {s: _curve(**{ev: {1: x, "rest": 0.5}}) for s, x in enumerate((-0.5, 0.0, 0.09))},
        # a bad start, then >= 0.3 at the first policy iteration (WARMUP + 1)
        "ppo-critic-warmup": {s: _curve(**{ev: {1: -0.5, WARMUP + 1: x, "rest": 0.1}})
                              for s, x in enumerate((0.5, 0.4, 0.3))},
        "ppo-bf16-copy": {s: _curve(**{"mismatch/token_abs_diff_mean": 1e-3}) for s in range(3)},
        "ppo-bf16-copy-recompute": {s: _curve(**{"policy/first_ratio_abs_dev": 0.0}) for s in range(3)},
        "ppo-bf16-copy-tis": {s: _curve(**{"mismatch/is_truncated_share": {1: 0.05, "rest": 0.0}})  # mean 0.0008
                              for s in range(3)},
    }
    return finals, curves


def practice(finals, curves, warmup=WARMUP, **kw):
    cfg = ExperimentsClaimsConfig(groups=["practice"], **kw)
    return compute_claims(finals, SFT, cfg, kl_coef=0.05, curves=curves, critic_warmup=warmup)


def holds(rows):
    return {r["claim"].split("(")[-1].split(" ")[0].rstrip(")"): r["holds"] for r in rows}


def test_practice_claims_hold_on_healthy_numbers():
    rows, notes = practice(*healthy())
    assert notes == []
    assert [r["group"] for r in rows] == ["practice"] * 6
    assert holds(rows) == {a: "yes" for a in PRACTICE_ARMS}, rows
    by = {a: r for a, r in zip(PRACTICE_ARMS, rows)}
    assert "iteration 1 -0.50, +0.00, +0.09 (3/3 seeds)" in by["ppo-critic-policy-init"]["measured"]
    assert "iteration 7 (the first policy iteration) +0.50, +0.40, +0.30" in by["ppo-critic-warmup"]["measured"]
    assert "-0.06, +0.00, +0.04 sd" in by["ppo-critic-warmup"]["measured"]
    assert "ratio 0.67, 0.67, 0.80" in by["ppo-beta0-dual-clip"]["measured"]
    assert "1.00e-03, 1.00e-03, 1.00e-03, over 60, 60, 60 iterations" in by["ppo-bf16-copy"]["measured"]
    assert "0.00e+00" in by["ppo-bf16-copy-recompute"]["measured"]
    assert "+0.00, -0.06, +0.10 sd" in by["ppo-bf16-copy-recompute"]["measured"]
    assert "0.0008, 0.0008, 0.0008" in by["ppo-bf16-copy-tis"]["measured"]
    assert by["ppo-bf16-copy-tis"]["threshold"].endswith("truncated share < 1%, in every seed")
    assert PRACTICE == {"bad_start_max_ev": 0.1, "warmup_min_ev": 0.3, "warmup_gold_margin_sd": 0.1,
                        "dual_clip_max_kl_ratio": 0.8, "bf16_min_token_diff": 1e-4, "recompute_gold_margin_sd": 0.1,
                        "tis_gold_margin_sd": 0.05, "tis_max_truncated_share": 0.01}  # docs/correction.md's


def _set(curves, arm, seed, key, it, value):
    curves[arm][seed][key][it - 1] = value


FAILS = {  # arm -> ways its claim fails, each one change to the healthy numbers
    "ppo-critic-policy-init": [
        lambda f, c: _set(c, "ppo-critic-policy-init", 2, "value/explained_variance", 1, 0.1),  # not < 0.1
        lambda f, c: c["ppo-critic-policy-init"].pop(1),  # a seed without curves: nan
    ],
    "ppo-critic-warmup": [
        lambda f, c: _set(c, "ppo-critic-warmup", 2, "value/explained_variance", WARMUP + 1, 0.29),
        lambda f, c: f["ppo-critic-warmup"][0].update(gold=0.30 - 0.055),  # 0.11 sd below ppo
    ],
    "ppo-beta0-dual-clip": [lambda f, c: f["ppo-beta0-dual-clip"][2].update(kl=41.0)],  # 0.82 x
    "ppo-bf16-copy": [
        lambda f, c: _set(c, "ppo-bf16-copy", 1, "mismatch/token_abs_diff_mean", 30, 1e-4),  # not > 1e-4
        lambda f, c: _set(c, "ppo-bf16-copy", 0, "mismatch/token_abs_diff_mean", 60, math.nan),  # not logged
        lambda f, c: c["ppo-bf16-copy"][0].update({"mismatch/token_abs_diff_mean": []}),  # no iteration
    ],
    "ppo-bf16-copy-recompute": [
        lambda f, c: _set(c, "ppo-bf16-copy-recompute", 2, "policy/first_ratio_abs_dev", 12, 1e-9),  # not exactly 0
        lambda f, c: f["ppo-bf16-copy-recompute"][1].update(gold=0.25 - 0.055),  # 0.11 sd below the copy
    ],
    "ppo-bf16-copy-tis": [
        lambda f, c: f["ppo-bf16-copy-tis"][0].update(gold=0.20 - 0.03),  # 0.06 sd below the copy
        lambda f, c: c["ppo-bf16-copy-tis"][1].update({"mismatch/is_truncated_share": [0.01] * IT}),  # not < 1%
    ],
}


@pytest.mark.parametrize("arm,i", [(a, i) for a, fs in FAILS.items() for i in range(len(fs))])
def test_each_practice_claim_fails_on_its_own(arm, i):
    finals, curves = healthy()
    FAILS[arm][i](finals, curves)
    assert holds(practice(finals, curves)[0]) == {a: "no" if a == arm else "yes" for a in PRACTICE_ARMS}


def test_warmup_claim_reads_the_first_policy_iteration_and_missing_arms_are_noted():
    finals, curves = healthy()
    # read at iteration 1 (no warm-up) the warm-up arm's critic is the bad start: the claim fails
    assert holds(practice(finals, curves, warmup=0)[0])["ppo-critic-warmup"] == "no"
    del finals["ppo-bf16-copy"]
    rows, notes = practice(finals, curves)
    assert set(holds(rows)) == {"ppo-critic-policy-init", "ppo-critic-warmup", "ppo-beta0-dual-clip"}
    assert sum("'practice' not checked: arm ppo-bf16-copy did not run" in n for n in notes) == 3
    # not asked for (the default groups): no practice row, no practice note
    rows, notes = compute_claims(finals, SFT, ExperimentsClaimsConfig(groups=["dpo"]), kl_coef=0.05, curves=curves)
    assert rows == [] and notes == ["claims 'dpo' not checked: arm dpo did not run or has no results"]


def test_sweep_results_feed_the_practice_claims_their_curves(tmp_path):
    """collect_results reads each run's metrics.jsonl into the curves the practice claims get, by
    seed, with ppo-critic-warmup's warm-up (iterations // 10): a fake sweep directory of two arms."""
    from fourfold.apps.experiments.sweep import Sweep, collect_results

    cfg = ExperimentsConfig(arms=["ppo", "ppo-critic-warmup"], seeds=[0, 1], iterations=20,
                            claims=ExperimentsClaimsConfig(groups=["practice"]))
    arms = build_arms(cfg)
    sw = Sweep(cfg, tmp_path, lambda *a, **k: None, arms, tmp_path / "demo", cfg.demo, ["p"], 0)
    summary = {"proxy": 0.0, "proxy_std": 1.0, "gold": 0.0, "gold_std": 0.5, "kl": 1.0, "length": 15.0,
               "well_formed": 0.9, "repetition": 0.0, "n": 256}
    (tmp_path / "baseline").mkdir()
    (tmp_path / "baseline" / "sft-biased-rm.json").write_text(json.dumps({"summary": summary, "rows": []}))
    state = {}
    for a in arms:
        for seed in cfg.seeds:
            d = sw.run_dir(a, seed)
            d.mkdir(parents=True)
            (d / "final_eval.json").write_text(json.dumps({"summary": {**summary, "gold": 0.3}, "rows": []}))
            # explained variance 0.5 at iteration 3 (the first policy iteration) in seed 0 only
            ev = {it: 0.5 if (it == 3 and seed == 0) else 0.0 for it in range(1, 21)}
            (d / "metrics.jsonl").write_text("".join(json.dumps(
                {"iteration": it, "value/explained_variance": v, "time/iteration_s": 1.0}) + "\n" for it, v in ev.items()))
            state[f"{a.name}/seed{seed}"] = "done"
    res = collect_results(sw, state)
    (row,) = res.claims
    assert row["claim"].startswith("2 critic-only warm-up iterations")
    assert "iteration 3 (the first policy iteration) +0.50, +0.00" in row["measured"] and row["holds"] == "no"
