"""The turns family: its claims on hand-made numbers, its config and every run's config (no
subprocess), its report and publish block from a hand-made record; a tiny family end to end and
the real `--quick` are in the slow marks."""
import dataclasses
import json
import math
import time
from pathlib import Path

import pytest

from fourfold.apps.experiments.config import ExperimentsConfig, TurnsClaimsConfig, TurnsConfig
from fourfold.apps.experiments.turns import TURNS_QUICK, Turns, turns_quick_config
from fourfold.apps.experiments.turns_claims import (
    compute_turns_claims,
    growth,
    growth_verdict,
    learn_verdict,
    match_verdict,
    mean_se,
    rotate,
    rows_verdict,
    seed_diffs,
    tail_mean,
)
from fourfold.config import load_config
from fourfold.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CC = TurnsClaimsConfig()
N = 400
ARMS = ["ppo", "ppo-no-critic", "grpo", "rloo", "ppo-256x1"]


def _runs(*golds, ev=None):
    """Per-seed rows; ``ev``: a critic arm's explained variance at its last iteration (a 4-iteration curve)."""
    rows = [{"seed": s, "n": N, "gold": g, "gold_greedy": min(1.0, g + 0.1)} for s, g in enumerate(golds)]
    if ev is not None:
        for r in rows:
            r["ev"] = [0.0, ev / 2, ev, ev]
            r["ev_tail"] = ev
    return rows


def _se(p):
    return math.sqrt(p * (1 - p) / N)


def _world():
    sft = {"h0": {"n": N, "gold": 0.4, "gold_greedy": 0.5, "turns_mean": 1.0},
           "h1": {"n": N, "gold": 0.4, "gold_greedy": 0.5, "turns_mean": 2.0},
           "h3": {"n": N, "gold": 0.1, "gold_greedy": 0.2, "turns_mean": 3.8}}
    finals = {
        "h0": {"ppo": _runs(0.9, 0.9, 0.9, ev=0.5), "ppo-no-critic": _runs(0.85, 0.85, 0.85),
               "grpo": _runs(0.9, 0.9, 0.9), "rloo": _runs(0.9, 0.9, 0.9), "ppo-256x1": _runs(1.0, 0.98, 0.99, ev=0.4)},
        "h1": {a: _runs(0.8, 0.8, 0.8) for a in ARMS},
        "h3": {"ppo": _runs(0.8, 0.8, 0.8, ev=0.3), "ppo-no-critic": _runs(0.5, 0.6, 0.7), "grpo": _runs(0.8, 0.8, 0.8),
               "rloo": _runs(0.75, 0.7, 0.8), "ppo-256x1": _runs(0.81, 0.79, 0.8, ev=0.06)},
    }
    finals["h1"]["rloo"] = _runs(0.8, 0.55, 0.8)  # seed 1 gains 0.15 over SFT's 0.4: above 0.1 and 2 SE
    finals["h1"]["grpo"] = _runs(0.8, 0.45, 0.8)  # seed 1 gains 0.05 < 0.1
    finals["h1"]["ppo"] = _runs(0.8, 0.8, 0.8, ev=0.25)
    finals["h1"]["ppo-256x1"] = _runs(0.8, 0.8, 0.8, ev=0.25)
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


def test_verdicts_and_their_nulls_by_hand():
    """Each finding's verdict function, and the same function on its null comparison: 'no'."""
    a = {0: {"seed": 0, "n": N, "gold": 0.9}, 1: {"seed": 1, "n": N, "gold": 0.7}, 2: {"seed": 2, "n": N, "gold": 0.8}}
    assert rotate(a) == {0: a[1], 1: a[2], 2: a[0]}
    d = seed_diffs(a, rotate(a))  # the arm against itself, seeds rotated: +0.2, -0.1, -0.1, mean 0
    assert [x for x, _ in d.values()] == pytest.approx([0.2, -0.1, -0.1])
    m, se = mean_se(d)
    assert m == pytest.approx(0.0) and se == pytest.approx(math.sqrt(0.06 / 2) / math.sqrt(3))
    assert rows_verdict(d, CC)[-1] is False  # the rows claim's null
    assert rows_verdict({0: (0.1, 0.02), 1: (0.12, 0.02)}, CC)[-1] is True  # 0.11 >= 0.03, > 2 x 0.014
    # growth: the critic-free arm against itself at the fewest and the most turns -> d sums to 0
    assert growth_verdict(d, seed_diffs(a, rotate(a)), CC)[-1] is False
    assert growth_verdict({0: (0.0, 0.01), 1: (0.0, 0.01)}, {0: (0.1, 0.01), 1: (0.08, 0.01)}, CC)[-1] is True
    # match: a cost of 0.01 (SE 0.01) against a gain of 0.4 (margin 0.08) holds; a cost at the margin does not
    m, se, b = match_verdict({0: (0.01, 0.014), 1: (0.01, 0.014)}, 0.4, CC)
    assert b.holds and b.margin == pytest.approx(0.08)
    assert not match_verdict({0: (0.08, 0.014), 1: (0.08, 0.014)}, 0.4, CC)[-1].holds
    # learns: SFT against itself gains 0
    sft = {"n": N, "gold": 0.4}
    assert learn_verdict({0: sft}, sft, CC) == ([0.0], False)
    assert learn_verdict({0: {"n": N, "gold": 0.6}}, sft, CC)[1] is True
    assert tail_mean([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], 0.25) == pytest.approx(0.65)
    assert tail_mean([0.2], 0.25) == 0.2 and math.isnan(tail_mean([], 0.25))


def test_claims_on_a_hand_made_family():
    finals, sft = _world()
    rows, notes = compute_turns_claims(finals, sft, CC, hops=[3, 0, 1], arms=ARMS,
                                       shapes={**{a: "32x8" for a in ARMS[:4]}, "ppo-256x1": "256x1"})
    assert notes == []
    assert [r["group"] for r in rows] == ["knob", "critic-learns", "critic-learns", "learns", "learns", "learns",
                                          "critic", "critic", "critic", "match", "match", "match", "rows", "rows", "rows"]
    assert [r["kind"] for r in rows][:4] == ["check", "check", "check", "finding"]
    assert all(r["null"].startswith("no (computed: ") for r in rows if r["kind"] == "finding")
    knob = rows[0]
    assert knob["holds"] == "yes" and "1.00, 2.00, 3.80" in knob["measured"] and "+1.00, +1.80" in knob["measured"]
    ev_ppo, ev_wide = rows[1], rows[2]
    assert ev_ppo["claim"] == "the critic learns (ppo, 32 rows x 8)" and ev_ppo["holds"] == "yes"
    assert "h0 0.500, 0.500, 0.500; h1 0.250, 0.250, 0.250; h3 0.300" in ev_ppo["measured"]
    assert ev_wide["holds"] == "no"  # 0.06 < 0.1 at h3
    learns = [r["holds"] for r in rows if r["group"] == "learns"]
    assert learns == ["yes", "no", "yes"]  # h1: grpo's seed 1 gains only 0.05
    assert "grpo +0.40, +0.05, +0.40" in rows[4]["measured"]
    crit = {r["claim"].split(" over ")[1].split(" at ")[0]: r for r in rows if r["group"] == "critic"}
    assert set(crit) == {"ppo-no-critic", "grpo", "rloo"}  # at 32 x 8 only: ppo-256x1 has no critic-free partner
    # ppo-no-critic: d = 0.25, 0.15, 0.05; SE = max(0.1 / sqrt(3), evaluation) -> bar 0.115 < 0.15: holds
    ev = math.sqrt(sum(_se(0.8) ** 2 + _se(g) ** 2 + _se(0.9) ** 2 + _se(0.85) ** 2 for g in (0.5, 0.6, 0.7))) / 3
    assert ev < 0.1 / math.sqrt(3)
    c = crit["ppo-no-critic"]
    assert c["holds"] == "yes" and "+0.25, +0.15, +0.05" in c["measured"] and "32 rows x 8 grows" in c["claim"]
    assert "h0 +0.05, h1 +0.00, h3 +0.20" in c["measured"]
    assert f"> {2 * 0.1 / math.sqrt(3):.3f}" in c["threshold"]
    assert c["null"] == "no (computed: ppo-no-critic against itself, seed s against seed s+1)"
    assert crit["grpo"]["holds"] == "no"  # no gain anywhere
    # rloo: d = 0.05, 0.1, 0.0: mean 0.05 meets grow_min but 2 SE = 2 x 0.05 / sqrt(3) = 0.058 > 0.05
    assert crit["rloo"]["holds"] == "no" and "mean +0.05" in crit["rloo"]["measured"]
    match = {r["claim"].split(" costs")[0]: r for r in rows if r["group"] == "match"}
    # grpo costs 0 at every turn count, but at h1 its seeds' spread (0.35 / sqrt(3) x ... ) is wide
    assert match["grpo"]["holds"] == "no" and match["rloo"]["holds"] == "no"
    assert match["ppo-no-critic"]["holds"] == "no"  # h3: a cost of 0.2 against a margin of 0.14
    assert "h3 +0.20 (bound" in match["ppo-no-critic"]["measured"]
    assert all(r["null"] == "no (computed: a cost exactly at the margin with the same SE)" for r in match.values())
    wide = [r for r in rows if r["group"] == "rows"]
    assert [r["holds"] for r in wide] == ["yes", "no", "no"]  # h0: +0.09 (SE 0.019); h1 +0.00; h3 +0.00
    assert wide[0]["claim"] == ("at the same trajectories, 256 rows x 1 beat 32 rows x 8 (ppo-256x1 vs ppo) at 1 turn (h0)")


def test_a_group_baseline_that_matches_the_critic_holds_non_inferiority():
    finals, sft = _world()
    for w in finals:
        finals[w]["grpo"] = [dict(r) for r in finals[w]["ppo"]]
        for r in finals[w]["grpo"]:
            r.pop("ev"), r.pop("ev_tail")
    rows, _ = compute_turns_claims(finals, sft, CC, hops=[0, 1, 3], arms=["ppo", "grpo"])
    m = [r for r in rows if r["group"] == "match"]
    assert len(m) == 1 and m[0]["holds"] == "yes" and m[0]["kind"] == "finding"


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
    assert "not run: h3" in [r for r in rows if r["group"] == "match"][0]["measured"]
    rows, notes = compute_turns_claims(finals, sft, CC, hops=[0, 1], arms=["ppo", "grpo"], quick=True)
    assert [r["group"] for r in rows] == ["knob", "critic-learns"]
    assert notes == [f"needs the full family: claims '{g}'" for g in ("learns", "critic", "match", "rows")]


def test_config_example_runs_and_quick(tmp_path):
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "turns.yaml")
    assert cfg.family == "turns" and cfg.turns == TurnsConfig(claims=TurnsClaimsConfig())
    assert (cfg.seeds, cfg.iterations, cfg.eval_prompts, cfg.group_size) == ([0, 1, 2], 40, 512, 8)
    fam = Turns(cfg, tmp_path, print)
    jobs = fam.jobs()
    assert len(jobs) == 3 + 3 * 3 * 5 and jobs[0].name == "world/h0" and jobs[3].name == "h3/ppo/seed0"
    assert [fam.sft_config(h).train.max_steps for h in (0, 1, 3)] == [150, 300, 600]
    assert fam.sft_config(3).model.max_positions == 56 and fam.world_dir(1).name == "turns-world-h1"
    cfgs = {a: fam.run_config(3, a, 2) for a in ARMS}
    for a, c in cfgs.items():
        assert (c.env.max_turns, c.env.max_tokens, c.ppo.iterations, c.run.seed) == (4, 56, 40, 2), a
        assert c.ppo.rollout_batch_size == 256 and c.ppo.kl_coef == 0.0, a  # the same trajectories per iteration
        assert c.model.policy == str(fam.world_dir(3) / "sft" / "model")
    assert [cfgs[a].ppo.estimator for a in ARMS] == ["gae", "reinforce_pp", "grpo", "rloo", "gae"]
    assert [cfgs[a].ppo.samples_per_prompt for a in ARMS] == [8, 8, 8, 8, 1]  # matched rows x K, and the contrast
    for a in ("ppo", "ppo-256x1"):
        assert cfgs[a].ppo.loads_critic and cfgs[a].model.critic_init == "policy"
        assert (cfgs[a].ppo.critic_lr, cfgs[a].ppo.critic_warmup) == (cfg.turns.critic_lr, cfg.turns.critic_warmup)
    assert not any(cfgs[a].ppo.loads_critic for a in ARMS[1:4])
    assert cfgs["grpo"].ppo.critic_lr == 1e-5  # untouched: no critic
    # a warm-up runs before the policy's iterations: every arm keeps 40 policy updates
    warm = Turns(load_config(ExperimentsConfig, ROOT / "examples" / "turns.yaml",
                             ["turns.critic_warmup=3", "turns.critic_lr=0.01", "turns.critic_overrides=[ppo.critic_lam=1.0]"]),
                 tmp_path, print)
    c = warm.run_config(1, "ppo", 0).ppo
    assert (c.iterations, c.critic_warmup, c.critic_lr, c.critic_lam) == (43, 3, 0.01, 1.0)
    assert warm.run_config(1, "rloo", 0).ppo.iterations == 40
    assert fam.run_config(0, "ppo-no-critic-256x1", 0).ppo.samples_per_prompt == 1
    assert fam.run_config(0, "grpo", 0).env.max_tokens == 20 and fam.world_key(0) != fam.world_key(1)
    quick = turns_quick_config(dataclasses.replace(cfg, quick=True))
    assert quick.turns.hops == TURNS_QUICK["turns.hops"] and quick.seeds == [0] and quick.iterations == 8
    assert (quick.run.output_dir, quick.turns.world_dir) == ("runs/turns-quick", "runs/turns-world-quick")
    for bad, msg in ((["turns.hops=[0, 0]"], "turns.hops: a hops value is listed twice"),
                     (["turns.hops=[4]"], "turns.hops: must list hops in"),
                     (["turns.arms=[dpo]"], "turns.arms: arm 'dpo' does not run in the turns family"),
                     (["turns.claims.learn_min_gain=2"], "turns.claims.learn_min_gain: must be in"),
                     (["turns.sft_steps_per_turn=0"], "turns.sft_steps_per_turn: must be >= 1"),
                     (["turns.critic_lr=0"], "turns.critic_lr: must be > 0"),
                     (["turns.critic_warmup=-1"], "turns.critic_warmup: must be an integer >= 0"),
                     (["turns.claims.match_margin_share=1"], "turns.claims.match_margin_share: must be in")):
        with pytest.raises(ConfigError, match=msg.replace("[", r"\[")):
            load_config(ExperimentsConfig, ROOT / "examples" / "turns.yaml", bad)


def _record():
    finals, sft = _world()
    shapes = {**{a: "32x8" for a in ARMS[:4]}, "ppo-256x1": "256x1"}
    rows, notes = compute_turns_claims(finals, sft, CC, hops=[0, 1, 3], arms=ARMS, shapes=shapes)
    from fourfold.apps.experiments.turns import ARM_WHAT, summarize

    for by in finals.values():
        for runs in by.values():
            for r in runs:
                r.update(turns_mean=2.0, turns_greedy=2.0, train_s=10.0)
    return {"worlds": {w: {"hops": h, "turns": h + 1, "max_tokens": 20 + 12 * h} for w, h in (("h0", 0), ("h1", 1), ("h3", 3))},
            "sft": sft, "finals": finals, "summaries": {w: {a: summarize(r, sft[w]) for a, r in by.items()}
                                                        for w, by in finals.items()},
            "curves": {"h0": {"ppo": [[0.4, 0.6, 0.9]]}}, "claims": rows, "notes": notes, "shapes": shapes,
            "ev_curves": {w: {a: [r["ev"] for r in by[a]] for a in ("ppo", "ppo-256x1")} for w, by in finals.items()},
            "arms": {a: ARM_WHAT[a] for a in ARMS}, "wall_s": 90.0, "jobs_s": 80.0,
            "config": {"seeds": [0, 1, 2], "iterations": 40, "eval_prompts": N, "group_size": 8,
                       "turns": {"hops": [0, 1, 3], "arms": ARMS, "critic_lr": 0.003, "critic_warmup": 0}}}


def test_report_and_publish_block_from_a_record(tmp_path):
    from fourfold.apps import publish
    from fourfold.apps.experiments.turns_report import write_turns_report

    rec = _record()
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "turns.yaml")
    write_turns_report(tmp_path, cfg, rec)
    md = (tmp_path / "summary.md").read_text()
    assert "| h3 | 4 | ppo-no-critic | 32x8 | 3 | 0.600 ± 0.100 | +0.50 |" in md
    assert "| h3 | 4 | ppo | 32x8 | 3 | 0.800 ± 0.000 | +0.70 | 0.900 ± 0.000 | +0.70 | 2.00 | 0.300 ± 0.000 |" in md
    assert "## The critic's explained variance per iteration" in md and "| h3 | ppo | 3 | 0.00 0.15 0.30 0.30 |" in md
    assert md.rstrip().endswith("| no | no (computed: ppo-256x1 against itself, seed s against seed s+1) |")
    assert md.index("## Claims") > md.index("## Held-out gold")
    assert (tmp_path / "turns.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (tmp_path / "report.html").read_text()
    assert "0.40 -&gt; 0.60 -&gt; 0.90" in html and "explained variance per iteration" in html
    (tmp_path / "results.json").write_text(json.dumps(rec))
    r = publish.collect_turns(tmp_path)
    assert set(publish.REQUIRED_KEYS["turns"]) <= set(r) and r["shapes"]["ppo-256x1"] == "256x1"
    block = publish.BLOCKS["docs/experiments.md"]["turns"]({"turns": r})
    assert "| 4 | ppo-no-critic | 32x8 | 0.600 ± 0.100 | +0.50 | 0.700 | +0.50 |  |" in block and "img/turns.png" in block
    assert "| 4 | ppo | 32x8 | 0.800 ± 0.000 | +0.70 | 0.900 | +0.70 | 0.300 |" in block
    assert "| 4 | ppo-256x1 | 0.00 0.03 0.06 0.06 |" in block and "critic_lr 0.003, 0 warm-up" in block
    assert "No results published yet" in publish.BLOCKS["docs/experiments.md"]["turns"]({})
    head = publish.turns_headline(r)[0]
    assert "1, 2, 4 turns | 4 of 12 findings hold; 2 of 3 checks pass" in head
    assert "ppo's gold gain over ppo-no-critic at 32 rows x 8 grows with the turns: yes" in head
    # the first run's record (no shapes, no explained variance) renders as it was published
    old = {k: v for k, v in r.items() if k not in ("shapes", "ev_curves", "critic_lr", "critic_warmup")}
    assert "| 4 | ppo-no-critic | 0.600 ± 0.100 | +0.50 | 0.700 | +0.50 |" in publish.BLOCKS["docs/experiments.md"]["turns"](
        {"turns": old})


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
    assert [c["group"] for c in res["claims"]] == ["knob", "critic-learns", "learns", "learns", "critic", "match"]
    assert len(res["ev_curves"]["h1"]["ppo"][0]) == 2 and "ev_tail" in res["summaries"]["h1"]["ppo"]
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
    assert [c["group"] for c in res["claims"]] == ["knob", "critic-learns"] and set(res["summaries"]) == {"h0", "h1"}
    print(f"turns --quick took {time.perf_counter() - t0:.0f} s")
