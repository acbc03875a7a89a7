"""The run around every trainer's loop (SFT, reward model, PPO, REINFORCE, gym), in one place.

:class:`RunScaffold` owns what each trainer used to set up on its own: seeding (first, before
anything draws a random number), the run directory and its ``config.yaml``, resume from the latest
checkpoint, the non-finite guard, the SIGTERM/SIGINT stop flag (and putting the old handlers back),
the metrics logger, and the periodic, final, stop-signal and stuck checkpoints. The loop itself
stays in the trainer, flat and in numbered steps; the scaffold has no hooks::

    run = RunScaffold(cfg)                                  # 0. validate, seed, run dir, config.yaml
    model, optimizer, ... = ...                             #    the trainer's own set-up
    run.track(modules={...}, optimizers={...}, schedulers={...}, state=lambda step: {...})
    state = run.resume()                                    #    None, or the checkpoint's state
    with run.loop(total=..., desc="sft", key_metrics=(...)) as logger:
        for step in range(start + 1, total + 1):
            ...                                             # 1, 2, 3 ... the trainer's steps
            run.log_skips(step)
            run.stop_if_stuck(step)
            logger.log(step, row)
            run.checkpoint_if_due(step, final=step == total)
        run.write(save_hf, model, tokenizer, run.out / "model")

It is shaped for more than one process: ``rank``, ``world_size`` and ``is_main`` are here (one
process today: rank 0 of 1), and every file the run writes (config, metrics, checkpoints, exported
models, summaries) goes through :meth:`RunScaffold.write`, the one place where rank-0-only writing
belongs.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Sequence

import torch

from fourfold.config import save_config, validate_tree
from fourfold.trainers.common import NonFiniteGuard, quiet_transformers, seed_everything


class RunScaffold:
    """Seeding, run directory, resume, non-finite guard, stop signal, logger and checkpoints of one
    run. ``cfg`` is a stage config with a ``run`` section (:class:`fourfold.config.RunConfig`).

    Constructing it validates ``cfg`` exactly as the CLI does (:func:`fourfold.config.validate_tree`:
    types, finite numbers, ranges, lengths against the models' config.json; a ConfigError before
    anything is written), then seeds python, numpy and torch with ``run.seed`` (a trainer's first
    act), creates ``run.output_dir`` with the resolved ``config.yaml`` and applies ``run.threads``.
    """

    rank: int = 0
    """This process's rank among the run's processes (one process today)."""
    world_size: int = 1
    """How many processes run this training together."""

    def __init__(self, cfg) -> None:
        validate_tree(cfg)  # a config built in Python is checked as the CLI checks a loaded one
        self.run_cfg = cfg.run
        seed_everything(self.run_cfg.seed)  # first: everything after draws from the seeded generators
        self.out = Path(self.run_cfg.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.write(save_config, cfg, self.out / "config.yaml")
        if self.run_cfg.threads is not None:
            torch.set_num_threads(self.run_cfg.threads)
        self.guard = NonFiniteGuard(limit=self.run_cfg.max_consecutive_skips)
        self.resumed_step: Optional[int] = None
        """The step of the checkpoint :meth:`resume` loaded (None: a fresh run)."""
        self.logger = None
        self._tracked: dict = {"modules": {}, "optimizers": {}, "schedulers": {}}
        self._state: Callable[[int], dict] = lambda step: {}
        self._stop = {"stop": False}

    @property
    def is_main(self) -> bool:
        """True on the process that writes the run's files (rank 0)."""
        return self.rank == 0

    def hf_device(self) -> torch.device:
        """The device of a Hugging Face model run (``run.device``; 'auto': CUDA when available), with
        transformers' own load reports and progress bars kept off the terminal."""
        from fourfold.models.loading import resolve_device

        quiet_transformers()
        return resolve_device(self.run_cfg.device)

    def write(self, fn: Callable, *args, **kwargs):
        """Call ``fn(*args, **kwargs)``, a function that writes into the run directory (or opens a
        writer there), and return its result."""
        return fn(*args, **kwargs)

    # ---- checkpoints ---------------------------------------------------------------------------

    def track(self, *, modules: Mapping, optimizers: Mapping, schedulers: Optional[Mapping] = None,
              state: Callable[[int], dict]) -> None:
        """Name what a checkpoint holds: ``modules``, ``optimizers`` and ``schedulers`` (name ->
        object with ``state_dict()``), and ``state(step)``, the trainer's JSON-able position at
        ``step`` (iteration, data order, counters; ``nonfinite_total`` for the guard's count)."""
        self._tracked = {"modules": dict(modules), "optimizers": dict(optimizers), "schedulers": dict(schedulers or {})}
        self._state = state

    def resume(self) -> Optional[dict]:
        """With ``run.resume`` and a complete checkpoint in the run directory: load the latest one
        into the tracked objects (and the global RNG states), restore the guard's skip count from
        its ``nonfinite_total`` and return its state. Otherwise None (a fresh run)."""
        from fourfold.checkpoint import checkpoint_step, latest_checkpoint, load_checkpoint

        ckpt = latest_checkpoint(self.out) if self.run_cfg.resume else None
        if ckpt is None:
            return None
        state = load_checkpoint(ckpt, **self._tracked)
        self.guard.total = state.get("nonfinite_total", 0)
        self.resumed_step = checkpoint_step(ckpt)
        return state

    def save(self, step: int) -> None:
        """Checkpoint ``step``: the tracked objects, ``state(step)`` and the RNG states, keeping the
        newest ``run.keep_checkpoints``."""
        from fourfold.checkpoint import save_checkpoint

        self.write(save_checkpoint, self.out, step, **self._tracked, state=self._state(step),
                   keep=self.run_cfg.keep_checkpoints)

    def checkpoint_if_due(self, step: int, *, count: Optional[int] = None, final: bool = False) -> None:
        """End of a step: checkpoint ``step`` when ``count`` (default ``step``) is a multiple of
        ``run.save_every``, when ``final``, or when SIGTERM/SIGINT arrived; after a stop signal,
        raise KeyboardInterrupt (the CLI exits with 130; ``--resume`` continues exactly)."""
        count = step if count is None else count
        every = self.run_cfg.save_every
        if (every and count % every == 0) or final or self._stop["stop"]:
            self.save(step)
        if self._stop["stop"]:
            raise KeyboardInterrupt

    # ---- the non-finite guard ------------------------------------------------------------------

    def log_skips(self, step: int) -> None:
        """Write the guard's new non-finite events to ``events.jsonl`` (which quantity, where)."""
        for event in self.guard.take_new_events():
            self.logger.event("nonfinite_skip", step=step, **event)

    def stop_if_stuck(self, step: int) -> None:
        """After ``run.max_consecutive_skips`` skipped updates in a row: checkpoint ``step`` (skipped
        updates never touched the weights, so this is the last good state), then NonFiniteError."""
        if self.guard.consecutive >= self.guard.limit:
            self.save(step)
            self.guard.check_limit()

    # ---- the loop ------------------------------------------------------------------------------

    @contextmanager
    def loop(self, *, total: int, desc: str, key_metrics: Sequence[str]) -> Iterator:
        """The training loop's context: the run's :class:`~fourfold.reporting.MetricsLogger`
        (``metrics.jsonl`` and ``events.jsonl``, cut back to the resumed step) and the stop-signal
        handlers; on the way out the logger is closed and the previous handlers are back."""
        from fourfold.reporting import MetricsLogger

        self.logger = self.write(MetricsLogger, self.out, progress=self.run_cfg.progress,
                                 tensorboard=self.run_cfg.tensorboard, total=total, desc=desc,
                                 key_metrics=key_metrics, resume_step=self.resumed_step)
        previous = _install_stop_handler(self._stop)
        try:
            yield self.logger
        finally:
            self.logger.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _install_stop_handler(flag: dict) -> dict:
    """SIGTERM/SIGINT set ``flag["stop"]``; returns the previous handlers (none are installed
    outside the main thread: there the caller's own signals apply)."""

    def handler(signum, frame):
        flag["stop"] = True

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass
    return previous
