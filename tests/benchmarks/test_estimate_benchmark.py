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
