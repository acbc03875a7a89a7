"""`fourfold estimate --config CFG [--nproc N] [--json] [--device-memory GiB]`: a PPO or REINFORCE
config mapped onto the memory estimate (config.json files only), and the one line `fourfold ppo`
prints before it starts."""
import json
import warnings

import pytest
from transformers import AutoConfig

from fourfold import cli
from fourfold.config import LoraConfig, PPOConfig, load_config
from fourfold.models.estimate.from_config import estimate_line, estimate_settings
from fourfold.models.estimate.memory import EstimateSettings, estimate_from_settings
from fourfold.models.estimate.params import count_lora
from fourfold.models.factory import llama_config
from fourfold.models.lora import LoraSettings


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Two model directories holding only a config.json (nothing to load but the sizes)."""
    root = tmp_path_factory.mktemp("estimate")
    llama_config(97, hidden=32, layers=2, heads=4, intermediate=48, pad_token_id=0, eos_token_id=1).save_pretrained(root / "sft")
    llama_config(97, hidden=24, layers=1, heads=2, intermediate=40, pad_token_id=0, eos_token_id=1).save_pretrained(root / "rm")
    return root


def write_config(path, dirs, text=""):
    path.write_text(f"model:\n  policy: {dirs / 'sft'}\n  reward: {dirs / 'rm'}\ndata:\n  prompts: p.jsonl\n"
                    "  max_prompt_len: 16\ngeneration:\n  max_new_tokens: 8\n" + text)
    return str(path)


PPO = "ppo:\n  rollout_batch_size: 8\n  minibatch_size: 4\n"


def run(argv, capsys):
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_is_exactly_the_estimate_of_the_config(dirs, tmp_path, capsys):
    cfg = write_config(tmp_path / "ppo.yaml", dirs, PPO)
    rc, out, err = run(["estimate", "--config", cfg, "--json"], capsys)
    assert rc == 0 and err == "" and out.count("\n") == 1
    got = json.loads(out)
    expected = estimate_from_settings(EstimateSettings(
        policy=str(dirs / "sft"), reward=str(dirs / "rm"), critic=str(dirs / "rm"), rollout_batch_size=8,
        minibatch_size=4, max_prompt_len=16, max_new_tokens=8, frozen_dtype="float32")).to_json()
    assert got == expected
    assert set(got["roles"]) == {"policy", "reference", "reward", "critic"}
    assert set(got["roles"]["policy"]) == {"params", "trainable_params", "weights_bytes", "grads_bytes", "optimizer_bytes"}
    assert got["roles"]["critic"]["params"] == got["roles"]["reward"]["params"] != got["roles"]["policy"]["params"]
    rc, out2, _ = run(["estimate", "--config", cfg, "--json", "--nproc", "2"], capsys)
    per_device = json.loads(out2)["roles"]["policy"]
    assert rc == 0 and per_device["optimizer_bytes"] < got["roles"]["policy"]["optimizer_bytes"]


def test_table_says_whether_the_run_fits(dirs, tmp_path, capsys):
    cfg = write_config(tmp_path / "ppo.yaml", dirs, PPO)
    rc, out, _ = run(["estimate", "--config", cfg, "--device-memory", "64"], capsys)
    assert rc == 0 and "fourfold estimate: full fine-tuning, fp32, 1 device" in out
    assert "training peak per device" in out and "fits on device (64.0 GiB)" in out
    rc, out, _ = run(["estimate", "--config", cfg, "--device-memory", "0.001", "ppo.rollout_batch_size=16"], capsys)
    assert rc == 0 and "does not fit on device (0.0 GiB)" in out


def test_levers_and_reinforce_are_mapped(dirs, tmp_path):
    cfg = load_config(PPOConfig, write_config(tmp_path / "ppo.yaml", dirs, PPO), [
        "model.precision=bf16-mixed", "model.frozen_dtype=bfloat16", "model.gradient_checkpointing=true",
        "model.logits_chunk=64", "model.critic_init=policy", "ppo.micro_batch_size=2", "ppo.entropy_coef=0.01",
        "run.concurrent_roles=true", "generation.weights=copy"])
    s = estimate_settings("ppo", cfg, nproc=2)
    assert s.engine_weights == "copy"
    assert (s.precision, s.frozen_dtype, s.gradient_checkpointing, s.logits_chunk) == ("bf16-mixed", "bfloat16", True, 64)
    assert (s.critic, s.micro_batch_size, s.with_entropy, s.concurrent_roles, s.nproc) == (
        str(dirs / "sft"), 2, True, True, 2)
    cfg.model.dtype, cfg.model.precision, cfg.model.frozen_dtype = "bfloat16", "fp32", None
    s = estimate_settings("ppo", cfg)
    assert (s.precision, s.frozen_dtype) == ("bf16", "bfloat16")
    cfg.ppo.advantage = "grpo"  # a critic-free estimator loads no critic, whatever use_critic says
    assert estimate_settings("ppo", cfg).critic is None
    cfg.ppo.advantage, cfg.ppo.use_critic = "gae", False
    assert estimate_settings("ppo", cfg).critic is None
    rf = tmp_path / "rf.yaml"
    write_config(rf, dirs, "reinforce:\n  rollout_batch_size: 8\n")
    from fourfold.config import ReinforceConfig

    s = estimate_settings("reinforce", load_config(ReinforceConfig, str(rf), []))
    assert s.critic is None and s.rollout_batch_size == s.minibatch_size == 8


def test_reinforce_config_is_recognised_by_its_section(dirs, tmp_path, capsys):
    cfg = write_config(tmp_path / "rf.yaml", dirs, "reinforce:\n  rollout_batch_size: 8\n")
    rc, out, _ = run(["estimate", "--config", cfg, "--json"], capsys)
    roles = json.loads(out)["roles"]
    assert rc == 0 and roles["critic"]["params"] == 0 and roles["policy"]["trainable_params"] > 0


def test_lora_settings_are_read_when_the_config_has_them(dirs, tmp_path):
    """model.lora (null: full fine-tuning) and model.critic_mode."""
    cfg = load_config(PPOConfig, write_config(tmp_path / "ppo.yaml", dirs, PPO), ["model.critic_init=policy"])
    assert estimate_settings("ppo", cfg).lora is None
    cfg.model.lora = LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    cfg.model.critic_mode = "adapter"
    s = estimate_settings("ppo", cfg)
    assert s.lora == LoraSettings(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"], dropout=0.0)
    assert (s.critic_mode, s.reward_mode) == ("adapter", "separate")
    assert s.reference is None
    est = estimate_from_settings(s)
    lora_params = count_lora(AutoConfig.from_pretrained(dirs / "sft"), 4, ["q_proj", "v_proj"]).params
    assert est.roles["policy"].trainable_params == lora_params
    assert est.roles["critic"].weights_bytes < est.roles["reward"].weights_bytes  # the critic is an adapter
    cfg.model.lora = LoraConfig(r=8)
    cfg.model.critic_mode = "separate"
    assert estimate_settings("ppo", cfg).lora.r == 8 and estimate_settings("ppo", cfg).critic_mode == "separate"


def test_ppo_prints_the_estimate_line_first_and_never_fails_on_it(dirs, tmp_path, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr("fourfold.trainers.ppo.train", lambda cfg, **kw: calls.append(cfg))
    cfg = write_config(tmp_path / "ppo.yaml", dirs, PPO)
    rc, out, err = run(["ppo", "--config", cfg], capsys)  # on stdout, with the run's other lines
    assert rc == 0 and len(calls) == 1 and err == ""
    assert out.count("\n") == 1 and out.startswith("fourfold ppo: memory estimate (full fine-tuning, fp32, 1 device): peak")
    rc, out, err = run(["ppo", "--config", cfg, f"model.policy={tmp_path / 'missing'}"], capsys)
    assert rc == 0 and len(calls) == 2 and err == ""  # the run goes on
    assert out.count("\n") == 1 and out.startswith("fourfold ppo: memory estimate unavailable (ModelLoadError:")
    assert estimate_line("ppo", load_config(PPOConfig, cfg, [])).startswith("memory estimate (")


def test_estimate_errors_are_one_line(dirs, tmp_path, capsys):
    cfg = write_config(tmp_path / "ppo.yaml", dirs, PPO)
    rc, out, err = run(["estimate", "--config", cfg, f"model.policy={tmp_path / 'missing'}"], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "no such directory" in err
    rc, _, err = run(["estimate", "--config", cfg, "ppo.minibatch_size=3"], capsys)
    assert rc == 2 and "ppo.rollout_batch_size" in err and err.count("\n") == 1


def test_placements_under_torchrun_are_read_from_the_plan(dirs, tmp_path):
    """`fourfold estimate --nproc N` follows the dist section: replicated trained roles keep their
    whole state on every device; with model.lora the shared base is sharded with its adapters (its
    frozen weights too) unless the policy is replicated; frozen models of their own placed fsdp are
    sharded."""
    def est(*overrides, nproc=4):
        cfg = load_config(PPOConfig, write_config(tmp_path / "ppo.yaml", dirs, PPO), list(overrides))
        return estimate_settings("ppo", cfg, nproc=nproc), estimate_from_settings(estimate_settings("ppo", cfg, nproc))

    one = est(nproc=1)[1].roles
    s, sharded = est()
    assert s.replicated == () and not s.shard_frozen and "4 devices, FSDP" in sharded.description
    assert sharded.roles["policy"].optimizer_bytes == -(-one["policy"].optimizer_bytes // 4)
    s, rep = est("dist.policy=replicate", "dist.critic=replicate", "dist.reference=fsdp")
    assert s.replicated == ("policy", "critic") and s.shard_frozen
    assert rep.roles["policy"].optimizer_bytes == one["policy"].optimizer_bytes
    assert rep.roles["reference"].weights_bytes == -(-one["reference"].weights_bytes // 4)
    lora = ("model.lora.r=4", "model.critic_init=policy", "model.critic_mode=adapter")
    s, lora_sharded = est(*lora)
    lora_one = est(*lora, nproc=1)[1].roles
    assert lora_sharded.roles["policy"].weights_bytes < 0.3 * lora_one["policy"].weights_bytes  # the base too
    s, lora_rep = est(*lora, "dist.policy=replicate", "dist.critic=replicate")
    assert s.replicated == ("policy", "critic") and "FSDP" not in lora_rep.description
    assert lora_rep.roles["policy"].weights_bytes == lora_one["policy"].weights_bytes
