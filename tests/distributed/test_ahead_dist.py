"""A sampler running ahead (rollout.max_staleness) under ``torchrun --nproc-per-node 2`` (gloo on
the CPU, FSDP2 for the policy and the critic): each rank runs its own sampler thread on its rows of
each batch, with its own snapshots, no collective in that thread; the trainer's thread gathers the
rows (padded to the longest rank's responses) or an environment run's trajectories. The metrics and
weights are the 1-process run's of the same lag (to 1e-4, as tests/distributed/test_ppo_dist.py;
PPO with a critic, a LoRA policy, an environment run), the lag is exactly min(i - 1, k), a 2-process
checkpoint with batches in flight (the whole batches, gathered to rank 0) resumes exactly, in 2
processes and in one, and an environment failing in one rank's sampler stops every rank."""
import shutil

import pytest
from disttest_utils import ROUNDING_KEYS, max_relative_diff, max_weight_diff, metric_rows, torchrun
from test_env_dist import CRITIC, env_files  # noqa: F401 - env_files: a fixture used below
from test_env_dist import _overrides as env_overrides
from test_ppo_dist import _overrides

from fourfold.checkpoint.encoding import read_component
from fourfold.cli import main


def _same_run(one_dir, two_dir, k: int, models=("policy", "critic")) -> dict:
    """Two runs with lag ``k`` agree: the lag, the metrics (1e-4 relative; the engine-trainer gap,
    float rounding at iteration 1 as in a synchronous run, measures the staleness after it and is
    compared relatively there too), the weights (1e-4). Returns the figures."""
    one, two = metric_rows(one_dir), metric_rows(two_dir)
    lags = [float(min(i, k)) for i in range(len(one))]
    assert [r["rollout/version_lag"] for r in two] == lags == [r["rollout/version_lag"] for r in one]
    stale = [abs(a[key] - b[key]) / abs(a[key]) for a, b in zip(one[1:], two[1:]) for key in ROUNDING_KEYS]
    assert all(abs(r[key]) < 1e-5 for r in (one[0], two[0]) for key in ROUNDING_KEYS)
    assert min(a[key] for a in one[1:] for key in ROUNDING_KEYS) > 1e-3, one
    strip = lambda rows: [{key: v for key, v in r.items() if key not in ROUNDING_KEYS} for r in rows]
    figures = {"metric_rel": max_relative_diff(strip(one), strip(two)), "stale_rel": max(stale),
               **{f"{m}_abs": max_weight_diff(one_dir / m, two_dir / m) for m in models}}
    assert all(v < 1e-4 for v in figures.values()), figures
    return figures


@pytest.mark.parametrize("lora", [False, True])
def test_ppo_running_ahead_on_two_processes_matches_one(tiny_lm, tmp_path, lora):
    """PPO with a critic, and with a LoRA policy (its adapter merged into each rank's snapshots)."""
    extra = {"rollout.max_staleness": 1, **({"model.lora.r": 4, "model.lora.alpha": 8} if lora else {})}
    over = lambda out: _overrides(tiny_lm, "ppo", out, **extra)
    assert main(["ppo", *over(tmp_path / "p1")]) == 0
    proc = torchrun("ppo", over(tmp_path / "p2"))
    assert proc.stdout.count("fourfold ppo: done") == 1
    figures = _same_run(tmp_path / "p1", tmp_path / "p2", 1)  # a LoRA run's policy/: the merged export
    assert (tmp_path / "p2" / "policy-adapter").is_dir() == lora
    print(f"k=1{' lora' if lora else ''}: 2 procs = 1 proc: {figures}; 2-process wall {proc.wall_s:.1f} s")


def test_an_environment_run_ahead_on_two_processes_matches_one(tiny_lm, env_files, tmp_path):  # noqa: F811
    """Each rank's sampler thread runs its rows' episodes; the trajectories are gathered in rank order."""
    over = lambda out: env_overrides(tiny_lm, env_files, out, **CRITIC, **{"rollout.max_staleness": 1})
    assert main(["ppo", *over(tmp_path / "p1")]) == 0
    proc = torchrun("ppo", over(tmp_path / "p2"))
    figures = _same_run(tmp_path / "p1", tmp_path / "p2", 1)
    assert all(r["env/turns_mean"] > 1 for r in metric_rows(tmp_path / "p2"))
    print(f"env k=1: 2 procs = 1 proc: {figures}; 2-process wall {proc.wall_s:.1f} s")


def test_two_processes_running_ahead_resume_exactly(tiny_lm, tmp_path):
    """k = 2, checkpoints every iteration; cut back to iteration 1's checkpoint (batches 2 and 3 in
    flight, each rank's rows gathered into the whole batch of 8) and resumed: in 2 processes the
    uninterrupted run exactly (1e-4), and in one process too."""
    over = lambda out, **extra: _overrides(tiny_lm, "ppo", out, **{"rollout.max_staleness": 2, "run.save_every": 1,
                                                                  "run.keep_checkpoints": 10, **extra})
    torchrun("ppo", over(tmp_path / "full"))
    for name in ("two", "one"):
        shutil.copytree(tmp_path / "full", tmp_path / name)
        for later in ("step-00000002", "step-00000003"):
            shutil.rmtree(tmp_path / name / "checkpoints" / later)
        shutil.rmtree(tmp_path / name / "policy")
    state = read_component(tmp_path / "two" / "checkpoints" / "step-00000001", "state")
    assert [(b["iteration"], b["version"]) for b in state["ahead"]["batches"]] == [(2, 0), (3, 0)]
    assert [b["result"]["samples"]["sequences"].shape[0] for b in state["ahead"]["batches"]] == [8, 8]
    torchrun("ppo", over(tmp_path / "two", **{"run.resume": "true"}))
    assert main(["ppo", *over(tmp_path / "one", **{"run.resume": "true"})]) == 0
    for name in ("two", "one"):
        figures = _same_run(tmp_path / "full", tmp_path / name, 2)
        print(f"k=2 resumed in {name} process(es) = uninterrupted: {figures}")


def test_an_environment_failing_in_one_ranks_sampler_stops_every_rank_with_the_one_process_line(
        tiny_lm, env_files, tmp_path, capsys):  # noqa: F811
    """k = 1: iteration 2's step() raises on a row of rank 1's slice, in rank 1's sampler thread
    (during iteration 1's update). The error reaches rank 1's trainer thread when it waits for the
    batch, and every rank raises it there (no rank waits in a gather for the one that failed): both
    stop with the one-process run's line, printed once."""
    import re

    from test_env_dist import _boom_prompts

    prompts, _ = _boom_prompts(env_files, tmp_path, "step")
    extra = {"data.prompts": prompts, **CRITIC, "rollout.max_staleness": 1}
    capsys.readouterr()
    assert main(["ppo", *env_overrides(tiny_lm, env_files, tmp_path / "one", **extra)]) == 2
    (expected,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("fourfold ppo: error:")]
    assert "raised ValueError: the board has no square z9" in expected
    proc = torchrun("ppo", env_overrides(tiny_lm, env_files, tmp_path / "two", **extra), timeout=120, check=False)
    err = proc.stderr
    assert proc.returncode != 0 and [x for x in err.splitlines() if x.startswith("fourfold ppo: error:")] == [expected], \
        err[-3000:]
    exits = dict(re.findall(r"rank +: (\d+) \(local_rank.*\n +exitcode +: (-?\d+)", err))
    assert set(exits) == {"0", "1"} and set(exits.values()) <= {"2", "-15"} and "2" in exits.values(), err[-3000:]
