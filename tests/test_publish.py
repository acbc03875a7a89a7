"""`make results` / `python -m fourfold.apps.publish`: the published blocks of README.md and the docs are
exactly what the generator writes from the committed results/*.json, every number of the README's
headline table is one it writes, and collect reads run outputs (small fixture outputs here; the
sweeps' own end-to-end tests collect their real ones)."""
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from fourfold.apps import publish, publish_demo
from fourfold.apps.provenance import git_commit, machine, write_provenance

ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")


def test_published_blocks_are_what_results_give():
    """The check `make results` ends with: rendering results/*.json changes nothing."""
    files = publish.render(ROOT)
    for name, text in files.items():
        assert (ROOT / name).read_text(encoding="utf-8") == text, f"{name}: run `python -m fourfold.apps.publish render`"
    assert publish.main(["check", "--root", str(ROOT)]) == 0


def test_every_number_of_the_headline_table_is_generated():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Headline results", 1)[1].split("\n## ", 1)[0]
    block = publish.MARK.search(section)
    assert block and block.group("name") == "headline"
    outside = section.replace(block.group(0), "")
    assert not [ln for ln in outside.splitlines() if ln.startswith("|")], "a table row outside the generated block"
    generated = publish.headline_table(publish.load_results(ROOT))
    table = [ln for ln in block.group("body").splitlines() if ln.startswith("| ") and not ln.startswith("| what")]
    assert len(table) >= 5
    for line in table:
        for n in NUMBER.findall(line):
            assert n in generated, (n, line)


def _demo_run(d: Path, seed: int, gain: float, quick: bool = False) -> Path:
    (d / "stages" / "reward").mkdir(parents=True)
    (d / "config.yaml").write_text(f"quick: {str(quick).lower()}\neval:\n  prompts: {512 if quick else 256}\n"
                                   f"run:\n  output_dir: {d}\n  seed: {seed}\n")
    ev = {"sft": {"proxy": -0.1, "gold": 0.05, "kl": 0.0, "length": 15.25, "well_formed": 0.95, "repetition": 0.004},
          "ppo": {"proxy": 1.6, "gold": 0.4, "kl": 3.94, "length": 27.1, "well_formed": 0.85, "repetition": 0.016},
          "gold_gain_sd": gain}
    (d / "eval.json").write_text(json.dumps(ev))
    (d / "stages" / "reward" / "DONE").write_text(json.dumps({"key": "k", "result": {
        "accuracy_vs_labelers": 0.7381, "accuracy_vs_gold": 0.6191, "slips_accuracy_vs_gold": 0.472, "wall_s": 80}}))
    write_provenance(d, command=f"fourfold demo --seed {seed}")
    return d


def _sweep(d: Path, arms: dict, claims: list, horizon: bool = False) -> Path:
    d.mkdir(parents=True)
    def summary(g):
        return {"seeds": 3, "proxy_delta_sd": 1.5, "proxy_delta_sd_sd": 0.02, "gold_delta_sd": g, "gold_delta_sd_sd": 0.04,
                "kl": 4.04, "length": 27.2, "well_formed": 0.87, "repetition": 0.01, "models": "4 (2+2)",
                "peak_rss_mb": 455.4, "peak_rss_mb_sd": 5.2, "s_per_iteration": 1.654, "train_s": 99.3, "train_s_sd": 2.1}
    cfg = {"seeds": [0, 1, 2], "iterations": 60, "eval_prompts": 2048, "group_size": 4, "dpo_beta": 0.1,
           "beta_high_multiplier": 100.0, "demo": {"ppo": {"kl_coef": 0.05, "ppo_epochs": 4, "rollout_batch_size": 64},
                                                   "reward": {"steps": 600, "batch_size": 32}},
           "horizon": {"horizons": [1, 6], "arms": ["ppo", "grpo"]}}
    sft = {"gold_std": 0.698, "length": 15.4, "well_formed": 0.94, "repetition": 0.0, "sentences": 1.1}
    res = {"config": cfg, "wall_s": 1722.0, "claims": claims, "notes": [],
           "sft": {w: sft for w in arms} if horizon else sft,
           "summaries": {w: {a: summary(g) for a, g in v.items()} for w, v in arms.items()} if horizon
           else {a: summary(g) for a, g in arms.items()},
           "demo": {"reward_result": {"accuracy_vs_labelers": 0.738, "accuracy_vs_gold": 0.619}}}
    if horizon:
        res.update(finals={w: {a: [{"sentences": 1.0}] for a in v} for w, v in arms.items()},
                   worlds={w: {"horizon": 1, "what": w, "demo": "d"} for w in arms}, rm={})
    (d / "results.json").write_text(json.dumps(res))
    write_provenance(d, command="fourfold experiments")
    return d


def test_collect_and_render_from_fixture_outputs(tmp_path):
    """Run outputs in, results/*.json out, every block rendered from them into a copy of the docs,
    with the commit and machine the outputs record."""
    root = tmp_path / "repo"
    for f in ("README.md", "docs/demo.md", "docs/experiments.md", "docs/arithmetic.md", "docs/correction.md"):
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / f, root / f)
    (root / "results").mkdir()
    shutil.copyfile(ROOT / "results" / "benchmarks.json", root / "results" / "benchmarks.json")
    runs = root / "runs"
    for s, g in ((0, 0.511), (1, 0.9), (2, 0.72)):
        _demo_run(runs / f"demo-s{s}", s, g)
        _demo_run(runs / f"demo-quick-s{s}", s, g / 2, quick=True)
    claim = {"group": "critic-free", "claim": "grpo raises gold above the SFT model's", "measured": "m",
             "threshold": "t", "holds": "yes"}
    _sweep(runs / "experiments", {"ppo": 0.553, "grpo": 0.444, "rloo": 0.49, "dpo": 0.21, "reinforce-lr3x": 0.2},
           [claim, {**claim, "group": "critic", "claim": "the critic helps", "holds": "no"}])
    _sweep(runs / "horizon", {"h1": {"ppo": 0.3, "grpo": 0.25}, "h6": {"ppo": 0.6, "grpo": 0.3}},
           [{**claim, "group": "critic", "claim": "the critic's baseline helps more as the horizon grows (x)"}],
           horizon=True)
    (runs / "horizon" / "horizon.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    (root / "docs" / "img").mkdir()
    for s, (b, a) in enumerate(((0.547, 0.955), (0.559, 0.986), (0.5, 0.9))):
        _arithmetic_run(runs / f"demo-arithmetic-s{s}", s, b, a)
    assert publish.main(["collect", "--root", str(root)]) == 0
    assert publish.main(["check", "--root", str(root)]) == 1  # the docs still show the committed numbers
    assert publish.main(["render", "--root", str(root)]) == 0
    assert publish.main(["check", "--root", str(root)]) == 0
    readme = (root / "README.md").read_text()
    assert "+0.51 / +0.90 / +0.72 sd (seeds 0, 1, 2; 256 held-out prompts)" in readme
    assert "1 of 2 findings hold; 0 of 0 checks pass in 3/3 seeds (5 arms x 3 seeds, 2048 held-out prompts, 28.7 min on 2 cores)" in readme
    assert "(+0.44, +0.49, +0.21 sd against PPO's +0.55)" in readme and "raise gold in every seed" in readme
    assert "when the critic pays: horizons 1, 6 | 1 of 1 findings hold; 0 of 0 checks pass (the critic's baseline helps more" in readme
    assert "gold +0.26 / +0.45 / +0.36 SFT sd over SFT on seeds 0 / 1 / 2 (512 held-out prompts;" in readme
    commit = json.loads((runs / "demo-s0" / "provenance.json").read_text())["commit"]
    assert f"commit {commit}" in readme and machine() in readme
    demo_md = (root / "docs" / "demo.md").read_text()
    assert "| 0 | -0.10 -> 1.60 | 0.05 -> 0.40 | +0.51 sd | 3.9 | 15.2 -> 27.1 | 0.950 -> 0.850 | 0.004 -> 0.016 | " \
           "73.8% / 61.9% / 47% |" in demo_md
    exp = (root / "docs" / "experiments.md").read_text()
    rows = [ln for ln in exp.splitlines() if ln.startswith("| ppo (beta 0.05, 4 epochs) |")]
    assert rows == ["| ppo (beta 0.05, 4 epochs) | +1.50 ± 0.02 | +0.55 ± 0.04 | 4.0 | 27.2 | 0.87 | 0.01 | 4 (2+2) | "
                    "455 ± 5 | 1.65 | 99 ± 2 |"]
    assert exp.index("| reinforce, lr x3 |") < exp.index("| dpo (beta 0.1) |")  # the sweep's arm order
    assert "| h6 | grpo | +1.50 ± 0.02 | +0.30 ± 0.04 |" in exp and "*Not yet run.*" not in exp
    assert (root / "docs" / "img" / "horizon.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((root / "results" / "demo.json").read_text())["full"]["1"]["gold_gain_sd"] == 0.9
    assert "greedy held-out accuracy 0.55 -> 0.95 / 0.56 -> 0.99 / 0.50 -> 0.90 on seeds 0 / 1 / 2, each run at " \
           "most 3.0 minutes" in readme
    arith = (root / "docs" / "arithmetic.md").read_text()
    assert "| 1 | 0.559 -> 0.986 | 0.459 -> 0.886 | 0.400 -> 0.020 | 100 | 50 | 180 |" in arith
    assert "(512 held-out problems; measured " in arith and machine() in arith


def _arithmetic_run(d: Path, seed: int, before: float, after: float) -> None:
    """What `fourfold demo --task arithmetic` leaves for publish: result.json and provenance.json."""
    d.mkdir(parents=True)
    metrics = lambda acc: {"accuracy": acc, "well_formed": 0.99, "dropped_carry": 0.4 if acc < 0.6 else 0.02,  # noqa: E731
                           "answered": 1.0}
    result = {"task": "arithmetic", "seed": seed, "quick": False, "heldout": 512,
              "before": {"greedy": metrics(before), "sampled": metrics(before - 0.1)},
              "after": {"greedy": metrics(after), "sampled": metrics(after - 0.1)},
              "seconds": {"sft": 100.0, "grpo": 50.0, "eval": 30.0, "total": 180.0}, "settings": {}}
    (d / "result.json").write_text(json.dumps(result))
    write_provenance(d)


def test_collect_keeps_what_it_has_no_outputs_for(tmp_path):
    """Only the horizon family ran: its summary is written, the demo's and the claims sweep's kept."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "results", root / "results")
    (root / "docs" / "img").mkdir(parents=True)
    _sweep(root / "runs" / "horizon", {"h1": {"ppo": 0.3}}, [], horizon=True)
    done = publish.write_results(root, [root / "runs/demo-s0"], [], root / "runs/experiments", root / "runs/horizon")
    assert [d.split(" ")[0] for d in done] == ["kept", "kept", "kept", "wrote", "kept"]
    for name in ("demo.json", "experiments.json", "benchmarks.json"):
        assert (root / "results" / name).read_text() == (ROOT / "results" / name).read_text()
    assert json.loads((root / "results" / "horizon.json").read_text())["summaries"]["h1"]["ppo"]["gold_delta_sd"] == 0.3
    # the quick demo's runs alone: its part of demo.json is rewritten, the full demo's kept
    quick = [_demo_run(root / "runs" / f"demo-quick-s{s}", s, 0.5 + s / 10, quick=True) for s in (0, 1)]
    publish.write_results(root, [root / "runs/demo-s0"], quick, root / "runs/experiments", root / "runs/horizon")
    demo = json.loads((root / "results" / "demo.json").read_text())
    assert demo["full"] == json.loads((ROOT / "results" / "demo.json").read_text())["full"]
    assert sorted(demo["quick"]) == ["0", "1"] and demo["quick"]["1"]["gold_gain_sd"] == 0.6


def test_render_refuses_unknown_and_missing_blocks():
    res = publish.load_results(ROOT)
    with pytest.raises(ValueError, match="unknown publish block 'nope'"):
        publish.render_text("<!-- publish:nope -->x<!-- /publish:nope -->", {}, res, "f.md")
    with pytest.raises(ValueError, match="f.md: no publish block headline"):
        publish.render_text("text", {"headline": publish.headline_table}, res, "f.md")
    with pytest.raises(FileNotFoundError, match="no demo evaluation"):
        publish_demo.collect_demo_run(Path("/nonexistent"))


def test_provenance():
    from fourfold.apps.provenance import CHECKOUT

    c = git_commit()
    assert (CHECKOUT / "fourfold" / "apps" / "provenance.py").is_file()  # the root, however deep the module sits
    if (CHECKOUT / ".git").exists():  # a checkout (CI's fresh clone is one): the commit is read
        assert re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", c), c
    else:
        assert c == "unknown"
    assert "cores" in machine()


@pytest.mark.parametrize("argv0, shown", [("/venv/bin/fourfold", "fourfold"), ("/src/fourfold/cli.py", "fourfold"),
                                          ("/src/fourfold/__main__.py", "fourfold"),  # python -m fourfold
                                          ("/src/fourfold/apps/publish.py", "publish.py"),
                                          ("/src/other/__main__.py", "__main__.py")])
def test_the_command_names_the_cli_however_it_was_started(monkeypatch, argv0, shown):
    from fourfold.apps.provenance import provenance

    monkeypatch.setattr(sys, "argv", [argv0, "experiments", "--config", "x.yaml"])
    assert provenance()["command"] == f"{shown} experiments --config x.yaml"


def test_the_machine_names_torchs_cpu_kernels():
    """Where torch is imported the machine line names the kernels its CPU ops run with (figures
    differ between them: docs/demo.md); ATEN_CPU_CAPABILITY's choice is what it reports."""
    import os
    import subprocess
    import sys

    import torch

    from fourfold.apps.provenance import cpu_kernels

    assert cpu_kernels() == torch.backends.cpu.get_cpu_capability()
    assert f"cores, {cpu_kernels()} kernels)" in machine()
    code = "import torch; from fourfold.apps.provenance import machine; print(machine())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ATEN_CPU_CAPABILITY": "default"},
                         capture_output=True, text=True, check=True).stdout
    assert "DEFAULT kernels" in out, out


def _checkout_copy(tmp_path) -> Path:
    """README.md, the published docs and results/ of this checkout, in ``tmp_path/repo``."""
    root = tmp_path / "repo"
    for f in ("README.md", "docs/demo.md", "docs/experiments.md", "docs/arithmetic.md", "docs/correction.md"):
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / f, root / f)
    shutil.copytree(ROOT / "results", root / "results")
    return root


def _one_line(capsys, argv) -> str:
    capsys.readouterr()
    assert publish.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_bad_inputs_are_one_line_errors_naming_the_file(tmp_path, capsys):
    """Each bad input a user met: a cut results/*.json, a README block whose end marker was deleted,
    a --root that does not exist, and a results file without its claims key."""
    root = _checkout_copy(tmp_path)
    assert publish.main(["check", "--root", str(root)]) == 0
    exp = root / "results" / "experiments.json"
    good = exp.read_text()

    exp.write_text(good[: len(good) // 2])  # cut
    err = _one_line(capsys, ["check", "--root", str(root)])
    assert err.startswith(f"python -m fourfold.apps.publish check: error: {exp}: not valid JSON"), err

    record = json.loads(good)
    del record["claims"]
    exp.write_text(json.dumps(record))
    err = _one_line(capsys, ["render", "--root", str(root)])
    assert f"{exp}: no 'claims' key(s)" in err, err
    exp.write_text(good)

    readme = root / "README.md"
    text = readme.read_text()
    readme.write_text(text.replace("<!-- /publish:headline -->", ""))
    start = text[: text.index("<!-- publish:headline -->")].count("\n") + 1
    err = _one_line(capsys, ["render", "--root", str(root)])
    assert f"{readme}:{start}: <!-- publish:headline --> has no end marker <!-- /publish:headline -->" in err, err
    assert readme.read_text() == text.replace("<!-- /publish:headline -->", "")  # nothing rewritten

    err = _one_line(capsys, ["check", "--root", str(tmp_path / "missing")])
    assert f"--root {tmp_path / 'missing'}: no such directory" in err, err


def test_the_default_root_is_this_checkout():
    """`make publish` runs without --root: the default is the checkout, not the package folder."""
    assert publish.REPO == ROOT and publish.main(["check"]) == 0


def test_runs_are_filed_by_machine_and_another_machines_runs_leave_the_published_set(tmp_path):
    """collect files every demo run under the machine its provenance names (a rerun on the same
    machine replaces that seed's run); --machines-only adds another machine's runs to
    results/machines.json and leaves results/demo.json as it was; docs/demo.md's table and the
    README's spread line are written from them."""
    root = _checkout_copy(tmp_path)
    runs = tmp_path / "runs"
    demo_json = (root / "results" / "demo.json").read_text()
    for s, g in ((0, 0.4), (1, 1.2)):
        _demo_run(runs / f"demo-s{s}", s, g)
        _demo_run(runs / f"demo-quick-s{s}", s, g / 2, quick=True)
        for d in (runs / f"demo-s{s}", runs / f"demo-quick-s{s}"):  # another machine's runs
            prov = json.loads((d / "provenance.json").read_text())
            (d / "provenance.json").write_text(json.dumps({**prov, "machine": "Other CPU (2 cores, AVX2 kernels)"}))
    argv = ["collect", "--root", str(root), "--machines-only", "--demo", str(runs / "demo-s0"), str(runs / "demo-s1"),
            "--demo-quick", str(runs / "demo-quick-s0"), str(runs / "demo-quick-s1")]
    assert publish.main(argv) == 0
    assert (root / "results" / "demo.json").read_text() == demo_json
    machines = json.loads((root / "results" / "machines.json").read_text())["machines"]
    before = json.loads((ROOT / "results" / "machines.json").read_text())["machines"]
    assert set(machines) == set(before) | {"Other CPU (2 cores, AVX2 kernels)"}
    other = machines["Other CPU (2 cores, AVX2 kernels)"]
    assert sorted(other) == ["full", "quick"] and other["full"]["1"]["gold_gain_sd"] == 1.2
    assert all(machines[m] == before[m] for m in before)
    # the same machine and seed again: replaced, the others kept
    again = publish.file_by_machine(machines, {"full": {"1": {**other["full"]["1"], "gold_gain_sd": 0.7}}})
    assert again["Other CPU (2 cores, AVX2 kernels)"]["full"]["1"]["gold_gain_sd"] == 0.7
    assert again["Other CPU (2 cores, AVX2 kernels)"]["full"]["0"] == other["full"]["0"]
    assert publish.main(["render", "--root", str(root)]) == 0
    res = publish.load_results(root)
    gains = [r["gold_gain_sd"] for parts in machines.values() for r in parts.get("full", {}).values()]
    lo, hi = min(gains), max(gains)
    with_full = sum(1 for parts in machines.values() if parts.get("full"))  # machines with runs of the full demo
    table = publish.machines_table(res)
    assert "| Other CPU (2 cores, AVX2 kernels) | +0.40 / +1.20 (0, 1) | 61.9% / 61.9% | +0.20 / +0.60 (0, 1) |" in table
    assert f"Over {len(gains)} runs of the demo on {with_full} machines: gold gain {lo:+.2f} to {hi:+.2f} sd." in table
    readme = (root / "README.md").read_text()
    assert f"over {len(gains)} runs on {with_full} machines the demo's gold gain was {lo:+.2f} to {hi:+.2f} sd" in readme
    assert table in (root / "docs" / "demo.md").read_text()
