"""The section every stage shares: where and how a run executes."""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

from fourfold.config.loader import require

MAX_SEED = 2**63 - 1
"""The largest seed: torch takes 64-bit seeds, and the named streams add small offsets to it."""


MMAP_THRESHOLD_MAX_KIB = 32 * 1024
"""The largest run.malloc_mmap_threshold_kib: glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit)."""


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
    """Show a rich progress bar on the terminal, and one plain line per logged row when stdout is
    not a terminal (nohup, Slurm, a pipe); false: neither (the final summary line still prints)."""
    tensorboard: bool = True
    """Also log to TensorBoard (``run.output_dir/tensorboard/``; a dependency of fourfold, so on by
    default; a one-line warning when it is not installed)."""
    max_consecutive_skips: int = 3
    """Stop (with a checkpoint of the last good state) after this many non-finite updates in a row."""
    concurrent_roles: bool = False
    """PPO: train the critic in a second thread while the policy trains (and run the reference
    pass beside the critic and reward passes). With threads=1 on a 2-core CPU this keeps both
    cores busy; results are identical to the sequential order."""
    report_to: list[Literal["tensorboard", "wandb"]] = dataclasses.field(default_factory=list)
    """More report sinks, e.g. ['wandb'] or ['tensorboard', 'wandb'] (metrics.jsonl is always
    written). They add to run.tensorboard: TensorBoard is written when run.tensorboard is true or
    'tensorboard' is listed here (turn it off with run.tensorboard=false and without listing it).
    'wandb' needs ``pip install 'fourfold[wandb]'``; the project is WANDB_PROJECT (default
    'fourfold'), WANDB_MODE=offline keeps the run local."""
    samples_every: int = 10
    """PPO/REINFORCE: every N iterations (and at the last one) write a few sample completions
    (prompt, response, score, and the probe's per-response values such as gold) to samples.jsonl
    and the report sinks; 0: never."""
    overwrite: bool = False
    """Start afresh in an output_dir that already holds a run (metrics.jsonl or checkpoints): its
    metrics, events, TensorBoard files and checkpoints are removed first. Without it (and without
    resume) such a directory is refused, so two runs never mix. Trainer stages only (the demo and
    the experiments have --fresh)."""
    malloc_mmap_threshold_kib: Optional[int] = None
    """CPU memory lever (Linux, glibc): tensors of at least this many KiB get their own memory
    mapping, returned to the OS when freed (glibc's M_MMAP_THRESHOLD, fixed). Without it glibc's
    threshold rises with the blocks a run frees, memory freed by generation stays resident through
    the update, and the peak RSS exceeds the live tensors (150-175 MiB on a 34M-parameter model).
    256 brings the peak RSS down to what ``fourfold estimate`` predicts, for some CPU time (page
    faults; docs/benchmarks.md). Same as MALLOC_MMAP_THRESHOLD_ (bytes) in the environment; null:
    glibc's default; elsewhere (macOS, CUDA memory) a one-line warning and no effect. 1-32768."""

    def validate(self, prefix: str = "run") -> None:
        require(0 <= self.seed <= MAX_SEED, f"{prefix}.seed", f"must be an integer in [0, 2**63 - 1], got {self.seed}")
        require(self.output_dir.strip() != "", f"{prefix}.output_dir",
                "must not be empty (it would write into the current directory)")
        require(not (self.resume and self.overwrite), f"{prefix}.overwrite",
                "cannot be combined with run.resume (resume continues the run, overwrite replaces it)")
        require(self.save_every >= 0, f"{prefix}.save_every", "must be >= 0")
        require(self.keep_checkpoints >= 1, f"{prefix}.keep_checkpoints", "must be >= 1")
        require(self.threads is None or self.threads >= 1, f"{prefix}.threads", "must be >= 1 or null")
        require(self.malloc_mmap_threshold_kib is None or 1 <= self.malloc_mmap_threshold_kib <= MMAP_THRESHOLD_MAX_KIB,
                f"{prefix}.malloc_mmap_threshold_kib",
                f"must be in [1, {MMAP_THRESHOLD_MAX_KIB}] (KiB; glibc's limit) or null")
        require(self.max_consecutive_skips >= 1, f"{prefix}.max_consecutive_skips", "must be >= 1")
        require(self.samples_every >= 0, f"{prefix}.samples_every", "must be >= 0 (0: no samples)")
        for name in self.report_to:
            require(name in ("tensorboard", "wandb"), f"{prefix}.report_to",
                    f"unknown sink {name!r} (known: 'tensorboard', 'wandb')")
        require(
            self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
            f"{prefix}.device",
            f"expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}",
        )
