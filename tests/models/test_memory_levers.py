"""The memory levers (fourfold.models.levers; model.gradient_checkpointing, model.precision,
model.frozen_dtype, model.logits_chunk): each gives the loss and gradients of the run without it
(float tolerance; bf16 tolerance for the bf16 levers) and is really on (layers recomputed, forwards
in bf16, frozen weights in bf16, no full logits tensor)."""
import copy
import math
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fourfold.config import LMModelConfig, PPOConfig, load_config
from fourfold.errors import ConfigError
from fourfold.models.factory import llama_config, random_causal_lm, random_scalar_model
from fourfold.models.levers import (
    autocast_forwards,
    autocast_region,
    enable_gradient_checkpointing,
    role_dtypes,
    set_logits_chunk,
)
from fourfold.models.lora import AdapterLM, LoraSettings, SharedBase, add_critic
from fourfold.models.roles import AdapterDisabledReference, ScalarModel, response_logprobs
from fourfold.rollout.eager import sample

V, T = 211, 6


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.fixture(scope="module")
def cfg():
    return llama_config(V, hidden=32, layers=2, heads=4, intermediate=64, max_positions=64, pad_token_id=0, eos_token_id=1)


@pytest.fixture(scope="module")
def batch():
    """[4, 12] prompt + response ids, row 1 left-padded by 3."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, V, (4, 12), generator=g)
    attn = torch.ones_like(ids)
    ids[1, :3], attn[1, :3] = 0, 0
    return ids, attn


def policy_loss_grads(model, batch, with_entropy=False):
    """(log-probs, entropy, {name: grad}) of a loss on the response log-probs (as the surrogate's),
    minus an entropy bonus when ``with_entropy`` (the entropy keeps its graph)."""
    ids, attn = batch
    model.zero_grad(set_to_none=True)
    logprobs, entropy = response_logprobs(model, ids, attn, T, 0.7, with_entropy=with_entropy)
    loss = (logprobs * torch.linspace(-1, 1, T)).sum()
    if with_entropy:
        loss = loss - 0.5 * entropy.sum()
    loss.backward()
    entropy = entropy.detach() if with_entropy else None
    return logprobs.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def critic_loss_grads(critic, batch):
    ids, attn = batch
    critic.zero_grad(set_to_none=True)
    values = critic.response_values(ids, attn, T)
    ((values - 0.5) ** 2).mean().backward()
    return values.detach(), {n: p.grad.clone() for n, p in critic.named_parameters() if p.grad is not None}


def assert_same_grads(a, b, atol=1e-6):
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol, rtol=1e-5), (k, (a[k] - b[k]).abs().max())


def count_calls(module) -> list:
    """Count ``module``'s forwards, including the recomputations of gradient checkpointing (which
    call ``module.forward`` but skip module hooks)."""
    calls, forward = [], module.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    module.forward = counted
    return calls


# ---- gradient checkpointing ----------------------------------------------------------------------


def test_gradient_checkpointing_same_loss_and_gradients_full_models(cfg, batch):
    policy = random_causal_lm(cfg, seed=0).train()
    critic = ScalarModel(random_scalar_model(cfg, seed=1)).train()
    lp, _, grads = policy_loss_grads(policy, batch)
    values, cgrads = critic_loss_grads(critic, batch)
    policy2, critic2 = enable_gradient_checkpointing(copy.deepcopy(policy)), enable_gradient_checkpointing(copy.deepcopy(critic))
    calls, ccalls = count_calls(policy2.model.layers[0].mlp), count_calls(critic2.hf.model.layers[0].mlp)
    lp2, _, grads2 = policy_loss_grads(policy2, batch)
    values2, cgrads2 = critic_loss_grads(critic2, batch)
    assert torch.allclose(lp, lp2, atol=1e-6) and torch.allclose(values, values2, atol=1e-6)
    assert_same_grads(grads, grads2)
    assert_same_grads(cgrads, cgrads2)
    assert len(calls) == 2 and len(ccalls) == 2  # forward + recomputation in backward
    with torch.no_grad():  # no-grad passes (scoring) are not checkpointed
        critic2.response_values(*batch, T)
    assert len(ccalls) == 3


def lora_roles(cfg):
    """Policy and critic adapters over one shared base, adapters moved away from zero."""
    base = SharedBase(random_causal_lm(cfg, seed=0), LoraSettings(r=4))
    policy, critic = AdapterLM(base), add_critic(base, LoraSettings(r=4))
    torch.manual_seed(3)
    with torch.no_grad():
        for p in [*policy.parameters(), *critic.parameters()]:
            p.normal_(0.0, 0.1)
    return base, policy.train(), critic.train()


def test_gradient_checkpointing_with_lora_on_a_shared_base(cfg, batch):
    """Both adapters get the same gradients with checkpointing as without; the frozen base gets
    none; the base is recomputed in backward although no role registers it; generation (eval
    mode) keeps its KV cache and its output."""
    _, policy, critic = lora_roles(cfg)
    _, _, grads = policy_loss_grads(policy, batch)
    _, cgrads = critic_loss_grads(critic, batch)
    base2, policy2, critic2 = lora_roles(cfg)
    enable_gradient_checkpointing(policy2)
    enable_gradient_checkpointing(critic2)
    calls = count_calls(base2.lm.model.layers[0].mlp)
    _, _, grads2 = policy_loss_grads(policy2, batch)
    _, cgrads2 = critic_loss_grads(critic2, batch)
    assert_same_grads(grads, grads2)
    assert_same_grads(cgrads, cgrads2)
    assert len(calls) == 4  # policy and critic: forward + recomputation each
    assert all(p.grad is None for p in base2.lm.parameters() if not p.requires_grad)
    ids, attn = batch
    plain = sample(policy.eval(), ids[:, :6], attn[:, :6], max_new_tokens=4, greedy=True)
    ckpt = sample(policy2.eval(), ids[:, :6], attn[:, :6], max_new_tokens=4, greedy=True)
    assert torch.equal(plain.sequences, ckpt.sequences) and not base2.lm.training
    assert AdapterDisabledReference(base2).logprobs(ids, attn, T).shape == (4, T)


# ---- precision -----------------------------------------------------------------------------------


def test_role_dtypes():
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    assert role_dtypes("float32") == (f32, f32)
    assert role_dtypes("bfloat16") == (bf16, bf16)  # fp32 precision: the weights' own dtype
    assert role_dtypes("float32", "bf16-mixed") == (f32, bf16)  # frozen roles bf16 unless frozen_dtype says
    assert role_dtypes("float32", "bf16-mixed", "float32") == (f32, f32)
    assert role_dtypes("float32", "bf16-mixed", "float16") == (f32, f16)
    assert role_dtypes("float32", "bf16-mixed", "bfloat16") == (f32, bf16)
    assert role_dtypes("float32", "bf16") == (bf16, bf16)
    assert role_dtypes("float32", "fp32", "float16") == (f32, f16)


def test_precision_and_chunk_are_validated_before_loading():
    with pytest.raises(ConfigError, match="model.precision: bf16-mixed keeps float32 master weights"):
        LMModelConfig(policy="p", dtype="bfloat16", precision="bf16-mixed").validate()
    with pytest.raises(ConfigError, match="model.precision: bf16 conflicts"):
        LMModelConfig(policy="p", dtype="float16", precision="bf16").validate()
    with pytest.raises(ConfigError, match="model.logits_chunk"):
        LMModelConfig(policy="p", logits_chunk=0).validate()
    LMModelConfig(policy="p", precision="bf16-mixed", frozen_dtype="bfloat16", logits_chunk=64).validate()


def test_bf16_mixed_close_to_fp32_with_fp32_master_weights_and_gradients(cfg, batch):
    """Every forward of a hooked model runs under bf16 autocast (also in another thread), the
    weights and gradients stay float32, and loss and gradients match fp32 to bf16 precision."""
    policy = random_causal_lm(cfg, seed=0).train()
    lp, _, grads = policy_loss_grads(policy, batch)
    mixed = copy.deepcopy(policy)
    autocast_forwards([mixed], "cpu")
    autocast_forwards([mixed], "cpu")  # idempotent
    ids, attn = batch
    assert mixed(ids).logits.dtype == torch.bfloat16 and policy(ids).logits.dtype == torch.float32
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(lambda: mixed(ids).logits.dtype).result() == torch.bfloat16
    lp2, _, grads2 = policy_loss_grads(mixed, batch)
    assert lp2.dtype == torch.float32 and (lp - lp2).abs().max() < 0.02
    assert all(p.dtype == torch.float32 for p in mixed.parameters())
    for k in grads:
        assert grads2[k].dtype == torch.float32
        assert (grads[k] - grads2[k]).norm() <= 0.03 * grads[k].norm() + 1e-6, k
    assert not torch.is_autocast_enabled("cpu")  # every region the hooks opened is closed


def test_bf16_mixed_never_reuses_a_cast_weight_across_an_optimizer_step(cfg, batch):
    """After a step, a hooked forward computes with the new weights (the cast cache lives for one
    forward only), and a generation region's cache gives the same samples as per-forward casts."""
    ids, attn = batch
    model = random_causal_lm(cfg, seed=0).train()
    autocast_forwards([model], "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    policy_loss_grads(model, batch)
    opt.step()
    fresh = copy.deepcopy(model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = fresh(ids, attention_mask=attn).logits
    with torch.no_grad():
        assert torch.equal(model(ids, attention_mask=attn).logits, expected)
    model.eval()
    with autocast_region("bf16-mixed", "cpu"):
        cached = sample(model, ids[:, :6], attn[:, :6], max_new_tokens=4, greedy=True)
    per_forward = sample(model, ids[:, :6], attn[:, :6], max_new_tokens=4, greedy=True)
    assert torch.equal(cached.sequences, per_forward.sequences)


# ---- logits chunk --------------------------------------------------------------------------------


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor (bytes) any op creates while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def test_logits_chunk_same_logprobs_entropies_and_gradients(cfg, batch):
    policy = random_causal_lm(cfg, seed=0).train()
    lp, ent, grads = policy_loss_grads(policy, batch, with_entropy=True)
    chunked = copy.deepcopy(policy)
    set_logits_chunk(chunked, 5)
    lp2, ent2, grads2 = policy_loss_grads(chunked, batch, with_entropy=True)
    assert torch.allclose(lp, lp2, atol=1e-6) and torch.allclose(ent, ent2, atol=1e-6)
    assert_same_grads(grads, grads2)
    with torch.no_grad():  # the reference's no-grad pass
        ref = response_logprobs(policy, *batch, T, 0.7)[0]
        assert torch.allclose(ref, response_logprobs(chunked, *batch, T, 0.7)[0], atol=1e-6)
    _, policy_lora, _ = lora_roles(cfg)
    lp3, _, grads3 = policy_loss_grads(policy_lora, batch)
    set_logits_chunk(policy_lora, 7)
    lp4, _, grads4 = policy_loss_grads(policy_lora, batch)
    assert torch.allclose(lp3, lp4, atol=1e-6)
    assert_same_grads(grads3, grads4)


def test_logits_chunk_never_materialises_the_full_logits():
    """Forward and backward of the log-probs: without chunking the largest tensor is the logits
    [B, T+1, V] (float32); with 8 tokens per chunk nothing that large is ever created."""
    big = llama_config(4000, hidden=16, layers=1, heads=2, intermediate=32, max_positions=64, pad_token_id=0, eos_token_id=1)
    policy = random_causal_lm(big, seed=0).train()
    ids = torch.randint(2, 4000, (16, 12), generator=torch.Generator().manual_seed(0))
    logits_bytes = 16 * (T + 1) * 4000 * 4  # 1.8 MB
    peaks = {}
    for chunk in (None, 8):
        set_logits_chunk(policy, chunk)
        with LargestTensor() as mode:
            policy_loss_grads(policy, (ids, torch.ones_like(ids)))
        peaks[chunk] = mode.largest
    assert peaks[None] >= logits_bytes
    # what is left is the head's weight and its gradient (4000 x 16 floats: 256 kB)
    assert peaks[8] <= 4000 * 16 * 4 < logits_bytes / 4, peaks


def test_logits_chunk_refuses_models_that_transform_their_logits(cfg, batch):
    policy = random_causal_lm(cfg, seed=0)
    policy.config.final_logit_softcapping = 30.0
    set_logits_chunk(policy, 4)
    with pytest.raises(ConfigError, match="final_logit_softcapping"):
        response_logprobs(policy, *batch, T)
    with pytest.raises(ValueError):
        set_logits_chunk(policy, 0)


# ---- the levers in the trainers -------------------------------------------------------------------


def _ppo(tiny_lm, out, **model):
    over = {"model.policy": tiny_lm / "sft", "model.reward": tiny_lm / "rm", "model.critic_init": "reward",
            "data.prompts": tiny_lm / "prompts.jsonl", "ppo.iterations": 2, "ppo.rollout_batch_size": 8,
            "ppo.minibatch_size": 4, "ppo.ppo_epochs": 2, "generation.max_new_tokens": 6, "run.output_dir": out,
            "run.progress": False, "run.tensorboard": False, **{f"model.{k}": v for k, v in model.items()}}
    from fourfold.reporting import is_timing_key, read_metrics
    from fourfold.trainers.ppo import train

    train(load_config(PPOConfig, None, [f"{k}={v}" for k, v in over.items()]))
    return [{k: v for k, v in row.items() if not is_timing_key(k)} for row in read_metrics(out / "metrics.jsonl")]


def _close(rows, other, rel):
    assert len(rows) == len(other) == 2
    for a, b in zip(rows, other):
        assert a.keys() == b.keys()
        for k in a:
            assert math.isclose(a[k], b[k], rel_tol=rel, abs_tol=1e-6), (k, a[k], b[k])


def test_ppo_with_levers_matches_ppo_without(tiny_lm, tmp_path):
    """Two PPO iterations: gradient checkpointing and logits chunks change no metric beyond float
    rounding; bf16-mixed with bf16 frozen roles trains float32 weights and gives finite metrics."""
    plain = _ppo(tiny_lm, tmp_path / "plain")
    _close(plain, _ppo(tiny_lm, tmp_path / "ckpt", gradient_checkpointing="true", logits_chunk=16), 1e-4)
    mixed = _ppo(tiny_lm, tmp_path / "mixed", precision="bf16-mixed", frozen_dtype="bfloat16")
    assert all(math.isfinite(v) for row in mixed for v in row.values())
    model = LMModelConfig(policy=str(tiny_lm / "sft"), reward=str(tiny_lm / "rm"), critic_init="reward",
                          precision="bf16-mixed", frozen_dtype="bfloat16", gradient_checkpointing=True, logits_chunk=16)
    roles = _ppo_roles(model)  # the plan's levers applied by the loader
    assert roles.policy(torch.tensor([[1, 5]])).logits.dtype == torch.bfloat16
    default = _ppo_roles(LMModelConfig(policy=str(tiny_lm / "sft"), reward=str(tiny_lm / "rm")))
    assert {p.dtype for p in roles.reference.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in roles.reward_model.parameters()} == {torch.bfloat16}
    assert {p.dtype for m in (roles.policy, roles.critic) for p in m.parameters()} == {torch.float32}
    # the critic is copied from the reward model before the reward model takes the frozen dtype
    assert all(torch.equal(a, b) for a, b in zip(roles.critic.state_dict().values(), default.critic.state_dict().values()))
    _assert_bf16_reference_close(roles, default)


def _ppo_roles(model):
    """The roles of a PPO config with this model section (GAE: with a critic), from its role plan."""
    from fourfold.config import PPOConfig, PromptDataConfig, RunConfig
    from fourfold.models.build import load_roles

    cfg = PPOConfig(model=model, data=PromptDataConfig(prompts="p"), run=RunConfig(concurrent_roles=False))
    return load_roles("ppo", cfg, torch.device("cpu"))


def _assert_bf16_reference_close(roles, default):
    """The bf16 reference's log-probs come back in float32, within 0.1 of the float32 reference's."""
    ids = torch.tensor([[1, 5, 9, 13, 2, 7]])
    with torch.no_grad():
        ref16 = roles.reference.logprobs(ids, torch.ones_like(ids), 3)
        ref32 = default.reference.logprobs(ids, torch.ones_like(ids), 3)
    assert ref16.dtype == torch.float32 and (ref16 - ref32).abs().max() < 0.1


def test_bf16_mixed_loads_the_frozen_roles_in_bf16_unless_frozen_dtype_says(tiny_lm):
    """model.precision: bf16-mixed and no model.frozen_dtype: the reference and the reward model
    (with LoRA: the shared base) load in bf16, the trained roles in float32; frozen_dtype: float32
    keeps them float32; fp32 runs load every role as before (float32)."""
    from fourfold.config import LoraConfig

    kw = dict(policy=str(tiny_lm / "sft"), reward=str(tiny_lm / "rm"), critic_init="reward")

    def dtypes(roles):
        frozen = [*roles.reference.model.parameters(), *roles.reward_model.parameters()]
        return {p.dtype for p in frozen}, {p.dtype for m in (roles.policy, roles.critic) for p in m.parameters()}

    f32, bf16 = torch.float32, torch.bfloat16
    assert dtypes(_ppo_roles(LMModelConfig(**kw, precision="bf16-mixed"))) == ({bf16}, {f32})
    assert dtypes(_ppo_roles(LMModelConfig(**kw, precision="bf16-mixed", frozen_dtype="float32"))) == ({f32}, {f32})
    assert dtypes(_ppo_roles(LMModelConfig(**kw))) == ({f32}, {f32})
    lora = _ppo_roles(LMModelConfig(**kw, precision="bf16-mixed", lora=LoraConfig(r=4)))
    assert {p.dtype for n, p in lora.base.lm.named_parameters() if "lora_" not in n} == {bf16}


def test_lora_roles_put_the_shared_base_in_the_frozen_dtype(tiny_lm):
    """model.lora with model.frozen_dtype: the shared base (policy's base, the reference) and a full
    reward model in bf16; a separate critic that starts as the reward model is trained in float32,
    with the reward model's own float32 weights (loaded as such, not copied from the bf16 one)."""
    from fourfold.config import LoraConfig

    kw = dict(policy=str(tiny_lm / "sft"), reward=str(tiny_lm / "rm"), critic_init="reward", lora=LoraConfig(r=4))
    roles = _ppo_roles(LMModelConfig(**kw, frozen_dtype="bfloat16"))
    default = _ppo_roles(LMModelConfig(**kw))
    assert {p.dtype for n, p in roles.base.lm.named_parameters() if "lora_" not in n} == {torch.bfloat16}
    assert {p.dtype for p in default.base.lm.parameters()} == {torch.float32}
    assert {p.dtype for p in roles.reward_model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in roles.critic.parameters()} == {torch.float32}
    assert all(torch.equal(a, b) for a, b in zip(roles.critic.state_dict().values(), default.critic.state_dict().values()))
    _assert_bf16_reference_close(roles, default)


def test_sft_with_gradient_checkpointing_matches_sft_without(tmp_path):
    """Three SFT steps from scratch: the same loss rows with model.gradient_checkpointing; finite
    ones under bf16-mixed."""
    import json

    from fourfold.config import SFTConfig
    from fourfold.reporting import is_timing_key, read_metrics
    from fourfold.tasks.tokenizer import build_word_tokenizer
    from fourfold.trainers.sft import train

    words = [f"w{i}" for i in range(20)]
    build_word_tokenizer(words, tmp_path / "tok")
    with open(tmp_path / "train.jsonl", "w") as f:
        for i in range(8):
            f.write(json.dumps({"prompt": f"w{i} w{i + 1}", "completion": f"w{i + 2} w{i + 3} w{i}"}) + "\n")

    def run(name, *extra):
        cfg = load_config(SFTConfig, None, [
            "model.from_scratch=true", f"model.tokenizer={tmp_path / 'tok'}", "model.hidden_size=32",
            "model.num_layers=2", "model.num_heads=4", "model.max_positions=16", f"data.train={tmp_path / 'train.jsonl'}",
            "train.batch_size=4", "train.max_steps=3", "train.lr=1e-2", "train.max_len=16", "train.log_every=1",
            f"run.output_dir={tmp_path / name}", "run.progress=false", "run.tensorboard=false", *extra])
        train(cfg)
        return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in read_metrics(tmp_path / name / "metrics.jsonl")]

    plain, ckpt = run("plain"), run("ckpt", "model.gradient_checkpointing=true")
    assert len(plain) == 3
    for a, b in zip(plain, ckpt):
        assert a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=1e-5, abs_tol=1e-7) for k in a), (a, b)
    mixed = run("mixed", "model.precision=bf16-mixed")
    assert all(math.isfinite(r["sft/loss"]) for r in mixed) and abs(mixed[0]["sft/loss"] - plain[0]["sft/loss"]) < 0.05
