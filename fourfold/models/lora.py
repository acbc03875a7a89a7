"""LoRA via peft, with one shared base model for all four roles.

One causal LM is loaded once and frozen; peft injects LoRA layers into it, and every role is a thin
module over that one base::

    base causal LM (frozen)  + adapter "policy"            -> AdapterLM               (policy, trained)
                             , every adapter disabled       -> AdapterDisabledReference (reference)
                             + adapter "critic" + value head -> AdapterScalarModel      (critic, trained)
                             + adapter "reward" + score head -> AdapterScalarModel      (reward, frozen)

Each role module registers only its own parameters (its adapter's LoRA weights and its head), so
``role.parameters()`` is what its optimizer steps, ``role.state_dict()`` is what a checkpoint holds,
``role.requires_grad_()``/``train()``/``eval()`` touch only its adapter, and the base never gets a
gradient. A role activates its adapter for the duration of its forward (:meth:`SharedBase.activate`).

**Not thread-safe.** The active adapter (and peft's ``requires_grad`` bookkeeping) is state of the one
base model: two roles must never run at the same time. :attr:`SharedBase.concurrent_safe` is False,
:func:`build_shared_roles` refuses ``concurrent=True`` (the trainer's ``run.concurrent_roles``), and a
role entering while another one runs raises :class:`AdapterConcurrencyError` instead of computing
with the wrong adapter.

Other stages: an SFT run with LoRA trains ``AdapterLM(SharedBase(lm, settings))`` (the same policy
module); a reward-model run trains :func:`lora_scalar_model` of its :class:`ScalarModel`.

Files (:mod:`fourfold.models.lora_io`): a policy exports an adapter directory (loads with
``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), dir)``) and a merged HF
directory (loads with plain ``AutoModelForCausalLM.from_pretrained``).

**LoRA reward model** (what a LoRA ``fourfold reward`` run writes, through
:func:`lora_scalar_model` and :meth:`LoraScalarModel.save_pretrained`): the adapter directory of a
SEQ_CLS peft model whose score head is in ``modules_to_save`` (peft saves it as
``base_model.model.score.weight``), plus ``fourfold_score.json`` = ``{"fourfold_score_shift": x}``
when the reward normalisation left a shift (a full reward model keeps it in ``config.json``).
:func:`load_reward_adapter` loads it onto the shared causal-LM base as a third adapter: the
backbone's LoRA weights (and full-path ``target_modules``) are renamed from the sequence
classifier's backbone prefix to the causal LM's (both ``model`` for Llama and Qwen2: only the head
differs) and the score head becomes the adapter role's head.
"""

from __future__ import annotations

import copy
import json
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import torch
from torch import nn

from fourfold.errors import ConfigError, FourfoldError, ModelLoadError
from fourfold.models.loading import (
    ensure_pad_embedding,
    load_causal_lm,
    load_sequence_scorer,
    load_tokenizer,
)
from fourfold.models.lora_io import (
    ADAPTER_WEIGHTS,
    PEFT_PREFIX,
    is_adapter_dir,
    save_adapter_dir,
    save_merged_dir,
)
from fourfold.models.roles import (
    AdapterDisabledReference,
    FunctionReward,
    ModelReward,
    ScalarModel,
    ScalarRole,
    per_position_scalars,
)

POLICY, CRITIC, REWARD = "policy", "critic", "reward"
SCORE_FILE = "fourfold_score.json"


@dataclass
class LoraSettings:
    """LoRA hyper-parameters (mirrored by the config schema's ``model.lora``)."""

    r: int = 8
    """Rank of each update: W + (alpha / r) * B @ A, A of shape r x in, B of shape out x r."""
    alpha: float = 16.0
    """Scale numerator of the update (the scale is alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training. 0 keeps the forwards deterministic, as every
    other dropout in fourfold is (PPO's ratio compares two forwards of the same tokens)."""
    target_modules: Union[list[str], str] = "all-linear"
    """Names (or name suffixes) of the modules that get an adapter, or 'all-linear': every linear
    layer except the output head, whatever the architecture calls them."""

    def __post_init__(self):
        self.validate()

    def validate(self, prefix: str = "model.lora") -> None:
        """ConfigError naming the key when a value is out of range."""
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ConfigError(f"{prefix}.r: must be an integer >= 1, got {self.r!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, Real) or not self.alpha > 0:
            raise ConfigError(f"{prefix}.alpha: must be a number > 0, got {self.alpha!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, Real) or not 0 <= self.dropout < 1:
            raise ConfigError(f"{prefix}.dropout: must be in [0, 1), got {self.dropout!r}")
        targets = self.target_modules
        if isinstance(targets, str):
            if targets != "all-linear":
                raise ConfigError(f"{prefix}.target_modules: a list of module names or 'all-linear', got {targets!r}")
        elif (not isinstance(targets, (list, tuple)) or not targets
              or not all(isinstance(t, str) and t for t in targets)):
            raise ConfigError(f"{prefix}.target_modules: a non-empty list of module names or 'all-linear', "
                              f"got {targets!r}")

    def peft_config(self, task_type: str = "CAUSAL_LM", modules_to_save: Optional[list[str]] = None):
        """The ``peft.LoraConfig`` of these settings (no bias training, B zero-initialised so a fresh
        adapter computes exactly the base model)."""
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=targets,
                          bias="none", task_type=task_type, modules_to_save=modules_to_save)


class AdapterConcurrencyError(FourfoldError, RuntimeError):
    """Two roles over one shared base ran at the same time (adapter switching is not thread-safe)."""


def adapter_parameters(lm: nn.Module, adapter: str) -> dict[str, nn.Parameter]:
    """The parameters of ``adapter`` in a model with peft layers injected, keyed as peft's adapter
    file names them without the ``base_model.model.`` prefix (``model.layers.0.self_attn.q_proj.lora_A.weight``)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    out: dict[str, nn.Parameter] = {}
    for name, module in lm.named_modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        for layer_name in module.adapter_layer_names:
            container = getattr(module, layer_name)
            if adapter not in container:
                continue
            item = container[adapter]
            if isinstance(item, nn.Parameter):
                out[f"{name}.{layer_name}"] = item
            else:
                out.update({f"{name}.{layer_name}.{k}": p for k, p in item.named_parameters()})
    return out


def _adapter_dropouts(lm: nn.Module, adapter: str) -> list[nn.Module]:
    return [m.lora_dropout[adapter] for m in lm.modules()
            if isinstance(getattr(m, "lora_dropout", None), nn.ModuleDict) and adapter in m.lora_dropout]


class SharedBase:
    """One causal LM in memory, wrapped by peft, that every LoRA role runs on.

    ``peft`` is the ``PeftModel``; ``lm`` the causal LM inside it (LoRA layers injected, all its own
    weights frozen); ``backbone`` its decoder without the LM head (``lm.base_model``). Adapters are
    added with :meth:`add_adapter`, each trained or frozen: peft's ``set_adapter`` and
    ``disable_adapter`` leave only the active adapter trainable, so after each switch the
    ``requires_grad`` flags are set again from that list, and both trained adapters keep theirs.
    """

    concurrent_safe = False
    """Roles over one base must run one at a time (see the module docstring)."""

    def __init__(self, lm: nn.Module, settings: LoraSettings, adapter: str = POLICY):
        from peft import get_peft_model

        lm.requires_grad_(False)
        self.peft = get_peft_model(lm, settings.peft_config(), adapter_name=adapter)
        self.lm = self.peft.get_base_model()
        self._params: dict[str, dict[str, nn.Parameter]] = {}
        self._trainable: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._active = adapter
        self._register(adapter, trainable=True)

    @property
    def backbone(self) -> nn.Module:
        return self.lm.base_model

    @property
    def adapters(self) -> list[str]:
        return list(self._params)

    def add_adapter(self, name: str, peft_config, trainable: bool) -> None:
        """A new adapter ``name`` from a ``peft.LoraConfig`` (B zero: it starts as the base model)."""
        self.peft.add_adapter(name, peft_config)
        self._register(name, trainable)

    def parameters_of(self, name: str) -> dict[str, nn.Parameter]:
        """The parameters of adapter ``name`` (see :func:`adapter_parameters`)."""
        return self._params[name]

    def dropouts_of(self, name: str) -> list[nn.Module]:
        """The dropout modules on adapter ``name``'s inputs (their train/eval mode is the role's)."""
        return _adapter_dropouts(self.lm, name)

    def _register(self, name: str, trainable: bool) -> None:
        params = adapter_parameters(self.lm, name)
        if not params:
            raise ModelLoadError(f"LoRA adapter {name!r}: target_modules matched no module of {type(self.lm).__name__}")
        self._params[name] = params
        self._trainable[name] = trainable
        self._restore_grads()

    def _restore_grads(self) -> None:
        for name, params in self._params.items():
            for p in params.values():
                p.requires_grad_(self._trainable[name])

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        if not self._lock.acquire(blocking=False):
            raise AdapterConcurrencyError(
                "two roles ran at once on one shared LoRA base; adapter switching is not thread-safe "
                "(run the policy, reference, critic and reward one after the other: run.concurrent_roles=false)")
        try:
            yield
        finally:
            self._lock.release()

    @contextmanager
    def activate(self, name: str) -> Iterator[None]:
        """Run the body with adapter ``name`` (alone) active."""
        with self._exclusive():
            if self._active != name:
                self.peft.set_adapter(name)
                self._active = name
                self._restore_grads()
            yield

    @contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """Run the body as the base model: every adapter off (peft's ``disable_adapter``)."""
        with self._exclusive():
            try:
                with self.peft.disable_adapter():
                    yield
            finally:
                self._restore_grads()

    def device(self) -> torch.device:
        return next(self.lm.parameters()).device


class _AdapterWeights(nn.Module):
    """Registers one adapter's parameters (``/`` for ``.`` in their names) and dropout modules, so the
    role holding it owns exactly them; the base's own weights are not registered anywhere here."""

    def __init__(self, base: SharedBase, name: str):
        super().__init__()
        self.weights = nn.ParameterDict({k.replace(".", "/"): p for k, p in base.parameters_of(name).items()})
        self.dropouts = nn.ModuleList(base.dropouts_of(name))


class AdapterLM(nn.Module):
    """The policy in LoRA mode: the shared causal LM with adapter ``name`` active.

    Called like the causal LM it wraps (keywords pass through; ``forwards_to`` tells
    :func:`~fourfold.models.roles.accepts_kwarg` which signature counts). ``parameters()`` are the
    adapter's only.
    """

    def __init__(self, base: SharedBase, name: str = POLICY):
        super().__init__()
        self.base = base  # a plain object: the base's weights are not this module's parameters
        self.adapter = name
        self.lora = _AdapterWeights(base, name)

    @property
    def forwards_to(self) -> nn.Module:
        return self.base.lm

    @property
    def config(self):
        return self.base.lm.config

    def forward(self, *args, **kwargs):
        with self.base.activate(self.adapter):
            return self.base.lm(*args, **kwargs)

    def save_adapter(self, path) -> None:
        """Write the adapter directory (``PeftModel.from_pretrained(base, path)`` loads it)."""
        save_adapter_dir(self.base.peft, self.adapter, path)

    def save_merged(self, path) -> None:
        """Write the base with this adapter merged in, as a plain HF causal-LM directory."""
        save_merged_dir(self.base.peft, self.adapter, path)


class AdapterScalarModel(ScalarRole, nn.Module):
    """Critic or reward model in LoRA mode: the shared backbone with adapter ``name`` active, then a
    linear ``head`` (hidden -> 1, float32) at every position, plus ``score_shift`` when set (the
    reward normalisation's shift, see :meth:`ScalarModel.set_affine`). Same interface as
    :class:`~fourfold.models.roles.ScalarModel` for the rollout and the trainers: ``forward``,
    ``score``, ``response_values``, ``reset_head``."""

    def __init__(self, base: SharedBase, name: str, head: nn.Linear, score_shift: Optional[float] = None):
        super().__init__()
        if not isinstance(head, nn.Linear) or head.out_features != 1:
            raise TypeError(f"adapter {name!r}: the head must be a linear layer with one output")
        self.base = base
        self.adapter = name
        self.lora = _AdapterWeights(base, name)
        self.head = head
        self.score_shift = score_shift

    @property
    def config(self):
        return self.base.lm.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                keep_last: Optional[int] = None) -> torch.Tensor:
        """Per-position scalars [B, L] (or [B, keep_last]), float32."""
        with self.base.activate(self.adapter):
            return per_position_scalars(self.base.backbone, self.head, input_ids, attention_mask, keep_last,
                                        self.score_shift)


def value_head(base: SharedBase) -> nn.Linear:
    """A float32 linear head hidden -> 1 without bias (as Llama's ``score``) on the base's device."""
    return nn.Linear(base.lm.config.hidden_size, 1, bias=False, device=base.device(), dtype=torch.float32)


def add_critic(base: SharedBase, settings: LoraSettings, reward: Optional[AdapterScalarModel] = None,
               name: str = CRITIC) -> AdapterScalarModel:
    """The critic as a second trained adapter with a value head.

    Without ``reward``: a fresh adapter of ``settings`` and a zero head (V = 0 everywhere at start,
    as ``critic_init: policy`` does today). With a reward adapter on the same base (``critic_init:
    reward``): a copy of its adapter (its own LoRA config), head and score shift, so the critic
    starts as the reward model, as the full-copy critic does.
    """
    if reward is None:
        base.add_adapter(name, settings.peft_config(), trainable=True)
        critic = AdapterScalarModel(base, name, value_head(base))
        critic.reset_head("zero")
        return critic
    config = copy.deepcopy(base.peft.peft_config[reward.adapter])
    config.inference_mode = False
    base.add_adapter(name, config, trainable=True)
    source, target = base.parameters_of(reward.adapter), base.parameters_of(name)
    with torch.no_grad():
        for key, p in target.items():
            p.copy_(source[key])
    head = copy.deepcopy(reward.head).requires_grad_(True)
    return AdapterScalarModel(base, name, head, reward.score_shift)


# ---------------------------------------------------------------------------------------------
# The LoRA reward model: written by a SEQ_CLS peft model, read as an adapter of the causal base
# (format: module docstring)
# ---------------------------------------------------------------------------------------------


class LoraScalarModel(ScalarModel):
    """A reward model trained with LoRA: a :class:`ScalarModel` over a SEQ_CLS ``PeftModel`` (adapter
    ``default``) whose score head is trained through ``modules_to_save``.

    ``parameters()`` include the frozen base (``make_optimizer`` keeps the trainable ones: the LoRA
    weights and the head). ``save_pretrained`` writes the LoRA reward-model format (module
    docstring), so ``save_hf(model, tok, dir)`` does; :meth:`save_merged` a plain
    sequence-classification directory.
    """

    def __init__(self, peft_model):
        from peft.utils import ModulesToSaveWrapper

        inner = peft_model.get_base_model()
        wrapper = getattr(inner, "score", None) or getattr(inner, "classifier", None)
        if not isinstance(wrapper, ModulesToSaveWrapper):
            raise TypeError("LoraScalarModel: the score head must be in the peft config's modules_to_save")
        super().__init__(peft_model, head=wrapper.modules_to_save[peft_model.active_adapter])

    @property
    def backbone(self) -> nn.Module:
        return self.hf.get_base_model().base_model

    def save_pretrained(self, path, **kwargs) -> None:
        """The adapter directory plus ``fourfold_score.json`` when a score shift is set."""
        save_adapter_dir(self.hf, self.hf.active_adapter, path)
        shift = getattr(self.hf.config, "fourfold_score_shift", None)
        if shift:
            (Path(path) / SCORE_FILE).write_text(json.dumps({"fourfold_score_shift": float(shift)}) + "\n")

    def save_merged(self, path) -> None:
        """A plain ``AutoModelForSequenceClassification`` directory (shift in ``config.json``)."""
        save_merged_dir(self.hf, self.hf.active_adapter, path)


def lora_scalar_model(model: ScalarModel, settings: LoraSettings) -> LoraScalarModel:
    """``model`` (a 1-label sequence classifier) with LoRA adapters and its head trained in full:
    what a LoRA reward-model run trains. The base's weights are frozen."""
    from peft import get_peft_model

    head = next((n for n in ("score", "classifier") if getattr(model.hf, n, None) is model.head), None)
    if head is None:
        raise TypeError("lora_scalar_model: the head must be the model's score or classifier layer")
    model.hf.requires_grad_(False)
    return LoraScalarModel(get_peft_model(model.hf, settings.peft_config("SEQ_CLS", modules_to_save=[head])))


def backbone_prefixes(lm: nn.Module) -> tuple[str, str]:
    """(backbone attribute of the sequence classifier of ``lm``'s architecture, that of ``lm``)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING,
    )

    try:
        seq_cls = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(lm.config)]
    except KeyError:
        raise ModelLoadError(f"{type(lm.config).__name__}: transformers has no sequence classifier for it, "
                             f"so a LoRA reward model cannot exist for this base") from None
    return seq_cls.base_model_prefix, type(lm).base_model_prefix


def split_reward_state(state: dict[str, torch.Tensor], source: str, target: str
                       ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A SEQ_CLS adapter file's tensors -> (backbone LoRA weights renamed ``source.*`` -> ``target.*``,
    head tensors by their name under the classifier, e.g. ``score.weight``); peft's
    ``base_model.model.`` prefix is dropped from both."""
    backbone, head = {}, {}
    for key, tensor in state.items():
        if not key.startswith(PEFT_PREFIX):
            raise ModelLoadError(f"unexpected tensor {key!r} in a peft adapter file")
        key = key[len(PEFT_PREFIX):]
        if key.startswith(source + "."):
            backbone[target + key[len(source):]] = tensor
        else:
            head[key] = tensor
    return backbone, head


def rename_target_modules(targets, source: str, target: str):
    """Full module paths in ``target_modules`` (peft resolves 'all-linear' to them) moved to the causal
    LM's backbone prefix; plain names and a regex string stay as they are."""
    if isinstance(targets, str):
        return targets
    return sorted(target + t[len(source):] if t.startswith(source + ".") else t for t in targets)


def _head_from(head_state: dict[str, torch.Tensor], hidden: int, where: str) -> nn.Linear:
    modules = {key.rsplit(".", 1)[0] for key in head_state}
    weight = next((head_state[f"{m}.weight"] for m in modules if f"{m}.weight" in head_state), None)
    if len(modules) != 1 or weight is None or tuple(weight.shape) != (1, hidden):
        raise ModelLoadError(f"{where}: expected one score head of shape (1, {hidden}) beside the LoRA weights, "
                             f"found {sorted(head_state)[:4]}")
    (module,) = modules
    bias = head_state.get(f"{module}.bias")
    head = nn.Linear(hidden, 1, bias=bias is not None, dtype=torch.float32)
    with torch.no_grad():
        head.weight.copy_(weight)
        if bias is not None:
            head.bias.copy_(bias)
    return head


def _copy_exact(params: dict[str, nn.Parameter], state: dict[str, torch.Tensor], where: str) -> None:
    missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
    if missing or unexpected:
        raise ModelLoadError(f"{where}: the LoRA weights do not fit this base (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}); was the reward model trained on the same base model?")
    with torch.no_grad():
        for key, p in params.items():
            if p.shape != state[key].shape:
                raise ModelLoadError(f"{where}: {key}: shape {tuple(state[key].shape)}, "
                                     f"the base needs {tuple(p.shape)}")
            p.copy_(state[key])


def load_reward_adapter(base: SharedBase, path, name: str = "reward") -> AdapterScalarModel:
    """A LoRA reward-model directory (module docstring) as frozen adapter ``name`` on ``base``, with
    its score head and shift: scores equal those of the SEQ_CLS peft model that wrote it."""
    import safetensors.torch
    from peft import LoraConfig

    path = Path(path)
    config = LoraConfig.from_pretrained(str(path))
    if config.task_type != "SEQ_CLS":
        raise ModelLoadError(f"{path}: a LoRA reward model is a SEQ_CLS adapter, this one is {config.task_type}")
    source, target = backbone_prefixes(base.lm)
    backbone, head_state = split_reward_state(safetensors.torch.load_file(str(path / ADAPTER_WEIGHTS)), source, target)
    config.task_type = "CAUSAL_LM"
    config.modules_to_save = None
    config.target_modules = rename_target_modules(config.target_modules, source, target)
    base.add_adapter(name, config, trainable=False)
    _copy_exact(base.parameters_of(name), backbone, str(path))
    head = _head_from(head_state, base.lm.config.hidden_size, str(path)).to(base.device())
    shift_file = path / SCORE_FILE
    shift = json.loads(shift_file.read_text())["fourfold_score_shift"] if shift_file.is_file() else None
    return AdapterScalarModel(base, name, head.requires_grad_(False), shift)


@dataclass
class SharedRoles:
    """The four roles over one base (the fields of ``trainers.lm.Roles``, plus the base)."""

    tokenizer: Any
    policy: AdapterLM
    reference: AdapterDisabledReference
    reward: Any
    critic: Optional[AdapterScalarModel] = None
    reward_model: Optional[nn.Module] = None
    base: Optional[SharedBase] = field(default=None, repr=False)


def build_shared_roles(
    policy: str,
    lora: LoraSettings,
    device: Any = "cpu",
    *,
    tokenizer: Optional[str] = None,
    dtype: Any = None,
    trust_remote_code: bool = False,
    reward: Optional[str] = None,
    reward_fn: Optional[Callable[[list[str], list[str]], Any]] = None,
    with_critic: bool = False,
    critic_init: str = "reward",
    concurrent: bool = False,
) -> SharedRoles:
    """Tokenizer and the four roles over one copy of ``policy`` (the SFT model directory).

    * policy: adapter ``policy`` (trained); reference: the base with adapters disabled;
    * reward: ``reward`` as a LoRA reward adapter directory (``adapter_config.json`` inside: loaded as
      adapter ``reward`` on this base, see :func:`load_reward_adapter`), as
      a separate frozen reward-model directory (a second model, as today), or ``reward_fn``;
    * critic (``with_critic``): adapter ``critic`` plus a value head, from ``critic_init`` ('policy':
      fresh adapter, zero head; 'reward': a copy of the reward adapter, which it then needs).

    The tokenizer gets a dedicated pad token and the base's embeddings are resized before the
    adapters are injected, as ``trainers.lm.load_roles`` does. ``concurrent=True`` is refused:
    roles over one base cannot run in parallel threads.
    """
    if concurrent:
        raise ConfigError("run.concurrent_roles: roles sharing one LoRA base cannot run concurrently "
                          "(adapter switching is not thread-safe); set it to false")
    if critic_init not in ("reward", "policy"):
        raise ConfigError(f"model.critic_init: expected 'reward' or 'policy', got {critic_init!r}")
    if reward is None and reward_fn is None:
        raise ConfigError("model.reward: a reward model directory or a reward function is needed")
    tok = load_tokenizer(tokenizer or policy, trust_remote_code=trust_remote_code)
    kw = dict(dtype=dtype, device=device, trust_remote_code=trust_remote_code)
    lm = load_causal_lm(policy, **kw)
    ensure_pad_embedding(lm, tok)
    base = SharedBase(lm, lora, POLICY)
    reward_model: Optional[nn.Module] = None
    if reward is None:
        reward_role: Any = FunctionReward(reward_fn)
    else:
        if is_adapter_dir(reward):
            reward_model = load_reward_adapter(base, reward, REWARD)
        else:
            reward_model = ScalarModel(load_sequence_scorer(reward, **kw))
            ensure_pad_embedding(reward_model.hf, tok)
        reward_role = ModelReward(reward_model)
    critic = None
    if with_critic:
        from_reward = critic_init == "reward"
        if from_reward and not isinstance(reward_model, AdapterScalarModel):
            raise ConfigError("model.critic_init: 'reward' with an adapter critic needs the reward model as a LoRA "
                              "adapter on the same base (a LoRA `fourfold reward` run); use 'policy'")
        critic = add_critic(base, lora, reward_model if from_reward else None)
        critic.train()
    policy_role = AdapterLM(base, POLICY)
    policy_role.train()
    return SharedRoles(tok, policy_role, AdapterDisabledReference(base), reward_role, critic, reward_model, base)
