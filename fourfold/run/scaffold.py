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
        written = save_trained(run, model, tokenizer, run.out / "model")
    return run.finish({"output_dir": ..., **written}, model=run.out / "model")  # the summary line

Under ``torchrun`` (sft, reward, dpo, ppo and reinforce) the scaffold starts the process group
(:func:`fourfold.dist.init_from_env`: gloo on CPU, NCCL on CUDA, each rank on ``cuda:LOCAL_RANK``),
seeds every rank with the same ``run.seed`` (data order, initial weights and minibatch permutations
are global), and only rank 0 writes: the run directory and ``config.yaml``, the metrics (other
ranks get a :class:`NullLogger`), exported models (:meth:`RunScaffold.write` runs its writer on
rank 0 only) and the summary line. Checkpoints are then sharded
(:mod:`fourfold.checkpoint.sharded`, written by every rank); a stop signal is acted on at the end of a
step only when every rank has agreed on it, so a collective checkpoint starts only with every peer
alive. In one process nothing of this changes anything.
"""

from __future__ import annotations

import os
import re
import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Sequence

import torch

from fourfold import dist
from fourfold.checkpoint import (
    CHECKPOINTS_DIR,
    CheckpointError,
    CorruptCheckpointError,
    checkpoint_dirs,
    checkpoint_step,
    checkpointer,
    latest_checkpoint,
)
from fourfold.config import config_to_dict, save_config, validate_tree
from fourfold.config.stages import stage_of, torchrun_stages
from fourfold.errors import ConfigError, FourfoldError, NonFiniteError, OutputError, RewardServerError
from fourfold.run.allocator import set_mmap_threshold
from fourfold.run.common import bf16_cpu_warning, quiet_transformers, seed_everything, skipped_lines
from fourfold.run.optim import NonFiniteGuard
from fourfold.run.run_dir import prepare_run_dir
from fourfold.sinks import done_line, open_sinks, require_sinks


class RunScaffold:
    """Seeding, run directory, resume, non-finite guard, stop signal, logger and checkpoints of one
    run. ``cfg`` is a stage config with a ``run`` section (:class:`fourfold.config.RunConfig`).

    Constructing it validates ``cfg`` exactly as the CLI does (:func:`fourfold.config.validate_tree`:
    types, finite numbers, ranges, lengths against the models' config.json; a ConfigError before
    anything is written), then seeds python, numpy and torch with ``run.seed`` (a trainer's first
    act), checks and creates ``run.output_dir``
    (:func:`~fourfold.run.run_dir.prepare_run_dir`: a used one needs ``run.resume`` or
    ``run.overwrite``), writes the resolved ``config.yaml`` and applies ``run.threads``. Launched
    by torchrun, it first starts the process group (module docstring).
    """

    def __init__(self, cfg) -> None:
        validate_tree(cfg)  # a config built in Python is checked as the CLI checks a loaded one
        self.run_cfg = cfg.run
        self.stage = getattr(stage_of(cfg), "name", "run")  # the summary line's name
        self._t0 = time.perf_counter()
        self.world = _start_group(cfg)  # torchrun: the process group; one process: rank 0 of 1
        seed_everything(self.run_cfg.seed)  # first: everything after draws from the seeded generators
        require_sinks(self.run_cfg.report_to)  # before any model loads
        self._cfg = cfg
        self.out = self._prepare_run_dir(cfg)  # checked, created; a used one refused unless resume/overwrite
        self.write(save_config, cfg, self.out / "config.yaml")
        if self.run_cfg.threads is not None:
            torch.set_num_threads(self.run_cfg.threads)
        self._warnings: list[str] = []  # said on the console before the logger existed; events once it does
        if self.run_cfg.malloc_mmap_threshold_kib is not None:  # before any model is loaded
            self._warn(set_mmap_threshold(self.run_cfg.malloc_mmap_threshold_kib))
        self.guard = NonFiniteGuard(limit=self.run_cfg.max_consecutive_skips)
        self.resumed_step: Optional[int] = None
        """The step of the checkpoint :meth:`resume` loaded (None: a fresh run)."""
        self.logger = None
        self._tracked: dict = {"modules": {}, "optimizers": {}, "schedulers": {}}
        self._state: Callable[[int], dict] = lambda step: {}
        self._checkpointer = checkpointer(self.sharded)  # the process group is known: plain or sharded
        self._stop = {"stop": False}
        self._total: Optional[int] = None  # the loop's last step (loop(total=...))

    def _warn(self, message: Optional[str]) -> None:
        """One warning line on stdout (rank 0; where every line of a run goes, :mod:`fourfold.sinks`),
        and an event in the run's log once it is open."""
        if message is None:
            return
        if self.is_main:
            print(f"fourfold {self.stage}: warning: {message}", flush=True)
        self._warnings.append(message)

    @property
    def rank(self) -> int:
        """This process's rank among the run's processes (0 in one process)."""
        return self.world.rank

    @property
    def world_size(self) -> int:
        """How many processes run this training together (1 without torchrun)."""
        return self.world.world_size

    @property
    def is_main(self) -> bool:
        """True on the process that writes the run's files (rank 0)."""
        return self.world.is_main

    @property
    def sharded(self) -> bool:
        """True under torchrun (even a world of 1): trained models shard with FSDP2
        (:mod:`fourfold.run.fsdp`) and checkpoints are DCP ones."""
        return dist.started()

    def hf_device(self) -> torch.device:
        """The device of a Hugging Face model run (``run.device``; 'auto': CUDA when available;
        under torchrun ``cuda:LOCAL_RANK``), with transformers' own load reports and progress bars
        kept off the terminal; a warning line when bf16 is asked of a CPU without native bf16
        (:func:`~fourfold.run.common.bf16_cpu_warning`)."""
        quiet_transformers()
        device = _device(self.run_cfg.device)
        self._warn(bf16_cpu_warning(self._cfg, device))  # bf16 asked of a CPU that emulates it
        return device

    def _prepare_run_dir(self, cfg):
        """:func:`prepare_run_dir` on rank 0; its verdict (the directory or the error) on every rank."""
        if not self.sharded:
            return prepare_run_dir(cfg)
        error = None
        if self.is_main:
            try:
                prepare_run_dir(cfg)
            except FourfoldError as e:
                error = e
        error = dist.broadcast_object(error)
        if error is not None:
            raise error
        return Path(cfg.run.output_dir)

    def write(self, fn: Callable, *args, **kwargs):
        """Call ``fn(*args, **kwargs)``, a function that writes into the run directory (or opens a
        writer there), and return its result; on a rank other than 0 nothing is called (None). A
        write that fails (disk full, the file-size limit, a read-only file system) is an
        :class:`~fourfold.errors.OutputError` naming the path; the writers are atomic, so what was
        saved before (the last good checkpoint) stays whole."""
        if not self.is_main:
            return None
        return self._writing(fn, *args, **kwargs)

    def _writing(self, fn: Callable, *args, **kwargs):
        """``fn(*args, **kwargs)`` with a failed write turned into an OutputError (see :meth:`write`)."""
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
        with a one-line warning on the console (and a ``warning`` event in ``events.jsonl``); when every
        checkpoint is corrupt, a CheckpointError (never a silent restart). Without ``run.resume`` or
        without checkpoints: None (a fresh run). A sharded checkpoint (a torchrun run's) loads at any
        world size, in one process too, and a one-process checkpoint loads under torchrun; resharded,
        that is said the same way as a warning."""
        found = checkpoint_dirs(self.out) if self.run_cfg.resume else []
        problems = []
        for ckpt in found:  # newest first
            try:
                state, note = self._load(ckpt)
            except CorruptCheckpointError as e:
                problems.append(str(e))
                continue
            notes = [f"{problem}; resuming from the older {ckpt.name}" for problem in problems] + [note] * bool(note)
            for message in notes:
                self._warn(message)
            self.guard.total = state.get("nonfinite_total", 0)
            self.resumed_step = checkpoint_step(ckpt)
            if self.is_main:
                print(f"fourfold {self.stage}: resumed from step {self.resumed_step} ({ckpt})", flush=True)
            return state
        if problems:
            raise CheckpointError(f"run.resume: every checkpoint in {self.out / 'checkpoints'} is corrupt "
                                  f"(newest: {problems[0]}); nothing to resume from: rerun with --overwrite")
        return None

    def _load(self, ckpt) -> tuple[dict, Optional[str]]:
        """(state, resharding note or None) of the checkpoint ``ckpt``, loaded into the tracked objects."""
        return self._checkpointer.load(ckpt, **self._tracked)

    def save(self, step: int) -> None:
        """Checkpoint ``step``: the tracked objects, ``state(step)`` and the RNG states, keeping the
        newest ``run.keep_checkpoints`` (under torchrun: sharded, written by every rank)."""
        self._writing(self._checkpointer.save, self.out, step, **self._tracked, state=self._state(step),
                      keep=self.run_cfg.keep_checkpoints)

    def checkpoint_if_due(self, step: int, *, count: Optional[int] = None, final: bool = False) -> None:
        """End of a step: checkpoint ``step`` when ``count`` (default ``step``) is a multiple of
        ``run.save_every``, when ``final`` or ``step`` is the loop's ``total`` (the run's last step:
        a run that ends leaves a checkpoint that ``--resume`` with more steps extends), or when
        SIGTERM/SIGINT arrived; after a stop signal, raise :class:`RunInterrupted` (a
        KeyboardInterrupt naming the checkpoint kept: the CLI says it and exits with 130;
        ``--resume`` continues exactly). The stop flag is read again after a due checkpoint is written,
        so a signal that arrives while it is written stops the run at this step, not one later. Under
        torchrun the ranks agree on the stop (any rank's signal stops all) before any checkpoint."""
        count = step if count is None else count
        every = self.run_cfg.save_every
        final = final or (count == step and step == self._total)
        stop = self._agreed_stop()  # first: a collective checkpoint starts only with every peer alive
        if (every and count % every == 0) or final or stop:
            self.save(step)
            stop = stop or self._agreed_stop()  # a signal that arrived while it was written: acted on now
        if stop:
            raise RunInterrupted(step, self._last_checkpoint())

    def _agreed_stop(self) -> bool:
        """Whether a stop signal arrived (under torchrun: on any rank; an all-reduce every rank makes)."""
        stop = self._stop["stop"]
        if self.world.distributed:
            stop = bool(dist.all_reduce_max(torch.tensor(int(stop))))
        return stop

    def _last_checkpoint(self) -> Optional[Path]:
        """The newest complete checkpoint of the run directory (None when there is none)."""
        from fourfold.checkpoint import latest_checkpoint

        return latest_checkpoint(self.out)

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
        (``metrics.jsonl`` and ``events.jsonl``, cut back to the resumed step; a
        :class:`NullLogger` on the other ranks) and the stop-signal handlers; on the way out the
        logger is closed and the previous handlers are back."""
        from fourfold.reporting import MetricsLogger

        rc = self.run_cfg
        self._total = total
        self.logger = NullLogger()
        if self.is_main:
            sinks = self.write(open_sinks, rc.report_to, self.out, config=config_to_dict(self._cfg))
            self.logger = self.write(MetricsLogger, self.out, progress=rc.progress,
                                     tensorboard=rc.tensorboard or "tensorboard" in rc.report_to, total=total,
                                     desc=desc, key_metrics=key_metrics, resume_step=self.resumed_step, sinks=sinks,
                                     stage=self.stage)
        for message in self._warnings:
            self.logger.event("warning", step=self.resumed_step, message=message)
        previous = _install_stop_handler(self._stop)
        try:
            yield self.logger
        except RewardServerError as e:  # the server stayed down: say where the run can continue from
            last = latest_checkpoint(self.out)
            keep = f"the last complete checkpoint is {last}: continue with --resume once the server answers again" \
                if last else "no checkpoint was written yet (nothing to resume)"
            raise RewardServerError(f"{e}; {keep}") from None
        except Exception as e:
            if not dist.is_peer_failure(e):
                raise
            previous[signal.SIGTERM] = signal.SIG_IGN  # torchrun's SIGTERM follows: the line below must get out
            raise self._peer_lost(e) from None
        finally:
            self.logger.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _peer_lost(self, error: BaseException) -> dist.PeerLostError:
        """The one line of a rank whose peer died: which rank this is, and the checkpoint to resume."""
        last = latest_checkpoint(self.out)
        resume = f"the last complete checkpoint is {last} (resume with --resume)" if last else "no checkpoint was written yet"
        first = re.sub(r"^\[[^\]]*\]\s*", "", str(error).strip()).split(". ")[0][:160] or type(error).__name__
        return dist.PeerLostError(f"rank {self.rank} of {self.world_size}: another rank of this run is gone (killed or "
                                  f"crashed; torchrun names it), so this one stops; {resume} [{first}]")

    # ---- samples and the end -------------------------------------------------------------------

    def samples_due(self, iteration: int, total: int) -> bool:
        """Whether ``iteration`` logs sample completions: every ``run.samples_every`` iterations and
        at the last one (never when it is 0)."""
        every = self.run_cfg.samples_every
        return bool(every) and (iteration % every == 0 or iteration == total)

    def warn_skipped(self, logger, skipped: list, notes: Sequence[str] = ()) -> None:
        """Say on the console and in events.jsonl how many bad data rows were skipped
        (``data.on_error: skip``) and the first, then each warning line on the data as a whole
        (``notes``: tied preference pairs left out, most tokens unknown), once: not again on resume."""
        if self.resumed_step is not None:
            return
        for line in skipped_lines(skipped, notes):
            logger.warn(line, step=0)

    def require_not_past(self, resumed: int, total: int, key: str, unit: str) -> None:
        """A resumed checkpoint at ``resumed`` (a ``unit``: step, iteration) past the run's last one,
        ``total`` (config ``key``), is refused: there is nothing to train, and exporting the
        checkpoint's model as the result of a shorter run would misstate it."""
        if resumed > total:
            raise ConfigError(f"{key}: {total}, but the checkpoint resumed from {self.out / 'checkpoints'} is at "
                              f"{unit} {resumed}, past the end; raise {key} above {resumed} to continue it, or "
                              "start over with --overwrite")

    def require_an_update(self, ran: int) -> None:
        """After the loop of a fresh run that ran ``ran`` steps or iterations: when not one update went
        through (every one skipped for a non-finite quantity, too few to reach
        ``run.max_consecutive_skips``), a NonFiniteError saying why, before the untrained model is
        exported as if it were the result."""
        if ran and self.resumed_step is None and self.guard.good == 0 and self.guard.events:
            last = self.guard.events[-1]
            raise NonFiniteError(f"no update went through in {ran} step(s): every one was skipped for a non-finite "
                                 f"quantity (last: {last['quantity']} at {last['where']}; events.jsonl lists them); "
                                 "the model was not trained and nothing was exported")

    def last_metrics_row(self) -> dict:
        """The last row of ``metrics.jsonl`` without its step ({} when there is none): what a trainer
        reports when it resumed a run that had already finished."""
        from fourfold.reporting import read_metrics

        rows = read_metrics(self.out / "metrics.jsonl")
        return {k: v for k, v in rows[-1].items() if k != "step"} if rows else {}

    def finish(self, result: dict, **outputs) -> dict:
        """End the run: print its final summary line (rank 0; on every run, terminal or not): the
        stage, the time it took, ``outputs`` (name -> path, e.g. ``model=...``), then the metrics,
        the samples and TensorBoard files when written, and the checkpoints when there are any (with
        the newest, which ``--resume`` extends).
        Returns ``result``, the trainer's summary dict."""
        if self.is_main:
            where = dict(outputs, metrics=self.logger.metrics_path)
            if self.logger.samples_path.is_file() and self.logger.samples_path.stat().st_size:
                where["samples"] = self.logger.samples_path
            if self.logger.tensorboard_dir is not None:
                where["tensorboard"] = self.logger.tensorboard_dir
            last = self._last_checkpoint()
            if last is not None:
                where["checkpoints"] = self.out / CHECKPOINTS_DIR
                where["last checkpoint"] = f"{last.name} (--resume with more steps extends the run from it)"
            print(done_line(self.stage, time.perf_counter() - self._t0, where), flush=True)
        return result


class RunInterrupted(KeyboardInterrupt):
    """A stop signal (SIGTERM, Ctrl-C) acted on at the end of step ``step``: the run saved
    ``checkpoint`` (the newest complete one; ``--resume`` continues from it exactly)."""

    def __init__(self, step: int, checkpoint: Optional[Path]):
        super().__init__(f"stopped after step {step}")
        self.step = step
        self.checkpoint = checkpoint


class NullLogger:
    """The logger of every rank but 0 under torchrun: it takes the rows, events and samples the
    trainer computes (on every rank alike) and writes nothing."""

    tensorboard_dir = None

    def __init__(self) -> None:
        self.last_step: Optional[int] = None

    def log(self, step: int, metrics: Mapping) -> None:
        """Take a metrics row (rank 0 writes it)."""
        self.last_step = int(step)

    def samples(self, step: int, rows: Sequence[Mapping]) -> None:
        """Take sample completions (rank 0 writes them)."""

    def event(self, kind: str, *, step: Optional[int] = None, **fields) -> None:
        """Take an event (rank 0 writes it)."""

    def warn(self, msg: str, *, step: Optional[int] = None, **fields) -> None:
        """Take a warning (rank 0 writes and shows it)."""

    def close(self) -> None:
        """Nothing to close."""


def _device(spec: str) -> torch.device:
    """``run.device`` resolved (:func:`~fourfold.models.loading.resolve_device`); under torchrun a
    CUDA run puts each rank on ``cuda:LOCAL_RANK`` (an explicit ``cuda:N`` is refused there)."""
    from fourfold.models.loading import resolve_device

    device = resolve_device(spec)
    if device.type != "cuda" or not dist.launched_by_torchrun():
        return device
    if device.index is not None:
        raise ConfigError(f"run.device: {spec} names one GPU, and under torchrun every rank takes "
                          "cuda:LOCAL_RANK; use cuda or auto")
    return torch.device("cuda", int(os.environ["LOCAL_RANK"]))


def one_process_start(cfg) -> torch.device:
    """The start of a command that runs in one process over a stage config with a ``run`` section
    (``fourfold generate``, ``fourfold score``: no run directory to resume, no seeding of its own):
    refused under torchrun as every stage outside :func:`~fourfold.config.stages.torchrun_stages`
    is, transformers kept quiet, ``run.threads`` applied; returns the device of ``run.device``."""
    _start_group(cfg)
    quiet_transformers()
    if cfg.run.threads is not None:
        torch.set_num_threads(cfg.run.threads)
    return _device(cfg.run.device)


def _start_group(cfg) -> dist.World:
    """Under torchrun: refuse what does not run there (a stage without a ``dist`` section), then
    start the process group on the run's device. Without torchrun: rank 0 of 1."""
    if not dist.launched_by_torchrun():
        return dist.world()
    if not getattr(stage_of(cfg), "torchrun", False):
        raise ConfigError(f"torchrun: this stage runs in one process only ({', '.join(torchrun_stages())} "
                          "run under torchrun); start it without torchrun")
    return dist.init_from_env(_device(cfg.run.device))


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
