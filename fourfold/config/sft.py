"""`fourfold sft`, and the pieces the supervised stages share (initial model, training loop)."""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

from fourfold.config.dist import TrainedDistConfig, check_dist
from fourfold.config.loader import require, require_at_least, validate_precision
from fourfold.config.lora import LoraConfig
from fourfold.config.model_limits import require_fits
from fourfold.config.run import RunConfig


@dataclasses.dataclass
class InitModelConfig:
    """The model a stage starts from: a directory, or a fresh Llama-shaped model from a config."""

    path: Optional[str] = None
    """HF directory (or hub name when online) to start from."""
    tokenizer: Optional[str] = None
    """Tokenizer directory; null = `path`'s (required when training from scratch)."""
    from_scratch: bool = False
    """Build a random-init Llama from the sizes below instead of loading `path`."""
    hidden_size: int = 128
    """From scratch: hidden size."""
    num_layers: int = 2
    """From scratch: decoder layers."""
    num_heads: int = 4
    """From scratch: attention heads."""
    intermediate_size: Optional[int] = None
    """From scratch: MLP width (null = 4 x hidden)."""
    max_positions: int = 128
    """From scratch: longest sequence."""
    trust_remote_code: bool = False
    """Allow model code from the model's repository."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights dtype."""
    lora: Optional[LoraConfig] = None
    """Train LoRA adapters (and, for a reward model, its score head) on the frozen `path` model
    instead of every weight; null = full fine-tuning. The run writes the merged model to
    `model/` and the adapter to `model-adapter/`."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer in backward instead of keeping its activations: less memory,
    about a third more compute; same loss and gradients."""
    precision: Literal["fp32", "bf16-mixed", "bf16"] = "fp32"
    """fp32: compute in the weights' dtype (model.dtype). bf16-mixed: float32 master weights,
    gradients and AdamW state (model.dtype must be float32), forwards under bf16 autocast. bf16:
    weights, gradients and AdamW moments in bf16. The loss is float32 in every mode."""

    def validate(self, prefix: str = "model") -> None:
        require(self.path is not None or self.from_scratch, f"{prefix}.path",
                "missing: a model directory (or model.from_scratch=true with model.tokenizer)")
        validate_precision(self.dtype, self.precision, prefix)
        require_at_least(self, prefix, 1, "hidden_size", "num_layers", "num_heads", "max_positions")
        require(self.intermediate_size is None or self.intermediate_size >= 1, f"{prefix}.intermediate_size",
                f"must be >= 1 or null, got {self.intermediate_size}")
        require(self.lora is None or not self.from_scratch, f"{prefix}.lora",
                "LoRA adapts a trained model (model.path); a model trained from scratch learns every weight")
        if self.from_scratch:
            require(self.tokenizer is not None or self.path is not None, f"{prefix}.tokenizer",
                    "training from scratch needs a tokenizer directory")
            require(self.hidden_size % self.num_heads == 0, f"{prefix}.hidden_size",
                    f"{self.hidden_size} is not divisible by num_heads={self.num_heads}")

    def check_max_len(self, max_len: int) -> None:
        """``train.max_len`` tokens fit the model: ``max_positions`` from scratch, else the limit
        in ``path``'s config.json (read before the model loads)."""
        if self.from_scratch:
            require(max_len <= self.max_positions, "train.max_len",
                    f"{max_len} is more than model.max_positions={self.max_positions}")
        else:
            require_fits(max_len, "train.max_len", [("model.path", self.path)])


@dataclasses.dataclass
class TrainLoopConfig:
    """Optimiser and loop of the supervised stages (SFT, reward model)."""

    epochs: float = 1.0
    """Passes over the training data (fractions allowed); ignored when max_steps is set."""
    max_steps: Optional[int] = None
    """Stop after this many optimizer steps."""
    batch_size: int = 16
    """Examples (pairs for the reward model) per optimizer step."""
    lr: float = 1e-4
    """Peak learning rate (AdamW)."""
    warmup_steps: int = 0
    """Linear warm-up steps, then linear decay to 0 (or constant, below)."""
    lr_schedule: Literal["linear", "constant"] = "linear"
    """Schedule after warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: Optional[float] = 1.0
    """Global gradient-norm clip; null = none."""
    max_len: int = 128
    """Longest prompt + response in tokens; longer examples are an error naming file and line."""
    eval_every: int = 0
    """Evaluate every N steps (0: only at the end)."""
    log_every: int = 10
    """Write a metrics row every N steps."""

    def validate(self, prefix: str = "train") -> None:
        require(self.epochs > 0 or self.max_steps is not None, f"{prefix}.epochs", "must be > 0")
        require(self.max_steps is None or self.max_steps >= 1, f"{prefix}.max_steps", "must be >= 1 or null")
        require(self.batch_size >= 1, f"{prefix}.batch_size", "must be >= 1")
        require(self.lr > 0, f"{prefix}.lr", "must be > 0")
        require(self.warmup_steps >= 0, f"{prefix}.warmup_steps", "must be >= 0")
        require(self.weight_decay >= 0, f"{prefix}.weight_decay", f"must be >= 0, got {self.weight_decay}")
        require(self.eval_every >= 0, f"{prefix}.eval_every", f"must be >= 0 (0: only at the end), got {self.eval_every}")
        require(self.max_len >= 2, f"{prefix}.max_len", "must be >= 2")
        require(self.log_every >= 1, f"{prefix}.log_every", "must be >= 1")
        require(self.max_grad_norm is None or self.max_grad_norm > 0, f"{prefix}.max_grad_norm", "must be > 0 or null")


@dataclasses.dataclass
class SFTDataConfig:
    """SFT data: prompt/completion pairs, whole texts or chat messages."""

    train: Optional[str] = None
    """JSONL or Parquet with `prompt` + `completion` (or `response`), `text`, or `messages`."""
    eval: Optional[str] = None
    """Optional held-out file in the same format."""
    on_error: Literal["raise", "skip"] = "raise"
    """Bad rows: error naming file and line, or skip and count."""
    assistant_turns: Literal["last", "all"] = "last"
    """A `messages` row with several assistant messages: 'last' trains the last one (the messages
    before it are the prompt); 'all' trains every assistant message, each tokenised on its own
    with EOS after it, the text between them (the other messages, the template's markers) not
    trained: the layout of a multi-turn rollout (docs/environments.md)."""

    def validate(self, prefix: str = "data") -> None:
        require(self.train is not None, f"{prefix}.train", "missing: path to the training file")


@dataclasses.dataclass
class SFTConfig:
    """`fourfold sft`: next-token loss on the response part (prompt tokens masked)."""

    model: InitModelConfig = dataclasses.field(default_factory=InitModelConfig)
    data: SFTDataConfig = dataclasses.field(default_factory=SFTDataConfig)
    train: TrainLoopConfig = dataclasses.field(default_factory=TrainLoopConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs/sft"))
    dist: TrainedDistConfig = dataclasses.field(default_factory=TrainedDistConfig)

    def validate(self, prefix: str = "") -> None:
        check_supervised_stage(self)


def check_supervised_stage(stage) -> None:
    """The checks across the sections of `fourfold sft` and `fourfold reward`: ``train.max_len``
    fits the model (:meth:`InitModelConfig.check_max_len`), then the ``dist`` section's."""
    stage.model.check_max_len(stage.train.max_len)
    check_dist(stage.dist, stage.run)
