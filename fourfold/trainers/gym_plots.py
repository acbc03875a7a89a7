"""Plots of gym runs, from what a run wrote (``metrics.jsonl`` and its evaluations): one run's
learning curve and the mean and spread over seeds.

This module sits at the reporting level: it reads results and draws them (numpy, matplotlib's
object API imported inside the functions, :func:`fourfold.reporting.read_metrics`); it never imports
models, rollout or trainers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from fourfold.reporting import read_metrics

__all__ = ["plot_run", "plot_seeds"]


def _read_metric(run_dir: Union[str, Path], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of ``key`` in ``run_dir/metrics.jsonl`` (rows without it skipped)."""
    rows = [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if r.get(key) is not None]
    return np.asarray([r["step"] for r in rows], dtype=float), np.asarray([r[key] for r in rows], dtype=float)


def plot_run(run_dir: Path, evals: list, title: str, threshold: Optional[float]) -> None:
    """``run_dir/learning_curve.png``: greedy eval return (mean +- std over the eval episodes) and
    the sampled training episodes' return vs env steps."""
    from matplotlib.figure import Figure  # object API: no pyplot global state

    fig = Figure(figsize=(6, 3.5), dpi=80)
    ax = fig.add_subplot(1, 1, 1)
    s, r = _read_metric(run_dir, "gym/episodic_return")
    if len(s):
        ax.plot(s, r, color="0.6", lw=0.8, label="training episodes (sampled actions)")
    ev = np.asarray(evals, dtype=float).reshape(-1, 3)
    ax.plot(ev[:, 0], ev[:, 1], "o-", ms=3, label="greedy evaluation (mean)")
    ax.fill_between(ev[:, 0], ev[:, 1] - ev[:, 2], ev[:, 1] + ev[:, 2], alpha=0.2)
    if threshold is not None:
        ax.axhline(threshold, color="k", ls="--", lw=0.8, label=f"solved ({threshold:g})")
    ax.set(xlabel="environment steps", ylabel="episodic return", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(run_dir / "learning_curve.png")


_YLABELS = {"gym/eval_return": "greedy evaluation return", "gym/episodic_return": "training episode return"}


def _smooth(steps: np.ndarray, values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the values logged in the trailing window (step - window, step]."""
    if window <= 0:
        return values
    csum = np.concatenate([[0.0], np.cumsum(values)])
    start = np.searchsorted(steps, steps - window, side="right")
    end = np.arange(1, len(steps) + 1)
    return (csum[end] - csum[start]) / (end - start)


def plot_seeds(
    run_dirs: Union[Sequence[Union[str, Path]], dict[str, Sequence[Union[str, Path]]]],
    out_png: Union[str, Path],
    *,
    keys: Sequence[str] = ("gym/eval_return",),
    threshold: Optional[float] = None,
    title: str = "",
    smooth_steps: int = 0,
) -> dict[str, dict[str, dict[str, list]]]:
    """Mean and spread (min-max band) over seeds of each metric in ``keys`` vs env steps: one
    panel per key, one line per group.

    ``run_dirs``: a list of run directories (one group) or ``{label: [run dirs]}``. Each run's
    curve (``smooth_steps`` > 0: a trailing mean over that many env steps) is interpolated onto the
    union of its group's logged steps, within the range every run covers. Writes ``out_png``
    (small: 80 dpi) and returns ``{key: {label: {"steps", "mean", "min", "max"}}}``.
    """
    from matplotlib.figure import Figure

    groups = run_dirs if isinstance(run_dirs, dict) else {"": list(run_dirs)}
    fig = Figure(figsize=(5 * len(keys), 3.5), dpi=80)
    out: dict[str, dict[str, dict[str, list]]] = {}
    for k, key in enumerate(keys):
        ax = fig.add_subplot(1, len(keys), k + 1)
        out[key] = {}
        for g, (label, dirs) in enumerate(groups.items()):
            curves = [_read_metric(d, key) for d in dirs]
            curves = [(st, _smooth(st, v, smooth_steps)) for st, v in curves if len(st)]
            if not curves:
                continue
            lo, hi = max(st[0] for st, _ in curves), min(st[-1] for st, _ in curves)
            grid = np.unique(np.concatenate([st[(st >= lo) & (st <= hi)] for st, _ in curves]))
            ys = np.stack([np.interp(grid, st, v) for st, v in curves])
            mean, ymin, ymax = ys.mean(0), ys.min(0), ys.max(0)
            color = f"C{g}"
            ax.plot(grid, mean, lw=1.5, color=color, label=f"{label + ' ' if label else ''}mean of {len(curves)} seeds")
            ax.fill_between(grid, ymin, ymax, alpha=0.2, color=color, lw=0)
            out[key][label] = {"steps": grid.tolist(), "mean": mean.tolist(), "min": ymin.tolist(), "max": ymax.tolist()}
        if threshold is not None:
            ax.axhline(threshold, color="k", ls="--", lw=0.8, label=f"solved ({threshold:g})")
        ax.set(xlabel="environment steps", ylabel=_YLABELS.get(key, key))
        ax.grid(alpha=0.3)
        if k == 0:
            ax.legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png)
    return out
