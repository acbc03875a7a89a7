"""benchmarks/estimate_vs_measured.py runs (tiny sizes) and prints one JSON line: the measured
peaks above the framework baseline beside the estimate's for the same workload."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_estimate_vs_measured_prints_one_json_line():
    p = subprocess.run([sys.executable, "benchmarks/estimate_vs_measured.py", "--hidden", "32", "--layers", "1",
                        "--heads", "2", "--vocab", "64", "--batch", "4", "--prompt-len", "4", "--response-len", "4",
                        "--minibatch", "2", "--iterations", "1", "--threads", "1", "--grad-ckpt"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, p.stdout[-2000:]
    out = json.loads(lines[0])
    assert out["measure"] == "rss_minus_baseline" and out["baseline_mib"] >= out["baseline_imports_mib"] > 0
    for key in ("generate_peak_mib", "train_peak_mib", "peak_mib"):
        assert key in out["measured"] and out["predicted"][key] > 0, key
    assert out["predicted"]["peak_mib"] == max(out["predicted"]["generate_peak_mib"], out["predicted"]["train_peak_mib"])
    assert out["workload"]["grad_ckpt"] is True and out["workload"]["precision"] == "fp32"


def test_estimate_vs_measured_env_mode_prints_one_json_line_with_the_env_settings():
    """--env: collect_turns over fixed-length observations; every trajectory reaches env.max_tokens
    (4 + 4 + 2 + 4 + 2 + 4 = 20: the default 3 turns and 2 observations) and the line adds ``env``."""
    p = subprocess.run([sys.executable, "benchmarks/estimate_vs_measured.py", "--env", "--hidden", "32", "--layers", "1",
                        "--heads", "2", "--vocab", "64", "--batch", "4", "--prompt-len", "4", "--response-len", "4",
                        "--obs-len", "2", "--minibatch", "2", "--iterations", "1", "--threads", "1"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, p.stdout[-2000:]
    out = json.loads(lines[0])
    single = {"benchmark", "measure", "baseline_imports_mib", "baseline_mib", "measured", "predicted", "ratio",
              "within_25pct", "s_total", "workload", "allocator_env", "torch", "python"}
    assert set(out) == single | {"env"}
    for key in ("generate_peak_mib", "train_peak_mib", "peak_mib"):
        assert key in out["measured"] and out["predicted"][key] > 0, key
    assert out["env"] == {"max_tokens": 20, "obs_len": 2, "turn_len": 4, "max_turns": 20, "engine": "eager",
                          "stop_at_eos": False, "trajectory_tokens": [20, 20]}


def test_env_estimate_is_the_trajectory_s_and_single_turn_at_p_plus_t():
    """The env mode's estimate is Workload.env_max_tokens'; env.max_tokens = P + T gives the
    single-turn figures (eager engine: no spare slot)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import estimate_vs_measured as bench
    from ppo_iteration import model_config

    single = bench.parse(["--hidden", "32", "--layers", "1", "--heads", "2", "--vocab", "64", "--batch", "4",
                          "--prompt-len", "4", "--response-len", "4", "--minibatch", "2"])
    assert single.env_max_tokens is None
    same = bench.parse(["--env", "--env-max-tokens", "8",
                        "--hidden", "32", "--layers", "1", "--heads", "2", "--vocab", "64", "--batch", "4",
                        "--prompt-len", "4", "--response-len", "4", "--minibatch", "2"])
    longer = bench.parse(["--env", "--hidden", "32", "--layers", "1", "--heads", "2", "--vocab", "64", "--batch", "4",
                          "--prompt-len", "4", "--response-len", "4", "--minibatch", "2"])
    assert longer.env_max_tokens == 4 + 3 * 4 + 2 * 8
    a, b, c = (bench.predict(x, model_config(x)) for x in (single, same, longer))
    assert a == b and c["generate_peak_mib"] > a["generate_peak_mib"] and c["train_peak_mib"] > a["train_peak_mib"]
