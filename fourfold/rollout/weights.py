"""The weights a rollout engine samples with (``generation.weights``), and the one weight-sync step.

An engine is given the policy at two moments: ``sync(policy)`` once per iteration, after the
previous update and before the rollout (the step a server engine holding its own copy of the
weights needs too), and the policy module at every call. Where its forwards take the weights from:

* :class:`AutoWeights` (``auto``, the default): ``gathered`` for an FSDP-sharded policy, ``live``
  otherwise (:func:`~fourfold.config.ppo.resolve_weights`): the faster of the two, the same numbers.
  ``resolved`` says which, once the engine has seen the policy.
* :class:`LiveWeights` (``live``): the training module as it is: a LoRA policy's
  adapter applied on the fly over the shared base, the bf16 casts of ``bf16-mixed`` made by
  autocast, an FSDP-sharded policy gathered layer by layer at every forward (every token).
  Nothing to sync; the least memory under torchrun, and the slowest there.
* :class:`GatheredWeights` (``gathered``): the training module, but an FSDP-sharded policy is
  gathered once per rollout: every FSDP unit keeps its gathered weights from its first forward
  until the rollout ends (``set_reshard_after_forward(False)``), then is resharded. Memory: the
  whole policy's weights on every rank during the rollout. In one process the same as ``live``.
* :class:`CopiedWeights` (``copy``): a plain inference copy of the policy
  (:func:`~fourfold.models.decoding.inference_copy`: no peft layers, no FSDP, no autocast hooks),
  refreshed by every ``sync`` in place: a LoRA adapter merged into it, FSDP shards gathered into
  it (once per iteration), in bf16 when training is ``bf16-mixed`` or ``bf16`` (and then run
  without autocast). Memory: one more copy of the policy's weights, resident. With LoRA and
  ``bf16-mixed`` the sampled tokens' log-probs come from the merged bf16 copy, so they differ from
  the training forward's by bf16 rounding (PPO's first ratio is then not exactly 1).

The same tokens in every mode in float32 (up to the rounding of a merged adapter); the tests
compare them (``tests/rollout/test_engine.py``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from torch import nn

from fourfold.config.ppo import resolve_weights
from fourfold.models.decoding import inference_copy, load_current_weights

WEIGHTS = ("auto", "live", "gathered", "copy")


class LiveWeights:
    """``generation.weights: live``: the engine runs the training module itself."""

    def sync(self, policy: nn.Module) -> None:
        """Nothing to copy: the engine reads the policy's own weights."""

    @contextlib.contextmanager
    def model(self, policy: nn.Module) -> Iterator[nn.Module]:
        """The module the rollout's forwards call: ``policy``."""
        yield policy


def fsdp_units(module: nn.Module) -> list:
    """The FSDP2 units inside ``module`` (``fully_shard`` applied), outermost first; [] when none."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


class GatheredWeights(LiveWeights):
    """``generation.weights: gathered``: the training module, each FSDP unit gathered once per rollout."""

    @contextlib.contextmanager
    def model(self, policy: nn.Module) -> Iterator[nn.Module]:
        """``policy`` with every FSDP unit but the root (which keeps its weights after a forward
        anyway) told to keep its gathered weights after its forward, for the whole rollout; then
        every unit resharded and told to reshard again, as training expects."""
        units = fsdp_units(policy)
        inner = [u for u in units if u is not policy]
        for unit in inner:
            unit.set_reshard_after_forward(False, recurse=False)
        try:
            yield policy
        finally:
            for unit in inner:
                unit.set_reshard_after_forward(True, recurse=False)
            for unit in units:
                unit.reshard()


class AutoWeights(GatheredWeights):
    """``generation.weights: auto``: gathered weights, which for a policy without FSDP units are its
    live weights (nothing to gather: the very same forwards), so one class serves both resolutions."""

    def __init__(self) -> None:
        self.resolved: Optional[str] = None
        """``gathered`` or ``live``: what ``auto`` is for the policy last synced or sampled (None before)."""

    def sync(self, policy: nn.Module) -> None:
        self.resolved = resolve_weights("auto", bool(fsdp_units(policy)))

    @contextlib.contextmanager
    def model(self, policy: nn.Module) -> Iterator[nn.Module]:
        if self.resolved is None:
            self.sync(policy)
        with super().model(policy) as m:
            yield m


class CopiedWeights:
    """``generation.weights: copy``: a plain inference copy in ``dtype`` (None: the policy's
    weights dtype), built at the first :meth:`sync` and refreshed in place by every later one."""

    def __init__(self, dtype: Optional[torch.dtype] = None):
        self.dtype = dtype
        self.copy: Optional[nn.Module] = None
        self.syncs = 0

    def sync(self, policy: nn.Module) -> None:
        """Copy the policy's current weights into the inference copy (building it the first time):
        under torchrun every rank calls it (an FSDP-sharded policy's shards are gathered)."""
        if self.copy is None:
            self.copy = inference_copy(policy, self.dtype)
        load_current_weights(self.copy, policy)
        self.syncs += 1

    @contextlib.contextmanager
    def model(self, policy: nn.Module) -> Iterator[nn.Module]:
        """The inference copy (``policy`` is not read: the copy holds its weights as of the last
        sync), with autocast off: the copy is already in the dtype it computes in."""
        if self.copy is None:
            raise RuntimeError("generation.weights: copy: the engine was never synced with the policy "
                               "(call engine.sync(policy) after each update, before the rollout)")
        device_type = next(self.copy.parameters()).device.type
        with torch.autocast(device_type=device_type, enabled=False):
            yield self.copy


def make_weights(kind: str, precision: str = "fp32"):
    """The weights of ``generation.weights`` = ``kind`` for a run in ``precision`` (``model.precision``):
    a ``copy`` is bf16 under ``bf16-mixed`` and ``bf16``, else in the policy's weights dtype."""
    if kind == "auto":
        return AutoWeights()
    if kind == "live":
        return LiveWeights()
    if kind == "gathered":
        return GatheredWeights()
    if kind == "copy":
        return CopiedWeights(torch.bfloat16 if precision in ("bf16-mixed", "bf16") else None)
    raise ValueError(f"generation.weights: {kind!r}: expected one of {', '.join(WEIGHTS)}")
