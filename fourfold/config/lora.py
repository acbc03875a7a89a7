"""`model.lora`: LoRA adapters instead of full fine-tuning (sft, reward, ppo, reinforce).

Mirrored by ``fourfold.models.plan.LoraSettings`` (the role plan converts one into the other with
``LoraSettings.from_config``, which asks this section's :meth:`LoraConfig.validate`, the one check of
the settings; this package imports only the standard library)."""

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
        """ConfigError naming the key when a value is out of range or of the wrong type: the one
        check of LoRA settings (``fourfold.models.plan.LoraSettings.from_config`` asks a section for
        it, so a config built in Python is checked as a loaded one is)."""
        r, alpha, dropout, targets = self.r, self.alpha, self.dropout, self.target_modules

        def number(x) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool)

        require(isinstance(r, int) and not isinstance(r, bool) and r >= 1, f"{prefix}.r",
                f"must be an integer >= 1, got {r!r}")
        require(number(alpha) and alpha > 0, f"{prefix}.alpha", f"must be > 0, got {alpha!r}")
        require(number(dropout) and 0 <= dropout < 1, f"{prefix}.dropout", f"must be in [0, 1), got {dropout!r}")
        if isinstance(targets, str):
            require(targets == "all-linear", f"{prefix}.target_modules",
                    f"a list of module names or 'all-linear', got {targets!r}")
        else:
            require(bool(targets) and all(isinstance(t, str) and t for t in targets), f"{prefix}.target_modules",
                    "a non-empty list of module names or 'all-linear'")
