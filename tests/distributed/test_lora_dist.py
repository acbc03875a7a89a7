"""LoRA under torchrun (2 processes, gloo on CPU): one shared base, sharded with FSDP2 with its
adapters and heads, gives the one-process run of the same config. The reward stage (a LoRA reward
model, normalised), PPO with an adapter critic over that LoRA reward model, and DPO agree on every
metric and every exported weight (merged and adapter) within 1e-5 of max(|value|, 1); a 2-process
PPO job killed with SIGKILL after a checkpoint resumes exactly at 2 processes and, resharded, in one
process; what rank 0 exports loads with plain transformers and peft. (SFT with LoRA over two
launchers as two nodes: test_multinode_dist.py.)"""
import json
import shutil

import pytest
import torch
from disttest_utils import killed_after, max_scaled_diff, max_tensor_diff, metric_rows, torchrun

from fourfold.cli import main

ADAPTER = "adapter_model.safetensors"
TOLERANCE = 1e-5


def _same_run(one, two, models: tuple, rows: int) -> dict:
    """Assert that two LoRA runs agree (metrics and each exported directory of ``models``, merged and
    adapter, within TOLERANCE of max(|value|, 1)) and return the figures."""
    figures = {"metrics": max_scaled_diff(metric_rows(one), metric_rows(two))}
    for m in models:
        figures[m] = max_tensor_diff(one / m, two / m)
        figures[f"{m}-adapter"] = max_tensor_diff(one / f"{m}-adapter", two / f"{m}-adapter", ADAPTER)
    assert len(metric_rows(two)) == rows and max(figures.values()) < TOLERANCE, figures
    return figures


def _reward(tiny_lm, data, out) -> list[str]:
    return [f"model.path={tiny_lm / 'sft'}", "model.lora.r=4", f"data.train={data['pairs']}",
            "train.max_len=16", "train.batch_size=8", "train.lr=3e-3", "train.max_steps=4", "train.log_every=1",
            "train.eval_every=2", "run.device=cpu", "run.progress=false", "run.tensorboard=false", "run.threads=1",
            f"run.output_dir={out}"]


@pytest.fixture(scope="module")
def reward_runs(tiny_lm, dist_data, tmp_path_factory):
    """A LoRA reward model (held-out split, normalised) trained by 1 and by 2 processes."""
    root = tmp_path_factory.mktemp("lora_reward")
    assert main(["reward", *_reward(tiny_lm, dist_data, root / "one")]) == 0
    torchrun("reward", _reward(tiny_lm, dist_data, root / "two"))
    return root


def test_reward_lora_two_processes_match_one(reward_runs):
    figures = _same_run(reward_runs / "one", reward_runs / "two", ("model",), rows=4)
    shifts = [json.loads((reward_runs / d / "model-adapter" / "fourfold_score.json").read_text())["fourfold_score_shift"]
              for d in ("one", "two")]
    assert abs(shifts[0] - shifts[1]) < TOLERANCE * max(abs(shifts[0]), 1.0)
    print(f"reward LoRA 2 procs = 1 proc: {figures}")


def _ppo(tiny_lm, reward_adapter, out, **extra) -> list[str]:
    """3 iterations of 8 responses on the tiny Llama with LoRA: the reward model a LoRA adapter on
    the same base, the critic a second adapter starting as it (one base for the four roles)."""
    over = {"model.policy": tiny_lm / "sft", "model.lora.r": 4, "model.reward": reward_adapter,
            "model.critic_mode": "adapter", "model.critic_init": "reward", "data.prompts": tiny_lm / "prompts.jsonl",
            "generation.max_new_tokens": 8, "generation.temperature": 1.5, "run.output_dir": out, "run.progress": False,
            "run.tensorboard": False, "run.device": "cpu", "run.seed": 3, "run.save_every": 0, "run.threads": 1,
            "ppo.iterations": 3, "ppo.rollout_batch_size": 8, "ppo.minibatch_size": 4, "ppo.ppo_epochs": 2,
            "ppo.lr": 3e-3, "ppo.critic_lr": 1e-3, "ppo.kl_coef": 0.1, **extra}
    return [f"{k}={v}" for k, v in over.items()]


@pytest.fixture(scope="module")
def ppo_runs(tiny_lm, reward_runs, tmp_path_factory):
    """The LoRA PPO config run by 1 and by 2 processes; returns (root, the reward adapter)."""
    root, adapter = tmp_path_factory.mktemp("lora_ppo"), reward_runs / "one" / "model-adapter"
    assert main(["ppo", *_ppo(tiny_lm, adapter, root / "one")]) == 0
    torchrun("ppo", _ppo(tiny_lm, adapter, root / "two"))
    return root, adapter


def test_ppo_lora_two_processes_match_one(ppo_runs):
    root, _ = ppo_runs
    print(f"ppo LoRA 2 procs = 1 proc: {_same_run(root / 'one', root / 'two', ('policy', 'critic'), rows=3)}")


def test_lora_exports_of_two_processes_load_with_transformers_and_peft(ppo_runs, tiny_lm):
    """The merged policy loads with plain transformers and the adapter with peft over the base: the
    same logits; the critic's adapter directory loads as a peft sequence classifier."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    root, _ = ppo_runs
    two = root / "two"
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(two / "policy")(ids).logits
        peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_lm / "sft"), two / "policy-adapter")
        torch.testing.assert_close(peft(ids).logits, merged, rtol=0, atol=1e-5)
        scorer = AutoModelForSequenceClassification.from_pretrained(tiny_lm / "sft", num_labels=1)
        critic = PeftModel.from_pretrained(scorer, two / "critic-adapter")
        plain = AutoModelForSequenceClassification.from_pretrained(two / "critic")
        torch.testing.assert_close(critic(ids).logits, plain(ids).logits, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def killed(ppo_runs, tiny_lm):
    """The 2-process LoRA PPO job (checkpoints every iteration) SIGKILLed after its first checkpoint."""
    root, adapter = ppo_runs
    out = root / "killed"
    killed_after("ppo", _ppo(tiny_lm, adapter, out, **{"run.save_every": 1}), out / "checkpoints" / "step-00000001")
    assert not (out / "policy").exists() and len(metric_rows(out)) < 3
    return out


def test_ppo_lora_resumes_exactly_after_sigkill(ppo_runs, killed, tiny_lm, tmp_path):
    """--resume by 2 processes: the uninterrupted 2-process run's rows and exports, bit for bit."""
    root, adapter = ppo_runs
    out = tmp_path / "resumed"
    shutil.copytree(killed, out)
    torchrun("ppo", _ppo(tiny_lm, adapter, out, **{"run.save_every": 1, "run.resume": True}))
    assert metric_rows(out) == metric_rows(root / "two")
    for name in ("policy", "critic"):
        assert max_tensor_diff(out / name, root / "two" / name) == 0.0, name
        assert max_tensor_diff(out / f"{name}-adapter", root / "two" / f"{name}-adapter", ADAPTER) == 0.0, name


def test_ppo_lora_two_process_checkpoint_resumes_in_one_process(ppo_runs, killed, tiny_lm, tmp_path):
    """The sharded adapters and heads load resharded without torchrun: the 2-process run's results."""
    root, adapter = ppo_runs
    out = tmp_path / "one"
    shutil.copytree(killed, out)
    assert main(["ppo", *_ppo(tiny_lm, adapter, out, **{"run.save_every": 1, "run.resume": True})]) == 0
    _same_run(root / "two", out, ("policy", "critic"), rows=3)


def test_dpo_lora_two_processes_match_one(tiny_lm, dist_data, tmp_path):
    """The reference is the base with the adapters off: its log-probs (each rank its share of the
    pairs) come before the base is sharded."""
    def args(out):
        return [f"model.path={tiny_lm / 'sft'}", "model.lora.r=4", f"data.train={dist_data['pairs']}",
                "train.max_len=16", "train.batch_size=8", "train.lr=3e-3", "train.max_steps=4", "train.log_every=1",
                "train.eval_every=2", "run.device=cpu", "run.progress=false", "run.tensorboard=false",
                "run.threads=1", f"run.output_dir={out}"]

    assert main(["dpo", *args(tmp_path / "one")]) == 0
    torchrun("dpo", args(tmp_path / "two"))
    print(f"dpo LoRA 2 procs = 1 proc: {_same_run(tmp_path / 'one', tmp_path / 'two', ('model',), rows=4)}")



@pytest.mark.slow  # 2 more PPO runs (1 and 2 processes) of about 30 s each
def test_ppo_lora_samples_from_a_merged_copy_under_two_processes(ppo_runs, tiny_lm, tmp_path):
    """generation.weights: copy with LoRA under torchrun: the engine's sync merges each adapted layer
    from its gathered shards into a plain copy of the policy. 2 processes = 1 process with the same
    engine, and both = the live LoRA policy's run (ppo_runs) up to float rounding."""
    root, adapter = ppo_runs
    engine = {"generation.engine": "static", "generation.weights": "copy"}
    assert main(["ppo", *_ppo(tiny_lm, adapter, tmp_path / "one", **engine)]) == 0
    torchrun("ppo", _ppo(tiny_lm, adapter, tmp_path / "two", **engine))
    same_engine = _same_run(tmp_path / "one", tmp_path / "two", ("policy", "critic"), rows=3)
    vs_live = _same_run(root / "one", tmp_path / "two", ("policy", "critic"), rows=3)
    print(f"ppo LoRA, weights=copy: 2 procs = 1 proc {same_engine}; = the live policy's run {vs_live}")
