"""The turns family: its claims on hand-made numbers, its config and every run's config (no
subprocess), its report and publish block from a hand-made record; a tiny family end to end and
the real `--quick` are in the slow marks."""
import dataclasses
import json
import math
import time
from pathlib import Path

import pytest

from fourfold.apps import claim_kinds
from fourfold.apps.experiments.config import ExperimentsConfig, TurnsClaimsConfig, TurnsConfig
from fourfold.apps.experiments.turns import TURNS_QUICK, Turns, turns_quick_config
from fourfold.apps.experiments.turns_claims import compute_turns_claims, growth
from fourfold.config import load_config
from fourfold.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CC = TurnsClaimsConfig()
N = 400
ARMS = ["ppo", "ppo-no-critic", "grpo", "rloo"]


def _runs(*golds):
    return [{"seed": s, "n": N, "gold": g, "gold_greedy": min(1.0, g + 0.1)} for s, g in enumerate(golds)]


def _se(p):
    return math.sqrt(p * (1 - p) / N)


def _world():
    sft = {"h0": {"n": N, "gold": 0.4, "gold_greedy": 0.5, "turns_mean": 1.0},
           "h1": {"n": N, "gold": 0.4, "gold_greedy": 0.5, "turns_mean": 2.0},
           "h3": {"n": N, "gold": 0.1, "gold_greedy": 0.2, "turns_mean": 3.8}}
    finals = {
        "h0": {"ppo": _runs(0.9, 0.9, 0.9), "ppo-no-critic": _runs(0.85, 0.85, 0.85), "grpo": _runs(0.9, 0.9, 0.9),
               "rloo": _runs(0.9, 0.9, 0.9)},
        "h1": {a: _runs(0.8, 0.8, 0.8) for a in ARMS},
        "h3": {"ppo": _runs(0.8, 0.8, 0.8), "ppo-no-critic": _runs(0.5, 0.6, 0.7), "grpo": _runs(0.8, 0.8, 0.8),
               "rloo": _runs(0.75, 0.7, 0.8)},
    }
    finals["h1"]["rloo"] = _runs(0.8, 0.55, 0.8)  # seed 1 gains 0.15 < 0.2 over SFT's 0.4
    return finals, sft


def test_growth_by_hand():
    """d = (0.3 - 0.05, 0.2 - 0.05, 0.1 - 0.05): mean 0.15, seeds' sd 0.1 -> SE 0.1 / sqrt(3) (larger than the evaluation's)."""
    most = {0: (0.3, 0.04), 1: (0.2, 0.04), 2: (0.1, 0.04)}
    fewest = {0: (0.05, 0.03), 1: (0.05, 0.03), 2: (0.05, 0.03), 7: (0.0, 0.0)}
    seeds, d, m, se = growth(most, fewest)
    assert seeds == [0, 1, 2] and d == pytest.approx([0.25, 0.15, 0.05]) and m == pytest.approx(0.15)
    assert se == pytest.approx(0.1 / math.sqrt(3))
    _, _, m1, se1 = growth({0: (0.3, 0.04)}, {0: (0.1, 0.03)})  # one seed: the evaluation's SE alone
    assert m1 == pytest.approx(0.2) and se1 == pytest.approx(0.05)
    _, _, _, se2 = growth({0: (0.2, 0.4), 1: (0.2, 0.4)}, {0: (0.0, 0.3), 1: (0.0, 0.3)})  # no spread: evaluation
    assert se2 == pytest.approx(math.sqrt(2 * 0.25) / 2)


def test_claims_on_a_hand_made_family():
    finals, sft = _world()
    rows, notes = compute_turns_claims(finals, sft, CC, hops=[3, 0, 1], arms=ARMS)
    assert notes == []
    by = {(r["group"], r["claim"]): r for r in rows}
    assert [r["group"] for r in rows] == ["knob", "learns", "learns", "learns", "critic", "critic", "critic"]
    knob = rows[0]
    assert knob["holds"] == "yes" and "1.00, 2.00, 3.80" in knob["measured"] and "+1.00, +1.80" in knob["measured"]
    learns = [r["holds"] for r in rows if r["group"] == "learns"]
    assert learns == ["yes", "no", "yes"]  # h1: rloo's seed 1 gains only 0.15
    assert "rloo +0.40, +0.15, +0.40" in rows[2]["measured"]
    crit = {r["claim"].split(" over ")[1].split(" grows")[0]: r for r in rows if r["group"] == "critic"}
    # ppo-no-critic: d = 0.25, 0.15, 0.05; SE = max(0.1 / sqrt(3), evaluation) -> bar 0.115 < 0.15: holds
    ev = math.sqrt(sum(_se(0.8) ** 2 + _se(g) ** 2 + _se(0.9) ** 2 + _se(0.85) ** 2 for g in (0.5, 0.6, 0.7))) / 3
    assert ev < 0.1 / math.sqrt(3)
    assert crit["ppo-no-critic"]["holds"] == "yes" and "+0.25, +0.15, +0.05" in crit["ppo-no-critic"]["measured"]
    assert "h0 +0.05, h1 +0.00, h3 +0.20" in crit["ppo-no-critic"]["measured"]
    assert f"> {2 * 0.1 / math.sqrt(3):.3f}" in crit["ppo-no-critic"]["threshold"]
    assert crit["grpo"]["holds"] == "no"  # no gain anywhere
    # rloo: d = 0.05, 0.1, 0.0: mean 0.05 meets grow_min but SE 0.05 / sqrt(3) x 2 = 0.058 > 0.05: within noise
    assert crit["rloo"]["holds"] == "no" and "mean +0.05" in crit["rloo"]["measured"]
    assert by[("knob", knob["claim"])]["threshold"] == "each step >= 0.5 turns"


def test_claims_that_cannot_be_checked_and_quick():
    finals, sft = _world()
    del finals["h3"]["ppo-no-critic"]
    sft["h1"]["turns_mean"] = 1.3  # a step of 0.3 < 0.5
    rows, notes = compute_turns_claims(finals, sft, CC, hops=[0, 1, 3], arms=ARMS)
    assert rows[0]["holds"] == "no"
    assert [r["holds"] for r in rows if r["group"] == "learns"][2] == "no"  # an arm has no results at h3
    assert "ppo-no-critic not run" in [r for r in rows if r["group"] == "learns"][2]["measured"]
    assert any("claims 'critic' not checked for ppo-no-critic" in n for n in notes)
    assert len([r for r in rows if r["group"] == "critic"]) == 2
    rows, notes = compute_turns_claims(finals, sft, CC, hops=[0, 1], arms=["ppo", "grpo"], quick=True)
    assert [r["group"] for r in rows] == ["knob"]
    assert notes == ["needs the full family: claims 'learns'", "needs the full family: claims 'critic'"]


def test_config_example_runs_and_quick(tmp_path):
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "turns.yaml")
    assert cfg.family == "turns" and cfg.turns == TurnsConfig(claims=TurnsClaimsConfig())
    assert (cfg.seeds, cfg.iterations, cfg.eval_prompts, cfg.group_size) == ([0, 1, 2], 40, 512, 8)
    fam = Turns(cfg, tmp_path, print)
    jobs = fam.jobs()
    assert len(jobs) == 3 + 3 * 3 * 4 and jobs[0].name == "world/h0" and jobs[3].name == "h3/ppo/seed0"
    assert [fam.sft_config(h).train.max_steps for h in (0, 1, 3)] == [150, 300, 600]
    assert fam.sft_config(3).model.max_positions == 56 and fam.world_dir(1).name == "turns-world-h1"
    cfgs = {a: fam.run_config(3, a, 2) for a in ARMS}
    for a, c in cfgs.items():
        assert (c.env.max_turns, c.env.max_tokens, c.ppo.iterations, c.run.seed) == (4, 56, 40, 2), a
        assert c.ppo.rollout_batch_size == 256 and c.ppo.kl_coef == 0.0, a  # the same trajectories per iteration
        assert c.model.policy == str(fam.world_dir(3) / "sft" / "model")
    assert [cfgs[a].ppo.estimator for a in ARMS] == ["gae", "reinforce_pp", "grpo", "rloo"]
    assert [cfgs[a].ppo.samples_per_prompt for a in ARMS] == [1, 1, 8, 8]
    assert cfgs["ppo"].ppo.loads_critic and cfgs["ppo"].model.critic_init == "policy"
    assert not any(cfgs[a].ppo.loads_critic for a in ARMS[1:])
    assert fam.run_config(0, "grpo", 0).env.max_tokens == 20 and fam.world_key(0) != fam.world_key(1)
    quick = turns_quick_config(dataclasses.replace(cfg, quick=True))
    assert quick.turns.hops == TURNS_QUICK["turns.hops"] and quick.seeds == [0] and quick.iterations == 8
    assert (quick.run.output_dir, quick.turns.world_dir) == ("runs/turns-quick", "runs/turns-world-quick")
    for bad, msg in ((["turns.hops=[0, 0]"], "turns.hops: a hops value is listed twice"),
                     (["turns.hops=[4]"], "turns.hops: must list hops in"),
                     (["turns.arms=[dpo]"], "turns.arms: arm 'dpo' does not run in the turns family"),
                     (["turns.claims.learn_min_gain=2"], "turns.claims.learn_min_gain: must be in"),
                     (["turns.sft_steps_per_turn=0"], "turns.sft_steps_per_turn: must be >= 1")):
        with pytest.raises(ConfigError, match=msg.replace("[", r"\[")):
            load_config(ExperimentsConfig, ROOT / "examples" / "turns.yaml", bad)


def _record():
    finals, sft = _world()
    rows, notes = compute_turns_claims(finals, sft, CC, hops=[0, 1, 3], arms=ARMS)
    from fourfold.apps.experiments.turns import ARM_WHAT, summarize

    for by in finals.values():
        for runs in by.values():
            for r in runs:
                r.update(turns_mean=2.0, turns_greedy=2.0, train_s=10.0)
    return {"worlds": {w: {"hops": h, "turns": h + 1, "max_tokens": 20 + 12 * h} for w, h in (("h0", 0), ("h1", 1), ("h3", 3))},
            "sft": sft, "finals": finals, "summaries": {w: {a: summarize(r, sft[w]) for a, r in by.items()}
                                                        for w, by in finals.items()},
            "curves": {"h0": {"ppo": [[0.4, 0.6, 0.9]]}}, "claims": rows, "notes": notes,
            "arms": {a: ARM_WHAT[a] for a in ARMS}, "wall_s": 90.0, "jobs_s": 80.0,
            "config": {"seeds": [0, 1, 2], "iterations": 40, "eval_prompts": N, "group_size": 8,
                       "turns": {"hops": [0, 1, 3], "arms": ARMS}}}


def test_report_and_publish_block_from_a_record(tmp_path):
    from fourfold.apps import publish
    from fourfold.apps.experiments.turns_report import write_turns_report

    rec = _record()
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "turns.yaml")
    write_turns_report(tmp_path, cfg, rec)
    md = (tmp_path / "summary.md").read_text()
    assert "| h3 | 4 | ppo-no-critic | 3 | 0.600 ± 0.100 | +0.50 |" in md and md.rstrip().endswith("| no | " + claim_kinds.rotated("ppo") + " |")
    assert md.index("## Claims") > md.index("## Held-out gold")
    assert (tmp_path / "turns.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "0.40 -&gt; 0.60 -&gt; 0.90" in (tmp_path / "report.html").read_text()
    (tmp_path / "results.json").write_text(json.dumps(rec))
    r = publish.collect_turns(tmp_path)
    assert set(publish.REQUIRED_KEYS["turns"]) <= set(r)
    block = publish.BLOCKS["docs/experiments.md"]["turns"]({"turns": r})
    assert "| 4 | ppo-no-critic | 0.600 ± 0.100 | +0.50 | 0.700 | +0.50 |" in block and "img/turns.png" in block
    assert "No results published yet" in publish.BLOCKS["docs/experiments.md"]["turns"]({})
    head = publish.turns_headline(r)[0]
    assert "1, 2, 4 turns | 3 of 6 findings hold; 1 of 1 checks pass" in head and "ppo's gold gain over ppo-no-critic grows with the turns: yes" in head


def _tiny(out: Path, world: Path) -> list[str]:
    return ["experiments", "--config", str(ROOT / "examples" / "turns.yaml"), "--output-dir", str(out),
            f"turns.world_dir={world}", "turns.hops=[0,1]", "turns.arms=[ppo,grpo]", "seeds=[0]", "iterations=2",
            "eval_prompts=16", "turns.sft_examples=200", "turns.sft_steps_per_turn=5", "turns.prompts=64",
            "turns.rl_overrides=[ppo.rollout_batch_size=16,ppo.minibatch_size=8]", "group_size=4", "run.progress=false"]


@pytest.mark.slow
def test_tiny_family_end_to_end(tmp_path):
    """Every piece at a tiny budget: two worlds, ppo and grpo, their evaluations, the claims, the
    report; then a rerun that skips everything."""
    from fourfold.cli import main

    out, world = tmp_path / "out", tmp_path / "world"
    assert main(_tiny(out, world)) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res["jobs"].values()) == {"done"} and len(res["jobs"]) == 2 + 4
    assert set(res["finals"]) == {"h0", "h1"} and res["sft"]["h1"]["n"] == 16
    assert [c["group"] for c in res["claims"]] == ["knob", "learns", "learns", "critic"]
    assert res["sft"]["h0"]["turns_mean"] == 1.0 and (out / "turns.png").is_file()
    t0 = time.perf_counter()
    assert main(_tiny(out, world)) == 0
    assert set(json.loads((out / "results.json").read_text())["jobs"].values()) == {"cached"}
    assert time.perf_counter() - t0 < 30


@pytest.mark.slow
def test_quick_end_to_end(tmp_path):
    """`fourfold experiments --config examples/turns.yaml --quick` from nothing."""
    from fourfold.cli import main

    out = tmp_path / "out"
    t0 = time.perf_counter()
    assert main(["experiments", "--config", str(ROOT / "examples" / "turns.yaml"), "--quick", "--output-dir",
                 str(out), f"turns.world_dir={tmp_path}/world", "run.progress=false"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert [c["group"] for c in res["claims"]] == ["knob"] and set(res["summaries"]) == {"h0", "h1"}
    print(f"turns --quick took {time.perf_counter() - t0:.0f} s")
