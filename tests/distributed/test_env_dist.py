"""Environment runs (issue 31) launched by ``torchrun --nproc-per-node 2`` (gloo on the CPU, the
policy and the critic FSDP2-sharded) are the 1-process run of the same config: each rank makes and
steps the environments of its own rows (with their per-row noise), the ranks' token and turn loops
stop together, the trajectories are gathered before the rewards, advantages and metrics. Rows end
after different numbers of turns (1, 2, or cut at 3), so the ranks step different numbers of turns:
a metric that were a mean of the ranks' means would differ. GRPO's groups of 4 straddle the ranks
(12 rows, rows 4-7 are one group): its advantages need the gathered batch. Metrics (every non-timing
key) agree to 1e-4 relative and the final weights to 1e-4 absolute, as the single-turn runs'
(tests/distributed/test_ppo_dist.py). The same with the static engine (generation.engine=static,
uncompiled: its preallocated turn cache), whose 1-process run is also the eager engine's. The
1-process runs run in the test's own process. An environment that raises on one rank's row stops
both ranks with the one-process run's line."""
import json
import random
import re

import pytest
from disttest_utils import max_relative_diff, max_weight_diff, metric_rows, torchrun

from fourfold.checkpoint import latest_checkpoint
from fourfold.cli import main

ENVS = '''
class Toy:
    """The row's prompt, then turns until the row's `limit` (4: cut by env.max_turns = 3). A turn
    scores the words it shares with the prompt minus 0.1 per word; the reply is a word naming how
    many words the turn had."""

    def __init__(self, row):
        self.prompt, self.limit, self.turn = row["prompt"], int(row["limit"]), 0
        self.boom = row.get("boom")  # "reset" or "step": that call raises (an environment failing on one rank)

    def reset(self):
        if self.boom == "reset":
            raise ValueError("the board has no square z9")
        return self.prompt

    def step(self, action):
        if self.boom == "step":
            raise ValueError("the board has no square z9")
        self.turn += 1
        said, known = action.split(), set(self.prompt.split())
        reward = sum(w in known for w in said) - 0.1 * len(said)
        return " w%d" % (len(said) % 10), float(reward), self.turn >= self.limit


def make_env(row):
    return Toy(row)
'''


@pytest.fixture(scope="module")
def env_files(tmp_path_factory):
    """envs.py and a prompts file of 32 rows whose `limit` is 1, 2 or 4 turns."""
    root = tmp_path_factory.mktemp("env_dist")
    (root / "envs.py").write_text(ENVS)
    rng = random.Random(0)
    with open(root / "prompts.jsonl", "w") as f:
        for _ in range(32):
            words = " ".join(f"w{rng.randrange(60)}" for _ in range(rng.randrange(2, 5)))
            f.write(json.dumps({"prompt": words, "limit": rng.choice([1, 2, 4])}) + "\n")
    return root


def _overrides(tiny_lm, files, out, **extra) -> list[str]:
    """3 PPO iterations of 8 trajectories (turns of up to 6 tokens, at most 40 tokens in all) on the
    tiny random Llama of the suite (hidden 64, 2 layers, 60 words)."""
    over = {"model.policy": tiny_lm / "sft", "data.prompts": files / "prompts.jsonl",
            "env.factory": f"{files / 'envs.py'}:make_env", "env.max_turns": 3, "env.max_tokens": 40,
            "generation.max_new_tokens": 6, "generation.temperature": 1.5, "run.output_dir": out,
            "run.progress": False, "run.tensorboard": False, "run.device": "cpu", "run.seed": 3,
            "run.save_every": 0, "run.threads": 1, "run.samples_every": 1, "ppo.iterations": 3,
            "ppo.rollout_batch_size": 8, "ppo.minibatch_size": 4, "ppo.ppo_epochs": 2, "ppo.lr": 3e-3,
            "ppo.kl_coef": 0.1}
    over.update(extra)
    return [f"{k}={v}" for k, v in over.items()]


def test_the_comparison_floors_rounding_and_catches_a_real_difference():
    """max_relative_diff by hand: iteration 1's KL is rounding on either side of 0 (the policy is the
    reference; seen on an Intel Xeon: -1.2e-7 vs -4.8e-7, 0.36 'relative'), a 1e-3 change of a
    metric of 2 is 5e-4, and a rounding key over 1e-5 fails."""
    a = [{"step": 1, "kl/k1": -1.19e-7, "policy/loss": 2.0, "mismatch/token_abs_diff_max": 4e-7}]
    b = [{"step": 1, "kl/k1": -4.77e-7, "policy/loss": 2.0, "mismatch/token_abs_diff_max": 5e-7}]
    assert max_relative_diff(a, b) == 0.0
    b[0]["policy/loss"] = 2.001
    assert max_relative_diff(a, b) == pytest.approx(5e-4)
    b[0]["kl/k1"] = 3e-6  # above the floor: relative to max(|a|, 1e-6)
    assert max_relative_diff(a, b) == pytest.approx(3.119e-6 / 1e-6)
    b[0]["mismatch/token_abs_diff_max"] = 2e-5
    with pytest.raises(AssertionError):
        max_relative_diff(a, b)


def _same_run(one, two, models) -> dict:
    rows_1, rows_2 = metric_rows(one), metric_rows(two)
    assert len(rows_1) == len(rows_2) == 3
    figures = {"metric_rel": max_relative_diff(rows_1, rows_2),
               **{f"{m}_abs": max_weight_diff(one / m, two / m) for m in models}}
    assert figures["metric_rel"] < 1e-4 and all(v < 1e-4 for v in figures.values()), figures
    assert any(r["env/truncated_frac"] > 0 for r in rows_2)  # cut trajectories (the bootstrap) are in it
    return figures


def _rank0_turns_differ(out, batch: int) -> bool:
    """Whether in some iteration rank 0's rows (the first half of the batch: the first samples rows
    shown, up to 4) took on average another number of turns than the whole batch: then the ranks
    stepped different numbers of turns."""
    shown = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    rows = {r["step"]: r["env/turns_mean"] for r in metric_rows(out)}
    differ = False
    for it, mean in rows.items():
        mine = [s for s in shown if s.get("step") == it][: min(4, batch // 2)]
        if mine and abs(sum(len(s["turns"]) for s in mine) / len(mine) - mean) > 1e-9:
            differ = True
    return differ


CRITIC = {"model.critic_init": "policy", "ppo.critic_lr": 1e-3}
"""PPO's GAE over the policy's tokens with the critic (from the policy), truncated rows bootstrapped."""


@pytest.fixture(scope="module")
def eager_one(tiny_lm, env_files, tmp_path_factory):
    """The 1-process PPO + critic run with the eager engine (the default): its output directory."""
    out = tmp_path_factory.mktemp("env_eager") / "p1"
    assert main(["ppo", *_overrides(tiny_lm, env_files, out, **CRITIC)]) == 0
    return out


def test_ppo_with_the_critic_against_an_environment_two_processes_match_one(tiny_lm, env_files, eager_one, tmp_path):
    """GAE over the policy's tokens with the critic (from the policy), truncated rows bootstrapped."""
    proc = torchrun("ppo", _overrides(tiny_lm, env_files, tmp_path / "p2", **CRITIC))
    assert proc.stdout.count("fourfold ppo: done") == 1
    figures = _same_run(eager_one, tmp_path / "p2", ("policy", "critic"))
    assert _rank0_turns_differ(tmp_path / "p2", 8)
    print(f"env ppo 2 procs = 1 proc: {figures}; 2-process wall {proc.wall_s:.1f} s")


def _sampled(out) -> list[dict]:
    """samples.jsonl's rows: the first 4 trajectories of each iteration (prompt, each turn's action
    and observation text and reward, return, done, truncated)."""
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def test_static_engine_against_an_environment_two_processes_match_one(tiny_lm, env_files, eager_one, tmp_path):
    """The same PPO + critic run with generation.engine=static (uncompiled): its cache of
    env.max_tokens + 1 slots kept across turns, each turn's chunk padded to the widest row of every
    rank, the token and turn loops stopping together. 2 processes = 1 process (as above), and the
    1-process run samples what the eager engine's does (the same per-row noise): the same env/*
    metrics every iteration and the same shown trajectories (with a word-level tokenizer the
    actions' text is their ids, EOS aside), and its metrics and weights are the eager run's within
    the tolerances above."""
    extra = {**CRITIC, "generation.engine": "static", "generation.compile": False}
    assert main(["ppo", *_overrides(tiny_lm, env_files, tmp_path / "s1", **extra)]) == 0
    proc = torchrun("ppo", _overrides(tiny_lm, env_files, tmp_path / "s2", **extra))
    assert proc.stdout.count("fourfold ppo: done") == 1
    figures = _same_run(tmp_path / "s1", tmp_path / "s2", ("policy", "critic"))
    assert _rank0_turns_differ(tmp_path / "s2", 8)
    static, eager = metric_rows(tmp_path / "s1"), metric_rows(eager_one)
    env_keys = [k for k in eager[0] if k.startswith("env/")]
    assert env_keys
    assert [{k: r[k] for k in env_keys} for r in static] == [{k: r[k] for k in env_keys} for r in eager]
    assert _sampled(tmp_path / "s1") == _sampled(eager_one)
    # and the whole run follows: the engine's log-probs (pi_old) are the eager engine's up to rounding
    against_eager = {"metric_rel": max_relative_diff(static, eager),
                     **{f"{m}_abs": max_weight_diff(tmp_path / "s1" / m, eager_one / m) for m in ("policy", "critic")}}
    assert all(v < 1e-4 for v in against_eager.values()), against_eager
    figures["static_vs_eager"] = against_eager
    print(f"env ppo, static engine, 2 procs = 1 proc: {figures}; 2-process wall {proc.wall_s:.1f} s")


@pytest.mark.slow  # one more pair of runs (~50-65 s on 2 shared cores), as test_ppo_dist.py's grpo test
def test_grpo_against_an_environment_two_processes_match_one(tiny_lm, env_files, tmp_path):
    """K = 4 trajectories a row, 12 rows: the second group is rows 4-7, half on each rank."""
    extra = {"ppo.advantage": "grpo", "ppo.samples_per_prompt": 4, "ppo.rollout_batch_size": 12,
             "ppo.minibatch_size": 6, "ppo.kl_in": "loss"}
    assert main(["ppo", *_overrides(tiny_lm, env_files, tmp_path / "g1", **extra)]) == 0
    proc = torchrun("ppo", _overrides(tiny_lm, env_files, tmp_path / "g2", **extra))
    figures = _same_run(tmp_path / "g1", tmp_path / "g2", ("policy",))
    assert not (tmp_path / "g2" / "critic").exists()
    print(f"env grpo 2 procs = 1 proc: {figures}; 2-process wall {proc.wall_s:.1f} s")


def _boom_prompts(files, out, call: str) -> tuple:
    """The prompts file with ``boom: call`` on one row of iteration 2's batch that rank 1 owns (the
    batch's rows 4-7 of 8, in the order of the run's EpochSampler, seeded by run.seed = 3): (the
    file, the row's line)."""
    from fourfold.data.collate import EpochSampler

    rows = [json.loads(line) for line in (files / "prompts.jsonl").read_text().splitlines()]
    batches = EpochSampler(len(rows), 8, seed=3, drop_last=True).batches()
    next(batches)
    boom = next(batches)[5]  # iteration 2, rank 1's second row
    rows[boom]["boom"] = call
    path = out / "boom.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, boom + 1


@pytest.mark.parametrize("call", ["step", pytest.param("reset", marks=pytest.mark.slow)])
def test_an_environment_failing_on_one_rank_stops_every_rank_with_the_one_process_line(
        tiny_lm, env_files, tmp_path, capsys, call):
    """Iteration 2's step() (reset()) raises on a row of rank 1's slice only. Rank 1 keeps the error
    until the next all-reduce every rank makes (the turn's end; for reset, the first observations'
    width), which carries its flag: both ranks stop there, rank 0 on its own (exit 2: neither
    killed by torchrun nor stuck until gloo's timeout, which the launch's 120 s timeout would turn
    into a failure), and rank 0 prints rank 1's line, the one the one-process run prints, once,
    with the user's traceback under it once (before, rank 0 said only that a peer was gone). Iteration 1's checkpoint and metrics row are kept, those of the
    one-process run."""
    prompts, line = _boom_prompts(env_files, tmp_path, call)
    extra = {"data.prompts": prompts, "run.save_every": 1, "model.critic_init": "policy", "ppo.critic_lr": 1e-3}
    capsys.readouterr()
    assert main(["ppo", *_overrides(tiny_lm, env_files, tmp_path / "one", **extra)]) == 2
    err_1 = capsys.readouterr().err
    (expected,) = [x for x in err_1.splitlines() if x.startswith("fourfold ppo: error:")]
    turn = " of turn 0" if call == "step" else ""
    assert expected == (f"fourfold ppo: error: env.factory: make_env: {call}(){turn} of the "
                        f"environment of row {prompts}:{line} raised ValueError: the board has no square z9 (the "
                        "traceback of the user's code follows)")
    assert err_1.splitlines()[-1] == "ValueError: the board has no square z9"  # the user's traceback under it

    proc = torchrun("ppo", _overrides(tiny_lm, env_files, tmp_path / "two", **extra), timeout=120, check=False)
    err = proc.stderr
    assert proc.returncode != 0 and [x for x in err.splitlines() if x.startswith("fourfold ppo: error:")] == [expected], \
        err[-3000:]
    assert err.count("\nValueError: the board has no square z9\n") == 1  # the user's traceback, once (rank 0's copy)
    exits = dict(re.findall(r"rank +: (\d+) \(local_rank.*\n +exitcode +: (-?\d+)", err))  # torchrun's summary
    # every rank stopped with the error (2) after rank 0 printed it (the ranks wait for each other at
    # shutdown); torchrun SIGTERMs (-15) a rank still exiting when the first is gone
    assert set(exits) == {"0", "1"} and set(exits.values()) <= {"2", "-15"} and "2" in exits.values(), err[-3000:]
    for out in ("one", "two"):  # iteration 1 kept: its checkpoint, its metrics row (the same in both runs)
        assert latest_checkpoint(tmp_path / out).name == "step-00000001"
    assert len(metric_rows(tmp_path / "two")) == 1
    assert max_relative_diff(metric_rows(tmp_path / "one"), metric_rows(tmp_path / "two")) < 1e-4
    print(f"env {call} failing on rank 1: 2-process wall {proc.wall_s:.1f} s")
