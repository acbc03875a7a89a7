"""A task as the RL trainers take it: prompts and a gold-reward probe (the trainers never see it),
and the CLI building both from ``data.task``."""
import random

from fourfold.cli import task_inputs
from fourfold.config import PPOConfig, ReinforceConfig, load_config
from fourfold.tasks import ReviewTask, task_probe, task_prompts


def test_task_prompts_are_the_seeded_sample_ppo_always_used():
    task = ReviewTask()
    prompts = task_prompts(task, batch_size=200, seed=3)
    assert prompts == task.sample_prompts(800, random.Random(3 + 7919))
    assert len(task_prompts(task, batch_size=8, seed=3)) == 512


def test_task_probe_logs_the_mean_gold_reward():
    task = ReviewTask()
    examples = task.sft_examples(16, random.Random(1))
    prompts = [e["prompt"] for e in examples]
    responses = [e["completion"] for e in examples[:8]] + ["is flimsy . it works poorly ."] * 8
    gold = task.gold_reward(prompts, responses)
    assert len(set(gold)) > 1  # a batch where the mean says something
    assert task_probe(task)(prompts, responses) == {"reward/gold_mean": float(sum(gold) / len(gold))}


def test_cli_resolves_data_task_into_prompts_and_probe():
    over = ["model.policy=p", "model.reward=r", "data.task=review", "reinforce.rollout_batch_size=256", "run.seed=5"]
    inputs = task_inputs("reinforce", load_config(ReinforceConfig, None, over))
    assert inputs["prompts"] == task_prompts(ReviewTask(), 256, 5)
    prompts, responses = inputs["prompts"][:2], ["is very sturdy . it works well ."] * 2
    assert inputs["probe"](prompts, responses) == task_probe(ReviewTask())(prompts, responses)

    models = ["model.policy=p", "model.reward=r"]
    with_file = load_config(PPOConfig, None, [*models, "data.task=review", "data.prompts=f.jsonl"])
    assert set(task_inputs("ppo", with_file)) == {"probe"}  # the file's prompts, the task's gold
    no_task = load_config(PPOConfig, None, [*models, "data.prompts=f.jsonl"])
    assert task_inputs("ppo", no_task) == {}


def test_data_task_options_reach_the_probe():
    """data.task_options build the task the probe scores with (here the horizon knob: 3 sentences
    wanted, so a 2-sentence review loses a third and the sentence penalty)."""
    import pytest

    from fourfold.errors import ConfigError

    over = ["model.policy=p", "model.reward=r", "data.task=review", "data.task_options={sentences: 3}"]
    inputs = task_inputs("ppo", load_config(PPOConfig, None, over))
    gold = inputs["probe"](["the blender"], ["is very sturdy . it works well ."])["reward/gold_mean"]
    assert gold == pytest.approx(2 / 3 - 0.25)
    assert inputs["prompts"] == task_prompts(ReviewTask(), 64, 0)  # the prompts do not depend on the options
    with pytest.raises(ConfigError, match="data.task_options: set, but data.task is null"):
        load_config(PPOConfig, None, ["model.policy=p", "model.reward=r", "data.prompts=f", "data.task_options={a: 1}"])
