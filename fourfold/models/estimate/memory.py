"""Memory of a PPO run per device, before anything is loaded (``fourfold estimate``).

:func:`estimate_from_settings` takes an :class:`EstimateSettings` (the four roles' model sources,
the mode, precision, batch shape and number of devices; :meth:`EstimateSettings.from_plan` reads
them off a role plan) and returns an :class:`Estimate`: per role the parameter counts and the bytes
of weights, gradients and AdamW state, and per device the peak of the two phases of an iteration,
generation (weights, AdamW state, the KV cache and sampling logits or the largest scoring pass) and
training (weights, AdamW state, the gradients, activations and logits of the role that needs most).

Parameter counts are exact (:mod:`fourfold.models.estimate.params`: each model built from its
``config.json`` on the meta device, LoRA adapters as peft creates them); bytes follow the precision
(``fp32``, ``bf16-mixed``, ``bf16``) and ``frozen_dtype``; a shared LoRA base is counted once; FSDP
divides what it shards by the number of devices and adds its gather buffers; the rollout engine's
inference copy of the policy (``engine_weights``) is resident in both phases. The model in full, term
by term (with what it leaves out: the allocator's caching, CUDA workspaces, the tokenizer, the
rollout buffers), is in docs/estimate.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

from fourfold.core.logprobs import BLOCK_ELEMENTS  # elements of one float32 log-prob block
from fourfold.models.estimate.params import LoraCount, ModelSource, Shape, count_lora, count_model, load_config, shape_of
from fourfold.models.estimate.result import Estimate, RoleMemory
from fourfold.models.plan import LoraSettings

ROLES = ("policy", "reference", "reward", "critic")
PRECISIONS = ("fp32", "bf16-mixed", "bf16")
ENGINE_WEIGHTS = ("live", "gathered", "copy")
_DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


@dataclass
class EstimateSettings:
    """Everything the estimate needs; model sources are directories / hub names or config objects."""

    policy: ModelSource
    """The policy's model (in LoRA mode: the shared base)."""
    reference: Optional[ModelSource] = None
    """The reference's model; None = the same as the policy (in LoRA mode it is always the base)."""
    reward: Optional[ModelSource] = None
    """The reward model; None = a reward function (no model). Unused with ``reward_mode='adapter'``."""
    critic: Optional[ModelSource] = None
    """The critic's model; None = no critic. With ``critic_mode='adapter'`` it lives on the base
    and only whether this is None matters."""
    lora: Optional[LoraSettings] = None
    """None = full fine-tuning of every trained role; else the adapters' settings (r, target
    modules and dropout count)."""
    critic_mode: str = "separate"
    """With ``lora``: ``separate``, a full critic model trained in full; ``adapter``, adapter + value head on the base."""
    reward_mode: str = "separate"
    """With ``lora``: ``separate``, a full frozen reward model; ``adapter``, a frozen adapter + score head on the base."""
    precision: str = "fp32"
    """``fp32`` | ``bf16-mixed`` | ``bf16`` (see the module docstring)."""
    frozen_dtype: Optional[str] = None
    """dtype of frozen weights (float32 / bfloat16 / float16); None = fp32 for ``fp32``, else bf16."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer in backward instead of keeping its activations."""
    rollout_batch_size: int = 64
    """Prompts sampled per iteration (global: split across devices)."""
    minibatch_size: int = 16
    """Responses per optimizer step (global)."""
    micro_batch_size: Optional[int] = None
    """Responses per forward/backward (global); None = the whole minibatch at once."""
    max_prompt_len: int = 64
    """P: prompt tokens (left-padded to the longest)."""
    max_new_tokens: int = 32
    """T: response tokens (the estimate assumes every response reaches it)."""
    with_entropy: bool = False
    """The policy loss has an entropy bonus (entropy_coef > 0): one more logits-sized gradient."""
    concurrent_roles: bool = False
    """Policy and critic train at the same time (run.concurrent_roles)."""
    nproc: int = 1
    """Devices; FSDP shards the trained state across them."""
    shard_frozen: bool = False
    """FSDP also shards the frozen models of their own (else replicated on every device)."""
    replicated: tuple = ()
    """Trained roles placed ``replicate`` (``policy``, ``critic``): a full copy with its gradients and
    AdamW state on every device. With ``lora`` the shared base goes with the policy: sharded with
    every role on it (its frozen weights too), or replicated."""
    trust_remote_code: bool = False
    """Allow a config.json that needs the model repository's own code."""
    logits_chunk: Optional[int] = None
    """Tokens per chunk of the LM head in the log-prob passes (``model.logits_chunk``); None = all
    response positions at once."""
    engine_weights: str = "live"
    """Where the rollout engine's forwards take the policy's weights from (``generation.weights``):
    ``live``, the policy itself; ``gathered``, the policy with every FSDP unit kept gathered through
    the rollout (with ``nproc`` > 1: its whole weights on every device while sampling); ``copy``, a
    resident inference copy (bf16 under bf16-mixed and bf16, else the policy's weights dtype; a LoRA
    policy's copy is its base with the adapter merged)."""

    @classmethod
    def from_plan(cls, plan, *, nproc: int = 1, **shape) -> "EstimateSettings":
        """The settings of a role plan (:func:`fourfold.models.plan.plan_roles`: which roles, from
        where, full or adapter, dtypes, levers) run on ``nproc`` devices; ``shape``: the batch sizes
        and lengths (``rollout_batch_size``, ``minibatch_size``, ``max_prompt_len``, ...)."""
        import torch

        from fourfold.models.plan import ADAPTER, FULL

        policy = plan.base_source or plan.role("policy").source
        reference, reward, critic = plan.role("reference"), plan.role("reward"), plan.role("critic")
        trained = plan.trained_dtype
        frozen_full = [r for r in (reference, reward) if r.form == FULL]
        replicated = tuple(r.name for r in plan.roles if r.trained and (
            r.placement if r.form == FULL else plan.base_placement) == "replicate")
        return cls(
            policy=policy,
            reference=reference.source if reference.form == FULL and reference.source != policy else None,
            reward=reward.source if reward.form == FULL else None,
            critic=None if critic is None else (critic.source if critic.form == FULL else policy),
            lora=plan.lora, critic_mode="adapter" if critic is not None and critic.form == ADAPTER else "separate",
            reward_mode="adapter" if reward.form == ADAPTER else "separate",
            precision=plan.precision if trained == torch.float32 else "bf16",
            frozen_dtype=str(plan.frozen_dtype).removeprefix("torch."),
            gradient_checkpointing=plan.gradient_checkpointing, concurrent_roles=plan.concurrent, nproc=nproc,
            shard_frozen=any(r.placement == "fsdp" for r in frozen_full), replicated=replicated,
            trust_remote_code=plan.trust_remote_code, logits_chunk=plan.logits_chunk, **shape)

    def validate(self) -> None:
        """Raise ValueError on an inconsistent combination."""
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r}: expected one of {', '.join(PRECISIONS)}")
        if self.frozen_dtype is not None and self.frozen_dtype not in _DTYPE_BYTES:
            raise ValueError(f"frozen_dtype {self.frozen_dtype!r}: expected float32, bfloat16 or float16")
        sizes = (self.rollout_batch_size, self.minibatch_size, self.micro_batch_size or 1, self.logits_chunk or 1,
                 self.max_prompt_len, self.max_new_tokens, self.nproc)
        if min(sizes) < 1:
            raise ValueError("batch sizes, lengths and nproc must be >= 1")
        if self.engine_weights not in ENGINE_WEIGHTS:
            raise ValueError(f"engine_weights {self.engine_weights!r}: expected one of {', '.join(ENGINE_WEIGHTS)}")
        lora = self.lora
        if lora is None:
            return
        if self.critic_mode not in ("separate", "adapter") or self.reward_mode not in ("separate", "adapter"):
            raise ValueError("critic_mode and reward_mode: expected 'separate' or 'adapter'")
        if self.critic_mode == "adapter" and self.critic is None:
            raise ValueError("critic_mode='adapter' needs a critic (critic is None)")
        if self.reference is not None and self.reference != self.policy:
            raise ValueError("in LoRA mode the reference is the policy's base: leave reference None")


# ---------------------------------------------------------------------------------------------
# Roles
# ---------------------------------------------------------------------------------------------


@dataclass
class _Role:
    """A role's memory plus what the phase model needs to know about it."""

    memory: RoleMemory
    shape: Shape
    res_bytes: int  # bytes of the residual stream (the dtype of the model's own weights)
    trained: bool = False
    causal: bool = True  # an LM head (policy, reference) rather than a score head
    full: bool = True  # every weight trained (else LoRA: base frozen)
    cast_params: int = 0  # fp32 Linear parameters autocast casts to bf16 under bf16-mixed
    cast_layer: int = 0  # of which in one decoder layer
    layer_params: int = 0  # FSDP unit size
    sharded: bool = False
    head_grad_params: int = 0  # LM-head parameters whose gradient exists before the layers' (full policy)
    lora: Optional[LoraCount] = None


def _dtype_bytes(s: EstimateSettings) -> tuple[int, int, int]:
    """(trained master bytes, frozen bytes, compute bytes)."""
    master = 2 if s.precision == "bf16" else 4
    frozen = _DTYPE_BYTES[s.frozen_dtype] if s.frozen_dtype else (4 if s.precision == "fp32" else 2)
    compute = 4 if s.precision == "fp32" else 2
    return master, frozen, compute


def _shard(n: int, sharded: bool, nproc: int) -> int:
    return math.ceil(n / nproc) if sharded else n


def _sharded(s: EstimateSettings, name: str) -> bool:
    """Whether trained role ``name`` is sharded across the devices (not replicated); the roles on
    a shared LoRA base go with ``policy``."""
    return s.nproc > 1 and name not in s.replicated


def _trained_memory(params: int, trainable: int, tensors: int, frozen_params: int, s: EstimateSettings,
                    sharded: bool) -> RoleMemory:
    """Trainable parameters (and ``frozen_params`` in the frozen dtype: a LoRA base's own weights)
    sharded across devices when ``sharded``, else whole on every device."""
    master, frozen, _ = _dtype_bytes(s)
    n = s.nproc
    return RoleMemory(params=params, trainable_params=trainable,
                      weights_bytes=_shard(trainable * master, sharded, n) + _shard(frozen_params * frozen, sharded, n),
                      grads_bytes=_shard(trainable * master, sharded, n),
                      optimizer_bytes=_shard(2 * trainable * master + 4 * tensors, sharded, n))


def _frozen_memory(params: int, stored: int, s: EstimateSettings, sharded: Optional[bool] = None) -> RoleMemory:
    """``stored`` frozen parameters, sharded as ``sharded`` says (default: ``shard_frozen``)."""
    _, frozen, _ = _dtype_bytes(s)
    sharded = s.shard_frozen if sharded is None else sharded
    return RoleMemory(params=params, weights_bytes=_shard(stored * frozen, sharded, s.nproc))


def _casts(s: EstimateSettings, linear: int, layer_linear: int) -> dict:
    """The fp32 Linear parameters bf16 autocast copies (all, and one decoder layer's), as _Role kwargs."""
    mixed = s.precision == "bf16-mixed"
    return {"cast_params": linear if mixed else 0, "cast_layer": layer_linear if mixed else 0}


def _separate_roles(s: EstimateSettings, cfg_of) -> dict[str, Optional[_Role]]:
    """The reward model and critic that are models of their own (None where absent or adapters)."""
    master, frozen, _ = _dtype_bytes(s)
    roles: dict[str, Optional[_Role]] = {"reward": None, "critic": None}
    if s.reward is not None and (s.lora is None or s.reward_mode == "separate"):
        wcfg = cfg_of(s.reward)
        wc = count_model(wcfg, scorer=True)
        roles["reward"] = _Role(_frozen_memory(wc.total, wc.total, s), shape_of(wcfg), frozen, causal=False,
                                layer_params=wc.layer, sharded=s.nproc > 1 and s.shard_frozen)
    if s.critic is not None and (s.lora is None or s.critic_mode == "separate"):
        ccfg = cfg_of(s.critic)
        cc = count_model(ccfg, scorer=True)
        roles["critic"] = _Role(_trained_memory(cc.total, cc.total, cc.tensors, 0, s, _sharded(s, "critic")),
                                shape_of(ccfg), master, trained=True, causal=False, layer_params=cc.layer,
                                sharded=_sharded(s, "critic"),
                                **_casts(s, cc.linear, cc.layer_linear))
    return roles


def _full_roles(s: EstimateSettings, cfg_of) -> dict[str, Optional[_Role]]:
    """Four models of their own: policy and critic trained in full, reference and reward frozen."""
    master, frozen, _ = _dtype_bytes(s)
    pcfg = cfg_of(s.policy)
    pc, shape = count_model(pcfg), shape_of(pcfg)
    sharded = _sharded(s, "policy")
    policy = _Role(_trained_memory(pc.total, pc.total, pc.tensors, 0, s, sharded), shape, master, trained=True,
                   layer_params=pc.layer, sharded=sharded, head_grad_params=shape.vocab * shape.hidden,
                   **_casts(s, pc.linear, pc.layer_linear))
    rcfg = cfg_of(s.reference) if s.reference is not None else pcfg
    rc = pc if s.reference is None else count_model(rcfg)
    reference = _Role(_frozen_memory(rc.total, rc.total, s), shape_of(rcfg), frozen,
                      layer_params=rc.layer, sharded=s.nproc > 1 and s.shard_frozen)
    return {"policy": policy, "reference": reference, **_separate_roles(s, cfg_of)}


def _lora_roles(s: EstimateSettings, cfg_of) -> dict[str, Optional[_Role]]:
    """Policy, reference and (adapter-mode) critic and reward on one base; separate ones as in full mode."""
    lora = s.lora
    _, frozen, _ = _dtype_bytes(s)
    bcfg = cfg_of(s.policy)
    shape, base, lc = shape_of(bcfg), count_model(bcfg), count_lora(bcfg, lora.r, lora.target_modules, lora.dropout)
    fp32_base = frozen == 4  # autocast casts the base's Linears too
    per_layer = lc.params // max(1, shape.layers)
    casts = _casts(s, (base.linear if fp32_base else 0) + lc.params, (base.layer_linear if fp32_base else 0) + per_layer)
    common = dict(shape=shape, res_bytes=frozen, full=False, layer_params=base.layer, lora=lc)
    roles = _separate_roles(s, cfg_of)
    sharded = _sharded(s, "policy")  # the base, with every role on it (the frozen weights too)
    roles["policy"] = _Role(_trained_memory(base.total + lc.params, lc.params, lc.tensors, base.total, s, sharded),
                            trained=True, sharded=sharded, **common, **casts)
    roles["reference"] = _Role(RoleMemory(params=base.total), **common)
    if s.critic_mode == "adapter" or s.reward_mode == "adapter":
        sc = count_model(bcfg, scorer=True)
    if s.critic_mode == "adapter":
        trainable = lc.params + sc.head
        roles["critic"] = _Role(_trained_memory(sc.total + lc.params, trainable, lc.tensors + sc.head_tensors, 0, s,
                                                sharded), trained=True, causal=False, sharded=sharded, **common, **casts)
    if s.reward_mode == "adapter":
        roles["reward"] = _Role(_frozen_memory(sc.total + lc.params, lc.params + sc.head, s, sharded), causal=False,
                                **common)
    return roles


def _roles(s: EstimateSettings) -> dict[str, Optional[_Role]]:
    configs: dict[tuple, object] = {}

    def cfg_of(source):
        key = ("path", os.fspath(source)) if isinstance(source, (str, os.PathLike)) else ("object", id(source))
        if key not in configs:
            configs[key] = load_config(source, s.trust_remote_code)
        return configs[key]

    return _lora_roles(s, cfg_of) if s.lora is not None else _full_roles(s, cfg_of)


def _compute_bytes(role: _Role, s: EstimateSettings) -> int:
    """Bytes of a role's activations: bf16 under either bf16 precision, else its weights' dtype."""
    return role.res_bytes if s.precision == "fp32" else 2


# ---------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------


def layer_activation_bytes_per_token(shape: Shape, res: int, c: int, norms_trained: bool,
                                     lora: Optional[LoraCount] = None, lora_copy: int = 0,
                                     lora_dropout: bool = False, autocast_copies: bool = False) -> int:
    """Bytes one Llama-style decoder layer saves for backward, per token (what autograd keeps).

    With residual-stream bytes ``res``, compute bytes ``c`` (2 under bf16 autocast), hidden h,
    heads a of dim d, MLP width i::

        2 RMSNorms   2 * (4h          the input upcast to float32 (kept by the variance)
                          + res*h     the normalised input (kept by the weight product; only when
                                      the norm weight is trained, i.e. full fine-tuning)
                          + c*h       the output, input of q/k/v resp. gate/up; under autocast
                                      on an fp32 residual each Linear casts its own bf16 copy:
                                      3 (q, k, v) resp. 2 (gate, up) copies
                          + 4)        rsqrt
        attention    c * 4*a*d        q after RoPE, k and v repeated to a heads (transformers
                                      repeats them whenever a padding mask is given), the output
                                      (o_proj reads the same storage)
                     + 4*a            SDPA's log-sum-exp (no s x s scores with flash/efficient SDPA)
        MLP          c * 4*i          gate, silu(gate), up, silu(gate) * up (input of down_proj)
        LoRA         c * sum(r)       each adapted Linear's lora_A output
                     + (c+1) * sum(in)  with dropout: each adapted Linear's dropped input and mask

    LoRA assumes the adapters cover the attention and MLP input projections (e.g. ``all-linear``;
    fewer targets save less). When the adapters' dtype differs from the base's (bf16 base with fp32
    adapters, ``lora_copy`` = bytes of the cast), peft casts each adapted Linear's input for its
    adapter: those copies, ``lora_copy * sum(in_features)``, are kept instead of the norms' outputs
    and of ``silu(gate) * up``.

    With gradient checkpointing a layer keeps only its input (``res * h``) and this full amount
    exists for one layer at a time, while that layer is recomputed in backward.
    """
    h, a, d, i = shape.hidden, shape.heads, shape.head_dim, shape.intermediate
    linear_inputs = 0 if lora_copy else c * h * (5 if autocast_copies else 2)
    norms = 2 * (4 * h + (res * h if norms_trained else 0) + 4) + linear_inputs
    attention = c * 4 * a * d + 4 * a
    mlp = c * (3 if lora_copy else 4) * i
    adapters = 0
    if lora is not None:
        adapters = (c * lora.per_layer_rank_elems + lora_copy * lora.per_layer_in_features
                    + ((c + 1) * lora.per_layer_in_features if lora_dropout else 0))
    return norms + attention + mlp + adapters


def _lora_copy_bytes(role: _Role, s: EstimateSettings) -> int:
    """Bytes of peft's per-Linear input cast (0 when adapters and base share a dtype, no autocast)."""
    if role.lora is None:
        return 0
    master, frozen, _ = _dtype_bytes(s)
    if s.precision == "bf16-mixed":
        return 2 if frozen != 4 else 0  # autocast casts the adapter's input to bf16 for lora_A
    return master if master != frozen else 0


def _train_terms(role: _Role, s: EstimateSettings) -> dict[str, int]:
    """One role's training peak above the resident weights and AdamW state, as named terms.

    Activations A (all layers, the final norm, the head's input slice, the causal mask, RoPE
    tables), the LM-head part H (saved logits ``b * (T+1) * V * c``, two more logits-sized
    gradients (three with entropy), three float32 blocks) and gradients G. With one micro-batch
    the peak is the larger of the start of backward (A + H + the LM head's gradient) and its end
    (G); with several, the gradients of the earlier ones are resident: G + A + H. A backward
    workspace ``b * s * (2i + 2h) * c`` and, under bf16-mixed, the bf16 weight copies are added.
    """
    c = _compute_bytes(role, s)
    shape, n = role.shape, s.nproc
    micro = math.ceil((s.micro_batch_size or s.minibatch_size) / n)
    n_micro = math.ceil(math.ceil(s.minibatch_size / n) / micro)
    T = s.max_new_tokens
    seq = s.max_prompt_len + T
    tokens = micro * seq
    h, L = shape.hidden, shape.layers
    autocast_fp32 = s.precision == "bf16-mixed" and role.res_bytes == 4  # casts of fp32 activations
    per_layer = layer_activation_bytes_per_token(shape, role.res_bytes, c, role.full, role.lora,
                                                 _lora_copy_bytes(role, s), bool(s.lora and s.lora.dropout > 0),
                                                 autocast_fp32)
    if s.gradient_checkpointing:
        layers = L * tokens * role.res_bytes * h + tokens * per_layer
    else:
        layers = L * tokens * per_layer
    head_trained = role.full or not role.causal  # LoRA: the LM head is frozen; a critic trains its score head
    final = (tokens * (4 * h + 4 + (role.res_bytes * h if role.full else 0))
             + (micro * (T + 1) * h * c if head_trained else 0))  # final norm, the head's input slice
    # the mask (and its bf16 copy in every layer under autocast on fp32), RoPE's cos/sin
    fixed = (micro * seq * seq * (role.res_bytes + (2 * L if autocast_fp32 else 0))
             + 2 * tokens * shape.head_dim * role.res_bytes)
    acts = layers + final + fixed
    head = _logits_bytes(shape, micro, T, c, s.logits_chunk, 3 + int(s.with_entropy)) if role.causal else 0
    grads = role.memory.grads_bytes
    master = 2 if s.precision == "bf16" else 4
    head_grad = _shard(role.head_grad_params * master, True, n)
    if n_micro > 1 or grads > acts + head + head_grad:
        live = {"gradients": grads, "activations": acts, "logits": head} if n_micro > 1 else {"gradients": grads}
    else:
        live = {"gradients": head_grad, "activations": acts, "logits": head}
    live["backward workspace"] = tokens * (2 * shape.intermediate + 2 * h) * c
    if n == 1:  # the Linears keep their bf16 weight copies for backward (one layer's at a time with checkpointing)
        kept = role.cast_params - (L - 1) * role.cast_layer if s.gradient_checkpointing else role.cast_params
        live["autocast bf16 weight copies"] = 2 * kept
    return live


def _logits_bytes(shape: Shape, b: int, T: int, c: int, chunk: Optional[int], copies: int) -> int:
    """The LM head's part of a pass over b rows: ``copies`` logits-sized tensors ``b * (T+1) * V * c``
    (the logits, their gradients) and three float32 log-prob blocks. With ``logits_chunk``: the
    response positions' hidden states, the last position's logits (the model's own head) and
    ``copies`` tensors of one chunk of logits instead."""
    V = shape.vocab
    if not chunk:
        return copies * b * (T + 1) * V * c + 3 * min(T, max(1, BLOCK_ELEMENTS // V)) * V * 4
    rows = min(chunk, b * T)
    return (b * T * shape.hidden * c + b * V * c + copies * rows * V * c
            + 3 * min(rows, max(1, BLOCK_ELEMENTS // V)) * V * 4)


def _forward_bytes(role: _Role, b: int, seq: int, c: int) -> int:
    """Peak of one no-grad forward over ``b x seq`` tokens: the largest layer-local working set
    (residual, its copy, the normalised input and either q/k/v/output or three MLP-wide tensors:
    in a no-grad forward each intermediate is freed as soon as it is used), the mask and RoPE."""
    sh = role.shape
    attention = c * 4 * sh.heads * sh.head_dim
    mlp = c * 3 * sh.intermediate
    per_token = 2 * role.res_bytes * sh.hidden + c * sh.hidden + max(attention, mlp)
    return b * seq * per_token + b * seq * seq * role.res_bytes + 2 * b * seq * sh.head_dim * role.res_bytes


def _scoring_bytes(roles: dict[str, Optional[_Role]], s: EstimateSettings, b: int) -> int:
    """The largest scoring pass (reference with its logits and log-prob blocks; reward; critic)."""
    T = s.max_new_tokens
    seq = s.max_prompt_len + T
    passes = {}
    for name in ("reference", "reward", "critic"):
        role = roles[name]
        if role is None:
            continue
        rc = _compute_bytes(role, s)
        extra = 0
        if role.causal:
            extra = _logits_bytes(role.shape, b, T, rc, s.logits_chunk, 1) + b * seq * role.shape.hidden * rc
        passes[name] = _forward_bytes(role, b, seq, rc) + extra
    if s.concurrent_roles and "reference" in passes:  # the reference runs beside critic and reward
        return passes["reference"] + max([passes.get("reward", 0), passes.get("critic", 0)])
    return max(passes.values(), default=0)


def _sampling_bytes(policy: _Role, s: EstimateSettings, b: int) -> int:
    """KV cache (plus one layer while it grows) + the larger of the prefill and a sampling step."""
    sh = policy.shape
    c = _compute_bytes(policy, s)
    kv = 2 * sh.layers * b * (s.max_prompt_len + s.max_new_tokens) * sh.kv_heads * sh.head_dim * c
    prefill = _forward_bytes(policy, b, s.max_prompt_len, c) + b * sh.vocab * c
    step = b * sh.vocab * (c + 16)
    return kv + kv // sh.layers + max(prefill, step)


def _fsdp_bytes(roles: dict[str, Optional[_Role]], s: EstimateSettings, training: bool) -> int:
    """Gather buffers of the largest sharded model: two unsharded layers + the embedding (+ two
    layers of fp32 gradients being reduce-scattered, in training)."""
    if s.nproc == 1:
        return 0
    _, _, c = _dtype_bytes(s)
    sizes = [2 * r.layer_params * c + r.shape.vocab * r.shape.hidden * c
             + (2 * r.layer_params * 4 if training and r.trained and r.full else 0)
             for r in roles.values() if r is not None and r.sharded]
    return max(sizes, default=0)


COPY_TERM = "inference copy of the policy"


def _engine_terms(policy: _Role, s: EstimateSettings) -> dict[str, int]:
    """The rollout engine's weights beyond the policy's own, per device: an inference copy (resident:
    both phases), or with ``gathered`` over several devices the policy's other shards while sampling."""
    if s.engine_weights == "copy":
        params = policy.memory.params - (policy.lora.params if policy.lora is not None else 0)
        return {f"{COPY_TERM} (generation.weights: copy)": params * (policy.res_bytes if s.precision == "fp32" else 2)}
    if s.engine_weights == "gathered" and s.nproc > 1:
        _, _, c = _dtype_bytes(s)
        gathered = policy.memory.trainable_params * c * (s.nproc - 1) // s.nproc
        return {"policy gathered for the rollout (generation.weights: gathered)": gathered}
    return {}


def estimate_from_settings(settings: EstimateSettings) -> Estimate:
    """Per-role memory and the per-device peaks of generation and training for ``settings``."""
    s = settings
    s.validate()
    roles = _roles(s)
    memory = {name: (roles[name].memory if roles[name] is not None else RoleMemory()) for name in ROLES}
    resident = {"weights": sum(m.weights_bytes for m in memory.values()),
                "AdamW state": sum(m.optimizer_bytes for m in memory.values())}
    b = math.ceil(s.rollout_batch_size / s.nproc)
    sampling, scoring = _sampling_bytes(roles["policy"], s, b), _scoring_bytes(roles, s, b)
    generate = dict(resident)
    if s.nproc == 1:
        generate["autocast bf16 weight copies"] = 2 * sum(r.cast_params for r in roles.values() if r is not None and r.trained)
    generate["FSDP gather buffers"] = _fsdp_bytes(roles, s, training=False)
    generate["sampling (KV cache, logits)" if sampling >= scoring else "scoring passes"] = max(sampling, scoring)
    engine = _engine_terms(roles["policy"], s)
    generate.update(engine)
    trained = {name: _train_terms(roles[name], s) for name in ("policy", "critic") if roles[name] is not None}
    if s.concurrent_roles:
        live = {f"{k} ({name})": v for name, terms in trained.items() for k, v in terms.items()}
    else:
        name, terms = max(trained.items(), key=lambda kv: sum(kv[1].values()))
        live = {f"{k} ({name})": v for k, v in terms.items()}
    train = {**resident, **live, "FSDP gather/reduce buffers": _fsdp_bytes(roles, s, training=True)}
    train.update({k: v for k, v in engine.items() if k.startswith(COPY_TERM)})  # resident
    return Estimate(memory, generate, train, _describe(s))


def _describe(s: EstimateSettings) -> str:
    if s.lora is None:
        mode = "full fine-tuning"
    else:
        mode = (f"LoRA r={s.lora.r} on a shared base (critic {s.critic_mode}, "
                f"reward model {s.reward_mode})")
    own_critic = s.critic is not None and (s.lora is None or s.critic_mode == "separate")
    fsdp = s.shard_frozen or any(_sharded(s, name) for name in ("policy", "critic")[:1 + own_critic])
    placed = (", FSDP" if fsdp else "") + (", frozen roles sharded" if s.shard_frozen else "") + (
        f", {' and '.join(s.replicated)} replicated" if s.replicated else "")
    devices = f"{s.nproc} device" + ("s" + placed if s.nproc > 1 else "")
    ckpt = ", gradient checkpointing" if s.gradient_checkpointing else ""
    return f"{mode}, {s.precision}{ckpt}, {devices}"
