"""`fourfold reward`: a Bradley-Terry reward model from preference pairs."""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

from fourfold.config.dist import TrainedDistConfig
from fourfold.config.loader import require
from fourfold.config.run import RunConfig
from fourfold.config.sft import InitModelConfig, TrainLoopConfig, check_supervised_stage


@dataclasses.dataclass
class PreferenceDataConfig:
    """Preference pairs: `prompt`, `chosen`, `rejected` per row."""

    train: Optional[str] = None
    """JSONL or Parquet with prompt / chosen / rejected."""
    eval: Optional[str] = None
    """Held-out pairs; null = hold out `eval_fraction` of train."""
    eval_fraction: float = 0.1
    """Share of train held out when `eval` is null (0 = none)."""
    on_error: Literal["raise", "skip"] = "raise"
    """Bad rows: error naming file and line, or skip and count. A tie (chosen the same as rejected)
    is no bad row: it is left out and counted either way; a file of nothing but ties is an error."""

    def validate(self, prefix: str = "data") -> None:
        require(self.train is not None, f"{prefix}.train", "missing: path to the preference file")
        require(0 <= self.eval_fraction < 1, f"{prefix}.eval_fraction", "must be in [0, 1)")


@dataclasses.dataclass
class RewardLossConfig:
    """Reward-model specifics."""

    margin: Optional[float] = None
    """Optional margin m in -log sigmoid(r_chosen - r_rejected - m)."""
    normalize: bool = True
    """After training, shift/scale the head so scores of the training responses (chosen and
    rejected, the reference samples) have mean 0 and std 1."""

    def validate(self, prefix: str = "reward") -> None:
        require(self.margin is None or self.margin >= 0, f"{prefix}.margin", "must be >= 0 or null")


@dataclasses.dataclass
class RewardConfig:
    """`fourfold reward`: a Bradley-Terry reward model from preference pairs."""

    model: InitModelConfig = dataclasses.field(default_factory=InitModelConfig)
    data: PreferenceDataConfig = dataclasses.field(default_factory=PreferenceDataConfig)
    train: TrainLoopConfig = dataclasses.field(default_factory=lambda: TrainLoopConfig(lr=5e-5))
    reward: RewardLossConfig = dataclasses.field(default_factory=RewardLossConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs/reward"))
    dist: TrainedDistConfig = dataclasses.field(default_factory=TrainedDistConfig)

    def validate(self, prefix: str = "") -> None:
        check_supervised_stage(self)
