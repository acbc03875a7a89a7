"""`fourfold demo --task arithmetic`: the settings of the verifiable world's demo (SFT from scratch
on a partly-right corpus -> GRPO with the rule reward -> report; fourfold.apps.demo.arithmetic).
Standard library only. The defaults are the measured settings of docs/arithmetic.md."""

from __future__ import annotations

import dataclasses

from fourfold.config.loader import require
from fourfold.config.run import RunConfig


@dataclasses.dataclass
class ArithmeticDemoConfig:
    """`fourfold demo --task arithmetic`: RL from a verifiable reward on the embedded arithmetic
    world, with greedy and sampled held-out accuracy before and after GRPO."""

    quick: bool = False
    """A tiny budget (well under a minute on 2 cores) for tests: every stage runs, nothing is learnt."""
    fresh: bool = False
    """Ignore cached stage outputs (stages/<name>/DONE) and rerun every stage."""
    digits: int = 2
    """Digits of each operand (2: 10 + 10 to 99 + 99)."""
    error_rate: float = 0.6
    """Share of SFT demonstrations with one mistake (a dropped carry, else a slip)."""
    examples: int = 20000
    """SFT demonstrations."""
    hidden_size: int = 64
    """Hidden size of the policy, a Llama trained from scratch."""
    num_layers: int = 2
    """Its decoder layers."""
    sft_steps: int = 500
    """SFT optimizer steps."""
    sft_lr: float = 3.0e-3
    """SFT peak learning rate."""
    sft_batch_size: int = 64
    """SFT examples per step."""
    iterations: int = 30
    """GRPO iterations."""
    samples_per_prompt: int = 8
    """GRPO's group: answers per problem."""
    rollout_batch_size: int = 256
    """Answers per GRPO iteration (rollout_batch_size / samples_per_prompt problems)."""
    minibatch_size: int = 128
    """Answers per GRPO optimizer step."""
    lr: float = 1.0e-4
    """GRPO learning rate (constant)."""
    kl_coef: float = 0.0
    """GRPO's k3 KL in the loss: 0, the verifier cannot be hacked."""
    heldout: int = 512
    """Held-out problems (pairs never seen in SFT or GRPO) of the before/after accuracy."""
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs/demo-arithmetic", threads=1))

    def validate(self, prefix: str = "") -> None:
        require(1 <= self.digits <= 6, "digits", f"must be in [1, 6], got {self.digits}")
        require(0.0 <= self.error_rate <= 1.0, "error_rate", f"must be in [0, 1], got {self.error_rate}")
        for key in ("examples", "hidden_size", "num_layers", "sft_steps", "sft_batch_size", "iterations",
                    "samples_per_prompt", "rollout_batch_size", "minibatch_size", "heldout"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        for key in ("sft_lr", "lr"):
            require(getattr(self, key) > 0, key, f"must be > 0, got {getattr(self, key)}")
        require(self.kl_coef >= 0, "kl_coef", f"must be >= 0, got {self.kl_coef}")
        require(self.hidden_size % 4 == 0, "hidden_size", f"must be a multiple of 4 (4 heads), got {self.hidden_size}")
        require(self.rollout_batch_size % self.samples_per_prompt == 0, "rollout_batch_size",
                f"must be a multiple of samples_per_prompt ({self.samples_per_prompt}), got {self.rollout_batch_size}")


QUICK = {"examples": 2000, "hidden_size": 32, "num_layers": 1, "sft_steps": 40, "sft_batch_size": 32,
         "iterations": 2, "samples_per_prompt": 4, "rollout_batch_size": 32, "minibatch_size": 32, "heldout": 64}
"""--quick: the same stages on a tiny budget (the default tier's end-to-end test)."""
