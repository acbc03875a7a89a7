"""The role plan (fourfold.models.plan): one pure function from a stage's config to its roles, read
by the loader, the memory estimate and the torchrun placement. What it says for each mode, and that
the loader builds exactly that (forms, dtypes, trained or frozen, one base)."""
import pytest
import torch

from fourfold.config import DPOConfig, PPOConfig, ReinforceConfig, RewardConfig, SFTConfig, load_config
from fourfold.errors import ConfigError
from fourfold.models.build import build_roles
from fourfold.models.estimate.memory import estimate
from fourfold.models.lora import AdapterLM, AdapterScalarModel, save_adapter
from fourfold.models.plan import ADAPTER, BASE, FULL, FUNCTION, plan_roles
from fourfold.models.roles import AdapterDisabledReference, FrozenReference, FunctionReward, ScalarModel

LORA = ["model.lora.r=4", "model.lora.alpha=8", "run.concurrent_roles=false"]


def _ppo(tiny_lm, *extra):
    return load_config(PPOConfig, None, [f"model.policy={tiny_lm / 'sft'}", f"model.reward={tiny_lm / 'rm'}",
                                         "data.prompts=p", *extra])


def _shape(plan) -> list[tuple]:
    return [(r.name, r.form, r.trained, r.start, None if r.dtype is None else str(r.dtype).split(".")[1])
            for r in plan.roles]


def test_full_ppo_four_models(tiny_lm):
    plan = plan_roles("ppo", _ppo(tiny_lm, "model.frozen_dtype=bfloat16"))
    assert _shape(plan) == [("policy", FULL, True, "load", "float32"), ("reference", FULL, False, "load", "bfloat16"),
                            ("reward", FULL, False, "load", "bfloat16"),
                            ("critic", FULL, True, "copy-reward", "float32")]
    assert [r.placement for r in plan.roles] == ["fsdp", "replicate", "replicate", "fsdp"]
    assert plan.role("reference").source == str(tiny_lm / "sft") and plan.lora is None


def test_critic_free_and_reinforce_have_no_critic(tiny_lm):
    assert plan_roles("ppo", _ppo(tiny_lm, "ppo.advantage=rloo", "ppo.samples_per_prompt=2")).names == \
        ("policy", "reference", "reward")
    rf = load_config(ReinforceConfig, None, [f"model.policy={tiny_lm / 'sft'}", "model.reward_fn=m:f", "data.prompts=p"])
    plan = plan_roles("reinforce", rf)
    assert plan.names == ("policy", "reference", "reward") and plan.role("reward").form == FUNCTION


def test_lora_one_base(tiny_lm, tmp_path):
    adapter = tmp_path / "rm-adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    plan = plan_roles("ppo", _ppo(tiny_lm, *LORA, f"model.reward={adapter}", "model.critic_mode=adapter"))
    assert [(r.name, r.form, r.trained, r.start) for r in plan.roles] == [
        ("policy", ADAPTER, True, "load"), ("reference", BASE, False, "load"), ("reward", ADAPTER, False, "load"),
        ("critic", ADAPTER, True, "copy-reward")]
    assert plan.base_source == str(tiny_lm / "sft")
    # a separate critic from a full reward model, the base in bf16: loaded from the reward model in float32
    plan = plan_roles("ppo", _ppo(tiny_lm, *LORA, "model.frozen_dtype=bfloat16"))
    assert _shape(plan)[2:] == [("reward", FULL, False, "load", "bfloat16"), ("critic", FULL, True, "load", "float32")]
    assert plan.base_dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="run.concurrent_roles"):
        plan_roles("ppo", _ppo(tiny_lm, "model.lora.r=4", "run.concurrent_roles=true"))


def test_supervised_stages(tiny_lm):
    sft = load_config(SFTConfig, None, ["model.from_scratch=true", f"model.tokenizer={tiny_lm / 'sft'}", "data.train=x"])
    plan = plan_roles("sft", sft)
    assert _shape(plan) == [("policy", FULL, True, "scratch", "float32")] and plan.scratch["hidden_size"] == 128
    rm = load_config(RewardConfig, None, [f"model.path={tiny_lm / 'sft'}", "data.train=x", "model.lora.r=4"])
    assert [(r.name, r.form, r.trained, r.start) for r in plan_roles("reward", rm).roles] == [
        ("reward", ADAPTER, True, "head-or-fresh")]
    dpo = load_config(DPOConfig, None, [f"model.path={tiny_lm / 'sft'}", "data.train=x", "model.lora.r=4"])
    assert [(r.name, r.form) for r in plan_roles("dpo", dpo).roles] == [("policy", ADAPTER), ("reference", BASE)]
    dpo = load_config(DPOConfig, None, [f"model.path={tiny_lm / 'sft'}", "data.train=x", "dpo.reference=ref"])
    ref = plan_roles("dpo", dpo).role("reference")
    assert (ref.form, ref.source, ref.key, ref.placement) == (FULL, "ref", "dpo.reference", "replicate")


def test_the_loader_builds_what_the_plan_says(tiny_lm, tmp_path):
    cpu = torch.device("cpu")
    full = build_roles(plan_roles("ppo", _ppo(tiny_lm, "model.frozen_dtype=bfloat16")), cpu)
    assert isinstance(full.reference, FrozenReference) and isinstance(full.critic, ScalarModel)
    assert {p.dtype for p in full.reference.model.parameters()} == {torch.bfloat16}
    assert all(p.requires_grad for p in full.critic.parameters())
    assert not any(p.requires_grad for p in full.reward_model.parameters())
    rm = build_roles(plan_roles("reward", load_config(RewardConfig, None, [
        f"model.path={tiny_lm / 'sft'}", "data.train=x", "model.lora.r=4", "model.lora.alpha=8"])), cpu).reward_model
    assert isinstance(rm, AdapterScalarModel) and rm.base.adapters == ["reward"]
    save_adapter(rm, tmp_path / "rm-adapter")
    lora = build_roles(plan_roles("ppo", _ppo(tiny_lm, *LORA, f"model.reward={tmp_path / 'rm-adapter'}",
                                              "model.critic_mode=adapter")), cpu)
    assert isinstance(lora.policy, AdapterLM) and isinstance(lora.reference, AdapterDisabledReference)
    assert lora.base.adapters == ["policy", "reward", "critic"]
    fn = build_roles(plan_roles("ppo", _ppo(tiny_lm, "model.reward=null", f"model.reward_fn={tiny_lm / 'reward_fn.py'}:reward",
                                            "model.critic_init=policy")), cpu)
    assert isinstance(fn.reward, FunctionReward) and fn.reward_model is None and fn.critic is not None


def test_the_estimate_reads_the_plan(tiny_lm):
    """The estimate restates no role rule: its roles are the plan's, as they are (a role the plan
    lacks or a function costs nothing; a role on the base holds no weights of its own)."""
    plan = plan_roles("ppo", _ppo(tiny_lm, *LORA, "model.critic_mode=separate", "model.critic_init=policy"))
    est = estimate(plan)
    assert [(r.name, r.form, r.source) for r in plan.roles] == [
        ("policy", ADAPTER, str(tiny_lm / "sft")), ("reference", BASE, None), ("reward", FULL, str(tiny_lm / "rm")),
        ("critic", FULL, str(tiny_lm / "sft"))]
    assert est.roles["reference"].weights_bytes == 0 and est.roles["reference"].params > 0
    assert est.roles["critic"].trainable_params == est.roles["critic"].params > est.roles["policy"].trainable_params
    assert est.description.startswith("LoRA r=4 on a shared base (critic separate, reward model separate)")
    plan = plan_roles("ppo", _ppo(tiny_lm, "ppo.advantage=grpo", "ppo.samples_per_prompt=2", "model.reward=null",
                                  "model.reward_fn=m:f"))
    est = estimate(plan)
    assert plan.role("critic") is None and plan.role("reward").form == FUNCTION
    assert est.roles["critic"].params == est.roles["reward"].params == 0


def test_the_evaluation_plan_loads_saved_models_through_the_loader(tiny_lm):
    """plan_evaluation: the saved models of an evaluation, each frozen and of its own, in load order;
    the loader checks them as any stage's (a causal LM given as the reward model is refused) and
    fits their embeddings to the tokenizer."""
    from fourfold.apps.evaluation import load_eval_roles
    from fourfold.errors import ModelLoadError
    from fourfold.models.plan import plan_evaluation

    sft, rm = str(tiny_lm / "sft"), str(tiny_lm / "rm")
    plan = plan_evaluation(sft, policy=sft, reference=sft, reward=rm)
    assert plan.stage == "evaluate" and plan.tokenizer == sft
    assert [(r.name, r.form, r.source, r.trained, r.dtype) for r in plan.roles] == [
        ("policy", FULL, sft, False, None), ("reference", FULL, sft, False, None), ("reward", FULL, rm, False, None)]
    assert plan_evaluation(sft, reward=rm).names == ("reward",)
    with pytest.raises(ValueError, match="no model given"):
        plan_evaluation(sft)
    roles = load_eval_roles(sft, rm, policy=sft)
    assert roles.policy is roles.reference.model  # the same directory: loaded once
    assert isinstance(roles.reference, FrozenReference) and isinstance(roles.reward_model, ScalarModel)
    assert not roles.reward_model.training and len(roles.tokenizer) <= roles.reference.model.get_input_embeddings().num_embeddings
    other = load_eval_roles(sft, rm, policy=sft + "/")
    assert other.policy is not other.reference.model and not other.policy.training
    with pytest.raises(ModelLoadError, match="reward"):
        load_eval_roles(sft, sft)  # a causal LM has no trained score head
