"""`dist`: where each model of a run lives when ``torchrun`` launches it (ignored in one process).

Under ``torchrun --nproc-per-node N`` a trained model (the SFT model, the reward model being
trained, DPO's and PPO's policy, PPO's critic) is sharded with FSDP2 (``fsdp``, the default: each
decoder layer, then the root; 1/N of its weights, gradients and AdamW state per rank) or replicated
(``replicate``: a full copy with its AdamW state on every rank, the gradients averaged over the
ranks in one all-reduce per optimizer step, for a model small enough to fit whole on every device).
A frozen model of PPO and REINFORCE (the reference, the reward model) is either a full copy on every
rank (``replicate``, the default: no communication in its forwards) or sharded too (``fsdp``: 1/N
of its weights per rank, optionally offloaded to CPU memory between uses). With ``model.lora`` the
roles on the shared base (the adapters, the reference that is the base itself) are placed with the
base, as the trained adapters' key says. DPO's reference is used once, before training (each rank
its share of the pairs, with a full copy). Without torchrun nothing here applies. The defaults need
no keys: ``torchrun ... -m fourfold.cli ppo --config CFG`` just works.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from fourfold.config.loader import require

Placement = Literal["fsdp", "replicate"]


@dataclasses.dataclass
class TrainedDistConfig:
    """Placement of the one trained model of `fourfold sft`, `fourfold reward` and `fourfold dpo`
    (its policy) under torchrun."""

    model: Placement = "fsdp"
    """The trained model: 'fsdp' (FSDP2: 1/N of its weights, gradients and AdamW state per rank) or
    'replicate' (a full copy per rank, one gradient all-reduce per step)."""
    mixed_precision: bool = False
    """bf16 parameters for the forward and backward, fp32 gradient reduction and fp32 master weights
    (FSDP2 MixedPrecisionPolicy, for the models placed 'fsdp'); CUDA only."""


@dataclasses.dataclass
class LMDistConfig:
    """Placement of the roles of `fourfold ppo` and `fourfold reinforce` under torchrun."""

    policy: Placement = "fsdp"
    """The policy (trained): 'fsdp' (sharded) or 'replicate' (a full copy per rank, one gradient
    all-reduce per step)."""
    critic: Placement = "fsdp"
    """PPO's critic (trained): 'fsdp' or 'replicate'; an adapter critic (model.critic_mode: adapter)
    shares the LoRA base with the policy and takes the policy's placement."""
    reference: Placement = "replicate"
    """The frozen reference: 'replicate' (a full copy per rank) or 'fsdp' (sharded)."""
    reward: Placement = "replicate"
    """The frozen reward model: 'replicate' or 'fsdp' (a reward_fn has no model: ignored)."""
    cpu_offload: bool = False
    """Keep the frozen roles placed 'fsdp' in CPU memory between their forwards (CPUOffloadPolicy)."""
    mixed_precision: bool = False
    """bf16 parameters for the forward and backward, fp32 gradient reduction and fp32 master weights
    (FSDP2 MixedPrecisionPolicy, for the models placed 'fsdp'); CUDA only."""

    def validate(self, prefix: str = "dist") -> None:
        require(not self.cpu_offload or "fsdp" in (self.reference, self.reward), f"{prefix}.cpu_offload",
                "offloads the frozen roles placed fsdp, and neither dist.reference nor dist.reward is fsdp")


def check_dist(dist, run) -> None:
    """Checks across sections of a stage with a ``dist`` section: mixed precision needs CUDA
    (``run.device: cpu`` is refused here; 'auto' on a machine without CUDA when the run starts)."""
    require(not (dist.mixed_precision and run.device == "cpu"), "dist.mixed_precision",
            "bf16 mixed precision needs CUDA, and run.device is cpu; set dist.mixed_precision=false")
