"""`fourfold estimate --config CFG [--nproc N] [--json] [--device-memory GiB]`: a PPO or REINFORCE
config mapped onto the memory estimate (config.json files only), and the one line `fourfold ppo`
prints before it starts."""
import json
import warnings

import pytest
import torch
from transformers import AutoConfig

from fourfold import cli
from fourfold.config import LoraConfig, PPOConfig, load_config
from fourfold.models.estimate.from_config import estimate_config, estimate_line, workload_of
from fourfold.models.estimate.memory import Workload, estimate
from fourfold.models.estimate.params import count_lora
from fourfold.models.factory import llama_config
from fourfold.models.lora import LoraSettings
from fourfold.models.plan import ADAPTER, FULL, plan_roles


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


@pytest.fixture(scope="module")
def reward_adapter_dir(tmp_path_factory):
    """A directory that reads as a LoRA reward adapter (the estimate reads none of it)."""
    path = tmp_path_factory.mktemp("reward-adapter")
    (path / "adapter_config.json").write_text("{}")
    return path


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
    plan = plan_roles("ppo", load_config(PPOConfig, cfg, []))
    assert [(r.name, r.form, r.source) for r in plan.roles] == [
        ("policy", FULL, str(dirs / "sft")), ("reference", FULL, str(dirs / "sft")), ("reward", FULL, str(dirs / "rm")),
        ("critic", FULL, str(dirs / "rm"))]
    expected = estimate(plan, Workload(rollout_batch_size=8, minibatch_size=4, max_prompt_len=16,
                                       max_new_tokens=8)).to_json()
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
    assert workload_of("ppo", cfg, nproc=2) == Workload(rollout_batch_size=8, minibatch_size=4, micro_batch_size=2,
                                                        max_prompt_len=16, max_new_tokens=8, with_entropy=True,
                                                        nproc=2, engine_weights="copy")
    plan = plan_roles("ppo", cfg)
    assert (plan.precision, plan.frozen_dtype, plan.gradient_checkpointing, plan.logits_chunk, plan.concurrent) == (
        "bf16-mixed", torch.bfloat16, True, 64, True)
    assert plan.role("critic").source == str(dirs / "sft")
    est = estimate_config("ppo", cfg, nproc=2)
    assert est.description == "full fine-tuning, bf16-mixed, gradient checkpointing, 2 devices, FSDP"
    assert est.roles["reference"].weights_bytes == 2 * est.roles["reference"].params  # bf16, replicated
    assert est.train["inference copy of the policy (generation.weights: copy)"] == 2 * est.roles["reference"].params
    assert "gradients (critic)" in est.train and "gradients (policy)" in est.train  # concurrent: both live
    cfg.model.dtype, cfg.model.precision, cfg.model.frozen_dtype = "bfloat16", "fp32", None
    est = estimate_config("ppo", cfg)
    assert est.description.startswith("full fine-tuning, bf16, ")
    policy = est.roles["policy"]
    assert policy.weights_bytes == policy.grads_bytes == 2 * policy.params  # bf16 weights and gradients
    cfg.ppo.advantage = "grpo"  # a critic-free estimator loads no critic, whatever use_critic says
    assert plan_roles("ppo", cfg).role("critic") is None and estimate_config("ppo", cfg).roles["critic"].params == 0
    cfg.ppo.advantage, cfg.ppo.use_critic = "gae", False
    assert plan_roles("ppo", cfg).role("critic") is None
    rf = tmp_path / "rf.yaml"
    write_config(rf, dirs, "reinforce:\n  rollout_batch_size: 8\n")
    from fourfold.config import ReinforceConfig

    rcfg = load_config(ReinforceConfig, str(rf), [])
    assert plan_roles("reinforce", rcfg).role("critic") is None
    w = workload_of("reinforce", rcfg)
    assert w.rollout_batch_size == w.minibatch_size == 8


def test_reinforce_config_is_recognised_by_its_section(dirs, tmp_path, capsys):
    cfg = write_config(tmp_path / "rf.yaml", dirs, "reinforce:\n  rollout_batch_size: 8\n")
    rc, out, _ = run(["estimate", "--config", cfg, "--json"], capsys)
    roles = json.loads(out)["roles"]
    assert rc == 0 and roles["critic"]["params"] == 0 and roles["policy"]["trainable_params"] > 0


def test_lora_settings_are_read_when_the_config_has_them(dirs, tmp_path):
    """model.lora (null: full fine-tuning) and model.critic_mode."""
    cfg = load_config(PPOConfig, write_config(tmp_path / "ppo.yaml", dirs, PPO), ["model.critic_init=policy"])
    assert plan_roles("ppo", cfg).lora is None
    cfg.model.lora = LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    cfg.model.critic_mode = "adapter"
    plan = plan_roles("ppo", cfg)
    assert plan.lora == LoraSettings(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"], dropout=0.0)
    assert [(r.name, r.form) for r in plan.roles] == [("policy", ADAPTER), ("reference", "base"), ("reward", FULL),
                                                     ("critic", ADAPTER)]
    est = estimate_config("ppo", cfg)
    assert est.description.startswith("LoRA r=4 on a shared base (critic adapter, reward model separate), ")
    lora_params = count_lora(AutoConfig.from_pretrained(dirs / "sft"), 4, ["q_proj", "v_proj"]).params
    assert est.roles["policy"].trainable_params == lora_params
    assert est.roles["critic"].weights_bytes < est.roles["reward"].weights_bytes  # the critic is an adapter
    cfg.model.lora = LoraConfig(r=8)
    cfg.model.critic_mode = "separate"
    assert plan_roles("ppo", cfg).lora.r == 8 and plan_roles("ppo", cfg).role("critic").form == FULL
    assert "(critic separate, reward model separate)" in estimate_config("ppo", cfg).description


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
        return plan_roles("ppo", cfg), estimate_config("ppo", cfg, nproc)

    one = est(nproc=1)[1].roles
    plan, sharded = est()
    assert [r.placement for r in plan.roles] == ["fsdp", "replicate", "replicate", "fsdp"]
    assert sharded.description.endswith("4 devices, FSDP")
    assert sharded.roles["policy"].optimizer_bytes == -(-one["policy"].optimizer_bytes // 4)
    assert sharded.roles["reference"].weights_bytes == one["reference"].weights_bytes
    plan, rep = est("dist.policy=replicate", "dist.critic=replicate", "dist.reference=fsdp")
    assert rep.description.endswith("4 devices, FSDP, frozen roles sharded, policy and critic replicated")
    assert rep.roles["policy"].optimizer_bytes == one["policy"].optimizer_bytes
    assert rep.roles["reference"].weights_bytes == -(-one["reference"].weights_bytes // 4)
    assert rep.roles["reward"].weights_bytes == one["reward"].weights_bytes  # each frozen role as it is placed
    lora = ("model.lora.r=4", "model.critic_init=policy", "model.critic_mode=adapter")
    _, lora_sharded = est(*lora)
    lora_one = est(*lora, nproc=1)[1].roles
    assert lora_sharded.roles["policy"].weights_bytes < 0.3 * lora_one["policy"].weights_bytes  # the base too
    plan, lora_rep = est(*lora, "dist.policy=replicate", "dist.critic=replicate")
    assert plan.base_placement == "replicate" and "FSDP" not in lora_rep.description
    assert lora_rep.description.endswith("policy and critic replicated")
    assert lora_rep.roles["policy"].weights_bytes == lora_one["policy"].weights_bytes


def test_frozen_roles_are_bf16_under_bf16_mixed_unless_frozen_dtype_says(dirs, tmp_path, reward_adapter_dir):
    """The plan and so the estimate: under bf16-mixed the reference and the reward model (with LoRA,
    the shared base) are bf16 by default, float32 with model.frozen_dtype: float32; fp32 runs keep
    them float32. The trained roles keep float32 master weights throughout."""
    def of(*overrides):
        cfg = load_config(PPOConfig, write_config(tmp_path / "ppo.yaml", dirs, PPO), list(overrides))
        return plan_roles("ppo", cfg), estimate_config("ppo", cfg)

    for overrides, frozen in ((["model.precision=bf16-mixed"], torch.bfloat16),
                              (["model.precision=bf16-mixed", "model.frozen_dtype=float32"], torch.float32),
                              (["model.precision=bf16-mixed", "model.frozen_dtype=float16"], torch.float16),
                              ([], torch.float32)):
        plan, est = of(*overrides)
        assert [r.dtype for r in plan.roles] == [torch.float32, frozen, frozen, torch.float32], overrides
        size = 4 if frozen == torch.float32 else 2
        for name in ("reference", "reward"):
            assert est.roles[name].weights_bytes == size * est.roles[name].params, (overrides, name)
        assert est.roles["policy"].weights_bytes == 4 * est.roles["policy"].params
    lora = ("model.lora.r=4", f"model.reward={reward_adapter_dir}", "model.critic_mode=adapter")
    plan, est = of("model.precision=bf16-mixed", *lora)
    assert plan.base_dtype == torch.bfloat16 and est.description.startswith("LoRA r=4 on a shared base (critic adapter, "
                                                                            "reward model adapter), bf16-mixed, ")
    adapters = est.roles["policy"].trainable_params
    base = est.roles["reference"].params
    assert est.roles["policy"].weights_bytes == 2 * base + 4 * adapters  # bf16 base, float32 adapters
    plan, est = of("model.precision=bf16-mixed", "model.frozen_dtype=float32", *lora)
    assert plan.base_dtype == torch.float32 and est.roles["policy"].weights_bytes == 4 * (base + adapters)


def test_the_default_engine_weights_are_counted_as_they_resolve(dirs, tmp_path):
    """generation.weights: auto is estimated as what it runs: gathered (the policy's other shards
    while sampling) for an FSDP policy over several devices, live otherwise."""
    def settings(*overrides, nproc=4):
        cfg = load_config(PPOConfig, write_config(tmp_path / "ppo.yaml", dirs, PPO), list(overrides))
        return workload_of("ppo", cfg, nproc=nproc)

    assert settings().engine_weights == "gathered"
    assert settings(nproc=1).engine_weights == "live"
    assert settings("dist.policy=replicate").engine_weights == "live"
    assert settings("generation.weights=live").engine_weights == "live"
    path = write_config(tmp_path / "ppo.yaml", dirs, PPO)
    auto, gathered = (estimate_config("ppo", load_config(PPOConfig, path, list(o)), nproc=4)
                      for o in ((), ("generation.weights=gathered",)))
    assert auto.generate == gathered.generate and any("gathered" in k for k in auto.generate)
    cfg = load_config(PPOConfig, path, [])
    assert estimate_line("ppo", cfg, 4).endswith("; generation.weights: auto = gathered")  # the run's first line
    assert estimate_line("ppo", cfg, 1).endswith("; generation.weights: auto = live")
    assert "generation.weights" not in estimate_line("ppo", load_config(PPOConfig, path, ["generation.weights=copy"]))


def test_an_environment_config_is_estimated_over_its_trajectories(dirs, tmp_path, capsys):
    """env.factory set: the workload carries env.max_tokens and generation.engine, the estimate's
    training forwards run over env.max_tokens tokens (env.max_tokens - data.max_prompt_len of them
    scored) and its table and first line say so; env.factory null keeps the single-turn workload."""
    path = tmp_path / "env.yaml"
    path.write_text(f"model:\n  policy: {dirs / 'sft'}\n  critic_init: policy\ndata:\n  prompts: p.jsonl\n"
                    "  max_prompt_len: 16\ngeneration:\n  max_new_tokens: 8\nenv:\n  factory: envs.py:make_env\n"
                    "  max_tokens: 64\n" + PPO)
    cfg = load_config(PPOConfig, str(path), [])
    w = workload_of("ppo", cfg)
    assert (w.env_max_tokens, w.engine, w.prompt_tokens, w.response_tokens, w.seq_len, w.kv_positions) == (
        64, "eager", 16, 48, 64, 64)
    static = workload_of("ppo", load_config(PPOConfig, str(path), ["generation.engine=static"]))
    assert (static.engine, static.kv_positions) == ("static", 65)
    plan = plan_roles("ppo", cfg)
    assert plan.role("reward") is None
    one_turn = Workload(rollout_batch_size=8, minibatch_size=4, max_prompt_len=16, max_new_tokens=48)
    est, single = estimate_config("ppo", cfg), estimate(plan, one_turn)
    assert est.train == single.train and est.generate == single.generate  # 16 + 48 = env.max_tokens, eager
    assert est.description == "full fine-tuning, fp32, 1 device, trajectories of 64 tokens (env.max_tokens; eager engine)"
    rc, out, _ = run(["estimate", "--config", str(path), "generation.engine=static"], capsys)
    assert rc == 0 and out.startswith("fourfold estimate: full fine-tuning, fp32, 1 device, trajectories of 64 tokens "
                                      "(env.max_tokens; KV cache 65 slots, static engine)\n")
    assert "trajectories of 64 tokens" in estimate_line("ppo", cfg)
    single_turn = load_config(PPOConfig, write_config(tmp_path / "ppo.yaml", dirs, PPO), [])
    assert workload_of("ppo", single_turn).env_max_tokens is None
