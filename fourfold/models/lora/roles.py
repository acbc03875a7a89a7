"""The LoRA roles over a :class:`~fourfold.models.lora.base.SharedBase`: the policy
(:class:`AdapterLM`) and the scalar roles, critic and reward model (:class:`AdapterScalarModel`).

Each role module registers only its own parameters (its adapter's LoRA weights and its head), so
``role.parameters()`` is what its optimizer steps, ``role.state_dict()`` is what a checkpoint holds,
``role.requires_grad_()``/``train()``/``eval()`` touch only its adapter, and the base never gets a
gradient. A role activates its adapter for the duration of its forward (:meth:`SharedBase.activate`).
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
from torch import nn

from fourfold.models.lora.base import CRITIC, POLICY, LoraSettings, SharedBase
from fourfold.models.roles import ScalarRole


class _AdapterWeights(nn.Module):
    """Registers one adapter's parameters (``/`` for ``.`` in their names) and dropout modules, so the
    role holding it owns exactly them; the base's own weights are not registered anywhere here.
    :meth:`refresh` registers the base's current ones (after sharding replaced them)."""

    def __init__(self, base: SharedBase, name: str):
        super().__init__()
        self.base, self.adapter = base, name  # the base: a plain object, not a submodule
        self.refresh()
        self.dropouts = nn.ModuleList(base.dropouts_of(name))
        base.hold(self)

    def refresh(self) -> None:
        self.weights = nn.ParameterDict({k.replace(".", "/"): p for k, p in self.base.parameters_of(self.adapter).items()})


class _OnSharedBase:
    """What the LoRA roles share: the module their forwards run through (a torchrun placement
    shards it, and a sharded role's parameters are gathered through it)."""

    base: SharedBase

    @property
    def runs_on(self) -> nn.Module:
        """The shared base's :class:`~fourfold.models.lora.base.BaseRunner`."""
        return self.base.runner


class AdapterLM(_OnSharedBase, nn.Module):
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
            return self.base.runner(*args, **kwargs)


class AdapterScalarModel(_OnSharedBase, ScalarRole, nn.Module):
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
        base.add_head(name, head)

    @property
    def config(self):
        return self.base.lm.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                keep_last: Optional[int] = None) -> torch.Tensor:
        """Per-position scalars [B, L] (or [B, keep_last]), float32."""
        with self.base.activate(self.adapter):
            return self.base.runner(input_ids, attention_mask, keep_last, self.score_shift, head=self.adapter)


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
