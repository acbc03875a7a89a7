"""`fourfold estimate` at the library level: exact parameter counts against instantiated models,
model-state bytes against the tensors one optimizer step allocates, the per-layer activation
formula against what autograd saves, the JSON shape and the table's fits line."""
import contextlib
import json
import subprocess
import sys
import warnings

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
)

from fourfold.config import PPOConfig, SFTConfig, load_config
from fourfold.models.estimate.memory import ROLES, Workload, estimate, layer_activation_bytes_per_token
from fourfold.models.estimate.params import count_lora, shape_of
from fourfold.models.plan import LoraSettings, plan_roles
from fourfold.models.roles import response_logprobs
from fourfold.run.optim import make_optimizer

SMALL = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)
CONFIGS = {
    "llama": lambda: LlamaConfig(**SMALL, num_key_value_heads=2, intermediate_size=48),
    "qwen2": lambda: Qwen2Config(**SMALL, num_key_value_heads=2, intermediate_size=48, tie_word_embeddings=True),
    "gpt2": lambda: GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                               bos_token_id=0, eos_token_id=1),
    "mistral": lambda: MistralConfig(**SMALL, num_key_value_heads=1, intermediate_size=40, sliding_window=None),
}
TARGETS = {"llama": ["q_proj", "v_proj"], "qwen2": "all-linear", "gpt2": "all-linear", "mistral": "all-linear"}


def ppo_plan(policy, *overrides, reward=None, critic=True, lora=None, reward_adapter=None):
    """The role plan of a PPO config whose models are config objects (named ``policy-config`` and
    ``reward-config`` in the config) and the map the estimate reads them from: the reward model
    ``reward`` (a function when None), or a LoRA adapter directory ``reward_adapter``; a critic
    (from the reward model, else the policy) unless ``critic`` is false; ``lora`` a ``model.lora``."""
    configs = {"policy-config": policy}
    keys = ["model.policy=policy-config", "data.prompts=p"]
    if reward_adapter is not None:
        keys.append(f"model.reward={reward_adapter}")
    elif reward is not None:
        configs["reward-config"] = reward
        keys.append("model.reward=reward-config")
    else:
        keys.append("model.reward_fn=m:f")
    if not critic:
        keys += ["ppo.advantage=grpo", "ppo.samples_per_prompt=2"]
    elif reward is None and reward_adapter is None:
        keys.append("model.critic_init=policy")
    if lora is not None:
        targets = lora.target_modules if isinstance(lora.target_modules, str) else f"[{','.join(lora.target_modules)}]"
        keys += [f"model.lora.r={lora.r}", f"model.lora.dropout={lora.dropout}", f"model.lora.target_modules={targets}"]
    cfg = load_config(PPOConfig, None, keys + list(overrides))
    return plan_roles("ppo", cfg), configs


def estimate_of(policy, *overrides, workload=None, **kw):
    """The estimate of :func:`ppo_plan`'s plan under ``workload``."""
    plan, configs = ppo_plan(policy, *overrides, **kw)
    return estimate(plan, workload, configs)


@pytest.fixture(scope="module")
def reward_adapter(tmp_path_factory):
    """A directory that reads as a LoRA reward adapter (the estimate reads none of it)."""
    path = tmp_path_factory.mktemp("reward-adapter")
    (path / "adapter_config.json").write_text("{}")
    return path


def numel(params) -> int:
    return sum(p.numel() for p in params)


def scorer(cfg):
    cfg = cfg.__class__.from_dict(cfg.to_dict())
    cfg.num_labels = 1
    return AutoModelForSequenceClassification.from_config(cfg)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_full_mode_counts_are_exact(arch):
    cfg = CONFIGS[arch]()
    roles = estimate_of(cfg, reward=cfg).roles
    lm, sc = AutoModelForCausalLM.from_config(cfg), scorer(cfg)
    for name, model in (("policy", lm), ("reference", lm), ("reward", sc), ("critic", sc)):
        assert roles[name].params == numel(model.parameters()), name
    assert roles["policy"].trainable_params == numel(lm.parameters())
    assert roles["critic"].trainable_params == numel(sc.parameters())
    assert roles["reference"].trainable_params == roles["reward"].trainable_params == 0


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_lora_counts_are_exact(arch, reward_adapter):
    """Policy = base + adapter (what get_peft_model builds); critic = backbone + its own adapter
    (add_adapter) + value head; reference = the base; reward adapter counted like the critic's."""
    cfg, targets = CONFIGS[arch](), TARGETS[arch]
    lora = LoraSettings(r=4, target_modules=targets)
    roles = estimate_of(cfg, "model.critic_mode=adapter", lora=lora, reward_adapter=reward_adapter).roles
    base = AutoModelForCausalLM.from_config(cfg)
    base_params = numel(base.parameters())
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=targets), adapter_name="policy")
    assert roles["policy"].params == numel(peft_model.parameters())
    assert roles["policy"].trainable_params == numel(p for p in peft_model.parameters() if p.requires_grad)
    peft_model.add_adapter("critic", LoraConfig(r=4, target_modules=targets))
    critic_adapter = numel(p for n, p in peft_model.named_parameters() if ".critic." in n)
    sc = scorer(cfg)
    head = numel((getattr(sc, "score", None) or sc.classifier).parameters())
    assert roles["critic"].trainable_params == critic_adapter + head
    assert roles["critic"].params == roles["reward"].params == numel(sc.parameters()) + critic_adapter
    assert roles["reference"].params == base_params and roles["reference"].trainable_params == 0
    assert roles["reference"].weights_bytes == 0  # the shared base is counted once, in the policy's weights


def test_counts_from_directories(tiny_lm):
    """Model sources as directories: only config.json is read."""
    cfg = load_config(PPOConfig, None, [f"model.policy={tiny_lm / 'sft'}", f"model.reward={tiny_lm / 'rm'}",
                                        "data.prompts=p"])
    roles = estimate(plan_roles("ppo", cfg)).roles
    assert roles["policy"].params == numel(AutoModelForCausalLM.from_pretrained(tiny_lm / "sft").parameters())
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_lm / "rm", num_labels=1)
    assert roles["reward"].params == roles["critic"].params == numel(rm.parameters())


def allocated_bytes(models, optimizers) -> int:
    """Bytes of the distinct storages behind parameters, gradients and optimizer state."""
    tensors = [p for m in models for p in m.parameters()]
    tensors += [p.grad for p in tensors if p.grad is not None]
    tensors += [v for opt in optimizers for state in opt.state.values() for v in state.values() if torch.is_tensor(v)]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def model_state_bytes(estimate) -> int:
    return sum(r.weights_bytes + r.grads_bytes + r.optimizer_bytes for r in estimate.roles.values())


def one_step(model, params, loss_fn, ids):
    opt = make_optimizer(params, lr=1e-3)
    loss_fn(model, ids).backward()
    opt.step()  # no zero_grad: the gradients stay allocated for the measurement
    return opt


def lm_loss(model, ids):
    return model(input_ids=ids).logits.float().sum()


def tiny_llama():
    return LlamaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=96, max_position_embeddings=64, pad_token_id=0)


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16"])
def test_full_model_state_bytes_match_one_optimizer_step(precision):
    cfg = tiny_llama()
    trained = torch.bfloat16 if precision == "bf16" else torch.float32
    frozen = torch.float32 if precision == "fp32" else torch.bfloat16
    policy, critic = AutoModelForCausalLM.from_config(cfg, dtype=trained), scorer(cfg).to(trained)
    reference, reward = AutoModelForCausalLM.from_config(cfg, dtype=frozen), scorer(cfg).to(frozen)
    ids = torch.randint(0, 128, (2, 8))
    opts = [one_step(policy, policy.parameters(), lm_loss, ids), one_step(critic, critic.parameters(), lm_loss, ids)]
    measured = allocated_bytes([policy, critic, reference, reward], opts)
    frozen_dtype = ["model.frozen_dtype=bfloat16"] if precision == "bf16-mixed" else []
    est = estimate_of(cfg, f"model.precision={precision}", *frozen_dtype, reward=cfg)
    assert abs(model_state_bytes(est) - measured) <= 0.05 * measured, (model_state_bytes(est), measured)


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_shared_base_model_state_bytes_match_one_optimizer_step(precision):
    """One base with adapters policy and critic (+ value head), a separate frozen reward model."""
    cfg = tiny_llama()
    frozen = torch.float32 if precision == "fp32" else torch.bfloat16
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(AutoModelForCausalLM.from_config(cfg, dtype=frozen),
                           LoraConfig(r=4, target_modules=targets), adapter_name="policy")
    ids = torch.randint(0, 128, (2, 8))
    policy_opt = one_step(model, model.parameters(), lm_loss, ids)
    model.add_adapter("critic", LoraConfig(r=4, target_modules=targets))
    model.set_adapter("critic")
    head = torch.nn.Linear(cfg.hidden_size, 1, bias=False)

    def value_loss(m, x):
        return head(m.base_model.model.model(input_ids=x).last_hidden_state.float()).sum()

    critic_opt = one_step(model, [*model.parameters(), *head.parameters()], value_loss, ids)
    reward = scorer(cfg).to(frozen)
    measured = allocated_bytes([model, head, reward], [policy_opt, critic_opt])
    lora = LoraSettings(r=4, target_modules=targets)
    frozen_dtype = ["model.frozen_dtype=bfloat16"] if precision == "bf16-mixed" else []
    est = estimate_of(cfg, "model.critic_mode=adapter", "model.critic_init=policy", f"model.precision={precision}",
                      *frozen_dtype, reward=cfg, lora=lora)
    assert abs(model_state_bytes(est) - measured) <= 0.05 * measured, (model_state_bytes(est), measured)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_model_state_bytes_match_one_optimizer_step_for_each_architecture(arch, lora):
    """fp32, every architecture of the count tests (tied embeddings, GPT-2's Conv1D, GQA): full =
    four models, policy and critic stepped; LoRA = policy and critic adapters (+ value head) on one
    base, each stepped, and a separate frozen reward model."""
    cfg = CONFIGS[arch]()
    cfg.pad_token_id = 0  # the sequence classifiers pool the last non-pad token of a batch
    ids = torch.randint(2, cfg.vocab_size, (2, 8))
    if lora:
        targets = TARGETS[arch]
        model = get_peft_model(AutoModelForCausalLM.from_config(cfg), LoraConfig(r=4, target_modules=targets),
                               adapter_name="policy")
        policy_opt = one_step(model, model.parameters(), lm_loss, ids)
        model.add_adapter("critic", LoraConfig(r=4, target_modules=targets))
        model.set_adapter("critic")
        head = torch.nn.Linear(cfg.hidden_size, 1, bias=False)

        def value_loss(m, x):
            return head(m.base_model.model.base_model(input_ids=x).last_hidden_state).sum()

        critic_opt = one_step(model, [*model.parameters(), *head.parameters()], value_loss, ids)
        measured = allocated_bytes([model, head, scorer(cfg)], [policy_opt, critic_opt])
        settings = ppo_plan(cfg, "model.critic_mode=adapter", "model.critic_init=policy", reward=cfg,
                            lora=LoraSettings(r=4, target_modules=targets))
    else:
        policy, critic = AutoModelForCausalLM.from_config(cfg), scorer(cfg)
        opts = [one_step(policy, policy.parameters(), lm_loss, ids), one_step(critic, critic.parameters(), lm_loss, ids)]
        measured = allocated_bytes([policy, critic, AutoModelForCausalLM.from_config(cfg), scorer(cfg)], opts)
        settings = ppo_plan(cfg, reward=cfg)
    estimated = model_state_bytes(estimate(settings[0], configs=settings[1]))
    assert abs(estimated - measured) <= 0.05 * measured, (estimated, measured)


def saved_bytes(model, ids, mask, n_response, autocast: bool) -> int:
    """Bytes autograd saves for backward in the policy's forward (parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ctx = torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False) if autocast else contextlib.nullcontext()
    with ctx, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        response_logprobs(model, ids, mask, n_response)
    return sum(seen.values())


CASES = {  # name: (weights dtype, autocast, LoRA, checkpointing, residual bytes, compute bytes, peft input copy bytes)
    "fp32": (torch.float32, False, False, False, 4, 4, 0),
    "bf16": (torch.bfloat16, False, False, False, 2, 2, 0),
    "bf16-mixed": (torch.float32, True, False, False, 4, 2, 0),
    "fp32-checkpointing": (torch.float32, False, False, True, 4, 4, 0),
    "lora-fp32": (torch.float32, False, True, False, 4, 4, 0),
    "lora-bf16-mixed": (torch.bfloat16, True, True, False, 2, 2, 2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_activation_formula_matches_saved_tensors(case):
    """Per layer and token: (saved bytes with 3 layers - with 1 layer) / 2 / tokens, against the
    documented formula; under autocast the bf16 weight copies the Linears save are taken out (they
    are a separate term of the estimate)."""
    dtype, autocast, lora, ckpt, res, c, copy = CASES[case]
    b, s, T = 2, 24, 8
    ids = torch.randint(2, 97, (b, s))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    measured = {}
    for layers in (1, 3):
        torch.manual_seed(0)
        cfg = LlamaConfig(**{**SMALL, "hidden_size": 64, "num_hidden_layers": layers}, num_key_value_heads=2,
                          intermediate_size=176)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        if ckpt:
            model.gradient_checkpointing_enable()
        if lora:
            model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear")).base_model.model
        model.train()
        measured[layers] = saved_bytes(model, ids, mask, T, autocast)
    per_token = (measured[3] - measured[1]) / 2 / (b * s)
    if autocast:  # bf16 copies of one layer's fp32 Linear weights (LoRA: of the adapters) and of the mask
        layer_linear = sum(m.weight.numel() for n, m in model.named_modules()
                           if isinstance(m, torch.nn.Linear) and ".layers.1." in n and (not lora or "lora_" in n))
        per_token -= 2 * layer_linear / (b * s) + (0 if lora else 2 * s)
    shape = shape_of(cfg)
    lora_count = count_lora(cfg, 4, "all-linear") if lora else None
    want = res * shape.hidden if ckpt else layer_activation_bytes_per_token(
        shape, res, c, not lora, lora_count, copy, autocast_copies=autocast and not lora)
    assert abs(per_token - want) <= 0.05 * want, (per_token, want)


def test_json_has_exactly_the_documented_keys():
    cfg = tiny_llama()
    out = estimate_of(cfg, reward=cfg, critic=False).to_json()
    assert set(out) == {"roles", "per_device"}
    assert tuple(out["roles"]) == ROLES
    for role in out["roles"].values():
        assert set(role) == {"params", "trainable_params", "weights_bytes", "grads_bytes", "optimizer_bytes"}
        assert all(isinstance(v, int) for v in role.values())
    assert set(out["per_device"]) == {"generate_peak_bytes", "train_peak_bytes"}
    assert out["roles"]["critic"] == dict.fromkeys(out["roles"]["critic"], 0)  # no critic
    assert json.loads(json.dumps(out)) == out


def test_table_says_whether_it_fits():
    cfg = tiny_llama()
    est = estimate_of(cfg, reward=cfg)
    assert "fits" not in est.table()
    assert est.table(device_bytes=80 << 30, device_name="cuda:0").splitlines()[-1].startswith(
        "fits on cuda:0 (80.0 GiB):")
    small = est.peak_bytes - 1
    assert est.table(device_bytes=small, device_name="cuda:0").splitlines()[-1].startswith(
        f"does not fit on cuda:0 ({small / 2**30:.1f} GiB): 1 B over")
    assert all(name in est.table() for name in ROLES)


def test_levers_lower_the_estimate_and_devices_shard_the_trained_state(reward_adapter):
    cfg = LlamaConfig(vocab_size=32000, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, intermediate_size=4864)
    shape = dict(rollout_batch_size=64, minibatch_size=16, max_prompt_len=64, max_new_tokens=128)
    full = estimate_of(cfg, reward=cfg, workload=Workload(**shape))
    ckpt = estimate_of(cfg, "model.gradient_checkpointing=true", reward=cfg, workload=Workload(**shape))
    lora = estimate_of(cfg, "model.critic_mode=adapter", lora=LoraSettings(), reward_adapter=reward_adapter,
                       workload=Workload(**shape))
    mixed = estimate_of(cfg, "model.precision=bf16-mixed", "model.frozen_dtype=bfloat16", reward=cfg,
                        workload=Workload(**shape))
    resident = full.train["weights"] + full.train["AdamW state"]
    assert ckpt.train_peak_bytes - resident < 0.3 * (full.train_peak_bytes - resident)
    assert model_state_bytes(lora) < 0.2 * model_state_bytes(full) and lora.peak_bytes < 0.5 * full.peak_bytes
    assert mixed.roles["reference"].weights_bytes * 2 == full.roles["reference"].weights_bytes
    four = estimate_of(cfg, reward=cfg, workload=Workload(**shape, nproc=4))
    for name in ("policy", "critic"):
        for key in ("weights_bytes", "grads_bytes", "optimizer_bytes"):
            assert getattr(four.roles[name], key) == -(-getattr(full.roles[name], key) // 4)
    assert four.roles["reference"].weights_bytes == full.roles["reference"].weights_bytes
    sharded = estimate_of(cfg, "dist.reference=fsdp", "dist.reward=fsdp", reward=cfg, workload=Workload(**shape, nproc=4))
    assert sharded.roles["reference"].weights_bytes == -(-full.roles["reference"].weights_bytes // 4)


def test_kv_cache_term():
    """Sampling holds the KV cache 2 * layers * B * (P + T) * kv_heads * head_dim * bytes (plus one
    layer's worth while it grows): one more new token adds exactly that per position."""
    cfg = LlamaConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=24, num_attention_heads=8,
                      num_key_value_heads=4, intermediate_size=512)
    terms = [estimate_of(cfg, critic=False, workload=Workload(rollout_batch_size=32, max_prompt_len=64,
                                                              max_new_tokens=t)).generate for t in (256, 257)]
    per_position = 2 * 24 * 32 * 4 * 32 * 4
    key = "sampling (KV cache, logits)"
    assert terms[1][key] - terms[0][key] == per_position + per_position // 24


def test_what_the_estimate_does_not_cover_is_refused(tiny_lm):
    cfg = tiny_llama()
    with pytest.raises(ValueError, match="batch sizes, lengths and nproc must be >= 1"):
        estimate_of(cfg, reward=cfg, workload=Workload(minibatch_size=0))
    sft = load_config(SFTConfig, None, [f"model.path={tiny_lm / 'sft'}", "data.train=x"])
    with pytest.raises(ValueError, match="the memory estimate covers ppo and reinforce plans, not 'sft'"):
        estimate(plan_roles("sft", sft))


def test_importing_the_estimate_loads_no_heavy_or_upper_modules():
    """torch only at import; transformers and peft are imported when an estimate is made."""
    code = ("import sys, fourfold.models.estimate.memory\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('transformers', 'peft') or m.startswith("
            "('fourfold.trainers', 'fourfold.config', 'fourfold.rollout', 'fourfold.data', 'fourfold.cli'))]\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_engine_weights_terms(lora):
    """generation.weights: copy adds a resident inference copy of the policy (bf16 under bf16-mixed;
    a LoRA policy's copy is its base with the adapter merged); gathered adds, over N devices, the
    policy's other shards while sampling; live adds nothing."""
    config = CONFIGS["llama"]()
    kw = dict(reward=config, lora=LoraSettings(r=4) if lora else None)
    live = estimate_of(config, **kw)
    copy = estimate_of(config, **kw, workload=Workload(engine_weights="copy"))
    mixed = estimate_of(config, "model.precision=bf16-mixed", **kw, workload=Workload(engine_weights="copy"))
    base_params = live.roles["reference"].params  # the policy's model without any adapter
    key = "inference copy of the policy (generation.weights: copy)"
    assert copy.generate[key] == copy.train[key] == 4 * base_params
    assert mixed.generate[key] == 2 * base_params
    assert copy.generate_peak_bytes - live.generate_peak_bytes == 4 * base_params
    gathered = estimate_of(config, **kw, workload=Workload(engine_weights="gathered", nproc=4))
    if not lora:
        assert gathered.generate["policy gathered for the rollout (generation.weights: gathered)"] == 4 * base_params * 3 // 4
    assert not any("generation.weights" in k for k in live.generate)
    with pytest.raises(ValueError, match="engine_weights"):
        estimate_of(config, **kw, workload=Workload(engine_weights="server"))


def test_the_training_breakdown_says_where_the_peak_falls():
    """Full fine-tuning: a model large against its batch peaks at the end of backward (all its
    gradients; the activations freed: the table names them and their size); a small one at the
    start (the activations and logits are terms); several micro-batches in the last one's backward."""
    big = LlamaConfig(vocab_size=32000, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, intermediate_size=4864)
    est = estimate_of(big, reward=big, workload=Workload(rollout_batch_size=2, minibatch_size=1, max_prompt_len=8,
                                                          max_new_tokens=8))
    table = est.table()
    assert "activations (policy)" not in est.train and est.train["gradients (policy)"] == est.roles["policy"].grads_bytes
    note = [line for line in table.splitlines() if "peak is" in line]
    assert len(note) == 1 and note[0].startswith("  (the policy's peak is at the end of backward (every gradient): "
                                                 "its activations and logits (")
    assert note[0].endswith(" MiB) are freed by then)")
    assert table.index("backward workspace (policy)") < table.index(note[0]) < table.index("(live tensors")
    small = tiny_llama()
    est = estimate_of(small, reward=small, workload=Workload(rollout_batch_size=64, minibatch_size=64))
    assert est.train["activations (policy)"] > 0 and est.train_notes == [
        "the policy's peak is at the start of backward (activations and logits kept, the LM head's gradient)"]
    assert "  (the policy's peak is at the start of backward" in est.table()
    est = estimate_of(small, reward=small, workload=Workload(rollout_batch_size=64, minibatch_size=64,
                                                             micro_batch_size=16))
    assert est.train_notes == ["the policy's peak is in the last micro-batch's backward (the earlier micro-batches' "
                               "gradients, its activations)"]
    assert sum(est.train.values()) == est.train_peak_bytes  # the notes are no terms


KV_MODEL = dict(vocab_size=1000, hidden_size=256, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=4,
                intermediate_size=512)
SAMPLING = "sampling (KV cache, logits)"


def test_an_environment_runs_kv_cache_holds_the_whole_trajectory():
    """With env.max_tokens M the KV cache is 2 * layers * B * M * kv_heads * head_dim * bytes on the
    eager engine and M + 1 slots on the static one (its turn cache), plus one layer's worth while it
    grows; the rest of the sampling term (the first observation's prefill, one step's logits per
    row) is the single-turn run's."""
    cfg = LlamaConfig(**KV_MODEL)
    shape = dict(rollout_batch_size=32, max_prompt_len=64, max_new_tokens=32)
    single = estimate_of(cfg, critic=False, workload=Workload(**shape)).generate[SAMPLING]
    kv_single = 2 * 24 * 32 * (64 + 32) * 4 * 32 * 4
    rest = single - kv_single - kv_single // 24
    for engine, slots in (("eager", 1024), ("static", 1025)):
        w = Workload(**shape, env_max_tokens=1024, engine=engine)
        assert (w.prompt_tokens, w.response_tokens, w.seq_len, w.kv_positions) == (64, 960, 1024, slots)
        kv = 2 * 24 * 32 * slots * 4 * 32 * 4
        assert estimate_of(cfg, critic=False, workload=w).generate[SAMPLING] == kv + kv // 24 + rest
    short = Workload(**shape, env_max_tokens=40)  # the first observation leaves the policy a token
    assert (short.prompt_tokens, short.response_tokens, short.seq_len) == (39, 1, 40)
    with pytest.raises(ValueError, match="env_max_tokens"):
        estimate_of(cfg, critic=False, workload=Workload(env_max_tokens=1))
    with pytest.raises(ValueError, match="engine"):
        estimate_of(cfg, critic=False, workload=Workload(engine="vllm"))


def test_the_static_engines_turn_cache_is_the_estimated_size():
    """What the static engine allocates for a multi-turn rollout (StaticEngine.turns: RowSlots of
    env.max_tokens + 1 slots), in bytes, is the KV cache the estimate counts (fp32)."""
    from fourfold.rollout.static import StaticEngine

    config = LlamaConfig(**SMALL, num_key_value_heads=2, intermediate_size=48)
    model = AutoModelForCausalLM.from_config(config).eval()
    B, P, M = 3, 5, 20
    ids, mask = torch.randint(2, 97, (B, P)), torch.ones(B, P, dtype=torch.long)
    with torch.no_grad(), StaticEngine().turns(model, ids, mask, max_tokens=M) as cache:
        allocated = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.rows.cache.layers)
    w = Workload(rollout_batch_size=B, max_prompt_len=P, env_max_tokens=M, engine="static")
    assert allocated == 2 * 2 * B * w.kv_positions * 2 * 8 * 4 == 2 * 2 * B * (M + 1) * 2 * 8 * 4


def test_an_environment_run_of_the_single_turn_length_is_the_single_turn_estimate():
    """env.max_tokens = P + T: every term is the single-turn run's (the training forwards over the same
    P + T tokens, T of them scored) but the static engine's spare slot (one position of KV cache and
    its one-layer share); the description says the trajectory's length."""
    cfg = LlamaConfig(**KV_MODEL)
    shape = dict(rollout_batch_size=16, minibatch_size=8, micro_batch_size=4, max_prompt_len=48, max_new_tokens=80)
    for overrides in ((), ("model.precision=bf16-mixed", "model.gradient_checkpointing=true")):
        single = estimate_of(cfg, *overrides, critic=False, workload=Workload(**shape))
        for engine in ("eager", "static"):
            env = estimate_of(cfg, *overrides, critic=False, workload=Workload(**shape, env_max_tokens=128, engine=engine))
            assert env.train == single.train and env.roles == single.roles and env.train_notes == single.train_notes
            c = 2 if overrides else 4
            position = 2 * 24 * 16 * 4 * 32 * c  # one position of KV cache for the batch
            slot = position + position // 24 if engine == "static" else 0
            assert {k: v for k, v in env.generate.items() if k != SAMPLING} == {
                k: v for k, v in single.generate.items() if k != SAMPLING}
            assert env.generate[SAMPLING] - single.generate[SAMPLING] == slot
            cache = "KV cache 129 slots, static engine" if engine == "static" else "eager engine"
            assert env.description == single.description + f", trajectories of 128 tokens (env.max_tokens; {cache})"
