"""The one loop of the supervised stages (SFT, reward model, DPO): each stage keeps its data set-up,
its loss and its metrics; the steps around them are written here once.

    steps = SupervisedSteps(run, model, cfg.train, n_examples, checkpoint_name, figures)  # 0. optimizer, resume
    with steps.loop("sft", key_metrics, skipped) as logger:  # the scaffold's loop context
        last = steps.run(logger, step=..., row=..., evaluate=..., check=..., lr_key=...)
        ...                                                  # the stage's export

Each step, as numbered in :meth:`SupervisedSteps.run`:

1. the next global batch of example indices from a seeded, resumable
   :class:`~fourfold.data.EpochSampler`, and this rank's part of it (all of it in one process);
2. the stage's ``step(rows) -> (loss, Figures)``: its forward and loss on those rows, and its
   figures (means weighted by tokens or pairs, sums), made those of the whole global batch
   (:mod:`fourfold.run.parallel`);
3. backward, global-norm clip and an AdamW step, skipped when the loss or the gradient norm is not
   finite (the schedule still counts the step), then the LR schedule;
4. a metrics row every ``train.log_every`` steps and at the end, from the sums since the previous
   row (:class:`Window`, the stage's ``row(window)``), with the held-out ``evaluate()`` every
   ``train.eval_every`` steps and at the end;
5. a checkpoint every ``run.save_every`` steps, at the end, and on SIGTERM/SIGINT (then exit).
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Sequence

import torch

from fourfold.data import EpochSampler
from fourfold.errors import ConfigError
from fourfold.run.optim import guarded_step, make_optimizer, make_schedule
from fourfold.run.parallel import Figures, loss_scale, shard_rows

StepFn = Callable[[list], "tuple[torch.Tensor, Figures]"]
"""``step(rows) -> (loss, figures)``: a stage's forward and loss on this rank's ``rows`` (example
indices), and its :class:`~fourfold.run.parallel.Figures` on them."""


def num_steps(max_steps: Optional[int], epochs: float, batches_per_epoch: int) -> int:
    """Optimizer steps of a supervised run: ``max_steps``, else ``ceil(epochs * batches per epoch)``."""
    if max_steps is not None:
        return max_steps
    return max(1, math.ceil(epochs * batches_per_epoch))


def require_batch(batch_size: int, examples: int, what: str) -> None:
    """A ConfigError naming ``train.batch_size`` when one batch needs more than the ``examples``
    a supervised stage loaded (``what`` says which, e.g. "training examples in data.jsonl")."""
    if batch_size > examples:
        raise ConfigError(f"train.batch_size: {batch_size} is more than the {examples} {what}; "
                          f"lower it to at most {examples}")


class Window(dict):
    """Sums since the previous metrics row: ``steps``, ``good_steps`` (updates that went through),
    ``grad_norm`` (over those), ``seconds`` and the stage's figures. A plain dict of floats, so a
    checkpoint holds it as it is."""

    def __init__(self, figures: tuple):
        super().__init__(dict.fromkeys(("steps", "good_steps", *figures, "grad_norm", "seconds"), 0.0))

    def add(self, figures: dict, grad_norm: Optional[float], seconds: float) -> None:
        """One step (``grad_norm`` None: the update was skipped)."""
        self["steps"] += 1
        self["good_steps"] += int(grad_norm is not None)
        for key, value in figures.items():
            self[key] += value
        self["grad_norm"] += grad_norm if grad_norm is not None else 0.0
        self["seconds"] += seconds

    def per_step(self, key: str) -> float:
        """The mean of ``key`` over the window's steps."""
        return self[key] / max(self["steps"], 1)

    def mean_grad_norm(self) -> float:
        """The mean gradient norm of the updates that went through (nan when none did)."""
        return self["grad_norm"] / self["good_steps"] if self["good_steps"] else float("nan")

    def reset(self) -> None:
        self.update(dict.fromkeys(self, 0.0))


class SupervisedSteps:
    """Step 0 of a supervised stage on the run scaffold ``run``: the sampler over ``n_examples``, the
    number of steps, AdamW and its schedule over ``model``'s parameters (``tc``: the stage's
    ``train`` section), named for the run's checkpoints (``checkpoint_name``: the module, which
    holds ``tracked``'s state, default ``model``) and resumed from the newest one when asked."""

    def __init__(self, run, model: torch.nn.Module, tc, n_examples: int, checkpoint_name: str,
                 figures: tuple, tracked: Optional[torch.nn.Module] = None):
        self.run_ctx, self.model, self.tc = run, model, tc
        self.sampler = EpochSampler(n_examples, tc.batch_size, seed=run.run_cfg.seed)
        self.total = num_steps(tc.max_steps, tc.epochs, len(self.sampler))
        self.optimizer = make_optimizer(model.parameters(), tc.lr, tc.weight_decay)
        self.schedule = make_schedule(self.optimizer, self.total, tc.lr_schedule, tc.warmup_steps)
        self.window = Window(figures)
        run.track(modules={checkpoint_name: tracked if tracked is not None else model},
                  optimizers={checkpoint_name: self.optimizer}, schedulers={checkpoint_name: self.schedule},
                  state=lambda step: {"step": step, "sampler": self.sampler.state_dict(), "window": dict(self.window),
                                      "nonfinite_total": run.guard.total})
        state = run.resume()
        self.start = 0
        if state is not None:
            self.sampler.load_state_dict(state["sampler"])
            self.window.update(state["window"])
            self.start = state["step"]
            run.require_not_past(self.start, self.total, "train.max_steps", "step")
        model.train()

    @contextmanager
    def loop(self, desc: str, key_metrics: tuple, skipped: list, notes: Sequence[str] = ()) -> Iterator:
        """The run's loop context (:meth:`RunScaffold.loop`: the metrics logger, the stop signal),
        after saying how many bad data rows were skipped and the data's other ``notes``."""
        with self.run_ctx.loop(total=self.total, desc=desc, key_metrics=key_metrics) as logger:
            self.run_ctx.warn_skipped(logger, skipped, notes)
            yield logger

    def run(self, logger, *, step: StepFn, row: Callable[[Window], dict], evaluate: Optional[Callable[[], dict]],
            check: str, lr_key: str) -> dict:
        """Steps 1-5 (module docstring) from the resumed step to the last; returns the last metrics
        row (that of the finished run when it resumed a run that had already ended). ``check``: the
        loss's name in the non-finite guard's events; ``lr_key``: the learning rate's metric."""
        run, tc, window = self.run_ctx, self.tc, self.window
        batches = self.sampler.batches()
        last: dict = {}
        for s in range(self.start + 1, self.total + 1):
            t0 = time.perf_counter()
            # 1. this rank's part of the next global batch
            part = shard_rows(next(batches), run.world)
            # 2. the stage's forward and loss; the figures of the whole global batch
            loss, figures = step(part.rows)
            figures, share = figures.global_(part)
            lr = self.optimizer.param_groups[0]["lr"]  # the rate this step uses
            # 3. backward, clip, guarded AdamW step, schedule
            grad_norm, good = guarded_step(self.model, self.optimizer, self.schedule, tc.max_grad_norm, run.guard,
                                           f"step {s}", [(loss * loss_scale(share),
                                                          {check: torch.tensor(figures.means["loss"])})])
            if good:
                run.guard.good_step()
            run.log_skips(s)
            window.add(figures.flat(), grad_norm if good else None, time.perf_counter() - t0)
            run.stop_if_stuck(s)
            # 4. metrics (means since the previous row) and the held-out evaluation
            metrics: dict = {}
            if s % tc.log_every == 0 or s == self.total:
                metrics.update(row(window), **{lr_key: lr, "train/nonfinite_skips": run.guard.total})
                window.reset()  # the same dict: checkpoints read it
            if evaluate is not None and ((tc.eval_every and s % tc.eval_every == 0) or s == self.total):
                metrics.update(evaluate())
            if metrics:
                logger.log(s, metrics)
                last = metrics
            # 5. checkpoint (every save_every steps, at the end, and when asked to stop)
            run.checkpoint_if_due(s, final=s == self.total)
        run.require_an_update(self.total - self.start)
        return last or run.last_metrics_row()
