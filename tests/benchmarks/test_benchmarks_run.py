"""The benchmarks run and print exactly one JSON line with their documented keys (tiny sizes here;
the figures themselves come from running them alone, see the README)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _one_json_line(args):
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, p.stdout[-2000:]
    return json.loads(lines[0])


def test_ppo_iteration_benchmark_prints_one_json_line():
    out = _one_json_line(["benchmarks/ppo_iteration.py", "--hidden", "32", "--layers", "1", "--heads", "2",
                          "--vocab", "64", "--batch", "4", "--prompt-len", "4", "--response-len", "4",
                          "--minibatch", "2", "--iterations", "3", "--warmup", "1", "--threads", "1", "--concurrent"])
    for key in ("s_per_iter", "gen_tokens_per_s", "train_tokens_per_s", "s_generate", "s_score", "s_train", "peak_mem_mib"):
        assert out[key] > 0, key
    assert out["workload"]["hidden"] == 32 and out["workload"]["optimizer_steps_per_iter"] == 8
    assert out["rss_file_mib"] is None or 0 < out["rss_file_mib"] < out["peak_mem_mib"]  # None off Linux


def test_async_benchmark_prints_one_json_line():
    """benchmarks/async.py --tiny: fourfold ppo synchronous with 2 threads against the sampler
    running ahead by 1 and 2 (one thread each), each in its own process; the lags are exact."""
    out = _one_json_line(["benchmarks/async.py", "--tiny"])
    assert out["workload"] == "tiny" and [r["config"] for r in out["runs"]] == ["k0", "k1", "k2"]
    assert [r["version_lag"] for r in out["runs"]] == [[0.0] * 3, [0.0, 1.0, 1.0], [0.0, 1.0, 2.0]]
    assert [r["threads"] for r in out["runs"]] == [2, 1, 1] and out["runs"][0]["s_sampler_wait"] is None
    for run in out["runs"]:
        for key in ("s_first_iteration", "s_per_iteration", "gen_tokens_per_s", "s_generate", "s_train", "peak_mem_mib"):
            assert run[key] > 0, (run["config"], key)
    assert out["speedup_k1"] > 0 and out["speedup_k2"] > 0


def test_gym_benchmark_prints_one_json_line(tmp_path):
    out = _one_json_line(["benchmarks/gym_cartpole.py", "--configs", "examples/cartpole.yaml", "--seeds", "1",
                          "--milestones", "1000", "--set", "ppo.total_timesteps=2048", "eval.every_steps=1024",
                          "--out", str(tmp_path), "--plot", ""])
    assert out


def test_ppo_floor_benchmark_prints_one_json_line():
    out = _one_json_line(["benchmarks/ppo_floor.py", "--hidden", "32", "--layers", "1", "--heads", "2",
                          "--vocab", "64", "--batch", "4", "--prompt-len", "4", "--response-len", "4",
                          "--minibatch", "2", "--iterations", "2", "--threads", "1"])
    for key in ("s_floor", "s_score", "s_train", "gemm_gflops", "rss_torch_mib", "rss_models_mib", "peak_rss_mib"):
        assert out[key] > 0, key
    assert out["rss_python_mib"] < out["rss_torch_mib"] <= out["rss_transformers_mib"] <= out["rss_models_mib"]
    assert out["workload"]["optimizer_steps_per_iter"] == 16


def test_train_step_benchmark_prints_one_json_line():
    out = _one_json_line(["benchmarks/train_step.py", "--mode", "tokens", "--iterations", "2", "--batch", "16",
                          "--response-len", "12", "--tokens", "64"])
    assert out["mode"] == "tokens" and out["micro_batch_tokens"] == 64 and out["updates"] == 2
    for key in ("first_update_s", "steady_update_s", "steady_ms_per_step", "rollout_tokens", "peak_rss_mib"):
        assert out[key] > 0, key


def test_reward_server_benchmark_prints_one_json_line():
    out = _one_json_line(["benchmarks/reward_server.py", "--rows", "4", "--words", "3", "--hidden", "16", "--layers", "1",
                          "--repeats", "1", "--max-wait-ms", "0"])
    for part in ("model", "function"):
        assert out[part]["local_scores_per_s"] > 0 and out[part]["served_scores_per_s"] > 0, part
    assert out["rows"] == 4 and out["machine"]


def test_bf16_matmul_benchmark_prints_one_json_line():
    """The line docs/benchmarks.md tabulates per CPU kind (issue 40, item 17): the CPU, torch's
    capability, whether it has native bf16, both times and their ratio."""
    out = _one_json_line(["benchmarks/bf16_matmul.py", "--repeats", "1", "--threads", "1"])
    assert out["benchmark"] == "bf16_matmul" and out["shape"] == "256x512 @ 512x2048" and out["threads"] == 1
    assert {"cpu", "torch", "capability", "native_bf16", "fp32_ms", "bf16_ms"} <= set(out)
    assert out["fp32_ms"] > 0 and out["bf16_ms"] > 0
    # the line rounds the ratio to 0.01 and each time to 0.001 ms: the ratio of the rounded times is off by
    # up to ratio x (0.0005 / fp32_ms + 0.0005 / bf16_ms) beside the ratio's own 0.005
    ratio = out["bf16_ms"] / out["fp32_ms"]
    assert abs(out["bf16_over_fp32"] - ratio) <= 0.005 + ratio * (0.0005 / out["fp32_ms"] + 0.0005 / out["bf16_ms"]) + 1e-9
