"""What the memory estimate reads: a role plan (:func:`fourfold.models.plan.plan_roles`, the one the
loader builds) and what the plan does not say, the batch shape and the devices (:class:`Workload`).

:class:`EstimateInput` holds both, with the byte sizes the plan's dtypes and precision give. The
estimate asks nothing else of a config: which roles exist, their forms (a model of its own, an
adapter on the shared base, the base itself, a function), sources, dtypes and placements are the
plan's :class:`~fourfold.models.plan.RoleSpec` s, read as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

import torch

from fourfold.models.plan import FULL, FUNCTION, RolePlan, RoleSpec

ENGINE_WEIGHTS = ("live", "gathered", "copy")
ENGINES = ("eager", "static")
DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}
ESTIMATED_STAGES = ("ppo", "reinforce")


@dataclass
class Workload:
    """The batch shape and the devices of a run (the config's ``ppo`` / ``reinforce``, ``data``,
    ``generation.weights`` and the number of processes)."""

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
    nproc: int = 1
    """Devices; FSDP shards what the plan places ``fsdp`` across them."""
    engine_weights: str = "live"
    """Where the rollout engine's forwards take the policy's weights from (``generation.weights``):
    ``live``, the policy itself; ``gathered``, the policy with every FSDP unit kept gathered through
    the rollout (with ``nproc`` > 1: its whole weights on every device while sampling); ``copy``, a
    resident inference copy (bf16 under bf16-mixed and bf16, else the policy's weights dtype; a LoRA
    policy's copy is its base with the adapter merged)."""
    env_max_tokens: Optional[int] = None
    """``env.max_tokens`` of a multi-turn environment run (``env.factory`` set): the most tokens of
    one trajectory (the first observation, the policy's turns, the later observations), the length
    the rollout's KV cache and the training forwards run over; None = a single-turn run."""
    engine: str = "eager"
    """``generation.engine``: with ``env_max_tokens``, the static engine's turn cache holds
    ``env_max_tokens + 1`` slots, the eager engine's grows to the trajectory's length (a
    single-turn run's cache is ``P + T`` positions on either)."""

    @property
    def prompt_tokens(self) -> int:
        """The first observation's tokens: P (``max_prompt_len``); in an environment run at most
        ``env_max_tokens - 1`` (a first observation must leave the policy a token)."""
        return self.max_prompt_len if self.env_max_tokens is None else min(self.max_prompt_len, self.env_max_tokens - 1)

    @property
    def response_tokens(self) -> int:
        """The positions after the first observation that the training forwards score (the LM head's
        ``T``): ``max_new_tokens``; in an environment run the rest of the trajectory,
        ``env_max_tokens - prompt_tokens`` (the policy's turns and the later observations)."""
        return self.max_new_tokens if self.env_max_tokens is None else self.env_max_tokens - self.prompt_tokens

    @property
    def seq_len(self) -> int:
        """Tokens of one row of the rollout and of the training forwards: ``P + T``, or
        ``env_max_tokens`` in an environment run."""
        return self.prompt_tokens + self.response_tokens

    @property
    def kv_positions(self) -> int:
        """Positions of the rollout's KV cache per row: ``seq_len``, plus the static engine's spare
        slot in an environment run (its turn cache is ``env_max_tokens + 1`` slots)."""
        spare = self.env_max_tokens is not None and self.engine == "static"
        return self.seq_len + int(spare)

    def validate(self) -> None:
        """Raise ValueError on a size below 1, an ``env_max_tokens`` below 2 or an unknown
        ``engine_weights`` or ``engine``."""
        sizes = (self.rollout_batch_size, self.minibatch_size, self.micro_batch_size or 1, self.max_prompt_len,
                 self.max_new_tokens, self.nproc)
        if min(sizes) < 1:
            raise ValueError("batch sizes, lengths and nproc must be >= 1")
        if self.env_max_tokens is not None and self.env_max_tokens < 2:
            raise ValueError(f"env_max_tokens must be >= 2, got {self.env_max_tokens}")
        if self.engine_weights not in ENGINE_WEIGHTS:
            raise ValueError(f"engine_weights {self.engine_weights!r}: expected one of {', '.join(ENGINE_WEIGHTS)}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine {self.engine!r}: expected one of {', '.join(ENGINES)}")


def dtype_bytes(dtype: Optional[torch.dtype]) -> int:
    """Bytes of one element of a weights dtype (float32 when None)."""
    return DTYPE_BYTES[dtype or torch.float32]


@dataclass(frozen=True)
class EstimateInput:
    """A plan, its workload, and the byte sizes they give."""

    plan: RolePlan
    workload: Workload = field(default_factory=Workload)
    configs: Mapping = field(default_factory=dict)
    """Model source -> a transformers config object, for sources that are no directory (tests and
    the synthetic benchmark); every other source's ``config.json`` is read."""

    def validate(self) -> None:
        """Raise ValueError on a plan the estimate does not cover or a bad workload."""
        if self.plan.stage not in ESTIMATED_STAGES:
            raise ValueError(f"the memory estimate covers {' and '.join(ESTIMATED_STAGES)} plans, "
                             f"not {self.plan.stage!r}")
        if self.plan.logits_chunk is not None and self.plan.logits_chunk < 1:
            raise ValueError("logits_chunk must be >= 1")
        self.workload.validate()

    @property
    def precision(self) -> str:
        """``fp32`` | ``bf16-mixed`` | ``bf16``: the plan's precision; under ``fp32``, ``bf16`` when the
        trained weights are not float32 (``model.dtype: bfloat16`` computes in bf16 too)."""
        if self.plan.precision == "bf16-mixed":
            return "bf16-mixed"
        return self.plan.precision if self.plan.trained_dtype == torch.float32 else "bf16"

    @property
    def master(self) -> int:
        """Bytes of a trained weight (and of its gradient and each AdamW moment): float32 under
        ``bf16-mixed`` (its master weights, adapters on a bf16 base too), else the trained dtype's."""
        return 4 if self.plan.precision == "bf16-mixed" else dtype_bytes(self.plan.trained_dtype)

    @property
    def frozen(self) -> int:
        """Bytes of a frozen weight (the reference, the reward model, the LoRA base)."""
        return dtype_bytes(self.plan.base_dtype if self.plan.lora is not None else self.plan.frozen_dtype)

    @property
    def compute(self) -> int:
        """Bytes of a computed activation: bf16 under either bf16 precision, else float32."""
        return 4 if self.precision == "fp32" else 2

    @property
    def nproc(self) -> int:
        return self.workload.nproc

    def placement(self, spec: RoleSpec) -> Optional[str]:
        """Where role ``spec`` goes under torchrun: its own placement for a model of its own, the
        shared base's for a role on it, None for a function."""
        if spec.form == FUNCTION:
            return None
        return spec.placement if spec.form == FULL else self.plan.base_placement

    def sharded(self, spec: RoleSpec) -> bool:
        """Whether role ``spec`` is sharded across the devices (FSDP over more than one)."""
        return self.nproc > 1 and self.placement(spec) == "fsdp"


__all__ = ["DTYPE_BYTES", "ENGINES", "ENGINE_WEIGHTS", "EstimateInput", "Workload", "dtype_bytes"]
