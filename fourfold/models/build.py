"""The one loader: any :class:`~fourfold.models.plan.RolePlan` (full, LoRA, shared base) becomes
:class:`Roles`, with every model checked against its role and the run's tokenizer
(:class:`~fourfold.models.checks.RoleChecker`) in every mode.

Roles are built in the plan's order (policy, reference, reward, critic), so the random draws of a
run (a fresh head, a LoRA adapter's initial A, a model from scratch) come in one fixed order:

* the tokenizer, with a dedicated pad token (the models' embeddings are resized for it);
* a model of its own (``full``): loaded in its dtype, checked, its embeddings resized; a critic
  starting as the reward model is a copy of it (the reward model is then loaded in the trained
  dtype and cast to its own after the copy);
* the shared base (LoRA): the first adapter role loads it (checked as a causal LM; for the reward
  stage, the sequence classifier the reward model starts from, its score head becoming the role's
  head) and every adapter or ``base`` role after it runs on that one copy;
* a full reward model whose directory saves another tokenizer than the run's: checked against its
  own tokenizer, scoring the decoded text encoded again (:class:`~fourfold.models.roles.RetokenizingReward`);
* the memory levers of the plan (gradient checkpointing of the trained roles, bf16 autocast of
  every forward under ``bf16-mixed``, the logits chunk of the causal roles): :func:`apply_levers`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from fourfold.errors import ModelLoadError
from fourfold.models.checks import RoleChecker
from fourfold.models.factory import llama_config, random_causal_lm, random_scalar_model
from fourfold.models.levers import autocast_forwards, enable_gradient_checkpointing, set_logits_chunk
from fourfold.models.loading import ensure_pad_embedding, load_causal_lm, load_sequence_scorer, load_tokenizer
from fourfold.models.lora import POLICY, REWARD, AdapterLM, AdapterScalarModel, SharedBase, add_critic, load_reward_adapter
from fourfold.models.plan import ADAPTER, BASE, FULL, FUNCTION, RolePlan, RoleSpec, plan_evaluation, plan_roles
from fourfold.models.reward_fn import load_reward_fn
from fourfold.models.reward_parts import reward_role
from fourfold.models.roles import (
    AdapterDisabledReference,
    FrozenReference,
    FunctionReward,
    ModelReward,
    RetokenizingReward,
    ScalarModel,
)


@dataclass
class Roles:
    """A stage's roles. PPO has all four (``critic`` None for the critic-free estimators and
    REINFORCE); SFT only ``policy``; the reward stage only ``reward_model`` (trained); DPO
    ``policy`` and ``reference``. ``reward`` is the frozen reward role PPO calls (a model's score or
    a function), ``reward_model`` its model when it has one; ``base`` the shared LoRA base."""

    tokenizer: Any
    policy: Optional[nn.Module] = None
    reference: Any = None
    reward: Any = None
    critic: Optional[nn.Module] = None
    reward_model: Optional[nn.Module] = None
    base: Optional[SharedBase] = field(default=None, repr=False)

    def modules(self) -> dict[str, Optional[nn.Module]]:
        """Role name -> the module that runs it (None where absent; the shared base's runner for a
        LoRA reference)."""
        reference = getattr(self.reference, "model", None)
        return {"policy": self.policy, "reference": reference, "reward": self.reward_model, "critic": self.critic}


def load_roles(stage: str, cfg, device: torch.device) -> Roles:
    """The roles of a stage config, built from its plan (:func:`~fourfold.models.plan.plan_roles`)."""
    return build_roles(plan_roles(stage, cfg), device)


def build_roles(plan: RolePlan, device: torch.device, *, reward_functions: Optional[dict] = None) -> Roles:
    """Every role of ``plan`` on ``device``, checked, with the plan's memory levers applied.
    ``reward_functions``: the plan's function parts already loaded and matched against the prompts
    file's columns (:func:`~fourfold.models.reward_parts.load_functions`; else loaded here, seeing
    no columns)."""
    tok = load_tokenizer(plan.tokenizer, trust_remote_code=plan.trust_remote_code)
    builder = _Builder(plan, tok, device, reward_functions)
    roles = Roles(tok)
    for spec in plan.roles:
        builder.build(spec, roles)
    roles.base = builder.base
    reward = plan.role("reward")
    if roles.reward_model is not None and reward.form == FULL and not reward.trained and reward.dtype is not None:
        roles.reward_model.to(reward.dtype)  # a no-op unless loaded in the trained dtype for a copy
    modules = roles.modules()
    for spec in plan.roles:
        if spec.trained and spec.name in ("policy", "critic") and modules[spec.name] is not None:
            modules[spec.name].train()
    return apply_levers(roles, plan, device)


class _Builder:
    """Builds the roles of one plan in order; holds the tokenizer's checker and the shared base."""

    def __init__(self, plan: RolePlan, tok, device: torch.device, reward_functions: Optional[dict] = None):
        self.plan, self.tok, self.device, self.reward_functions = plan, tok, device, reward_functions
        self.check = RoleChecker(tok, plan.tokenizer_key, plan.tokenizer, trust_remote_code=plan.trust_remote_code)
        self.base: Optional[SharedBase] = None
        self.head: Optional[nn.Linear] = None  # the reward stage's head, taken off its base model

    def build(self, spec: RoleSpec, roles: Roles) -> None:
        if spec.name == "policy":
            roles.policy = self.policy(spec)
        elif spec.name == "reference":
            roles.reference = AdapterDisabledReference(self.base) if spec.form == BASE else \
                FrozenReference(self.causal_lm(spec.source, spec.key, spec.dtype))
        elif spec.name == "reward":
            self.reward(spec, roles)
        else:
            roles.critic = self.critic(spec, roles.reward_model)

    # ---- models of their own ---------------------------------------------------------------------

    def _kw(self, dtype) -> dict:
        return dict(dtype=dtype, device=self.device, trust_remote_code=self.plan.trust_remote_code)

    def causal_lm(self, path: str, key: str, dtype) -> nn.Module:
        """A causal LM from ``path`` (config key ``key``), checked, its embeddings fitting the tokenizer."""
        lm = load_causal_lm(path, **self._kw(dtype))
        self.check.causal_lm(lm, key, path)
        ensure_pad_embedding(lm, self.tok)
        return lm

    def scorer(self, path: str, key: str, dtype, head_required: bool = True) -> ScalarModel:
        """A scalar model from ``path``: a reward model's head, or (not ``head_required``) a fresh one."""
        model = ScalarModel(load_sequence_scorer(path, **self._kw(dtype)))
        self.check.scorer(model.hf, key, path, head_required=head_required)
        ensure_pad_embedding(model.hf, self.tok)
        return model

    def scratch_config(self):
        s, tok = self.plan.scratch, self.tok
        return llama_config(len(tok), s["hidden_size"], s["num_layers"], s["num_heads"], s["intermediate_size"],
                            s["max_positions"], pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                            eos_token_id=tok.eos_token_id)

    # ---- the roles ---------------------------------------------------------------------------------

    def policy(self, spec: RoleSpec) -> nn.Module:
        if spec.start == "scratch":
            lm = random_causal_lm(self.scratch_config(), dtype=spec.dtype)  # global RNG: seeded by the scaffold
            ensure_pad_embedding(lm, self.tok)
            return lm.to(self.device)
        if spec.form == FULL:
            return self.causal_lm(spec.source, spec.key, spec.dtype)
        lm = self.causal_lm(self.plan.base_source, spec.key, self.plan.base_dtype)
        self.base = SharedBase(lm, self.plan.lora, POLICY)
        return AdapterLM(self.base, POLICY)

    def reward(self, spec: RoleSpec, roles: Roles) -> None:
        """The reward role: the reward model (when the plan has one), then the plan's parts put
        together (:func:`~fourfold.models.reward_parts.reward_role`: the one part itself, or their
        weighted sum)."""
        if spec.form != FUNCTION:
            self.reward_model(spec, roles)
        if self.plan.reward_parts:
            roles.reward = reward_role(self.plan.reward_parts, model_role=roles.reward,
                                       functions=self.reward_functions, eos_token_id=self.tok.eos_token_id,
                                       tokenizer=self.tok)
        elif spec.form == FUNCTION:  # a plan built by hand, without parts: the one function
            roles.reward = FunctionReward(load_reward_fn(spec.source), name=spec.source)

    def reward_model(self, spec: RoleSpec, roles: Roles) -> None:
        if spec.trained:
            roles.reward_model = self.trained_reward(spec)
            return
        if spec.form == ADAPTER:
            self.check.same_tokenizer(spec.key, spec.source)
            if self.base is None:  # a reward adapter on its own (score, serve-reward): its base, loaded here
                self.base = SharedBase(self.causal_lm(self.plan.base_source, spec.key, self.plan.base_dtype),
                                       self.plan.lora, adapter="served-base")
            model = load_reward_adapter(self.base, spec.source, REWARD)
        elif self.plan.stage in ("ppo", "reinforce") and self.check.differs(spec.source) is not None:
            model, roles.reward = self.retokenizing_reward(spec)
            roles.reward_model = model
            return
        else:
            critic = self.plan.role("critic")
            copied = critic is not None and critic.start == "copy-reward" and critic.form == FULL
            model = self.scorer(spec.source, spec.key, critic.dtype if copied else spec.dtype)
        roles.reward_model, roles.reward = model, ModelReward(model)

    def retokenizing_reward(self, spec: RoleSpec):
        """A full reward model whose directory holds a tokenizer of another vocabulary than the
        run's: (its model, checked against its own tokenizer, and the role that encodes the text
        again with that tokenizer). A critic cannot start as it (another vocabulary)."""
        critic = self.plan.role("critic")
        if critic is not None and critic.start == "copy-reward":
            raise ModelLoadError(f"model.critic_init: 'reward' copies the reward model, and {spec.key} ({spec.source}) "
                                 f"has another tokenizer than {self.plan.tokenizer_key} ({self.check.differs(spec.source)}); "
                                 "use model.critic_init=policy")
        tok = load_tokenizer(spec.source, trust_remote_code=False)  # the reward model's own, no remote code
        model = ScalarModel(load_sequence_scorer(spec.source, **self._kw(spec.dtype)))
        RoleChecker(tok, spec.key, spec.source).scorer(model.hf, spec.key, spec.source)
        ensure_pad_embedding(model.hf, tok)
        return model, RetokenizingReward(model, tok, self.tok.eos_token_id)

    def trained_reward(self, spec: RoleSpec):
        """The reward stage's model: a scalar model (a directory's head kept, else a fresh N(0, 0.02)
        one; or from scratch), or with LoRA an adapter + that head on its backbone."""
        if spec.start == "scratch":
            model, fresh = ScalarModel(random_scalar_model(self.scratch_config(), dtype=spec.dtype)), True
        else:
            path = spec.source or self.plan.base_source
            model = ScalarModel(load_sequence_scorer(path, **dict(self._kw(spec.dtype), device="cpu")))
            archs = getattr(model.config, "architectures", None) or []
            fresh = not any(a.endswith("ForSequenceClassification") for a in archs)
            self.check.scorer(model.hf, spec.key, path, head_required=not fresh)
        if fresh:
            model.reset_head("normal")  # global RNG: seeded by the scaffold
        ensure_pad_embedding(model.hf, self.tok)
        model = model.to(self.device)
        if spec.form == FULL:
            return model
        head = model.head
        for name in ("score", "classifier"):  # the head leaves the base: the role owns it
            if getattr(model.hf, name, None) is head:
                setattr(model.hf, name, None)
        self.base = SharedBase(model.hf, self.plan.lora, REWARD)
        return AdapterScalarModel(self.base, REWARD, head.requires_grad_(True))

    def critic(self, spec: RoleSpec, reward_model) -> nn.Module:
        if spec.form == ADAPTER:
            return add_critic(self.base, self.plan.lora, reward_model if spec.start == "copy-reward" else None)
        if spec.start == "copy-reward":
            critic = copy.deepcopy(reward_model)  # backbone and head from the reward model
        elif spec.start == "zero-head":
            critic = self.scorer(spec.source, spec.key, spec.dtype, head_required=False)
            critic.reset_head("zero")  # fresh value head: V = 0 everywhere at the start
        else:
            critic = self.scorer(spec.source, spec.key, spec.dtype)
        ensure_pad_embedding(critic.hf, self.tok)
        critic.requires_grad_(True)
        return critic


def apply_levers(roles: Roles, plan: RolePlan, device: torch.device) -> Roles:
    """The plan's memory levers on loaded ``roles`` (returns them): gradient checkpointing of the
    trained roles, bf16 autocast of every forward under ``bf16-mixed``, and the logits chunk of the
    causal roles. The dtypes are applied at load. Applying them twice changes nothing."""
    modules = roles.modules()
    trained = [modules[s.name] for s in plan.roles if s.trained and modules.get(s.name) is not None]
    if plan.gradient_checkpointing:
        for module in trained:
            enable_gradient_checkpointing(module)
    if plan.precision == "bf16-mixed":
        autocast_forwards([modules[s.name] for s in plan.roles if s.form != FUNCTION], device.type)
    if plan.logits_chunk:
        for name in ("policy", "reference"):
            if modules.get(name) is not None:
                set_logits_chunk(modules[name], plan.logits_chunk)
    return roles


def load_saved(tokenizer: str, *, policy: Optional[str] = None, reference: Optional[str] = None,
               reward: Optional[str] = None, device: Optional[torch.device] = None) -> Roles:
    """Saved models used as they are (:func:`~fourfold.models.plan.plan_evaluation`), built and
    checked by the one loader: ``policy``, ``reference`` and ``reward_model`` (with ``reward``, its
    score) where given, on ``device`` (default: the CPU)."""
    plan = plan_evaluation(tokenizer, policy=policy, reference=reference, reward=reward)
    return build_roles(plan, device or torch.device("cpu"))


__all__ = ["Roles", "apply_levers", "build_roles", "load_roles", "load_saved"]
