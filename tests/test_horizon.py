"""The horizon family of `fourfold experiments`: its claims on hand-made numbers (including claims
that do not hold), its config and quick settings, its worlds and jobs, the token-credit items, the
report, and a tiny family end to end (then a rerun that skips everything); the real `--quick` is in
the slow marks."""
import dataclasses
import json
import math
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from fourfold.apps.experiments.config import ExperimentsConfig, HorizonClaimsConfig, HorizonConfig
from fourfold.apps.experiments.credit import credit_items, token_sentences
from fourfold.apps.experiments.horizon import HORIZON_QUICK, horizon_quick_config
from fourfold.apps.experiments.horizon_claims import compute_horizon_claims, world_label
from fourfold.apps.experiments.horizon_report import result_rows, write_horizon_report
from fourfold.config import load_config
from fourfold.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
N = 1024  # prompts: SE of a gold mean = 0.5 / 32 = 0.0156, of a difference in sd 0.044 (2 SE: 0.088)


def row(seed, gold, **kw):
    base = {"seed": seed, "n": N, "gold": gold, "gold_std": 0.5, "proxy": 1.0, "proxy_std": 1.0, "kl": 3.0,
            "length": 20.0, "length_std": 3.0, "kl_std": 1.0, "well_formed": 0.9, "repetition": 0.0}
    return {**base, **kw}


def arm(*golds, **kw):
    return [row(s, g, **kw) for s, g in enumerate(golds)]


def sft(length, sentences):
    return {"gold": 0.0, "gold_std": 0.5, "length": length, "length_std": 3.0, "n": N, "sentences": sentences,
            "proxy": 0.0, "proxy_std": 1.0, "kl": 0.0, "well_formed": 0.9, "repetition": 0.0}


def healthy():
    """gold sd 0.5 everywhere: the critic's gain 0, 0.1, 0.3 sd at k = 1, 3, 6; grpo and rloo 0-0.04 sd
    below ppo (non-inferior: the mean's SE 0.0255 sd, its upper bound cost + 0.042 below 20% of ppo's
    0.4 / 0.5 / 0.6 sd gain); the same under noise; K = 8 0.2 sd above K = 2."""
    finals = {
        "h1": {"ppo": arm(0.2, 0.21, 0.19), "ppo-no-critic": arm(0.2, 0.21, 0.19), "grpo": arm(0.2, 0.21, 0.19),
               "rloo": arm(0.2, 0.21, 0.19)},
        "h3": {"ppo": arm(0.25, 0.25, 0.25), "ppo-no-critic": arm(0.2, 0.2, 0.2), "grpo": arm(0.24, 0.24, 0.24),
               "rloo": arm(0.24, 0.24, 0.24)},
        "h6": {"ppo": arm(0.3, 0.3, 0.3), "ppo-no-critic": arm(0.15, 0.15, 0.15), "grpo": arm(0.29, 0.29, 0.29),
               "rloo": arm(0.28, 0.28, 0.28)},
        "h6-noisy": {"ppo": arm(0.2, 0.2, 0.2), "grpo": arm(0.195, 0.195, 0.195)},
        "h6-k2": {"grpo": arm(0.1, 0.1, 0.1)},
        "h6-k8": {"grpo": arm(0.2, 0.2, 0.2)},
    }
    sfts = {w: sft(7 + 6 * (int(w[1]) - 1), float(w[1])) for w in finals}
    return finals, sfts


def claims(finals, sfts, quick=False, **hc):
    return compute_horizon_claims(finals, sfts, HorizonConfig(**hc), group_size=4, quick=quick)


def by_group(rows):
    out = {}
    for r in rows:
        out.setdefault(r["group"], []).append(r)
    return out


def test_every_claim_holds_on_healthy_numbers():
    rows, notes = claims(*healthy())
    assert notes == []
    g = by_group(rows)
    assert list(g) == ["knob", "critic", "match", "noisy", "group-size"]
    assert [len(v) for v in g.values()] == [1, 1, 2, 1, 1]
    assert all(r["holds"] == "yes" for r in rows), [r for r in rows if r["holds"] != "yes"]
    critic = g["critic"][0]
    assert "gain h1 +0.00, h3 +0.10, h6 +0.30 sd" in critic["measured"]
    assert "h6 minus h1: +0.30, +0.30, +0.30 sd (3/3 seeds beyond noise), mean +0.30 sd" in critic["measured"]
    assert critic["threshold"].startswith("mean increase >= 0.1 sd, and > 2 evaluation standard errors (0.12, ")
    grpo = g["match"][0]
    assert grpo["claim"] == "a group baseline (grpo) matches the critic at every horizon tried"
    # h6: cost 0.02 sd, SE 0.0255 (the evaluation's), bound 0.02 + 1.645 x 0.0255 = 0.062 < 20% of 0.6 sd
    assert "h1 +0.00 (bound +0.04 / margin 0.080; " in grpo["measured"]
    assert "h6 +0.02 (bound +0.06 / margin 0.120; seeds +0.02, +0.02, +0.02)" in grpo["measured"]
    assert grpo["threshold"] == "upper 95% bound < 20% of ppo's gold gain at that horizon: non-inferiority, at every one"
    assert "labeler_noise 0.3" in g["noisy"][0]["claim"]
    size = g["group-size"][0]
    assert size["claim"].startswith("a group of 8 beats a group of 2 (grpo at h6")
    assert "K=2 +0.20, K=4 +0.58, K=8 +0.40 sd" in size["measured"] and "(3/3 seeds)" in size["measured"]
    assert "SFT length 7.0, 19.0, 37.0 words, sentences 1.00, 3.00, 6.00 at h1, h3, h6" in g["knob"][0]["measured"]


def test_claims_that_do_not_hold():
    finals, sfts = healthy()
    finals["h6"]["ppo-no-critic"][2]["gold"] = 0.29  # the critic's gain at k = 6 vanishes in seed 2
    finals["h3"]["rloo"] = arm(0.05, 0.05, 0.05)  # 0.4 sd below ppo at k = 3
    finals["h6-noisy"]["grpo"] = arm(0.0, 0.0, 0.0)  # 0.4 sd under noise
    finals["h6-k8"]["grpo"] = arm(0.11, 0.12, 0.1)  # K = 8 no better than K = 2
    sfts["h3"]["length"] = 7.2  # the knob did not lengthen k = 3 beyond noise (2 SE: 0.27 words)
    rows, notes = claims(finals, sfts)
    holds = {(r["group"], r["claim"].split("(")[1][:4] if r["group"] in ("match", "noisy") else ""): r["holds"]
             for r in rows}
    assert holds == {("knob", ""): "no", ("critic", ""): "no", ("match", "grpo"): "yes", ("match", "rloo"): "no",
                     ("noisy", "grpo"): "no", ("group-size", ""): "no"}
    critic = [r for r in rows if r["group"] == "critic"][0]
    assert "(2/3 seeds beyond noise)" in critic["measured"]
    # a mean increase below the bar fails even when every seed is beyond noise
    finals, sfts = healthy()
    for r in finals["h6"]["ppo-no-critic"]:
        r["gold"] = 0.27  # +0.06 sd at k = 6: 0.06 < 0.1
    rows, _ = claims(finals, sfts, claims=HorizonClaimsConfig(critic_min_increase_sd=0.1, noise_z=0.5))
    assert [r["holds"] for r in rows if r["group"] == "critic"] == ["no"]


def test_missing_worlds_and_arms_are_noted_never_passed():
    finals, sfts = healthy()
    del finals["h3"]["rloo"], finals["h6-k8"], finals["h6-noisy"]
    rows, notes = claims(finals, sfts)
    rloo = [r for r in rows if "(rloo)" in r["claim"]][0]
    assert rloo["holds"] == "no" and "not run: h3" in rloo["measured"]
    assert "claims 'match' not checked at h3: arm rloo has no results" in notes
    assert any(n.startswith("claims 'noisy' not checked at h6-noisy") for n in notes)
    assert "claims 'group-size' not checked: grpo at K = 2 or K = 8 has no results" in notes
    # without ppo-no-critic at the longest horizon the critic claim is not checked (a note)
    finals, sfts = healthy()
    del finals["h6"]["ppo-no-critic"]
    rows, notes = claims(finals, sfts)
    assert not [r for r in rows if r["group"] == "critic"]
    assert any("claims 'critic' not checked: needs ppo and ppo-no-critic" in n for n in notes)


def test_quick_states_only_the_knob():
    finals, sfts = healthy()
    rows, notes = claims({w: finals[w] for w in ("h1", "h3")}, {w: sfts[w] for w in ("h1", "h3")}, quick=True,
                         horizons=[1, 3], arms=["ppo", "grpo"], noisy_task_options={}, group_sizes=[])
    assert [r["group"] for r in rows] == ["knob"] and rows[0]["holds"] == "yes"
    assert notes == [f"needs the full sweep: claims '{g}'" for g in ("critic", "match", "noisy", "group-size")]


def test_config_example_defaults_and_errors():
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "horizon.yaml")
    assert cfg.family == "horizon" and cfg.horizon == dataclasses.replace(HorizonConfig(), demo_dir="runs/demo-horizon")
    assert cfg.seeds == [0, 1, 2] and cfg.run.output_dir == "runs/horizon" and cfg.demo.model.max_positions == 112
    assert ExperimentsConfig().family == "claims"  # the claims sweep stays the default
    for bad, msg in ((["horizon.arms=[ppo, dpo]"], "horizon.arms: arm 'dpo' does not run in the horizon family"),
                     (["horizon.horizons=[1, 1]"], "a horizon is listed twice"),
                     (["horizon.horizons=[0]"], "horizon.horizons"),
                     (["horizon.group_sizes=[1]"], "horizon.group_sizes"),
                     (["horizon.group_arm=ppo"], "horizon.group_arm: must be one of grpo, rloo"),
                     (["horizon.task_options={sentences: 2}"], "sentences is set by horizons"),
                     (["demo.model.max_positions=64"], "demo.model.max_positions: must hold a 16-token prompt"),
                     (["horizon.claims.match_margin_share=0"], "horizon.claims.match_margin_share")):
        with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace("(", r"\(")):
            load_config(ExperimentsConfig, ROOT / "examples" / "horizon.yaml", bad)
    quick = horizon_quick_config(dataclasses.replace(cfg, quick=True))
    assert quick.horizon.horizons == [1, 3] and quick.seeds == [0] and quick.iterations == HORIZON_QUICK["iterations"]
    assert (quick.run.output_dir, quick.horizon.demo_dir) == ("runs/horizon-quick", "runs/demo-horizon-quick")
    assert quick.demo.sft.steps == 700 and not quick.demo.quick  # the quick demo's budgets, applied here
    assert cfg.horizon.demo_dir == "runs/demo-horizon"  # the original is untouched


def test_horizon_demo_configs(tmp_path):
    from fourfold.apps.experiments.horizon import horizon_demo

    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "horizon.yaml", [f"horizon.demo_dir={tmp_path}/d"])
    d6 = horizon_demo(cfg, 6)
    assert d6.task_options == {"labeler_length_bias": 0.0, "sentences": 6} and d6.generation.max_new_tokens == 84
    assert d6.run.output_dir == f"{tmp_path}/d-h6" and horizon_demo(cfg, 1).generation.max_new_tokens == 24
    noisy = horizon_demo(cfg, 6, "noisy", {"labeler_noise": 0.3})
    assert noisy.task_options["labeler_noise"] == 0.3 and noisy.run.output_dir.endswith("d-h6-noisy")


def test_family_jobs(tmp_path):
    from fourfold.apps.experiments import horizon

    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "horizon.yaml", [f"horizon.demo_dir={tmp_path}/d"])
    fam = horizon.Family(cfg, tmp_path / "out", lambda *a, **k: None, ["the blender"] * 4, 7)
    worlds = fam.worlds()
    assert [w.label for w in worlds] == ["h1", "h3", "h6", "h6-noisy", "h6-k2", "h6-k8"]
    assert [[a.name for a in w.sweep.arms] for w in worlds][2:] == [["ppo", "ppo-no-critic", "grpo", "rloo"],
                                                                    ["ppo", "grpo"], ["grpo"], ["grpo"]]
    k8 = worlds[-1]
    assert k8.demo_dir == worlds[2].demo_dir and k8.sweep.arms[0].ppo == {"advantage": "grpo", "samples_per_prompt": 8}
    assert worlds[0].sweep.cfg.claims.groups == ["critic", "critic-free"] and worlds[3].sweep.cfg.claims.groups == []
    jobs = {j.name: j for j in fam.jobs(worlds)}
    assert [n for n in jobs if n.startswith("demo/")] == ["demo/h1", "demo/h3", "demo/h6", "demo/h6-noisy"]
    assert jobs["demo/h6-noisy"].deps == ("demo/h6",)
    assert jobs["h6-k8/grpo/seed2"].deps == ("demo/h6",) and jobs["h1/sft/biased-rm"].deps == ("demo/h1",)
    assert jobs["credit"].deps == ("h6/ppo/seed0", "h6/grpo/seed0")
    assert len(jobs) == 4 + 6 + 3 * (4 + 4 + 4 + 2 + 1 + 1) + 1
    # an arm's run: the world's task (gold of k sentences in its training curves), its response length
    from fourfold.apps.experiments.arms import run_config

    sw = worlds[2].sweep
    rc = run_config(sw.cfg, sw.arms[0], 0, sft=tmp_path / "s", rm=tmp_path / "r", run_dir=tmp_path / "run")
    assert rc.data.task_options == {"labeler_length_bias": 0.0, "sentences": 6} and rc.generation.max_new_tokens == 84
    assert rc.ppo.iterations == cfg.iterations


def test_default_claims_arms_keep_their_run_keys():
    """data.task_options is left out of a run's key when empty: the claims sweep's default arms key
    as they did before it existed (a finished sweep is not retrained)."""
    from fourfold.apps.experiments import build_arms, run_config, run_key

    cfg = ExperimentsConfig()
    keys = {a.name: run_key(run_config(cfg, a, 1, sft=Path("/x/sft"), rm=Path("/x/rm"), run_dir=Path("/nonexistent/r")),
                            a.stage, {"sft": "s", "reward": "r"}) for a in build_arms(cfg)}
    assert keys["ppo"] == "264aa5055c11ced0" and keys["grpo"] == "3503c91558c55c8b"
    assert keys["reinforce-lr3x"] == "822bce36262d006c" and keys["dpo"] == "2d151dc83f76973b"


def test_token_sentences_and_credit_items():
    from fourfold.tasks import get_task

    assert token_sentences([" is", " great", " .", " i", " love", " it", " !", "<eos>"]) == [0, 0, 0, 1, 1, 1, 1, -1]
    assert token_sentences([" is", " great"]) == [-1, -1]
    task = get_task("review", sentences=2)
    credit = {"items": [{"prompt": "the lamp", "response": "is great . i hate it .",
                         "tokens": [" is", " great", " .", " i", " hate", " it", " .", "</s>"],
                         "advantages": [0.1] * 8, "advantages_group": [0.5] * 8, "score": 1.0, "gold": 0.0,
                         "kl_sum": 0.3, "finished": True},
                        {"prompt": "the lamp", "response": "great great", "tokens": [" great", " great"],
                         "advantages": [0.0, 0.0], "advantages_group": [-0.5, -0.5], "score": -1.0, "gold": -1.5,
                         "kl_sum": 0.1, "finished": False}]}
    a, b = credit_items(credit, task)
    assert a["sentence"] == [0, 0, 0, 1, 1, 1, 1, -1] and a["sentence_polarity"] == [1, -1]
    assert a["gae"] == [0.1] * 8 and a["group"] == [0.5] * 8
    assert b["sentence_polarity"] == [] and b["sentence"] == [-1, -1]


class _Html(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.stack = [], []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.imgs.append(dict(attrs).get("src", ""))
        elif tag not in ("meta", "br"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
        self.stack.pop()


def _record(finals, sfts, rows, notes):
    summaries = {w: {a: {"seeds": 3, "gold_delta_sd": 0.1, "proxy_delta_sd": 1.0, "kl": 3.0, "length": 20.0,
                         "well_formed": 0.9, "models": "4 (2+2)", "peak_rss_mb": 450.0, "s_per_iteration": 1.5,
                         "train_s": 60.0} for a in arms} for w, arms in finals.items()}
    return {"sft": sfts, "finals": finals, "summaries": summaries, "claims": rows, "notes": notes,
            "worlds": {w: {"horizon": int(w[1]), "what": f"world {w}", "demo": "d"} for w in finals},
            "rm": {w: {"accuracy_vs_labelers": 0.7, "accuracy_vs_gold": 0.65} for w in finals}, "wall_s": 61.0,
            "jobs_s": 60.0}


def test_report_from_numbers(tmp_path):
    finals, sfts = healthy()
    rows, notes = claims(finals, sfts)
    record = _record(finals, sfts, rows, notes)
    cfg = load_config(ExperimentsConfig, ROOT / "examples" / "horizon.yaml")
    item = {"prompt": "the lamp", "response": "is great .", "tokens": [" is", " great", " .", "</s>"],
            "gae": [0.2, 0.4, -0.1, 0.3], "group": [0.5] * 4, "score": 1.0, "gold": 1.0, "kl_sum": 0.2,
            "finished": True, "sentence": [0, 0, 0, -1], "sentence_polarity": [1]}
    credit = {"views": [{"label": "ppo", "policy": "p", "items": [item] * 4}], "K": 4, "horizon": 6, "kl_coef": 0.05,
              "gamma": 1.0, "lam": 0.95, "group_advantage": "grpo"}
    write_horizon_report(tmp_path, cfg, record, credit)
    md = (tmp_path / "summary.md").read_text()
    lines = md.rstrip("\n").split("\n")
    start = max(i for i, line in enumerate(lines) if line.startswith("| claim | kind | measured | threshold | holds | null |"))
    assert len(lines) - start == 2 + len(rows) and all(line.startswith("|") for line in lines[start:])  # claims last
    assert "| h6-k8 | grpo | 3 |" in md and "| h1 | SFT | 1 |" in md
    assert [r["arm"] for r in result_rows(record) if r["world"] == "h6-noisy"] == ["SFT", "ppo", "grpo"]
    page = (tmp_path / "report.html").read_text()
    p = _Html()
    p.feed(page)
    p.close()
    assert p.stack == [] and len(p.imgs) == 1 and (tmp_path / "horizon.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "mean GAE advantage" in page and "+0.167" in page  # the positive sentence's tokens: (0.2 + 0.4 - 0.1) / 3
    assert 'href="h6-noisy/report.html"' in page


def _tiny(out: Path, demo: Path) -> list[str]:
    return ["experiments", "--output-dir", str(out), "family=horizon", f"horizon.demo_dir={demo}",
            "horizon.horizons=[1,2]", "horizon.arms=[ppo,grpo]", "horizon.noisy_arms=[ppo]", "horizon.group_sizes=[2]",
            "horizon.credit_prompts=1", "demo.model.max_positions=64", "demo.model.hidden_size=32",
            "demo.sft.examples=300", "demo.sft.steps=10", "demo.pairs.pairs=40", "demo.pairs.eval_pairs=10",
            "demo.pairs.slip_eval_pairs=4", "demo.reward.steps=5", "demo.ppo.rollout_batch_size=8",
            "demo.ppo.minibatch_size=4", "iterations=2", "seeds=[0]", "eval_prompts=16", "run.progress=false"]


def test_tiny_family_end_to_end(tmp_path):
    """Every piece of the family at a tiny budget: the worlds' demo stages (the noisy one seeded with
    its horizon's SFT model), the runs, the credit view, each world's report and the family's; then a
    rerun that skips everything; then the published horizon block from its outputs."""
    from fourfold.apps import publish
    from fourfold.cli import main

    out, demo = tmp_path / "out", tmp_path / "demo"
    assert main(_tiny(out, demo)) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res["jobs"].values()) == {"done"} and len(res["jobs"]) == 3 + 4 + (2 + 2 + 1 + 1) + 1  # a run: train + evaluate
    assert [c["group"] for c in res["claims"]] == ["knob", "match", "group-size"]
    assert res["sft"]["h1"]["sentences"] > 0 and "sentences" in res["finals"]["h2"]["ppo"][0]
    assert (demo.parent / "demo-h2-noisy" / "stages" / "sft" / "DONE").is_file()
    assert "seeded_from" in json.loads((demo.parent / "demo-h2-noisy" / "stages" / "sft" / "DONE").read_text())["result"]
    for w in ("h1", "h2", "h2-noisy", "h2-k2"):
        assert (out / w / "summary.md").is_file() and (out / w / "provenance.json").is_file()
    credit = json.loads((out / "credit.json").read_text())
    assert [v["label"] for v in credit["views"]] == ["ppo", "grpo"] and len(credit["views"][0]["items"]) == 4
    it = credit["views"][0]["items"][0]
    assert len(it["gae"]) == len(it["group"]) == len(it["tokens"]) and len(set(it["group"])) == 1  # flat
    md = (out / "summary.md").read_text()
    assert md.rstrip().split("\n")[-1].startswith("| ") and "| h2-k2 | grpo |" in md
    cfg = (out / "h2" / "configs" / "ppo-seed0.yaml").read_text()
    assert "sentences: 2" in cfg and "max_new_tokens: 36" in cfg

    t0 = time.perf_counter()
    assert main(_tiny(out, demo)) == 0
    assert set(json.loads((out / "results.json").read_text())["jobs"].values()) == {"cached"}
    assert time.perf_counter() - t0 < 60

    record = publish.collect_horizon(out)
    block = publish.horizon_text(record)
    assert "| h2-k2 | grpo |" in block and record["provenance"]["commit"] in block
    g = record["summaries"]["h1"]["ppo"]["gold_delta_sd"]
    assert f"{g:+.2f}" in block and "| knob |" not in block and "the horizon knob works" in block


@pytest.mark.slow
def test_quick_end_to_end(tmp_path):
    """`fourfold experiments --config examples/horizon.yaml --quick` from nothing: its one claim, the
    rest listed as needing the full sweep, the credit view at horizon 3 (measured: see
    docs/experiments.md, 'Budget and timing')."""
    from fourfold.cli import main

    out = tmp_path / "out"
    t0 = time.perf_counter()
    assert main(["experiments", "--config", str(ROOT / "examples" / "horizon.yaml"), "--quick", "--output-dir",
                 str(out), f"horizon.demo_dir={tmp_path}/demo", "run.progress=false"]) == 0
    took = time.perf_counter() - t0
    res = json.loads((out / "results.json").read_text())
    assert [c["group"] for c in res["claims"]] == ["knob"]
    assert sum(n.startswith("needs the full sweep") for n in res["notes"]) == 4
    assert set(res["finals"]) == {world_label(1), world_label(3)} and (out / "credit.json").is_file()
    print(f"horizon --quick took {took:.0f} s; knob: {res['claims'][0]['measured']}")
    assert not math.isnan(res["wall_s"])
