"""benchmarks/turns.py runs and prints one JSON line with its documented keys (tiny sizes)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_turns_benchmark_prints_one_json_line():
    p = subprocess.run([sys.executable, "benchmarks/turns.py", "--hidden", "32", "--layers", "1", "--heads", "2",
                        "--vocab", "64", "--batch", "3", "--prompt-len", "4", "--turn-len", "3", "--obs-len", "2",
                        "--repeats", "1", "--warmup", "0", "--threads", "1"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, p.stdout
    out = json.loads(lines[0])
    for key in ("multi_turn_s", "single_turn_s", "multi_tokens_per_s", "single_tokens_per_s", "slowdown"):
        assert out[key] > 0, key
    assert out["workload"]["trajectory_tokens"] == 4 * 3 + 3 * 2
