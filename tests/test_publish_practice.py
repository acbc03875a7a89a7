"""Publishing the practice sweep (`fourfold experiments --config examples/practice.yaml`, docs/correction.md
"Results"): its docs/correction.md block from a hand-made results/practice.json record, collect from a
fake sweep directory whose results.json is the one the sweep writes (its claims and notes computed by
the sweep's own collect_results), the file kept when the sweep did not run, and `publish check`."""
import json
import math
import shutil
from pathlib import Path

from fourfold.apps import publish
from fourfold.apps.publish_practice import NOT_YET, practice_headline, practice_text, run_metrics

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/demo.md", "docs/experiments.md", "docs/arithmetic.md", "docs/correction.md")
PROV = {"commit": "abc123def456", "machine": "Test CPU (2 cores)", "date": "2026-12-02",
        "command": "fourfold experiments --config examples/practice.yaml"}


def _summary(gold, gold_sd, kl, kl_sd):
    return {"seeds": 3, "gold_delta_sd": gold, "gold_delta_sd_sd": gold_sd, "kl": kl, "kl_sd": kl_sd}


def _record():
    return {"provenance": PROV, "wall_s": 5460.0, "seeds": [0, 1, 2], "iterations": 60, "eval_prompts": 2048,
            "rollout_batch_size": 64, "sft": {"gold_std": 0.698}, "critic_warmup": 6,
            "arms": ["ppo", "ppo-critic-warmup", "ppo-bf16-copy-tis"],
            "summaries": {"ppo": _summary(0.553, 0.041, 4.04, 0.52), "ppo-critic-warmup": _summary(0.5, 0.1, 3.9, 0.3),
                          "ppo-bf16-copy-tis": _summary(-0.125, 0.02, 6.25, 0.15)},
            "metrics": {"ppo-critic-warmup": {s: {"ev_1": -0.5, "ev_first": x, "token_diff_min": None,
                                                  "first_ratio_max": None, "truncated_mean": None}
                                              for s, x in (("0", 0.5), ("1", 0.4), ("2", 0.3))},
                        "ppo-bf16-copy-tis": {s: {"ev_1": 0.2, "ev_first": 0.2, "token_diff_min": x,
                                                  "first_ratio_max": 0.0, "truncated_mean": 0.0008}
                                              for s, x in (("0", 1e-3), ("1", 2e-3), ("2", 3e-3))}},
            "claims": [{"group": "practice", "claim": "token TIS costs no gold (ppo-bf16-copy-tis vs ppo-bf16-copy)",
                        "measured": "gold minus ppo-bf16-copy's -0.02, +0.00, +0.00 sd", "threshold": "t1", "holds": "yes"},
                       {"group": "practice", "claim": "warm-up fixes the bad start (ppo-critic-warmup)",
                        "measured": "m2", "threshold": "t2", "holds": "no"}],
            "notes": ["claims 'practice' not checked: arm ppo-critic-policy-init did not run or has no results"]}


def _block(rec):
    return publish.BLOCKS["docs/correction.md"]["practice"]({"practice": rec})


def test_block_from_a_hand_made_record():
    text = _block(_record())
    lines = text.splitlines()
    assert lines[0].startswith("`fourfold experiments --config examples/practice.yaml`: 91.0 minutes, measured "
                               "2026-12-02 on Test CPU (2 cores), commit abc123def456; seeds 0, 1, 2; 60 iterations x 64 "
                               "responses per run, 2048 held-out prompts. Gold change in units of the SFT samples' gold "
                               "sd (0.698)")
    assert "(the first policy iteration: 7 for ppo-critic-warmup, 1 for the others;" in lines[0]
    rows = {ln.split(" | ")[0][2:]: ln for ln in lines if ln.startswith("| ppo")}
    assert list(rows) == ["ppo", "ppo-critic-warmup", "ppo-bf16-copy-tis"]  # the record's arm order
    assert rows["ppo"] == "| ppo | 3 | +0.55 ± 0.04 | 4.0 ± 0.5 | - | - | - | - | - |"  # logs none of them
    assert rows["ppo-critic-warmup"] == "| ppo-critic-warmup | 3 | +0.50 ± 0.10 | 3.9 ± 0.3 | -0.50 ± 0.00 | +0.40 ± 0.10 | - | - | - |"
    assert rows["ppo-bf16-copy-tis"] == ("| ppo-bf16-copy-tis | 3 | -0.12 ± 0.02 | 6.2 ± 0.1 | +0.20 ± 0.00 | "
                                         "+0.20 ± 0.00 | 2.00e-03 ± 1.00e-03 | 0.00e+00 ± 0.00e+00 | 0.0008 ± 0.0000 |")
    assert "**Practice claims: 1 of 2 findings hold; 0 of 0 checks pass**" in text
    assert ("| token TIS costs no gold (ppo-bf16-copy-tis vs ppo-bf16-copy) |  | gold minus ppo-bf16-copy's -0.02, "
            "+0.00, +0.00 sd | t1 | yes |  |") in lines  # a hand-made record: no kind, no null
    assert "| warm-up fixes the bad start (ppo-critic-warmup) |  | m2 | t2 | no |  |" in lines
    assert lines[-1] == "- claims 'practice' not checked: arm ppo-critic-policy-init did not run or has no results"
    # one seed: no sd; no notes: no list
    one = {**_record(), "notes": [], "summaries": {**_record()["summaries"], "ppo": _summary(0.553, math.nan, 4.04, None)}}
    one["metrics"]["ppo-critic-warmup"] = {"0": one["metrics"]["ppo-critic-warmup"]["0"]}
    text = _block(one)
    assert "| ppo | 3 | +0.55 | 4.0 | - |" in text and "| +0.50 | - | - | - |" in text
    assert not text.splitlines()[-1].startswith("- ")
    assert _block(None) == NOT_YET == practice_text(None, str) and "\n" not in NOT_YET


def test_headline_row_from_a_hand_made_record():
    assert practice_headline(None) == []
    assert practice_headline(_record()) == [
        "| PPO as practised now: critic warm-up, dual-clip, the bf16 copy with and without correction | 1 of 2 findings "
        "hold; 0 of 0 checks pass (3 seeds; token TIS costs no gold: yes; warm-up fixes the bad start: no) | `fourfold experiments "
        "--config examples/practice.yaml` | [docs/correction.md](docs/correction.md#results) |"]
    table = publish.headline_table(publish.load_results(ROOT))  # the README's table has the row once published
    assert (practice_headline(json.loads((ROOT / "results" / "practice.json").read_text()))[0] in table.splitlines()
            if (ROOT / "results" / "practice.json").exists() else "practice.yaml" not in table)


def test_run_metrics_read_the_curves_as_the_claims_do():
    nan = math.nan
    c = {"iteration": [1.0, 2.0, 3.0], "value/explained_variance": [-0.5, nan, 0.4],
         "mismatch/token_abs_diff_mean": [3e-3, nan, 1e-3], "policy/first_ratio_abs_dev": [0.0, 2e-9, 0.0],
         "mismatch/is_truncated_share": [0.01, 0.02, nan]}
    m = run_metrics(c, 3)
    assert m == {"ev_1": -0.5, "ev_first": 0.4, "token_diff_min": 1e-3, "first_ratio_max": 2e-9,
                 "truncated_mean": 0.015}
    assert run_metrics(c, 2)["ev_first"] is None and run_metrics(c, 9)["ev_first"] is None  # not logged / no iteration
    assert run_metrics({"iteration": []}, 1) == dict.fromkeys(m)


def _fake_sweep(out: Path) -> None:
    """A practice sweep's output directory: three of its arms over two seeds, each run's final
    evaluation and metrics.jsonl, results.json with the keys write_outputs gives it (claims, notes,
    summaries and finals from the sweep's collect_results) and provenance.json."""
    from fourfold.apps.experiments import build_arms
    from fourfold.apps.experiments.config import ExperimentsClaimsConfig, ExperimentsConfig
    from fourfold.apps.experiments.sweep import Sweep, collect_results
    from fourfold.apps.provenance import write_provenance
    from fourfold.config import config_to_dict

    cfg = ExperimentsConfig(arms=["ppo", "ppo-critic-warmup", "ppo-bf16-copy"], seeds=[0, 1], iterations=20,
                            claims=ExperimentsClaimsConfig(groups=["practice"]))
    arms = build_arms(cfg)
    sw = Sweep(cfg, out, lambda *a, **k: None, arms, out / "demo", cfg.demo, ["p"], 0)
    sft = {"proxy": 0.0, "proxy_std": 1.0, "gold": 0.0, "gold_std": 0.5, "kl": 0.0, "length": 15.0,
           "well_formed": 0.9, "repetition": 0.0, "n": 256}
    (out / "baseline").mkdir(parents=True)
    (out / "baseline" / "sft-biased-rm.json").write_text(json.dumps({"summary": sft, "rows": []}))
    state = {}
    for a in arms:
        for seed in cfg.seeds:
            d = sw.run_dir(a, seed)
            d.mkdir(parents=True)
            gold = {"ppo": 0.3, "ppo-critic-warmup": 0.25 + 0.1 * seed, "ppo-bf16-copy": 0.2}[a.name]
            (d / "final_eval.json").write_text(json.dumps({"summary": {**sft, "gold": gold, "kl": 4.0 + seed}, "rows": []}))
            rows = []
            for it in range(1, 21):
                r = {"iteration": it, "time/iteration_s": 1.0}
                if a.name == "ppo-critic-warmup":  # -0.5 at iteration 1, 0.35 / 0.45 at the first policy iteration (3)
                    r["value/explained_variance"] = {1: -0.5, 3: 0.35 + 0.1 * seed}.get(it, 0.6)
                if a.name == "ppo-bf16-copy":
                    r["mismatch/token_abs_diff_mean"] = 1e-4 if (it, seed) == (1, 0) else 2e-3  # 1e-4: not > 1e-4
                rows.append(r)
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            state[f"{a.name}/seed{seed}"] = "done"
    res = collect_results(sw, state)
    results = {"config": config_to_dict(cfg), "sft": res.sft, "sft_unbiased_rm": None, "finals": res.finals,
               "summaries": res.summaries, "claims": res.claims, "notes": res.notes, "jobs": state,
               "wall_s": 1234.5, "jobs_s": 1200.0, "demo": {"reward_result": {"accuracy_vs_gold": 0.62}}}
    (out / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True, default=str))
    write_provenance(out, command="fourfold experiments --config examples/practice.yaml")


def _checkout_copy(tmp_path) -> Path:
    root = tmp_path / "repo"
    for f in DOCS:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / f, root / f)
    shutil.copytree(ROOT / "results", root / "results")
    return root


def test_collect_from_a_sweep_directory_then_render(tmp_path, capsys):
    root = _checkout_copy(tmp_path)
    (root / "results" / "practice.json").unlink(missing_ok=True)  # the checkout may hold a published sweep
    assert publish.main(["render", "--root", str(root)]) == 0
    assert NOT_YET in (root / "docs" / "correction.md").read_text()
    assert publish.main(["check", "--root", str(root)]) == 0  # not run yet: the block says so
    out = tmp_path / "prac" / "out"
    _fake_sweep(out)
    kept = {f: (root / "results" / f).read_text() for f in ("demo.json", "experiments.json", "horizon.json")}
    assert publish.main(["collect", "--root", str(root), "--practice", str(out)]) == 0
    assert f"wrote {root / 'results' / 'practice.json'}" in capsys.readouterr().out
    assert kept == {f: (root / "results" / f).read_text() for f in kept}  # the other families: no outputs, kept
    rec = json.loads((root / "results" / "practice.json").read_text())
    assert set(publish.REQUIRED_KEYS["practice"]) <= set(rec)
    prov = json.loads((out / "provenance.json").read_text())
    assert rec["provenance"] == prov and prov["command"] == "fourfold experiments --config examples/practice.yaml"
    assert rec["arms"] == ["ppo", "ppo-critic-warmup", "ppo-bf16-copy"] and rec["critic_warmup"] == 2
    assert rec["seeds"] == [0, 1] and rec["wall_s"] == 1234.5
    assert rec["metrics"]["ppo-critic-warmup"]["1"]["ev_1"] == -0.5
    assert math.isclose(rec["metrics"]["ppo-critic-warmup"]["1"]["ev_first"], 0.45)
    assert rec["metrics"]["ppo-bf16-copy"]["0"]["token_diff_min"] == 1e-4
    assert rec["metrics"]["ppo"]["0"] == dict.fromkeys(rec["metrics"]["ppo"]["0"])  # ppo logs none of them
    assert [c["claim"].split("(")[-1] for c in rec["claims"]] == ["ppo-critic-warmup)", "ppo-bf16-copy)"]
    assert rec["notes"] == [f"claims 'practice' not checked: arm {a} did not run or has no results"
                            for a in ("ppo-critic-policy-init", "ppo-beta0-dual-clip, ppo-beta0", "ppo-bf16-copy-recompute",
                                      "ppo-bf16-copy-tis")]

    assert publish.main(["check", "--root", str(root)]) == 1  # the docs still say "not run yet"
    assert publish.main(["render", "--root", str(root)]) == 0
    assert publish.main(["check", "--root", str(root)]) == 0
    doc = (root / "docs" / "correction.md").read_text()
    block = publish.MARK.search(doc[doc.index("### Results"):])
    assert block and block.group("name") == "practice" and NOT_YET not in doc
    body = block.group("body")
    assert (f"`fourfold experiments --config examples/practice.yaml`: 20.6 minutes, measured {prov['date']} on "
            f"{prov['machine']}, commit {prov['commit']}; seeds 0, 1; 20 iterations x 64 responses per run") in body
    # gold in sd of 0.5: warm-up arm 0.5 and 0.7 sd (mean 0.60, sd 0.14); EV -0.5 at 1, 0.35 / 0.45 at 3
    assert "| ppo-critic-warmup | 2 | +0.60 ± 0.14 | 4.5 ± 0.7 | -0.50 ± 0.00 | +0.40 ± 0.07 | - | - | - |" in body
    assert "| ppo-bf16-copy | 2 | +0.40 ± 0.00 | 4.5 ± 0.7 | - | - | 1.05e-03 ± 1.34e-03 | - | - |" in body
    assert "| ppo | 2 | +0.60 ± 0.00 | 4.5 ± 0.7 | - | - | - | - | - |" in body
    assert "| ppo-bf16-copy-tis |" not in body  # did not run: absent from the table
    # warm-up: EV 0.35, 0.45 >= 0.3 and gold -0.1, +0.1 sd from ppo's: holds; the bf16 copy's 1e-4 in seed 0: not
    assert "**Practice claims: 1 of 1 findings hold; 0 of 1 checks pass**" in body
    assert "(ppo-critic-warmup) | finding | value/explained_variance at iteration 3 (the first policy iteration) +0.35, +0.45;" in body
    assert "| > 0.0001 every iteration, in every seed | no |" in body
    assert "- claims 'practice' not checked: arm ppo-bf16-copy-tis did not run or has no results" in body


def test_collect_keeps_practice_json_when_the_sweep_did_not_run(tmp_path):
    root = _checkout_copy(tmp_path)
    text = json.dumps({**_record(), "provenance": PROV}, indent=1, sort_keys=True) + "\n"
    (root / "results" / "practice.json").write_text(text)
    done = publish.write_results(root, [], [], root / "runs/experiments", root / "runs/horizon",
                                 practice=tmp_path / "nowhere")
    assert not any("practice.json" in d for d in done)  # an absent optional family: nothing said, the file kept
    assert (root / "results" / "practice.json").read_text() == text
    assert publish.main(["render", "--root", str(root)]) == 0
    assert "| ppo-bf16-copy-tis | 3 | -0.12 ± 0.02 |" in (root / "docs" / "correction.md").read_text()
