"""`fourfold demo --task arithmetic`: SFT -> GRPO with the rule reward -> report. The default tier
runs --quick end to end (seconds); the slow tier the full demo, whose held-out accuracy rises
(thresholds from the measured seeds, docs/arithmetic.md, with a margin)."""

import json
from pathlib import Path

import pytest

from fourfold.apps.demo.arithmetic_config import ArithmeticDemoConfig
from fourfold.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_quick_runs_every_stage_and_writes_the_report_and_result(tmp_path, capsys):
    out = tmp_path / "arith"
    assert main(["demo", "--task", "arithmetic", "--quick", "--output-dir", str(out), "--seed", "1"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert (result["task"], result["seed"], result["quick"], result["heldout"]) == ("arithmetic", 1, True, 64)
    for when in ("before", "after"):
        for mode in ("greedy", "sampled"):
            assert set(result[when][mode]) == {"accuracy", "well_formed", "dropped_carry", "answered"}
            assert 0.0 <= result[when][mode]["accuracy"] <= 1.0
    assert set(result["seconds"]) == {"sft", "grpo", "eval", "total"} and result["seconds"]["total"] > 0
    report = (out / "report.md").read_text()
    assert report.startswith("# fourfold demo --task arithmetic (seed 1, --quick)") and "| greedy |" in report
    assert (out / "provenance.json").is_file() and (out / "sft").is_dir() and (out / "policy").is_dir()
    said = capsys.readouterr().out
    assert "held-out accuracy (greedy)" in said
    # a rerun with the same settings reuses every stage
    assert main(["demo", "--task", "arithmetic", "--quick", "--output-dir", str(out), "--seed", "1"]) == 0
    assert capsys.readouterr().out.count("cached") == 3
    assert json.loads((out / "result.json").read_text())["after"] == result["after"]


def test_the_demos_defaults_are_the_measured_learnability_settings():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tool", ROOT / "tools" / "arithmetic_learnability.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    d, c = tool.parser().parse_args([]), ArithmeticDemoConfig()
    assert (c.digits, c.error_rate, c.examples, c.hidden_size, c.num_layers, c.sft_steps, c.sft_lr, c.sft_batch_size,
            c.iterations, c.samples_per_prompt, c.rollout_batch_size, c.minibatch_size, c.lr, c.kl_coef, c.heldout) == (
        d.digits, d.error_rate, d.examples, d.hidden, d.layers, d.sft_steps, d.sft_lr, d.sft_batch, d.iterations,
        d.group, d.rollout, d.minibatch, d.lr, d.kl, d.heldout)


def test_bad_settings_and_an_unknown_task_are_one_line(tmp_path, capsys):
    assert main(["demo", "--task", "arithmetic", "--output-dir", str(tmp_path / "a"), "rollout_batch_size=30"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rollout_batch_size: must be a multiple of samples_per_prompt (8), got 30" in err
    with pytest.raises(SystemExit) as e:
        main(["demo", "--task", "nope"])
    assert e.value.code == 2


@pytest.mark.slow  # about 3-4 minutes on 2 cores
def test_the_full_demo_raises_held_out_accuracy(tmp_path):
    assert main(["demo", "--task", "arithmetic", "--output-dir", str(tmp_path / "arith"), "--seed", "0"]) == 0
    r = json.loads((tmp_path / "arith" / "result.json").read_text())
    before, after = r["before"], r["after"]
    assert before["greedy"]["dropped_carry"] > 0.3  # SFT imitated the corpus's mistake
    assert after["greedy"]["accuracy"] > before["greedy"]["accuracy"] + 0.25
    assert after["sampled"]["accuracy"] > before["sampled"]["accuracy"] + 0.15
    assert r["seconds"]["total"] < 300
