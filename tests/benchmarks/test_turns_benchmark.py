"""benchmarks/turns.py runs and prints one JSON line with its documented keys, both engines (tiny sizes, the
static step not compiled: the compiled path is the benchmark's own run)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_turns_benchmark_prints_one_json_line():
    p = subprocess.run([sys.executable, "benchmarks/turns.py", "--hidden", "32", "--layers", "1", "--heads", "2",
                        "--vocab", "64", "--batch", "3", "--prompt-len", "4", "--turn-len", "3", "--obs-len", "2",
                        "--repeats", "1", "--warmup", "0", "--threads", "1", "--no-compile"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, p.stdout
    out = json.loads(lines[0])
    assert set(out["engines"]) == {"eager", "static"}
    for engine, row in out["engines"].items():
        for key in ("multi_turn_s", "single_turn_s", "multi_tokens_per_s", "single_tokens_per_s", "slowdown",
                    "first_multi_s", "first_single_s"):
            assert row[key] > 0, (engine, key)
        assert row["compile_multi_s"] >= 0 and row["compile_single_s"] >= 0 and row["compiled"] is False
    # the static cache of the turns: env.max_tokens + 1 = prompt + trajectory + 2 slots
    assert out["engines"]["static"]["cache_positions"]["multi"] == 4 + 18 + 2
    assert out["workload"]["trajectory_tokens"] == 4 * 3 + 3 * 2
