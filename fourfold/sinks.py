"""What a run shows and sends beside ``metrics.jsonl``: the plain console line, the final summary
line, sample completions as a table, and the optional Weights & Biases sink.

The console: on a terminal the rich progress bar of :class:`~fourfold.reporting.MetricsLogger`;
off a terminal (nohup, Slurm, ``| tee``, CI) one :func:`plain_line` per logged row; on every run a
final :func:`done_line` naming where the model, metrics and checkpoints went. Numbers on the
console have 4 significant digits (:func:`fmt_number`).

One stream: everything a run says (the bar or the plain lines, warnings as ``fourfold <stage>:
warning: ...``, the demo's stage headers and results, the summary line, how an interrupted run
stopped) goes to stdout, so ``> log`` keeps it all in order; stderr holds only errors (the CLI's
``fourfold <stage>: error: ...`` line).

``run.report_to`` names extra sinks (:data:`SINKS`). ``"tensorboard"`` is written by the metrics
logger itself; ``"wandb"`` is :class:`WandbSink`, which imports ``wandb`` only when asked for
(``pip install 'fourfold[wandb]'``). A sink has ``log(step, row)``, ``samples(step, rows)`` and
``close()``. Like ``reporting``, this module never imports models or rollout.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fourfold.errors import ConfigError

__all__ = ["SINKS", "WandbSink", "done_line", "fmt_duration", "fmt_fixed", "fmt_number", "open_sinks", "plain_line",
           "require_sinks", "samples_markdown"]

SINKS = ("tensorboard", "wandb")
"""The names ``run.report_to`` accepts."""

_WANDB_MISSING = "run.report_to: 'wandb' needs the wandb package: pip install 'fourfold[wandb]'"


def fmt_number(value: Any) -> str:
    """A console number: ints as they are, floats with 4 significant digits, None (a NaN/inf
    written as null) as ``nan``."""
    if value is None:
        return "nan"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def fmt_fixed(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals, a value that rounds to zero written ``0.000``, never
    ``-0.000`` (an estimate of 0, such as the SFT model's KL to itself, is not negative)."""
    return f"{round(float(value), digits) + 0.0:.{digits}f}"


def fmt_duration(seconds: float) -> str:
    """``12 s``, ``3.2 min`` or ``1.5 h``."""
    if seconds < 60:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def eta_s(elapsed_s: float, done: int, left: int) -> float | None:
    """Seconds left at the rate so far: ``elapsed_s / done * left`` (None before any step is done
    or after the last)."""
    return elapsed_s / done * left if done > 0 and left > 0 else None


def plain_line(desc: str, step: int, total: int | None, row: Mapping[str, Any], key_metrics: Sequence[str],
               elapsed_s: float, first_step: int = 0) -> str:
    """One console line for a logged row, for output that is not a terminal:
    ``ppo 3/10: reward/score_mean=0.1235 kl/k1=0.01234 (4.1 s, about 9.6 s left)``. Only the key
    metrics the row has; the time left (:func:`eta_s`) from this process's steps so far (those after
    ``first_step``, the resumed one) once one is done and while some are left."""
    where = f"{desc or 'train'} {step}/{total}" if total is not None else f"{desc or 'train'} step {step}"
    shown = " ".join(f"{k}={fmt_number(row[k])}" for k in key_metrics if k in row)
    left = eta_s(elapsed_s, step - first_step, total - step) if total is not None else None
    when = fmt_duration(elapsed_s) + (f", about {fmt_duration(left)} left" if left is not None else "")
    return f"{where}: {shown} ({when})" if shown else f"{where} ({when})"


def done_line(stage: str, seconds: float, outputs: Mapping[str, Any]) -> str:
    """The final summary line of a run: ``fourfold ppo: done in 3.2 min: model runs/x/policy,
    metrics runs/x/metrics.jsonl, checkpoints runs/x/checkpoints`` (``outputs``: name -> path, in order)."""
    where = ", ".join(f"{name} {path}" for name, path in outputs.items())
    return f"fourfold {stage}: done in {fmt_duration(seconds)}: {where}"


def samples_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """Sample rows as a markdown table (TensorBoard's text panel renders it); ``|`` and newlines escaped."""
    columns = list(dict.fromkeys(k for r in rows for k in r))

    def cell(v: Any) -> str:
        text = fmt_number(v) if isinstance(v, (int, float)) or v is None else str(v)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def require_sinks(report_to: Sequence[str]) -> None:
    """Fail early, before any model loads, when a requested sink cannot run: ConfigError naming
    ``run.report_to`` and what to install."""
    if "wandb" in report_to:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError(_WANDB_MISSING) from None


def open_sinks(report_to: Sequence[str], run_dir: str | os.PathLike, *, config: Mapping[str, Any] | None) -> list:
    """The extra sinks ``report_to`` asks for (TensorBoard is not one: the metrics logger writes it)."""
    return [WandbSink(run_dir, config=config)] if "wandb" in report_to else []


class WandbSink:
    """Metrics and sample tables to a Weights & Biases run.

    One W&B run per process, named after the run directory; the project is ``WANDB_PROJECT``
    (default ``fourfold``), the files go to ``WANDB_DIR`` (default: the run directory's
    ``wandb/``), and ``WANDB_MODE=offline`` keeps everything local (``wandb sync`` uploads later).
    A resumed run starts a new W&B run that continues at the resumed step.
    """

    def __init__(self, run_dir: str | os.PathLike, *, config: Mapping[str, Any] | None = None):
        try:
            import wandb
        except ImportError:
            raise ConfigError(_WANDB_MISSING) from None
        self._wandb = wandb
        run_dir = Path(run_dir)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "fourfold"), name=run_dir.resolve().name,
                              dir=None if os.environ.get("WANDB_DIR") else str(run_dir),
                              config=dict(config or {}))

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        """The row's finite values at ``step`` (nulls, i.e. NaN/inf, are left out)."""
        self.run.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=step)

    def samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """The sample rows as a ``samples`` table at ``step``."""
        columns = list(dict.fromkeys(k for r in rows for k in r))
        table = self._wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        """Finish the W&B run (flushes an offline run to disk)."""
        self.run.finish()
