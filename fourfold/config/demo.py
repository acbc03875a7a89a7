"""`fourfold demo`: the embedded default (SFT -> RM -> PPO -> eval -> report on the review task)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from fourfold.config.loader import require, require_at_least, require_positive
from fourfold.config.lora import LoraConfig
from fourfold.config.ppo import GenerationConfig, PPOAlgoConfig
from fourfold.config.run import RunConfig


def _require_steps(section, prefix: str) -> None:
    """The optimiser settings the demo's SFT and reward stages share: steps, batch_size, lr."""
    require_at_least(section, prefix, 1, "steps", "batch_size")
    require_positive(section, prefix, "lr")


@dataclasses.dataclass
class DemoModelConfig:
    """The tiny Llama-shaped model the demo trains from scratch (word-level tokenizer)."""

    hidden_size: int = 128
    """Hidden size of the SFT model (and so of every role: all are initialised from it)."""
    num_layers: int = 2
    """Decoder layers."""
    num_heads: int = 4
    """Attention heads."""
    max_positions: int = 64
    """Longest prompt + response in tokens."""

    def validate(self, prefix: str = "model") -> None:
        require_at_least(self, prefix, 1, "hidden_size", "num_layers", "num_heads", "max_positions")
        require(self.hidden_size % self.num_heads == 0, f"{prefix}.hidden_size", "must be divisible by num_heads")


@dataclasses.dataclass
class DemoSFTConfig:
    """Stage 1: the corpus and supervised fine-tuning from scratch."""

    examples: int = 20000
    """Generated reviews to train on."""
    steps: int = 1200
    """Optimizer steps."""
    batch_size: int = 32
    """Examples per step."""
    lr: float = 3e-3
    """Peak learning rate (warm-up then linear decay)."""

    def validate(self, prefix: str = "sft") -> None:
        _require_steps(self, prefix)
        require_at_least(self, prefix, 1, "examples")


@dataclasses.dataclass
class DemoPairsConfig:
    """Stage 2: response pairs sampled from the SFT model, labelled by the simulated labelers."""

    pairs: int = 4000
    """Preference pairs for training the reward model."""
    eval_pairs: int = 500
    """Held-out pairs: reward-model accuracy against the labelers and against gold."""
    temperature: float = 1.0
    """Sampling temperature for the pairs."""
    slip_eval_pairs: int = 250
    """Held-out minimal pairs: an SFT sample against the same sample with one slip (a word
    substituted, swapped, dropped or repeated), labelled by the same labelers. The RM's accuracy
    on them says whether it sees grammar at all."""
    slip_pairs: int = 0
    """More such minimal pairs added to the RM's training data (0: none, the default). Natural
    pairs rarely differ in well-formedness, so without them the RM cannot learn that broken text
    is bad; they help only with a deeper RM (reward.extra_layers, see the README)."""

    def validate(self, prefix: str = "pairs") -> None:
        require_positive(self, prefix, "pairs", "eval_pairs")
        require_at_least(self, prefix, 0, "slip_pairs", "slip_eval_pairs")
        require_positive(self, prefix, "temperature")


@dataclasses.dataclass
class DemoRewardConfig:
    """Stage 3: the reward model, initialised from the SFT model."""

    steps: int = 600
    """Optimizer steps."""
    batch_size: int = 32
    """Pairs per step."""
    lr: float = 1e-3
    """Peak learning rate."""
    extra_layers: int = 0
    """Decoder layers added on top of the SFT model's before training (fourfold.models.factory.
    grow_layers: their output projections start at zero, so the grown model starts as the SFT
    model). With the SFT model's 2 layers alone the RM cannot learn to see a grammar slip, even
    from slip pairs; 0 (the default) keeps the RM the SFT model's size."""

    def validate(self, prefix: str = "reward") -> None:
        _require_steps(self, prefix)
        require_at_least(self, prefix, 0, "extra_layers")


@dataclasses.dataclass
class DemoEvalConfig:
    """Stage 5: before/after evaluation on held-out prompts."""

    prompts: int = 256
    """Held-out prompts (never seen in PPO)."""
    samples_in_report: int = 8
    """Rows of the before/after sample table (and of the per-token advantage view)."""

    def validate(self, prefix: str = "eval") -> None:
        require_at_least(self, prefix, 1, "prompts")
        require_at_least(self, prefix, 0, "samples_in_report")


@dataclasses.dataclass
class DemoLoraConfig(LoraConfig):
    """The demo in LoRA mode (`fourfold demo lora.r=16`): the adapter settings of `model.lora`, and
    which stages use them. SFT trains from scratch, so it always learns every weight."""

    reward: bool = True
    """Train the reward model as a LoRA adapter on the SFT model too; PPO then holds one base in
    memory for all four roles (critic_mode adapter, the critic starting as the reward adapter).
    false: the reward model stays fully fine-tuned (its cached stage is reused) and PPO's critic is
    a separate full copy of it."""
    lr_multiplier: float = 3.0
    """The policy's learning rate (ppo.lr) and the LoRA reward model's (reward.lr) are the
    configured ones times this: at one learning rate a low-rank adapter moves the weights far less
    than full fine-tuning does, so LoRA wants a higher rate. 3 (measured in docs/lora.md: at 10 the
    LoRA reward model ended at chance against gold and the policy's KL spiked). The critic keeps
    ppo.critic_lr (its value head, trained in full, would not stand the higher rate)."""

    def validate(self, prefix: str = "lora") -> None:
        super().validate(prefix)
        require_positive(self, prefix, "lr_multiplier")

    def adapter(self) -> LoraConfig:
        """The `model.lora` section of the stages that train with LoRA."""
        return LoraConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LoraConfig)})


@dataclasses.dataclass
class DemoConfig:
    """`fourfold demo`: RLHF from zero on the embedded review task (SFT -> RM -> PPO -> eval -> report)."""

    quick: bool = False
    """A short budget (about 2 minutes on 2 cores) for tests and a first look."""
    fresh: bool = False
    """Ignore cached stage outputs and rerun every stage."""
    task_options: dict = dataclasses.field(default_factory=dict)
    """Options of the review task (fourfold.tasks.ReviewTaskConfig fields, e.g. labeler_length_bias)."""
    model: DemoModelConfig = dataclasses.field(default_factory=DemoModelConfig)
    sft: DemoSFTConfig = dataclasses.field(default_factory=DemoSFTConfig)
    pairs: DemoPairsConfig = dataclasses.field(default_factory=DemoPairsConfig)
    reward: DemoRewardConfig = dataclasses.field(default_factory=DemoRewardConfig)
    ppo: PPOAlgoConfig = dataclasses.field(default_factory=lambda: PPOAlgoConfig(
        iterations=150, rollout_batch_size=64, minibatch_size=16, lr=3e-4, critic_lr=1e-3, kl_coef=0.05))
    generation: GenerationConfig = dataclasses.field(default_factory=lambda: GenerationConfig(max_new_tokens=40))
    """PPO's sampling settings; the response length and the engine (`engine`, `weights`, `compile`,
    `stop_check_every`) also of the preference pairs' sampling and the eval stage's (the same
    tokens with either engine, so no stage's cache key holds the engine)."""
    eval: DemoEvalConfig = dataclasses.field(default_factory=DemoEvalConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(
        output_dir="runs/demo", threads=1, save_every=10, concurrent_roles=True))
    lora: Optional[DemoLoraConfig] = None
    """LoRA mode for PPO (and the reward model, see lora.reward), e.g. `lora.r=16`; null = full
    fine-tuning everywhere (the stages' cache keys are then those of a demo without this key)."""

    def validate(self, prefix: str = "") -> None:
        if self.lora is not None and self.lora.reward:
            require(self.reward.extra_layers == 0, "lora.reward",
                    "a LoRA reward model shares the SFT model's base: it cannot have reward.extra_layers")
