"""LoRA with one shared base (fourfold.models.lora): the reference is the base exactly, the base
never learns, both trained adapters and the value head do, exports load and agree, the LoRA reward
format round-trips, and the four roles hold one copy of the base weights."""
import json

import pytest
import torch

from fourfold.checkpoint import load_checkpoint, save_checkpoint, save_pretrained_atomic
from fourfold.config import LoraConfig, PPOConfig, RewardConfig, load_config
from fourfold.errors import ConfigError, ModelLoadError
from fourfold.models.build import load_roles
from fourfold.models.factory import llama_config, random_causal_lm
from fourfold.models.loading import load_causal_lm, load_sequence_scorer
from fourfold.models.lora import (
    SCORE_FILE,
    AdapterConcurrencyError,
    AdapterLM,
    AdapterScalarModel,
    LoraSettings,
    SharedBase,
    add_critic,
    backbone_prefixes,
    load_reward_adapter,
    rename_target_modules,
    save_adapter,
    save_merged,
    split_reward_state,
)
from fourfold.models.roles import (
    FrozenReference,
    ScalarModel,
    accepts_kwarg,
    position_ids_from_mask,
    response_logprobs,
)
from fourfold.rollout.eager import sample
from fourfold.rollout.score import score_rollout

SETTINGS = LoraSettings(r=4, alpha=8.0)


def _batch(vocab: int = 60, seed: int = 0):
    """Left-padded prompts + responses (pad id 0 is never drawn), mask from the layout."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (3, 9), generator=g)
    attn = torch.ones_like(ids)
    ids[0, :2], attn[0, :2] = 0, 0
    return ids, attn


def _logits(model, ids, attn):
    return model(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn), use_cache=False).logits


def _train_policy(policy, steps: int = 3, lr: float = 1e-2):
    """A few AdamW steps raising the log-probs of a fixed batch: the adapter's B becomes non-zero."""
    ids, attn = _batch(seed=1)
    opt = torch.optim.AdamW(policy.parameters(), lr=lr)
    for _ in range(steps):
        logprobs, _ = response_logprobs(policy, ids, attn, 4)
        (-logprobs.mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _base_weights(base: SharedBase) -> dict[str, torch.Tensor]:
    return {n: p for n, p in base.lm.named_parameters() if "lora_" not in n}


def _shared_roles(tiny_lm, reward, critic_init: str = "policy", *extra: str):
    """The PPO roles of ``model.lora`` (r 4, alpha 8) with an adapter critic, from the role plan."""
    cfg = load_config(PPOConfig, None, [f"model.policy={tiny_lm / 'sft'}", f"model.reward={reward}", "data.prompts=p",
                                        "model.lora.r=4", "model.lora.alpha=8", "model.critic_mode=adapter",
                                        f"model.critic_init={critic_init}", "run.concurrent_roles=false", *extra])
    return load_roles("ppo", cfg, torch.device("cpu"))


@pytest.fixture
def roles(tiny_lm):
    torch.manual_seed(0)
    return _shared_roles(tiny_lm, tiny_lm / "rm")


def test_settings_are_validated():
    assert LoraSettings().target_modules == "all-linear"
    config = LoraSettings(r=2, alpha=3.0, dropout=0.1, target_modules=["q_proj", "v_proj"]).peft_config()
    got = (config.r, config.lora_alpha, config.lora_dropout, sorted(config.target_modules))
    assert got == (2, 3.0, 0.1, ["q_proj", "v_proj"])
    bad = [({"r": 0}, "model.lora.r"), ({"r": 2.0}, "model.lora.r"), ({"alpha": 0}, "model.lora.alpha"),
           ({"dropout": 1.0}, "model.lora.dropout"), ({"dropout": -0.1}, "model.lora.dropout"),
           ({"target_modules": "q_proj"}, "model.lora.target_modules"),
           ({"target_modules": []}, "model.lora.target_modules")]
    for kwargs, key in bad:  # one check, the config section's, also for a section built in Python
        with pytest.raises(ConfigError, match=key):
            LoraSettings.from_config(LoraConfig(**kwargs))
    assert LoraSettings.from_config(LoraConfig(r=2, alpha=3, target_modules=["q_proj"])) == LoraSettings(
        r=2, alpha=3.0, target_modules=("q_proj",))
    assert LoraSettings.from_config(None) is None


def test_the_lora_messages_are_the_config_loaders(tmp_path):
    """A bad model.lora from the command line and from Python: the same one-line message."""
    base = ["model.policy=p", "model.reward=r", "data.prompts=p"]
    cases = {"model.lora.alpha=0.0": "model.lora.alpha: must be > 0, got 0.0",
             "model.lora.dropout=1.0": "model.lora.dropout: must be in [0, 1), got 1.0",
             "model.lora.r=0": "model.lora.r: must be an integer >= 1, got 0",
             "model.lora.target_modules=[]": "model.lora.target_modules: a non-empty list of module names or "
                                             "'all-linear'"}
    for override, message in cases.items():
        with pytest.raises(ConfigError) as loaded:
            load_config(PPOConfig, None, [*base, override])
        assert str(loaded.value).endswith(message), (str(loaded.value), message)
        key, value = override.split("=")
        field = key.rsplit(".", 1)[1]
        value = [] if value == "[]" else float(value) if "." in value else int(value)
        with pytest.raises(ConfigError) as built:
            LoraSettings.from_config(LoraConfig(**{field: value}))
        assert str(built.value) == message


def test_reference_is_the_base_exactly_after_the_policy_trained(roles, tiny_lm):
    plain = load_causal_lm(str(tiny_lm / "sft"))
    ids, attn = _batch()
    _train_policy(roles.policy)
    assert all(bool(p.abs().sum() > 0) for k, p in roles.policy.named_parameters() if "lora_B" in k)
    with torch.no_grad():
        with roles.base.adapters_disabled():
            ref_logits = _logits(roles.base.lm, ids, attn)
        assert torch.equal(ref_logits, _logits(plain, ids, attn))
        assert not torch.allclose(_logits(roles.policy, ids, attn), ref_logits)  # the adapter is active
    want = FrozenReference(plain).logprobs(ids, attn, 4, 0.7)
    assert torch.equal(roles.reference.logprobs(ids, attn, 4, 0.7), want)


def test_base_gets_no_gradient(roles):
    before = {n: p.detach().clone() for n, p in _base_weights(roles.base).items()}
    _train_policy(roles.policy)
    ids, attn = _batch()
    opt = torch.optim.AdamW(roles.critic.parameters(), lr=1e-2)
    for _ in range(2):
        roles.critic.response_values(ids, attn, 4).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for name, p in _base_weights(roles.base).items():
        assert p.grad is None and not p.requires_grad, name
        assert torch.equal(p, before[name]), name


def test_both_adapters_and_the_value_head_get_gradients(roles):
    policy, critic = roles.policy, roles.critic
    torch.manual_seed(3)
    critic.reset_head("normal")  # a zero head would pass no gradient to the critic's adapter
    policy_params = dict(policy.named_parameters())
    critic_params = dict(critic.named_parameters())
    assert not {id(p) for p in policy_params.values()} & {id(p) for p in critic_params.values()}
    ids, attn = _batch()
    roles.reference.logprobs(ids, attn, 4)  # peft's disable/enable must not freeze either adapter
    response_logprobs(policy, ids, attn, 4)[0].mean().backward()
    assert all(p.grad is not None for p in policy_params.values())
    assert all(bool(p.grad.abs().sum() > 0) for k, p in policy_params.items() if "lora_B" in k)
    assert all(p.grad is None for p in critic_params.values())
    policy.zero_grad(set_to_none=True)
    critic.response_values(ids, attn, 4).pow(2).mean().backward()
    assert all(p.grad is not None for p in critic_params.values())
    assert bool(critic.head.weight.grad.abs().sum() > 0)
    assert all(bool(p.grad.abs().sum() > 0) for k, p in critic_params.items() if "lora_B" in k)
    assert all(p.grad is None for p in policy_params.values())
    critic.zero_grad(set_to_none=True)
    # switching adapters between a forward and its backward loses no gradient (peft's set_adapter
    # would leave the inactive adapter with requires_grad=False), and an optimizer built now sees all
    policy_loss = response_logprobs(policy, ids, attn, 4)[0].mean()
    value_loss = critic.response_values(ids, attn, 4).pow(2).mean()
    assert all(p.requires_grad for p in [*policy_params.values(), *critic_params.values()])
    (policy_loss + value_loss).backward()
    assert all(p.grad is not None for p in [*policy_params.values(), *critic_params.values()])


def test_roles_share_one_copy_of_the_base(tiny_lm, tmp_path):
    _write_lora_reward(tiny_lm, tmp_path / "rm-lora")
    roles = _shared_roles(tiny_lm, tmp_path / "rm-lora", "reward")
    lms = [roles.policy.base.lm, roles.reference.base.lm, roles.critic.base.lm, roles.reward_model.base.lm]
    assert len({lm.get_input_embeddings().weight.data_ptr() for lm in lms}) == 1
    embedding = lms[0].get_input_embeddings().weight
    owned = [p for role in (roles.policy, roles.critic, roles.reward_model) for p in role.parameters()]
    assert not any(p.data_ptr() == embedding.data_ptr() for p in owned)
    base_numel = sum(p.numel() for p in _base_weights(roles.base).values())
    assert sum(p.numel() for p in owned) < base_numel / 2  # the roles own adapters and heads only
    assert roles.base.adapters == ["policy", "reward", "critic"]


def test_export_merged_and_adapter_directories(roles, tiny_lm, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _train_policy(roles.policy)
    ids, attn = _batch()
    save_pretrained_atomic(lambda d: save_merged(roles.policy, d), tmp_path / "policy")
    save_pretrained_atomic(lambda d: save_adapter(roles.policy, d), tmp_path / "policy-adapter")
    for d in ("policy", "policy-adapter"):
        assert not list((tmp_path / d).glob("*.bin")) and list((tmp_path / d).glob("*.safetensors"))
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    plain = AutoModelForCausalLM.from_pretrained(tiny_lm / "sft")
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_lm / "sft"),
                                        tmp_path / "policy-adapter")
    with torch.no_grad():
        want = _logits(roles.policy, ids, attn)
        torch.testing.assert_close(_logits(merged, ids, attn), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(_logits(adapted, ids, attn), want, atol=1e-6, rtol=1e-6)
        with roles.base.adapters_disabled():  # exporting merged nothing into the base in memory
            assert torch.equal(_logits(roles.base.lm, ids, attn), _logits(plain, ids, attn))


def test_exports_from_the_gathered_base_are_the_live_exports(roles, tmp_path):
    """What rank 0 writes under torchrun (from the base runner's state dict gathered whole, the
    deltas by lora_delta) is, in one process, what the live export writes, bit for bit: the policy
    and the adapter critic, merged and adapter; lora_delta is peft's get_delta_weight, in bf16 too."""
    import safetensors.torch
    from peft.tuners.lora import Linear

    from fourfold.models.lora.files import lora_delta

    _train_policy(roles.policy)
    gathered = {k: t.detach().clone() for k, t in roles.base.runner.state_dict().items()}
    for role, name in ((roles.policy, "policy"), (roles.critic, "critic")):
        for writer in (save_merged, save_adapter):
            writer(role, tmp_path / f"{name}-{writer.__name__}-live")
            writer(role, tmp_path / f"{name}-{writer.__name__}-gathered", gathered)
            files = sorted(p.name for p in (tmp_path / f"{name}-{writer.__name__}-live").glob("*.safetensors"))
            for file in files:
                live, got = (safetensors.torch.load_file(str(tmp_path / f"{name}-{writer.__name__}-{k}" / file))
                             for k in ("live", "gathered"))
                assert live.keys() == got.keys() and all(torch.equal(live[k], got[k]) for k in live), (name, file)
    layer = next(m for m in roles.base.lm.modules() if isinstance(m, Linear))
    for dtype in (torch.float32, torch.bfloat16):
        layer.lora_A["policy"].to(dtype), layer.lora_B["policy"].to(dtype)
        a, b = layer.lora_A["policy"].weight, layer.lora_B["policy"].weight
        assert torch.equal(lora_delta(layer, "policy", a.detach().clone(), b.detach().clone()),
                           layer.get_delta_weight("policy"))


def _write_lora_reward(tiny_lm, out, seed: int = 5):
    """What a LoRA reward run writes: the reward stage's adapter role on the SFT model's backbone,
    'trained' (random B and head), normalised (a shift in fourfold_score.json). Returns the role."""
    torch.manual_seed(seed)
    cfg = load_config(RewardConfig, None, [f"model.path={tiny_lm / 'sft'}", "data.train=p", "model.lora.r=4",
                                           "model.lora.alpha=8"])
    rm = load_roles("reward", cfg, torch.device("cpu")).reward_model
    assert isinstance(rm, AdapterScalarModel)  # the type PPO loads
    with torch.no_grad():
        for name, p in rm.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    rm.set_affine(2.0, 0.5)
    save_pretrained_atomic(lambda d: save_adapter(rm, d), out)
    return rm


def test_lora_reward_round_trip(tiny_lm, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    rm = _write_lora_reward(tiny_lm, tmp_path / "rm-lora")
    assert json.loads((tmp_path / "rm-lora" / "adapter_config.json").read_text())["task_type"] == "SEQ_CLS"
    assert json.loads((tmp_path / "rm-lora" / SCORE_FILE).read_text()) == {"fourfold_score_shift": 0.5}
    ids, attn = _batch()
    with torch.no_grad():
        want = rm.score(ids, attn)
    roles = _shared_roles(tiny_lm, tmp_path / "rm-lora", "reward")
    torch.testing.assert_close(roles.reward(ids, attn), want, atol=1e-6, rtol=1e-6)
    assert all(not p.requires_grad for p in roles.reward_model.parameters())
    with torch.no_grad():  # critic_init: reward -> the critic starts as the reward model
        torch.testing.assert_close(roles.critic(ids, attn), roles.reward_model(ids, attn))
    # the directory is a plain peft SEQ_CLS adapter: peft's own forward pools the last token (no left padding)
    seq_cls = AutoModelForSequenceClassification.from_pretrained(tiny_lm / "sft", num_labels=1)
    seq_cls.config.pad_token_id = 0
    peft_rm = PeftModel.from_pretrained(seq_cls, tmp_path / "rm-lora")
    with torch.no_grad():
        logits = peft_rm(input_ids=ids[1:], attention_mask=attn[1:]).logits.squeeze(-1)
    torch.testing.assert_close(logits + 0.5, want[1:], atol=1e-5, rtol=1e-5)
    # merged: a plain sequence classifier with the shift in config.json
    save_pretrained_atomic(lambda d: save_merged(rm, d), tmp_path / "rm-merged")
    with torch.no_grad():
        merged = ScalarModel(load_sequence_scorer(str(tmp_path / "rm-merged"))).score(ids, attn)
    torch.testing.assert_close(merged, want, atol=1e-5, rtol=1e-5)


def test_reward_keys_move_between_backbone_prefixes(tiny_lm):
    lm = load_causal_lm(str(tiny_lm / "sft"))
    assert backbone_prefixes(lm) == ("model", "model")  # Llama: only the head differs
    a, b, h = torch.zeros(2, 8), torch.zeros(8, 2), torch.zeros(1, 8)
    state = {"base_model.model.transformer.h.0.attn.c_attn.lora_A.weight": a,
             "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight": b,
             "base_model.model.score.weight": h}
    backbone, head = split_reward_state(state, "transformer", "model")
    assert backbone == {"model.h.0.attn.c_attn.lora_A.weight": a, "model.h.0.attn.c_attn.lora_B.weight": b}
    assert head == {"score.weight": h}
    renamed = rename_target_modules({"transformer.h.0.attn.c_attn", "c_proj"}, "transformer", "model")
    assert renamed == ["c_proj", "model.h.0.attn.c_attn"]
    assert rename_target_modules("all-linear", "transformer", "model") == "all-linear"
    with pytest.raises(ModelLoadError):
        split_reward_state({"score.weight": h}, "model", "model")


def test_reward_adapter_from_another_base_is_refused(tiny_lm, tmp_path):
    _write_lora_reward(tiny_lm, tmp_path / "rm-lora")
    other = random_causal_lm(llama_config(70, hidden=32, layers=1, heads=2), seed=0)
    with pytest.raises(ModelLoadError, match="same base"):
        load_reward_adapter(SharedBase(other, SETTINGS), tmp_path / "rm-lora")


def test_rollout_runs_on_the_shared_roles_one_at_a_time(roles, tiny_lm):
    ids, attn = _batch()
    assert accepts_kwarg(roles.policy, "logits_to_keep")
    samples = sample(roles.policy, ids[:, :5], attn[:, :5], max_new_tokens=3, pad_token_id=0,
                     generator=torch.Generator().manual_seed(0))
    scores = score_rollout(samples, reference=roles.reference, reward=roles.reward, critic=roles.critic)
    assert scores.values.shape == scores.ref_logprobs.shape == samples.logprobs.shape and scores.scores.shape == (3,)
    with pytest.raises(ConfigError, match="concurrent"):
        _shared_roles(tiny_lm, tiny_lm / "rm", "policy", "run.concurrent_roles=true")
    with roles.base.activate("critic"):  # a second role while one runs: refused, never the wrong adapter
        with pytest.raises(AdapterConcurrencyError):
            roles.policy(input_ids=ids, attention_mask=attn)
        with pytest.raises(AdapterConcurrencyError):
            roles.reference.logprobs(ids, attn, 4)


def test_adapter_roles_checkpoint_round_trip(roles, tmp_path):
    _train_policy(roles.policy)
    with torch.no_grad():
        roles.critic.head.weight.normal_()
    modules = {"policy": roles.policy, "critic": roles.critic}
    saved = {k: {n: t.clone() for n, t in m.state_dict().items()} for k, m in modules.items()}
    save_checkpoint(tmp_path, 1, modules=modules)
    with torch.no_grad():
        for m in modules.values():
            for p in m.parameters():
                p.zero_()
    load_checkpoint(tmp_path / "checkpoints" / "step-00000001", modules=modules)
    for k, m in modules.items():
        assert saved[k].keys() == m.state_dict().keys()
        assert all(torch.equal(saved[k][n], t) for n, t in m.state_dict().items())


def test_qwen2_base(tmp_path):
    """'all-linear' finds Qwen2's projections (with their q/k/v biases) without any module names; the
    merged export of a model with tied embeddings keeps them tied."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True)  # as Qwen2.5-0.5B
    plain = random_causal_lm(config, seed=0)
    base = SharedBase(random_causal_lm(config, seed=0), SETTINGS)
    policy = AdapterLM(base)
    critic = add_critic(base, SETTINGS)
    assert any(k.endswith("q_proj/lora_A/weight") for k in policy.lora.weights)
    assert len(policy.lora.weights) == len(critic.lora.weights) == 2 * 7 * 2  # A and B, 7 linears, 2 layers
    _train_policy(policy)
    ids, attn = _batch(vocab=64)
    with torch.no_grad():
        with base.adapters_disabled():
            assert torch.equal(_logits(base.lm, ids, attn), _logits(plain, ids, attn))
        save_pretrained_atomic(lambda d: save_merged(policy, d), tmp_path / "merged")
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
        assert merged.lm_head.weight.data_ptr() == merged.get_input_embeddings().weight.data_ptr()
        torch.testing.assert_close(_logits(merged, ids, attn), _logits(policy, ids, attn), atol=1e-5, rtol=1e-5)
