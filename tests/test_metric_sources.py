"""The metrics table says which trainer logs each metric (fourfold.names.LOGGED_BY): brief ppo and
reinforce runs on tiny models log every metric documented as always logged by them (and those whose
condition the run meets), and nothing that the table does not give to them."""
import pytest

from fourfold.config import PPOConfig, ReinforceConfig, load_config
from fourfold.config.stages import STAGES
from fourfold.reporting import LOGGED_BY, METRICS, documented, logged_by, read_metrics


def test_every_metric_names_the_trainers_that_log_it():
    assert set(LOGGED_BY) == set(METRICS)
    trainers = {"ppo", "reinforce", "gym", "sft", "reward", "dpo"}
    assert trainers <= set(STAGES)
    for name in METRICS:
        sources = logged_by(name)
        assert sources and set(sources) <= trainers, (name, LOGGED_BY[name])
    assert logged_by("value/loss") == {"ppo": "with a critic: ppo.advantage gae", "gym": "algo ppo"}
    assert logged_by("mismatch/is_masked_share") == {
        "ppo": "a masking rollout_correction: token_mis, seq_mis, geo_mis", "reinforce": "the same"}
    assert logged_by("iteration") == {"ppo": "", "reinforce": "", "gym": ""}
    # nothing logs these (ratio_mean was computed in the loss and dropped); gym logs epochs and advantage_mean
    assert "policy/ratio_mean" not in METRICS and "time/checkpoint_s" not in METRICS
    assert logged_by("policy/epochs") == {"gym": "algo ppo"}


def _run(tiny_lm, out, cls, **extra):
    from fourfold.trainers.ppo import train as ppo
    from fourfold.trainers.reinforce import train as reinforce

    over = {"model.policy": tiny_lm / "sft", "model.reward": tiny_lm / "rm", "data.prompts": tiny_lm / "prompts.jsonl",
            "generation.max_new_tokens": 6, "run.output_dir": out, "run.progress": False, "run.device": "cpu"}
    over.update(extra)
    cfg = load_config(cls, None, [f"{k}={v}" for k, v in over.items()])
    (ppo if cls is PPOConfig else reinforce)(cfg)
    return read_metrics(out / "metrics.jsonl")


PPO = {"ppo.iterations": 2, "ppo.rollout_batch_size": 8, "ppo.minibatch_size": 4, "ppo.ppo_epochs": 2}
RUNS = {
    # (trainer, overrides, the conditions the run meets)
    "ppo-gae": ("ppo", PPO, {"with a critic: ppo.advantage gae"}),
    "ppo-grpo": ("ppo", {**PPO, "ppo.advantage": "grpo", "ppo.samples_per_prompt": 2, "ppo.minibatch_size": 8},
                 {"ppo.samples_per_prompt > 1"}),
    "reinforce": ("reinforce", {"reinforce.iterations": 2, "reinforce.rollout_batch_size": 8}, set()),
}


@pytest.mark.parametrize("run", list(RUNS))
def test_a_brief_run_logs_what_the_table_says(tiny_lm, tmp_path, run):
    trainer, overrides, met = RUNS[run]
    rows = _run(tiny_lm, tmp_path / run, PPOConfig if trainer == "ppo" else ReinforceConfig, **overrides)
    assert len(rows) == 2
    _check(run, trainer, met, rows, every_row=True)


@pytest.mark.parametrize("algo", ["ppo", "reinforce"])
def test_a_brief_gym_run_logs_what_the_table_says(tmp_path, algo, capsys):
    pytest.importorskip("gymnasium")
    from fourfold.cli import main

    assert main(["gym", f"algo={algo}", "env.num_envs=2", "ppo.num_steps=32", "ppo.ppo_epochs=1", "ppo.total_timesteps=128",
                 "reinforce.total_timesteps=400", "eval.every_steps=64", "eval.episodes=1", "run.progress=false",
                 "--output-dir", str(tmp_path / "gym")]) == 0
    rows = read_metrics(tmp_path / "gym" / "metrics.jsonl")
    met = {f"algo {algo}", "an episode finished in the rollout", "an evaluation iteration"}
    _check(f"gym {algo}", "gym", met, rows, every_row=False)  # rows without an episode or an evaluation differ


def _check(run, trainer, met, rows, every_row):
    """Each row (or, every_row False, the rows together) logs every metric the table gives to
    ``trainer`` with no condition or a condition in ``met``, and nothing else."""
    assert rows
    expected = {name for name in METRICS if logged_by(name).get(trainer, None) in {"", *met}}
    for row in rows if every_row else [set().union(*map(set, rows))]:
        logged = set(row) - {"step"}
        assert expected <= logged, f"{run}: documented as logged but missing: {sorted(expected - logged)}"
        assert all(documented(k) for k in logged), sorted(k for k in logged if not documented(k))
        stray = sorted(k for k in logged if trainer not in logged_by(k))
        assert not stray, f"{run}: logged, but the table does not give them to {trainer}: {stray}"
        # a conditional metric the run does not meet is not logged
        unmet = sorted(k for k in logged if logged_by(k)[trainer] not in {"", *met})
        assert not unmet, f"{run}: logged under a condition the run does not meet: {unmet}"


def _words(rng, n):
    return " ".join(f"w{rng.randrange(60)}" for _ in range(n))


SUPERVISED = {  # stage: (the data's rows, overrides, the conditions the run meets)
    "sft": (lambda rng: {"prompt": _words(rng, 3), "completion": _words(rng, 4)},
            ["data.eval={data}"], {"an eval file: data.eval"}),  # sft has no eval_fraction
    "reward": (lambda rng: {"prompt": _words(rng, 3), "chosen": _words(rng, 4), "rejected": _words(rng, 5)},
               ["data.eval_fraction=0.25"], {"an eval split"}),
    "dpo": (lambda rng: {"prompt": _words(rng, 3), "chosen": _words(rng, 4), "rejected": _words(rng, 5)},
            ["data.eval_fraction=0.25"], {"an eval split"}),
}


@pytest.mark.parametrize("stage", list(SUPERVISED))
def test_a_brief_supervised_run_logs_what_the_table_says(tiny_lm, tmp_path, stage, capsys):
    """sft, reward and dpo (through the CLI, with an eval split) log what the table gives them."""
    import json
    import random

    from fourfold.cli import main

    row, overrides, met = SUPERVISED[stage]
    rng = random.Random(0)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row(rng)) + "\n" for _ in range(16)))
    overrides = [o.format(data=data) for o in overrides]
    assert main([stage, f"model.path={tiny_lm / 'sft'}", f"data.train={data}", "train.max_steps=2", "train.batch_size=4",
                 "train.max_len=16", "run.device=cpu", "run.progress=false", "run.tensorboard=false",
                 *overrides, "--output-dir", str(tmp_path / stage)]) == 0, capsys.readouterr().err
    rows = read_metrics(tmp_path / stage / "metrics.jsonl")
    _check(stage, stage, met, rows, every_row=False)  # the eval metrics are on the eval steps' rows
