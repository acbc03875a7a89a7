"""Publishing the measurement sweep (`fourfold experiments --config examples/measure.yaml`,
docs/experiments.md "The update's measurements"): collect from a fake sweep directory whose
results.json is the one the sweep writes (its 'measure' claims computed by the sweep's own
collect_results, each with kind and null), its block and README row rendered, `publish check`."""
import json
import math
import shutil
from pathlib import Path

import pytest

from fourfold.apps import publish
from fourfold.apps.publish_measure import NOT_YET, measure_headline, measure_text, run_metrics

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/demo.md", "docs/experiments.md", "docs/arithmetic.md", "docs/correction.md")
CMD = "fourfold experiments --config examples/measure.yaml"


def _fake_sweep(out: Path) -> None:
    """ppo-stress and ppo-stress-no-clip over two seeds: the clipped arm's gold 0.3 against 0.1 (0.4
    sd of 0.5, 2 SE = 0.177 sd at n 256), KL 2 + s against 6 + 3s (3x), approx_kl 0.01 against
    0.05, entropy 1.0 against 0.4 over the last quarter of 8 iterations (2 of them)."""
    from fourfold.apps.experiments import build_arms
    from fourfold.apps.experiments.config import ExperimentsClaimsConfig, ExperimentsConfig
    from fourfold.apps.experiments.sweep import Sweep, collect_results
    from fourfold.apps.provenance import write_provenance
    from fourfold.config import config_to_dict

    cfg = ExperimentsConfig(arms=["ppo-stress", "ppo-stress-no-clip"], seeds=[0, 1], iterations=8,
                            claims=ExperimentsClaimsConfig(groups=["measure"]))
    arms = build_arms(cfg)
    sw = Sweep(cfg, out, lambda *a, **k: None, arms, out / "demo", cfg.demo, ["p"], 0)
    sft = {"proxy": 0.0, "proxy_std": 1.0, "gold": 0.0, "gold_std": 0.5, "kl": 0.0, "length": 15.0,
           "well_formed": 0.9, "repetition": 0.0, "n": 256}
    (out / "baseline").mkdir(parents=True)
    (out / "baseline" / "sft-biased-rm.json").write_text(json.dumps({"summary": sft, "rows": []}))
    state = {}
    for a in arms:
        free = a.name.endswith("no-clip")
        for seed in cfg.seeds:
            d = sw.run_dir(a, seed)
            d.mkdir(parents=True)
            kl = 3 * (2.0 + seed) if free else 2.0 + seed
            (d / "final_eval.json").write_text(json.dumps({"summary": {**sft, "gold": 0.1 if free else 0.3, "kl": kl},
                                                           "rows": []}))
            rows = [{"iteration": it, "time/iteration_s": 1.0, "policy/approx_kl": 0.05 if free else 0.01,
                     "policy/clipfrac": 0.0 if free else 0.2, "policy/grad_norm": float(it),
                     "policy/entropy": 0.4 if free and it > 6 else 1.0} for it in range(1, 9)]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            state[f"{a.name}/seed{seed}"] = "done"
    res = collect_results(sw, state)
    results = {"config": config_to_dict(cfg), "sft": res.sft, "sft_unbiased_rm": None, "finals": res.finals,
               "summaries": res.summaries, "claims": res.claims, "notes": res.notes, "jobs": state,
               "wall_s": 600.0, "jobs_s": 590.0, "demo": {"reward_result": {"accuracy_vs_gold": 0.62}}}
    (out / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True, default=str))
    write_provenance(out, command=CMD)


def _checkout_copy(tmp_path) -> Path:
    root = tmp_path / "repo"
    for f in DOCS:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / f, root / f)
    shutil.copytree(ROOT / "results", root / "results")
    return root


def test_run_metrics_read_the_curves_as_the_claims_do():
    nan = math.nan
    c = {"iteration": [1.0, 2.0, 3.0, 4.0], "policy/approx_kl": [0.01, nan, 0.03, 0.02],
         "policy/entropy": [2.0, 1.0, 1.0, 0.5], "policy/grad_norm": [1.0, 7.0, nan, 2.0]}
    m = run_metrics(c)
    assert m == {"approx_kl": 0.02, "clipfrac": None, "entropy_tail": 0.5, "grad_snr": None, "dual_clipfrac": None,
                 "grad_norm_max": 7.0}


def test_collect_render_check_from_a_sweep_directory(tmp_path, capsys):
    root = _checkout_copy(tmp_path)
    (root / "results" / "measure.json").unlink(missing_ok=True)  # the checkout may hold a published sweep
    assert publish.main(["render", "--root", str(root)]) == 0
    assert NOT_YET in (root / "docs" / "experiments.md").read_text()
    out = tmp_path / "m" / "out"
    _fake_sweep(out)
    kept = {f: (root / "results" / f).read_text() for f in ("demo.json", "experiments.json")}
    assert publish.main(["collect", "--root", str(root), "--measure", str(out)]) == 0
    assert f"wrote {root / 'results' / 'measure.json'}" in capsys.readouterr().out
    assert kept == {f: (root / "results" / f).read_text() for f in kept}
    rec = json.loads((root / "results" / "measure.json").read_text())
    assert set(publish.REQUIRED_KEYS["measure"]) <= set(rec)
    assert rec["provenance"]["command"] == CMD and rec["arms"] == ["ppo-stress", "ppo-stress-no-clip"]
    rows = {c["key"]: c for c in rec["claims"]}
    # gold 0.4 sd > 0.18; KL 3x; approx_kl 5x; entropy 0.4x: all hold; the nulls (KL 9/6 = 1.5 over seeds of the
    # unclipped arm: yes at >= 1.5; the others no) as the run computed them, kept whole
    assert list(rows) == ["clip-gold-stress", "clip-kl-stress", "clip-step-stress", "clip-entropy-stress"]
    assert {k: (c["holds"], c["null"], c["kind"]) for k, c in rows.items()} == {
        "clip-gold-stress": ("yes", "no", "finding"), "clip-kl-stress": ("yes", "yes", "finding"),
        "clip-step-stress": ("yes", "no", "finding"), "clip-entropy-stress": ("yes", "no", "finding")}
    assert rows["clip-gold-stress"]["null_what"] == "ppo-stress against itself, seed s against seed s+1"
    assert rec["metrics"]["ppo-stress-no-clip"]["1"] == {"approx_kl": pytest.approx(0.05), "clipfrac": 0.0, "entropy_tail": 0.4,
                                                         "grad_snr": None, "dual_clipfrac": None, "grad_norm_max": 8.0}
    assert publish.main(["check", "--root", str(root)]) == 1  # the docs still say "not run yet"
    assert publish.main(["render", "--root", str(root)]) == 0
    assert publish.main(["check", "--root", str(root)]) == 0
    doc = (root / "docs" / "experiments.md").read_text()
    body = doc[doc.index("<!-- publish:measure -->"):doc.index("<!-- /publish:measure -->")]
    assert NOT_YET not in body and f"`{CMD}`: 10.0 minutes" in body
    assert "| ppo-stress-no-clip | 2 | +0.20 ± 0.00 | 7.500 ± 2.121 | 0.0500 ± 0.0000 | 0.000 ± 0.000 | 0.400 ± 0.000 | - | - | 8.00 ± 0.00 |" in body
    assert "**Measurement claims: 3 of 4 findings hold; 0 of 0 checks pass; 1 flagged (null says yes)**" in body
    readme = (root / "README.md").read_text()
    assert measure_headline(rec)[0] in readme.splitlines()


def test_text_and_headline_without_a_record():
    assert measure_text(None, str) == NOT_YET and "\n" not in NOT_YET
    assert measure_headline(None) == []
