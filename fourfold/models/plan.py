"""Which roles a stage has and how each one is built, as one pure plan.

:func:`plan_roles` turns a stage's config into a :class:`RolePlan` without loading anything: for
each role (``policy``, ``reference``, ``reward``, ``critic``) its form (a model of its own, an
adapter on the shared LoRA base, the base itself with adapters disabled, or a reward function),
where it comes from, whether it trains, its weights dtype, how a scalar head starts and where it
goes under torchrun. Three readers, and no other copy of these rules:

* the loader, :func:`fourfold.models.build.build_roles` (every stage's models, checked);
* the memory estimate, :func:`fourfold.models.estimate.memory.estimate` (its roles, as they are);
* the torchrun placement, :func:`fourfold.run.parallel.place_roles`.

The stages' roles::

    sft        policy (trained causal LM: a directory, from scratch, or an adapter on it)
    reward     reward (trained scorer: a directory's head kept, or a fresh one; or an adapter)
    dpo        policy (trained), reference (dpo.reference, model.path, or the policy's base)
    ppo        policy, reference, reward (model, LoRA adapter or function), critic (when loaded)
    reinforce  policy, reference, reward
    generate   policy (a causal LM, not trained)              :func:`plan_inference`
    score      reward (a reward model, not trained)           :func:`plan_inference`
    evaluate   saved models used as they are, all frozen (:func:`plan_evaluation`): policy,
               reference, reward, those given

Config objects are read by attribute (of the config package only the reward parts' naming rule is
used, imported when called), so the plan is the same for a config loaded from YAML and one built in
Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

import torch

from fourfold.errors import ConfigError
from fourfold.models.checks import has_tokenizer_files
from fourfold.models.levers import role_dtypes

if TYPE_CHECKING:  # the config package is imported where it is used (the memory estimate runs without it)
    from fourfold.config.rewards import RewardSource as RewardPart

FULL, ADAPTER, BASE, FUNCTION = "full", "adapter", "base", "function"
"""Role forms: a model of its own, an adapter (+ head) on the shared base, the shared base with
every adapter disabled (the LoRA reference), a reward without a model here (functions, a server)."""

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_dir(path) -> bool:
    """A directory holding a peft adapter (``adapter_config.json``)."""
    return path is not None and (Path(path) / ADAPTER_CONFIG).is_file()


@dataclass(frozen=True)
class LoraSettings:
    """LoRA hyper-parameters (the config's ``model.lora``, checked there: :meth:`from_config`; the
    config schema mirrors these fields)."""

    r: int = 8
    """Rank of each update: W + (alpha / r) * B @ A, A of shape r x in, B of shape out x r."""
    alpha: float = 16.0
    """Scale numerator of the update (the scale is alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training (0 keeps the forwards deterministic)."""
    target_modules: Union[tuple, str] = "all-linear"
    """Names (or name suffixes) of the modules that get an adapter, or 'all-linear': every linear
    layer except the output head."""

    def __post_init__(self):
        if isinstance(self.target_modules, list):  # frozen: a tuple keeps the settings hashable
            object.__setattr__(self, "target_modules", tuple(self.target_modules))

    @classmethod
    def from_config(cls, lora) -> Optional["LoraSettings"]:
        """The settings of a ``model.lora`` section (None: full fine-tuning), checked by the
        section's own ``validate()`` (``fourfold.config.LoraConfig``, the one owner of the rules:
        a ConfigError naming ``model.lora.<key>``), so a section built in Python is checked too."""
        if lora is None:
            return None
        validate = getattr(lora, "validate", None)
        if callable(validate):
            validate()
        targets = lora.target_modules if isinstance(lora.target_modules, str) else tuple(lora.target_modules)
        return cls(r=lora.r, alpha=float(lora.alpha), dropout=float(lora.dropout), target_modules=targets)

    def peft_config(self, task_type: str = "CAUSAL_LM", modules_to_save: Optional[list] = None):
        """The ``peft.LoraConfig`` of these settings (no bias training, B zero-initialised so a fresh
        adapter computes exactly the base model)."""
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=targets,
                          bias="none", task_type=task_type, modules_to_save=modules_to_save)


@dataclass(frozen=True)
class RoleSpec:
    """How one role is built."""

    name: str
    """``policy``, ``reference``, ``reward`` or ``critic``."""
    form: str
    """FULL, ADAPTER, BASE or FUNCTION."""
    source: Optional[str]
    """Where it loads from: a model directory (FULL), an adapter directory (a reward ADAPTER; None
    for a fresh adapter), ``module:function`` (FUNCTION); None from scratch or for BASE."""
    key: str
    """The config key that names the source, for messages (``model.reward``)."""
    trained: bool
    dtype: Optional[torch.dtype] = None
    """Weights dtype of a model of its own (adapters keep float32 heads, the base has its own)."""
    start: str = "load"
    """How it starts: ``load`` (everything from ``source``; a scorer's head must be there),
    ``head-or-fresh`` (a scorer keeps the directory's head, or gets a fresh N(0, 0.02) one),
    ``scratch`` (random init from ``RolePlan.scratch``), ``copy-reward`` (a critic starting as
    the reward model), ``zero-head`` (a critic on the policy's backbone with a zero value head)."""
    placement: str = "fsdp"
    """Under torchrun: ``fsdp`` (sharded) or ``replicate`` (a full copy on every rank; a trained
    role's gradients averaged over the ranks before each step). A role on the shared LoRA base
    follows :attr:`RolePlan.base_placement`."""

    @property
    def causal(self) -> bool:
        """A causal LM (policy, reference) rather than a scorer (reward, critic)."""
        return self.name in ("policy", "reference")


MODEL, FUNCTION_PART, REMOTE = "model", "function", "remote"
"""Kinds of reward part: the reward model (the reward role's model), a function, a reward server
(:data:`fourfold.config.rewards.MODEL_KIND` and its two siblings: the same strings, written here
too because the memory estimate imports this module without the config package)."""


def reward_parts(m) -> tuple:
    """The reward parts of a model section (PPO, REINFORCE, `fourfold score`, `fourfold bon`'s
    scorer), in the order the score sums them: :func:`fourfold.config.rewards.reward_sources`, the
    one list (each a :class:`~fourfold.config.rewards.RewardSource`; imported here, not at the top:
    the memory estimate imports this module without the config package)."""
    from fourfold.config.rewards import reward_sources

    return tuple(reward_sources(m))


def is_weighted(parts: tuple) -> bool:
    """Several parts, or one whose weight is not 1 (:func:`fourfold.config.rewards.is_weighted_sum`):
    the score is a weighted sum and each part is logged; one part of weight 1 is the reward role."""
    from fourfold.config.rewards import is_weighted_sum

    return is_weighted_sum(p.weight for p in parts)


@dataclass(frozen=True)
class RolePlan:
    """Every role of a stage, in load order, and what they share."""

    stage: str
    """The stage the plan is for (``sft``, ``reward``, ``dpo``, ``ppo``, ``reinforce``; ``generate``, ``score``)."""
    roles: tuple[RoleSpec, ...]
    """The :class:`RoleSpec` of each role, in the order they are built."""
    tokenizer: str
    """The tokenizer's directory (``model.tokenizer``, else the first model's)."""
    tokenizer_key: str
    """The config key that names it, for messages."""
    lora: Optional[LoraSettings] = None
    """The adapters' settings (``model.lora``); None: full fine-tuning."""
    base_source: Optional[str] = None
    """The shared base's directory (LoRA): every ADAPTER and BASE role runs on one copy of it."""
    base_dtype: Optional[torch.dtype] = None
    """The shared base's weights dtype (the frozen roles' for PPO and REINFORCE)."""
    scratch: Optional[dict] = None
    """From-scratch sizes (``hidden_size``, ``num_layers``, ``num_heads``, ``intermediate_size``,
    ``max_positions``) of a model built at random over the tokenizer's vocabulary."""
    trust_remote_code: bool = False
    precision: str = "fp32"
    gradient_checkpointing: bool = False
    logits_chunk: Optional[int] = None
    mixed_precision: bool = False
    """FSDP2's bf16 parameters in forward and backward (``dist.mixed_precision``)."""
    cpu_offload: bool = False
    """Frozen roles placed ``fsdp`` stay in CPU memory between their forwards (``dist.cpu_offload``)."""
    concurrent: bool = False
    """The trainer runs roles in parallel threads (``run.concurrent_roles``)."""
    frozen_dtype: Optional[torch.dtype] = field(default=None)
    """The frozen roles' weights dtype (``model.frozen_dtype``, resolved: bf16 under ``bf16-mixed``
    when unset, else the trained roles' dtype; :func:`~fourfold.models.levers.role_dtypes`)."""
    reward_parts: tuple[RewardPart, ...] = ()
    """The parts of the score (PPO, REINFORCE): the reward model, functions, a server
    (:func:`reward_parts`); the reward role is their weighted sum (:func:`is_weighted`), or the
    one part itself."""

    def without(self, *names: str) -> "RolePlan":
        """This plan without the roles ``names`` (roles the caller brings ready-made)."""
        return replace(self, roles=tuple(r for r in self.roles if r.name not in names))

    def role(self, name: str) -> Optional[RoleSpec]:
        """The spec of role ``name``, or None when the stage has no such role."""
        return next((r for r in self.roles if r.name == name), None)

    @property
    def names(self) -> tuple:
        return tuple(r.name for r in self.roles)

    @property
    def base_placement(self) -> Optional[str]:
        """Where the shared LoRA base goes under torchrun (None: no base): ``replicate`` when its
        trained adapters are placed so, else ``fsdp``. Every role on the base (adapter or ``base``)
        follows it: the adapters' weights live in the base's own layers."""
        if self.lora is None:
            return None
        on_base = [r.placement for r in self.roles if r.trained and r.form == ADAPTER]
        return "replicate" if on_base and all(p == "replicate" for p in on_base) else "fsdp"

    @property
    def trained_dtype(self) -> torch.dtype:
        trained = [r.dtype for r in self.roles if r.trained and r.form == FULL]
        return trained[0] if trained else (self.base_dtype or torch.float32)


def plan_roles(stage: str, cfg) -> RolePlan:
    """The :class:`RolePlan` of a stage config (``sft``, ``reward``, ``dpo``, ``ppo``, ``reinforce``)."""
    if stage in ("ppo", "reinforce"):
        with_critic = stage == "ppo" and cfg.ppo.loads_critic
        env = getattr(cfg, "env", None)
        return _lm_plan(stage, cfg.model, cfg.dist, with_critic, bool(cfg.run.concurrent_roles),
                        with_reward=env is None or env.factory is None or bool(reward_parts(cfg.model)))
    if stage in ("sft", "reward", "dpo"):
        return _supervised_plan(stage, cfg)
    raise ValueError(f"plan_roles: no roles for stage {stage!r}")


def adapter_base(path: str, key: str) -> str:
    """The base model an adapter directory records (``base_model_name_or_path``, a local directory
    made absolute); a ConfigError naming ``key`` when it records none."""
    import json

    base = json.loads((Path(path) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base:
        raise ConfigError(f"{key}: {path}: the adapter names no base model (base_model_name_or_path)")
    return resolvable_base(base)


def resolvable_base(name: Optional[str]) -> Optional[str]:
    """The base model an adapter directory records (``base_model_name_or_path``), as a path that
    resolves from any directory: a local directory made absolute (the command line's relative
    ``runs/sft/model`` would only load from the directory the run started in); a hub name as it is."""
    if name and Path(name).is_dir():
        return str(Path(name).resolve())
    return name


SERVED_BASE = LoraSettings(r=1, alpha=1.0)
"""The shared base's own adapter when a reward adapter is used on its own (`fourfold score`,
`fourfold serve-reward`): B = 0 (the base model itself), never active."""


def plan_inference(stage: str, m, keys: Optional[dict] = None) -> RolePlan:
    """The :class:`RolePlan` of ``fourfold generate`` (``policy``: the causal LM ``model.path``) or
    ``fourfold score`` (``reward``: the reward model ``model.reward``; a LoRA reward adapter, the
    ``model-adapter/`` of a LoRA `fourfold reward` run, on the base its adapter_config names, as PPO
    loads it beside the policy) from the command's ``model`` section ``m``: one frozen model in
    ``model.dtype``, built and checked as a training stage's. ``keys``: how messages name
    ``model.path``/``model.reward`` and ``model.tokenizer`` (`fourfold serve-reward`'s flags)."""
    dtype, _ = role_dtypes(m.dtype)
    names = {"model.path": "model.path", "model.reward": "model.reward", "model.tokenizer": "model.tokenizer",
             **(keys or {})}
    lora = base = None
    if stage == "generate":
        key = names["model.path"]
        role = RoleSpec("policy", FULL, m.path, key, False, dtype)
    elif stage == "score":
        key = names["model.reward"]
        if is_adapter_dir(m.reward):
            lora, base = SERVED_BASE, adapter_base(m.reward, key)
            role = RoleSpec("reward", ADAPTER, m.reward, key, False)
        else:
            role = RoleSpec("reward", FULL, m.reward, key, False, dtype)
    else:
        raise ValueError(f"plan_inference: no roles for stage {stage!r}")
    tokenizer = m.tokenizer or (role.source if base is None or has_tokenizer_files(role.source) else base)
    return RolePlan(stage, (role,), tokenizer, names["model.tokenizer"] if m.tokenizer else key,
                    lora=lora, base_source=base, base_dtype=dtype if base else None,
                    trust_remote_code=m.trust_remote_code)


def plan_evaluation(tokenizer: str, *, policy: Optional[str] = None, reference: Optional[str] = None,
                    reward: Optional[str] = None) -> RolePlan:
    """The roles of saved models used as they are (stage ``evaluate``: the held-out evaluation, the
    demo's pair sampling and its reward model's accuracy): each given directory a frozen model of its
    own, loaded in its checkpoint's dtype and checked like a trained stage's (the policy and the
    reference as causal LMs with the same embeddings, the reward model with its trained head); the
    tokenizer is ``tokenizer``'s (the SFT model's directory, or the reward model's)."""
    roles = [RoleSpec(name, FULL, source, name, False) for name, source in
             (("policy", policy), ("reference", reference), ("reward", reward)) if source is not None]
    if not roles:
        raise ValueError("plan_evaluation: no model given")
    return RolePlan("evaluate", tuple(roles), tokenizer, "tokenizer")


def _levers(model) -> dict:
    return dict(precision=model.precision, gradient_checkpointing=model.gradient_checkpointing,
                trust_remote_code=model.trust_remote_code)


def _supervised_plan(stage: str, cfg) -> RolePlan:
    """SFT and the reward model: one trained model; DPO: the trained policy and its reference."""
    m = cfg.model
    trained, _ = role_dtypes(m.dtype, m.precision)
    lora = LoraSettings.from_config(m.lora)
    form = ADAPTER if lora is not None else FULL
    scratch = None
    if m.from_scratch:
        scratch = dict(hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                       intermediate_size=m.intermediate_size, max_positions=m.max_positions)
    name = "reward" if stage == "reward" else "policy"
    start = "scratch" if scratch else ("head-or-fresh" if stage == "reward" else "load")
    roles = [RoleSpec(name, form, None if lora else m.path, "model.path", True, trained, start,
                      placement=cfg.dist.model)]
    if stage == "dpo":
        if lora is not None and cfg.dpo.reference is None:
            roles.append(RoleSpec("reference", BASE, None, "model.path", False))
        else:
            ref = cfg.dpo.reference or m.path
            roles.append(RoleSpec("reference", FULL, ref, "dpo.reference" if cfg.dpo.reference else "model.path",
                                  False, trained, placement="replicate"))  # used before training, whole
    tokenizer = m.tokenizer or m.path
    return RolePlan(stage, tuple(roles), tokenizer, "model.tokenizer" if m.tokenizer else "model.path", lora=lora,
                    base_source=m.path if lora is not None else None, base_dtype=trained if lora else None,
                    scratch=scratch, mixed_precision=cfg.dist.mixed_precision, **_levers(m))


def _lm_plan(stage: str, m, dist_cfg, with_critic: bool, concurrent: bool, with_reward: bool = True) -> RolePlan:
    """PPO and REINFORCE: policy, reference, reward (model or function) and, for PPO, the critic.
    ``with_reward`` False (an environment run, ``env.factory``, with no reward part beside the
    environment's: its step gives the rewards): no reward role."""
    lora = LoraSettings.from_config(m.lora)
    trained, frozen = role_dtypes(m.dtype, m.precision, m.frozen_dtype)
    if lora is not None and concurrent:
        raise ConfigError("run.concurrent_roles: roles sharing one LoRA base cannot run concurrently "
                          "(adapter switching is not thread-safe); set it to false")
    if lora is None and is_adapter_dir(m.reward):
        raise ConfigError(f"model.reward: {m.reward} is a LoRA adapter directory: set model.lora to load it "
                          f"as an adapter on the policy's base, or give the merged model (model/ of the same run)")
    parts = reward_parts(m)
    if not parts and with_reward:
        raise ConfigError("model.reward: a reward model directory, a reward function or a reward server is needed")
    roles = [RoleSpec("policy", ADAPTER if lora else FULL, m.policy, "model.policy", True, trained,
                      placement=dist_cfg.policy)]
    if lora is not None:
        roles.append(RoleSpec("reference", BASE, None, "model.policy", False))
    else:
        ref_key = "model.reference" if m.reference else "model.policy"
        roles.append(RoleSpec("reference", FULL, m.reference or m.policy, ref_key, False, frozen,
                              placement=dist_cfg.reference))
    reward = _reward_spec(m, lora, frozen, dist_cfg.reward) if with_reward else None
    if reward is not None:
        roles.append(reward)
    if with_critic:
        roles.append(replace(_critic_spec(m, lora, reward, trained, frozen), placement=dist_cfg.critic))
        if roles[-1].form == ADAPTER and dist_cfg.critic != dist_cfg.policy:
            raise ConfigError(f"dist.critic: {dist_cfg.critic}, and dist.policy is {dist_cfg.policy}: the adapter "
                              "critic and the policy live in one shared LoRA base, placed once; give both the same")
    return RolePlan(stage, tuple(roles), m.tokenizer or m.policy, "model.tokenizer" if m.tokenizer else "model.policy",
                    lora=lora, base_source=m.policy if lora else None, base_dtype=frozen if lora else None,
                    logits_chunk=m.logits_chunk, mixed_precision=dist_cfg.mixed_precision,
                    cpu_offload=dist_cfg.cpu_offload, concurrent=concurrent, frozen_dtype=frozen,
                    reward_parts=parts, **_levers(m))


def _reward_spec(m, lora: Optional[LoraSettings], frozen: torch.dtype, placement: str) -> RoleSpec:
    if m.reward is None:  # functions, a server: no model in this process
        parts = reward_parts(m)
        one = parts[0] if len(parts) == 1 else None
        key = one.key if one is not None else "model.reward_fns"
        return RoleSpec("reward", FUNCTION, one.source if one is not None else None, key, False)
    if lora is not None and is_adapter_dir(m.reward):
        return RoleSpec("reward", ADAPTER, m.reward, "model.reward", False)
    return RoleSpec("reward", FULL, m.reward, "model.reward", False, frozen, placement=placement)


def _critic_spec(m, lora: Optional[LoraSettings], reward: RoleSpec, trained: torch.dtype,
                 frozen: torch.dtype) -> RoleSpec:
    """The critic: ``model.critic``, else from ``critic_init`` (a copy of the reward model, or the
    policy's backbone with a zero value head); an adapter on the base with ``critic_mode: adapter``."""
    from fourfold.config.critic import critic_start  # here: the memory estimate imports the plan without the config

    from_reward = critic_start(m) == "reward"
    if m.critic_mode == "adapter":  # the config requires model.lora and no model.critic
        if from_reward and reward.form != ADAPTER:
            raise ConfigError("model.critic_init: 'reward' with an adapter critic needs the reward model as a LoRA "
                              "adapter on the same base (a LoRA `fourfold reward` run); use 'policy'")
        return RoleSpec("critic", ADAPTER, None, "model.critic_init", True,
                        start="copy-reward" if from_reward else "zero-head")
    if m.critic is not None:
        return RoleSpec("critic", FULL, m.critic, "model.critic", True, trained)
    if not from_reward:
        return RoleSpec("critic", FULL, m.policy, "model.policy", True, trained, start="zero-head")
    if reward.form == FUNCTION:
        raise ConfigError("model.critic_init: 'reward' needs model.reward")
    if reward.form == ADAPTER:
        raise ConfigError("model.critic_init: 'reward' with critic_mode 'separate' copies a full reward model, "
                          "and model.reward is a LoRA adapter: use critic_mode=adapter (the critic starts as "
                          "that adapter) or critic_init=policy")
    if lora is not None and trained != frozen:  # the reward model's weights, loaded in the trained dtype
        return RoleSpec("critic", FULL, m.reward, "model.reward", True, trained)
    return RoleSpec("critic", FULL, m.reward, "model.reward", True, trained, start="copy-reward")
