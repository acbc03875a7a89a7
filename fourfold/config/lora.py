"""`model.lora`: LoRA adapters instead of full fine-tuning (sft, reward, ppo, reinforce).

Mirrored by ``fourfold.models.lora.LoraSettings`` (the trainers convert one into the other; this
package imports only the standard library)."""

from __future__ import annotations

import dataclasses
from typing import Union

from fourfold.config.loader import require


@dataclasses.dataclass
class LoraConfig:
    """LoRA via peft: the base model stays frozen, each trained role learns a low-rank update
    W + (alpha / r) * B @ A of its adapted layers (B starts at zero: a fresh adapter is the base)."""

    r: int = 8
    """Rank of each update (A: r x in, B: out x r)."""
    alpha: float = 16.0
    """Scale numerator of the update (the scale is alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training (0 keeps the forwards deterministic, as PPO's
    ratio of two forwards of the same tokens wants)."""
    target_modules: Union[str, list[str]] = "all-linear"
    """'all-linear' (every linear layer but the output head) or a list of module names, e.g.
    [q_proj, v_proj]."""

    def validate(self, prefix: str = "model.lora") -> None:
        require(self.r >= 1, f"{prefix}.r", f"must be an integer >= 1, got {self.r!r}")
        require(self.alpha > 0, f"{prefix}.alpha", f"must be > 0, got {self.alpha!r}")
        require(0 <= self.dropout < 1, f"{prefix}.dropout", f"must be in [0, 1), got {self.dropout!r}")
        if isinstance(self.target_modules, str):
            require(self.target_modules == "all-linear", f"{prefix}.target_modules",
                    f"a list of module names or 'all-linear', got {self.target_modules!r}")
        else:
            require(bool(self.target_modules) and all(self.target_modules), f"{prefix}.target_modules",
                    "a non-empty list of module names or 'all-linear'")
