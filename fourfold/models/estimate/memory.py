"""Memory of a PPO or REINFORCE run per device, before anything is loaded (``fourfold estimate``).

:func:`estimate` takes a role plan (:func:`fourfold.models.plan.plan_roles`, the plan the loader
builds) and a :class:`~fourfold.models.estimate.settings.Workload` (the batch shape and the number of
devices) and returns an :class:`Estimate`: per role the parameter counts and the bytes of weights,
gradients and AdamW state (:mod:`fourfold.models.estimate.roles`, one rule per form of role spec),
and per device the peak of the two phases of an iteration, generation (weights, AdamW state, the KV
cache and sampling logits or the largest scoring pass) and training (weights, AdamW state, the
gradients, activations and logits of the role that needs most).

Parameter counts are exact (:mod:`fourfold.models.estimate.params`: each model built from its
``config.json`` on the meta device, LoRA adapters as peft creates them); bytes follow the plan's
dtypes and precision (``fp32``, ``bf16-mixed``, ``bf16``); a shared LoRA base is counted once; FSDP
divides what the plan places ``fsdp`` by the number of devices and adds its gather buffers; the
rollout engine's inference copy of the policy (``engine_weights``) is resident in both phases. An
environment run (``Workload.env_max_tokens``) has its KV cache and training forwards over the whole
trajectory (``Workload.seq_len``, ``kv_positions``) in place of the prompt and one response. The
model in full, term by term (with what it leaves out: the allocator's caching, CUDA workspaces, the
tokenizer, the rollout buffers), is in docs/estimate.md.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional

from fourfold.core.logprobs import BLOCK_ELEMENTS  # elements of one float32 log-prob block
from fourfold.models.estimate.params import LoraCount, Shape
from fourfold.models.estimate.result import Estimate, RoleMemory, fmt_bytes
from fourfold.models.estimate.roles import ROLES, RoleCost, role_costs, shard
from fourfold.models.estimate.settings import EstimateInput, Workload
from fourfold.models.plan import ADAPTER, FULL, LoraSettings, RolePlan

__all__ = ["ROLES", "Estimate", "EstimateInput", "LoraSettings", "Workload", "estimate",
           "layer_activation_bytes_per_token"]


def _compute_bytes(role: RoleCost, s: EstimateInput) -> int:
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


def _lora_copy_bytes(role: RoleCost, s: EstimateInput) -> int:
    """Bytes of peft's per-Linear input cast (0 when adapters and base share a dtype, no autocast)."""
    if role.lora is None:
        return 0
    master, frozen = s.master, s.frozen
    if s.precision == "bf16-mixed":
        return 2 if frozen != 4 else 0  # autocast casts the adapter's input to bf16 for lora_A
    return master if master != frozen else 0


PEAK_AT, FREED = "peak at", "activations freed"  # the two entries of _train_terms that are notes, not terms
PEAK_START = "at the start of backward (activations and logits kept, the LM head's gradient)"
PEAK_END = "at the end of backward (every gradient)"
PEAK_LAST_MICRO = "in the last micro-batch's backward (the earlier micro-batches' gradients, its activations)"


def _train_terms(role: RoleCost, s: EstimateInput) -> dict:
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
    micro = math.ceil((s.workload.micro_batch_size or s.workload.minibatch_size) / n)
    n_micro = math.ceil(math.ceil(s.workload.minibatch_size / n) / micro)
    T, seq = s.workload.response_tokens, s.workload.seq_len  # P + T, or env.max_tokens in an environment run
    tokens = micro * seq
    h, L = shape.hidden, shape.layers
    autocast_fp32 = s.precision == "bf16-mixed" and role.res_bytes == 4  # casts of fp32 activations
    per_layer = layer_activation_bytes_per_token(shape, role.res_bytes, c, role.full, role.lora,
                                                 _lora_copy_bytes(role, s), bool(s.plan.lora and s.plan.lora.dropout > 0),
                                                 autocast_fp32)
    if s.plan.gradient_checkpointing:
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
    head = _logits_bytes(shape, micro, T, c, s.plan.logits_chunk, 3 + int(s.workload.with_entropy)) if role.causal else 0
    grads = role.memory.grads_bytes
    master = 2 if s.precision == "bf16" else 4
    head_grad = shard(role.head_grad_params * master, True, n)
    if n_micro > 1 or grads > acts + head + head_grad:
        live = {"gradients": grads, "activations": acts, "logits": head} if n_micro > 1 else {"gradients": grads}
    else:
        live = {"gradients": head_grad, "activations": acts, "logits": head}
    live[PEAK_AT] = PEAK_LAST_MICRO if n_micro > 1 else (PEAK_END if "activations" not in live else PEAK_START)
    live[FREED] = 0 if "activations" in live else acts + head
    live["backward workspace"] = tokens * (2 * shape.intermediate + 2 * h) * c
    if n == 1:  # the Linears keep their bf16 weight copies for backward (one layer's at a time with checkpointing)
        kept = role.cast_params - (L - 1) * role.cast_layer if s.plan.gradient_checkpointing else role.cast_params
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


def _forward_bytes(role: RoleCost, b: int, seq: int, c: int) -> int:
    """Peak of one no-grad forward over ``b x seq`` tokens: the largest layer-local working set
    (residual, its copy, the normalised input and either q/k/v/output or three MLP-wide tensors:
    in a no-grad forward each intermediate is freed as soon as it is used), the mask and RoPE."""
    sh = role.shape
    attention = c * 4 * sh.heads * sh.head_dim
    mlp = c * 3 * sh.intermediate
    per_token = 2 * role.res_bytes * sh.hidden + c * sh.hidden + max(attention, mlp)
    return b * seq * per_token + b * seq * seq * role.res_bytes + 2 * b * seq * sh.head_dim * role.res_bytes


def _scoring_bytes(roles: dict[str, Optional[RoleCost]], s: EstimateInput, b: int) -> int:
    """The largest scoring pass (reference with its logits and log-prob blocks; reward; critic)."""
    T, seq = s.workload.response_tokens, s.workload.seq_len
    passes = {}
    for name in ("reference", "reward", "critic"):
        role = roles[name]
        if role is None:
            continue
        rc = _compute_bytes(role, s)
        extra = 0
        if role.causal:
            extra = _logits_bytes(role.shape, b, T, rc, s.plan.logits_chunk, 1) + b * seq * role.shape.hidden * rc
        passes[name] = _forward_bytes(role, b, seq, rc) + extra
    if s.plan.concurrent and "reference" in passes:  # the reference runs beside critic and reward
        return passes["reference"] + max([passes.get("reward", 0), passes.get("critic", 0)])
    return max(passes.values(), default=0)


def _sampling_bytes(policy: RoleCost, s: EstimateInput, b: int) -> int:
    """KV cache (plus one layer while it grows) + the larger of the (first observation's) prefill and
    a sampling step: the cache holds ``kv_positions`` per row (P + T; an environment run's
    env.max_tokens, + 1 slot on the static engine)."""
    sh = policy.shape
    c = _compute_bytes(policy, s)
    kv = 2 * sh.layers * b * s.workload.kv_positions * sh.kv_heads * sh.head_dim * c
    prefill = _forward_bytes(policy, b, s.workload.prompt_tokens, c) + b * sh.vocab * c
    step = b * sh.vocab * (c + 16)
    return kv + kv // sh.layers + max(prefill, step)


def _fsdp_bytes(roles: dict[str, Optional[RoleCost]], s: EstimateInput, training: bool) -> int:
    """Gather buffers of the largest sharded model: two unsharded layers + the embedding (+ two
    layers of fp32 gradients being reduce-scattered, in training)."""
    if s.nproc == 1:
        return 0
    c = s.compute
    sizes = [2 * r.layer_params * c + r.shape.vocab * r.shape.hidden * c
             + (2 * r.layer_params * 4 if training and r.trained and r.full else 0)
             for r in roles.values() if r is not None and r.sharded]
    return max(sizes, default=0)


COPY_TERM = "inference copy of the policy"


def _engine_terms(policy: RoleCost, s: EstimateInput) -> dict[str, int]:
    """The rollout engine's weights beyond the policy's own, per device: an inference copy (resident:
    both phases), or with ``gathered`` over several devices the policy's other shards while sampling."""
    if s.workload.engine_weights == "copy":
        params = policy.memory.params - (policy.lora.params if policy.lora is not None else 0)
        return {f"{COPY_TERM} (generation.weights: copy)": params * (policy.res_bytes if s.precision == "fp32" else 2)}
    if s.workload.engine_weights == "gathered" and s.nproc > 1:
        gathered = policy.memory.trainable_params * s.compute * (s.nproc - 1) // s.nproc
        return {"policy gathered for the rollout (generation.weights: gathered)": gathered}
    return {}


def estimate(plan: RolePlan, workload: Optional[Workload] = None, configs: Optional[Mapping] = None) -> Estimate:
    """Per-role memory and the per-device peaks of generation and training of the roles of ``plan``
    (a ``ppo`` or ``reinforce`` plan) under ``workload`` (default: :class:`Workload`'s defaults).
    ``configs``: model source -> a transformers config, for sources that are no directory."""
    s = EstimateInput(plan, workload or Workload(), configs or {})
    s.validate()
    roles = role_costs(s)
    memory = {name: (roles[name].memory if roles[name] is not None else RoleMemory()) for name in ROLES}
    resident = {"weights": sum(m.weights_bytes for m in memory.values()),
                "AdamW state": sum(m.optimizer_bytes for m in memory.values())}
    b = math.ceil(s.workload.rollout_batch_size / s.nproc)
    sampling, scoring = _sampling_bytes(roles["policy"], s, b), _scoring_bytes(roles, s, b)
    generate = dict(resident)
    if s.nproc == 1:
        generate["autocast bf16 weight copies"] = 2 * sum(r.cast_params for r in roles.values() if r is not None and r.trained)
    generate["FSDP gather buffers"] = _fsdp_bytes(roles, s, training=False)
    generate["sampling (KV cache, logits)" if sampling >= scoring else "scoring passes"] = max(sampling, scoring)
    engine = _engine_terms(roles["policy"], s)
    generate.update(engine)
    trained = {name: _train_terms(roles[name], s) for name in ("policy", "critic") if roles[name] is not None}
    notes = {name: (terms.pop(PEAK_AT), terms.pop(FREED)) for name, terms in trained.items()}
    if s.plan.concurrent:
        live = {f"{k} ({name})": v for name, terms in trained.items() for k, v in terms.items()}
    else:
        name, terms = max(trained.items(), key=lambda kv: sum(kv[1].values()))
        live = {f"{k} ({name})": v for k, v in terms.items()}
    train = {**resident, **live, "FSDP gather/reduce buffers": _fsdp_bytes(roles, s, training=True)}
    train.update({k: v for k, v in engine.items() if k.startswith(COPY_TERM)})  # resident
    peaks = [name for name in notes if f"gradients ({name})" in live]
    where = [f"the {name}'s peak is {notes[name][0]}" + (
        f": its activations and logits ({fmt_bytes(notes[name][1])}) are freed by then" if notes[name][1] else "")
        for name in peaks]
    return Estimate(memory, generate, train, _describe(s), train_notes=where)


def _describe(s: EstimateInput) -> str:
    """E.g. ``LoRA r=8 on a shared base (critic adapter, reward model separate), bf16-mixed, 1 device``."""
    plan = s.plan
    if plan.lora is None:
        mode = "full fine-tuning"
    else:
        critic, reward = plan.role("critic"), plan.role("reward")
        on_base = ["adapter" if r is not None and r.form == ADAPTER else "separate" for r in (critic, reward)]
        mode = f"LoRA r={plan.lora.r} on a shared base (critic {on_base[0]}, reward model {on_base[1]})"
    fsdp = any(s.placement(r) == "fsdp" for r in plan.roles)
    frozen_sharded = any(r.form == FULL and not r.trained and r.placement == "fsdp" for r in plan.roles)
    replicated = [r.name for r in plan.roles if r.trained and s.placement(r) == "replicate"]
    placed = (", FSDP" if fsdp else "") + (", frozen roles sharded" if frozen_sharded else "") + (
        f", {' and '.join(replicated)} replicated" if replicated else "")
    devices = f"{s.nproc} device" + ("s" + placed if s.nproc > 1 else "")
    ckpt = ", gradient checkpointing" if plan.gradient_checkpointing else ""
    return f"{mode}, {s.precision}{ckpt}, {devices}{_env_length(s.workload)}"


def _env_length(w: Workload) -> str:
    """An environment run's lengths, e.g. ``, trajectories of 512 tokens (env.max_tokens; KV cache 513
    slots, static engine)``; "" for a single-turn run (its lengths are the config's P + T)."""
    if w.env_max_tokens is None:
        return ""
    cache = f"KV cache {w.kv_positions} slots, static engine" if w.engine == "static" else "eager engine"
    return f", trajectories of {w.seq_len} tokens (env.max_tokens; {cache})"
