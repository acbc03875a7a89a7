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
    run.done("sft", model=run.out / "model")                #    the final summary line

It is shaped for more than one process: ``rank``, ``world_size`` and ``is_main`` are here (one
process today: rank 0 of 1), and every file the run writes (config, metrics, checkpoints, exported
models, summaries) goes through :meth:`RunScaffold.write`, the one place where rank-0-only writing
belongs.
"""

from __future__ import annotations

import signal
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Optional, Sequence

import torch

from fourfold.config import config_to_dict, save_config, validate_tree
from fourfold.errors import FourfoldError, OutputError
from fourfold.sinks import done_line, open_sinks, require_sinks
from fourfold.trainers.common import NonFiniteGuard, quiet_transformers, seed_everything
from fourfold.trainers.run_dir import prepare_run_dir


class RunScaffold:
    """Seeding, run directory, resume, non-finite guard, stop signal, logger and checkpoints of one
    run. ``cfg`` is a stage config with a ``run`` section (:class:`fourfold.config.RunConfig`).

    Constructing it validates ``cfg`` exactly as the CLI does (:func:`fourfold.config.validate_tree`:
    types, finite numbers, ranges, lengths against the models' config.json; a ConfigError before
    anything is written), then seeds python, numpy and torch with ``run.seed`` (a trainer's first
    act), checks and creates ``run.output_dir``
    (:func:`~fourfold.trainers.run_dir.prepare_run_dir`: a used one needs ``run.resume`` or
    ``run.overwrite``), writes the resolved ``config.yaml`` and applies ``run.threads``.
    """

    rank: int = 0
    """This process's rank among the run's processes (one process today)."""
    world_size: int = 1
    """How many processes run this training together."""

    def __init__(self, cfg) -> None:
        validate_tree(cfg)  # a config built in Python is checked as the CLI checks a loaded one
        self.run_cfg = cfg.run
        self._t0 = time.perf_counter()
        seed_everything(self.run_cfg.seed)  # first: everything after draws from the seeded generators
        require_sinks(self.run_cfg.report_to)  # before any model loads
        self._cfg = cfg
        self.out = prepare_run_dir(cfg)  # checked, created; a used one refused unless resume/overwrite
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
        self._warnings: list[str] = []  # said on stderr before the logger existed; events once it does

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
        writer there), and return its result. A write that fails (disk full, the file-size limit, a
        read-only file system) is an :class:`~fourfold.errors.OutputError` naming the path; the
        writers are atomic, so what was saved before (the last good checkpoint) stays whole."""
        try:
            return fn(*args, **kwargs)
        except OSError as e:
            if isinstance(e, FourfoldError):
                raise
            where = e.filename or self.out
            raise OutputError(f"{where}: cannot write ({e.strerror or e}); earlier checkpoints are intact") from None

    # ---- checkpoints ---------------------------------------------------------------------------

    def track(self, *, modules: Mapping, optimizers: Mapping, schedulers: Optional[Mapping] = None,
              state: Callable[[int], dict]) -> None:
        """Name what a checkpoint holds: ``modules``, ``optimizers`` and ``schedulers`` (name ->
        object with ``state_dict()``), and ``state(step)``, the trainer's JSON-able position at
        ``step`` (iteration, data order, counters; ``nonfinite_total`` for the guard's count)."""
        self._tracked = {"modules": dict(modules), "optimizers": dict(optimizers), "schedulers": dict(schedulers or {})}
        self._state = state

    def resume(self) -> Optional[dict]:
        """With ``run.resume`` and checkpoints in the run directory: load the newest one that is
        whole into the tracked objects (and the global RNG states), restore the guard's skip count
        from its ``nonfinite_total`` and return its state. A corrupt newer checkpoint is passed over
        with a one-line warning on stderr (and a ``warning`` event in ``events.jsonl``); when every
        checkpoint is corrupt, a CheckpointError (never a silent restart). Without ``run.resume`` or
        without checkpoints: None (a fresh run)."""
        from fourfold.checkpoint import CheckpointError, CorruptCheckpointError, checkpoint_dirs, checkpoint_step, load_checkpoint

        found = checkpoint_dirs(self.out) if self.run_cfg.resume else []
        problems = []
        for ckpt in found:  # newest first
            try:
                state = load_checkpoint(ckpt, **self._tracked)
            except CorruptCheckpointError as e:
                problems.append(str(e))
                continue
            for problem in problems:
                message = f"{problem}; resuming from the older {ckpt.name}"
                print(f"fourfold: warning: {message}", file=sys.stderr)
                self._warnings.append(message)
            self.guard.total = state.get("nonfinite_total", 0)
            self.resumed_step = checkpoint_step(ckpt)
            return state
        if problems:
            raise CheckpointError(f"run.resume: every checkpoint in {self.out / 'checkpoints'} is corrupt "
                                  f"(newest: {problems[0]}); nothing to resume from: rerun with --overwrite")
        return None

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

        rc = self.run_cfg
        sinks = self.write(open_sinks, rc.report_to, self.out, config=config_to_dict(self._cfg))
        self.logger = self.write(MetricsLogger, self.out, progress=rc.progress,
                                 tensorboard=rc.tensorboard or "tensorboard" in rc.report_to, total=total, desc=desc,
                                 key_metrics=key_metrics, resume_step=self.resumed_step, sinks=sinks)
        for message in self._warnings:
            self.logger.event("warning", step=self.resumed_step, message=message)
        previous = _install_stop_handler(self._stop)
        try:
            yield self.logger
        finally:
            self.logger.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    # ---- samples and the end -------------------------------------------------------------------

    def samples_due(self, iteration: int, total: int) -> bool:
        """Whether ``iteration`` logs sample completions: every ``run.samples_every`` iterations and
        at the last one (never when it is 0)."""
        every = self.run_cfg.samples_every
        return bool(every) and (iteration % every == 0 or iteration == total)

    def done(self, stage: str, **outputs) -> None:
        """Print the run's final summary line (on every run, terminal or not): the time it took,
        ``outputs`` (name -> path, e.g. ``model=...``), then the metrics, the samples and
        TensorBoard files when written, and the checkpoints when there are any."""
        from fourfold.checkpoint import CHECKPOINTS_DIR, list_checkpoints

        where = dict(outputs, metrics=self.logger.metrics_path)
        if self.logger.samples_path.is_file() and self.logger.samples_path.stat().st_size:
            where["samples"] = self.logger.samples_path
        if self.logger.tensorboard_dir is not None:
            where["tensorboard"] = self.logger.tensorboard_dir
        if list_checkpoints(self.out):
            where["checkpoints"] = self.out / CHECKPOINTS_DIR
        if self.is_main:
            print(done_line(stage, time.perf_counter() - self._t0, where), flush=True)


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
