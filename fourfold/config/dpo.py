"""`fourfold dpo`: direct preference optimisation of a causal LM on preference pairs."""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

from fourfold.config.dist import TrainedDistConfig, check_dist
from fourfold.config.loader import require
from fourfold.config.reward import PreferenceDataConfig
from fourfold.config.run import RunConfig
from fourfold.config.sft import InitModelConfig, TrainLoopConfig
from fourfold.names import DPO_LOSSES


@dataclasses.dataclass
class DPOAlgoConfig:
    """DPO specifics: the loss on the log-ratio margin h = (pc - rc) - (pr - rr) of sequence
    log-probs (policy p, reference r; chosen c, rejected r) and the frozen reference.

    Porting a TRL ``DPOConfig``: ``loss_type='sigmoid'`` is ``loss: sigmoid``, ``loss_type='ipo'`` is
    ``loss: ipo`` (per-token mean log-ratios in both). TRL's ``label_smoothing`` is not read by its
    ``sigmoid`` loss (only by ``robust``, ``exo_pair`` and ``aot``; older TRL releases did apply it to
    ``sigmoid`` as conservative DPO), so a TRL config with ``loss_type: sigmoid`` and any
    ``label_smoothing`` trains plain DPO: port it with ``label_smoothing: 0`` here, where a non-zero
    value does change the loss (conservative DPO)."""

    beta: float = 0.1
    """beta: the strength of the implicit KL to the reference (DPO paper: 0.1; smaller lets the
    policy move further). Implicit rewards are beta * (log pi - log pi_ref). For the IPO losses it is
    the paper's tau: the margin is regressed to 1 / (2 beta)."""
    label_smoothing: float = 0.0
    """eps in [0, 0.5): the assumed share of flipped labels (conservative DPO, Mitchell 2023);
    loss = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h). sigmoid loss only (TRL's
    sigmoid loss ignores its label_smoothing: see above)."""
    loss: Literal[DPO_LOSSES] = "sigmoid"
    """'sigmoid': DPO (Rafailov et al. 2023); 'ipo': (h_mean - 1/(2 beta))^2 (Azar et al. 2023) with
    h_mean = (pc - rc) / nc - (pr - rr) / nr the margin of per-token mean log-ratios (nc, nr: the
    responses' token counts, EOS included), as the IPO authors and TRL compute it; 'ipo_sum': the same
    on the summed margin h (fourfold's 'ipo' before, kept for old configs: its loss grows with the
    responses' length, so its beta is not comparable with 'ipo''s)."""
    reference: Optional[str] = None
    """Frozen reference model directory; null = model.path (the SFT model DPO starts from)."""

    def validate(self, prefix: str = "dpo") -> None:
        require(self.beta > 0, f"{prefix}.beta", f"must be > 0, got {self.beta}")
        require(0 <= self.label_smoothing < 0.5, f"{prefix}.label_smoothing",
                f"must be in [0, 0.5), got {self.label_smoothing}")
        require(self.loss == "sigmoid" or self.label_smoothing == 0, f"{prefix}.label_smoothing",
                f"applies to loss: sigmoid only; loss: {self.loss} has none")


@dataclasses.dataclass
class DPOConfig:
    """`fourfold dpo`: DPO on preference pairs, from an SFT model kept frozen as the reference."""

    model: InitModelConfig = dataclasses.field(default_factory=InitModelConfig)
    data: PreferenceDataConfig = dataclasses.field(default_factory=PreferenceDataConfig)
    train: TrainLoopConfig = dataclasses.field(default_factory=lambda: TrainLoopConfig(lr=1e-6))
    dpo: DPOAlgoConfig = dataclasses.field(default_factory=DPOAlgoConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs/dpo"))
    dist: TrainedDistConfig = dataclasses.field(default_factory=TrainedDistConfig)

    def validate(self, prefix: str = "") -> None:
        check_dist(self.dist, self.run)
        require(not self.model.from_scratch, "model.from_scratch",
                "DPO starts from a trained model (usually the SFT output), which is also its reference; "
                "set model.path")
