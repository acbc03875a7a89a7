"""`dist`: where each model of a run lives when ``torchrun`` launches it (ignored in one process).

Under ``torchrun --nproc-per-node N`` every trained model (the SFT model, the reward model being
trained, DPO's and PPO's policy, PPO's critic) is sharded with FSDP2 (``fsdp``: each decoder layer,
then the root); a frozen model of PPO and REINFORCE (the reference, the reward model) is either a
full copy on every rank (``replicate``, the default: no communication in its forwards) or sharded
too (``fsdp``: 1/N of its weights per rank, optionally offloaded to CPU memory between uses). DPO's
reference is used once, before training, by every rank in full. Without torchrun nothing here
applies. The defaults need no keys: ``torchrun ... -m fourfold.cli ppo --config CFG`` just works.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from fourfold.config.loader import require

Placement = Literal["fsdp", "replicate"]


def _trained_role(value: str, key: str, role: str) -> None:
    """A trained role shards with FSDP2: ``replicate`` is refused, naming the key."""
    require(value == "fsdp", key, f"{value} is not supported for {role}, which trains (trained models shard "
                                  "with FSDP2); use fsdp")


@dataclasses.dataclass
class TrainedDistConfig:
    """Placement of the one trained model of `fourfold sft`, `fourfold reward` and `fourfold dpo`
    (its policy) under torchrun."""

    model: Placement = "fsdp"
    """The trained model: 'fsdp' (FSDP2, the only choice for a trained model)."""
    mixed_precision: bool = False
    """bf16 parameters for the forward and backward, fp32 gradient reduction and fp32 master weights
    (FSDP2 MixedPrecisionPolicy); CUDA only."""

    def validate(self, prefix: str = "dist") -> None:
        _trained_role(self.model, f"{prefix}.model", "the model")


@dataclasses.dataclass
class LMDistConfig:
    """Placement of the roles of `fourfold ppo` and `fourfold reinforce` under torchrun."""

    policy: Placement = "fsdp"
    """The policy (trained): 'fsdp'."""
    critic: Placement = "fsdp"
    """PPO's critic (trained): 'fsdp'."""
    reference: Placement = "replicate"
    """The frozen reference: 'replicate' (a full copy per rank) or 'fsdp' (sharded)."""
    reward: Placement = "replicate"
    """The frozen reward model: 'replicate' or 'fsdp' (a reward_fn has no model: ignored)."""
    cpu_offload: bool = False
    """Keep the frozen roles placed 'fsdp' in CPU memory between their forwards (CPUOffloadPolicy)."""
    mixed_precision: bool = False
    """bf16 parameters for the forward and backward, fp32 gradient reduction and fp32 master weights
    (FSDP2 MixedPrecisionPolicy); CUDA only."""

    def validate(self, prefix: str = "dist") -> None:
        _trained_role(self.policy, f"{prefix}.policy", "the policy")
        _trained_role(self.critic, f"{prefix}.critic", "the critic")
        require(not self.cpu_offload or "fsdp" in (self.reference, self.reward), f"{prefix}.cpu_offload",
                "offloads the frozen roles placed fsdp, and neither dist.reference nor dist.reward is fsdp")


def check_dist(dist, run) -> None:
    """Checks across sections of a stage with a ``dist`` section: mixed precision needs CUDA
    (``run.device: cpu`` is refused here; 'auto' on a machine without CUDA when the run starts)."""
    require(not (dist.mixed_precision and run.device == "cpu"), "dist.mixed_precision",
            "bf16 mixed precision needs CUDA, and run.device is cpu; set dist.mixed_precision=false")
