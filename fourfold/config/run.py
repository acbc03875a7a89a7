"""The section every stage shares: where and how a run executes."""

from __future__ import annotations

import dataclasses
from typing import Optional

from fourfold.config.loader import require

MAX_SEED = 2**63 - 1
"""The largest seed: torch takes 64-bit seeds, and the named streams add small offsets to it."""


@dataclasses.dataclass
class RunConfig:
    """Where and how a run executes (shared by every stage)."""

    output_dir: str = "runs/run"
    """Run directory: resolved config, metrics.jsonl, checkpoints and outputs go here."""
    seed: int = 0
    """Seed for python, torch (CPU and CUDA) and data order; set explicitly by each trainer."""
    device: str = "auto"
    """'cpu', 'cuda', 'cuda:N' or 'auto' (cuda when available)."""
    threads: Optional[int] = None
    """torch intra-op threads; null leaves torch's default. Tiny models run fastest with 1."""
    save_every: int = 0
    """Write a resumable checkpoint every N iterations/steps (0: only at the end and on SIGTERM)."""
    keep_checkpoints: int = 2
    """How many of the newest complete checkpoints to keep."""
    resume: bool = False
    """Continue from the newest complete checkpoint in output_dir when there is one."""
    progress: bool = True
    """Show a rich progress bar on the terminal."""
    tensorboard: bool = True
    """Also log to TensorBoard when it is installed."""
    max_consecutive_skips: int = 3
    """Stop (with a checkpoint of the last good state) after this many non-finite updates in a row."""
    concurrent_roles: bool = False
    """PPO: train the critic in a second thread while the policy trains (and run the reference
    pass beside the critic and reward passes). With threads=1 on a 2-core CPU this keeps both
    cores busy; results are identical to the sequential order."""

    def validate(self, prefix: str = "run") -> None:
        require(0 <= self.seed <= MAX_SEED, f"{prefix}.seed", f"must be an integer in [0, 2**63 - 1], got {self.seed}")
        require(self.save_every >= 0, f"{prefix}.save_every", "must be >= 0")
        require(self.keep_checkpoints >= 1, f"{prefix}.keep_checkpoints", "must be >= 1")
        require(self.threads is None or self.threads >= 1, f"{prefix}.threads", "must be >= 1 or null")
        require(self.max_consecutive_skips >= 1, f"{prefix}.max_consecutive_skips", "must be >= 1")
        require(
            self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
            f"{prefix}.device",
            f"expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}",
        )
