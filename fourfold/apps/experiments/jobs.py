"""Jobs: chains of subprocesses, ``workers`` at a time, with dependencies.

Every run and evaluation of the sweep is a subprocess (``python -m fourfold.cli ppo ...``,
``python -m fourfold.apps.experiments evaluate ...``), so that a crash or a kill of one loses nothing
else. A failed job fails nothing but the jobs that depend on it.

The tail every family's runner shares: :func:`clear_dirs` (``--fresh``), :func:`run_family_jobs`,
:func:`failed_notes` and :func:`raise_unfinished`.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.report_kit import duration
from fourfold.errors import FourfoldError


class ExperimentError(FourfoldError, RuntimeError):
    """Some runs of the sweep failed (the report is still written from the others)."""


@dataclasses.dataclass
class Job:
    """A named chain of commands run in one worker slot, after the jobs named in ``deps``.
    ``prepare()`` runs in this process right before the job starts and returns the commands (an
    empty list when everything is already done)."""

    name: str
    prepare: Callable[[], list[list[str]]]
    deps: tuple[str, ...] = ()
    progress: Callable[[], str] | None = None
    finished: Callable[[list[str], "Finished"], None] | None = None
    """Called in this process after each command of the chain exits (its argv and how it ended)."""


@dataclasses.dataclass
class Finished:
    """How one command of a job ended: exit status, wall seconds, and the peak resident memory of
    the subprocess (MB: its VmHWM, sampled every 0.25 s while it ran; None where /proc has none)."""

    returncode: int
    seconds: float
    peak_rss_mb: float | None


def peak_rss_mb(pid: int) -> float | None:
    """The peak resident set size so far (VmHWM, MB) of process ``pid``, from /proc/<pid>/status:
    Linux only, None elsewhere or once the process has exited. (The kernel's rusage of a child is no
    substitute: its ru_maxrss keeps the high-water mark of the parent it was forked from.)"""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def child_env(threads: int | None) -> dict:
    """This process's environment with ``threads`` threads for every math library of a child."""
    env = dict(os.environ)
    n = str(threads or 1)
    env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    return env


def tail(path: Path, n: int = 8) -> str:
    """The last ``n`` lines of a text file ('' when it cannot be read)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


@dataclasses.dataclass
class _Running:
    job: Job
    proc: subprocess.Popen
    rest: list[list[str]]
    t0: float
    log_file: Any
    cmd: list[str]
    t_cmd: float
    peak_mb: float | None = None


class _Pool:
    """The state of :func:`run_jobs`: pending and running jobs, and each finished job's state."""

    def __init__(self, jobs: Sequence[Job], workers: int, log_dir: Path, threads: int | None,
                 log: Callable[[str], None]):
        self.pending, self.workers, self.log_dir, self.log = list(jobs), workers, log_dir, log
        self.names = {j.name for j in jobs}
        self.total = len(jobs)
        self.env = child_env(threads)
        self.state: dict[str, str] = {}
        self.running: dict[str, _Running] = {}
        self.t_start = time.perf_counter()

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name.replace('/', '_')}.log"

    def start(self, job: Job, cmds: list[list[str]], t0: float) -> None:
        f = open(self.log_path(job.name), "a", encoding="utf-8")
        f.write(f"\n$ {' '.join(cmds[0])}\n")
        f.flush()
        proc = subprocess.Popen(cmds[0], stdout=f, stderr=subprocess.STDOUT, env=self.env)
        self.running[job.name] = _Running(job, proc, cmds[1:], t0, f, cmds[0], time.perf_counter())

    def launch_ready(self) -> None:
        """Start pending jobs whose dependencies finished, up to ``workers``; skip those whose failed."""
        for job in list(self.pending):
            if len(self.running) >= self.workers:
                break
            bad = [d for d in job.deps if d in self.names and self.state.get(d, "").startswith(("failed", "skipped"))]
            if bad:
                self.pending.remove(job)
                self.state[job.name] = f"skipped: {bad[0]} did not finish"
                self.log(f"  skip {job.name} ({bad[0]} did not finish)")
                continue
            if any(d in self.names and self.state.get(d) not in ("done", "cached") for d in job.deps):
                continue
            self.pending.remove(job)
            try:
                cmds = job.prepare()
            except Exception as e:  # noqa: BLE001 - one bad job must not stop the sweep
                self.state[job.name] = f"failed: {type(e).__name__}: {e}"
                self.log(f"  [red]fail[/red] {job.name}: {e}")
                continue
            if not cmds:
                self.state[job.name] = "cached"
                continue
            self.log(f"  start {job.name}")
            self.start(job, cmds, time.perf_counter())

    def reap(self) -> None:
        """Record the jobs whose current command ended; start the next command of a chain."""
        for name in list(self.running):
            r = self.running[name]
            peak = peak_rss_mb(r.proc.pid)  # a high-water mark: the last sample before the exit counts
            if peak is not None:
                r.peak_mb = max(r.peak_mb or 0.0, peak)
            rc = r.proc.poll()
            if rc is None:
                continue
            r.log_file.close()
            del self.running[name]
            if r.job.finished is not None:
                try:
                    r.job.finished(r.cmd, Finished(rc, time.perf_counter() - r.t_cmd, r.peak_mb))
                except Exception as e:  # noqa: BLE001 - a bookkeeping error must not stop the sweep
                    self.log(f"  [yellow]note[/yellow]: {name}: recording how a command ended failed: {e}")
            if rc != 0:
                self.state[name] = f"failed: exit status {rc} (log: {self.log_path(name)})"
                self.log(f"  [red]fail[/red] {name} (exit status {rc}); last lines of its log:\n"
                         + tail(self.log_path(name)))
            elif r.rest:
                self.start(r.job, r.rest, r.t0)
            else:
                self.state[name] = "done"
                n_done = sum(1 for s in self.state.values() if s in ("done", "cached"))
                self.log(f"  done  {name} in {duration(time.perf_counter() - r.t0)}  "
                         f"[{n_done}/{self.total}, {duration(time.perf_counter() - self.t_start)} so far]")

    def report_running(self) -> None:
        parts = [f"{n} {r.job.progress()}" if r.job.progress else n for n, r in self.running.items()]
        self.log(f"  ... running: {', '.join(parts)}")

    def terminate(self) -> None:
        """SIGTERM to every running child (trainers checkpoint and exit), then wait (kill after 60 s)."""
        for r in self.running.values():
            if r.proc.poll() is None:
                r.proc.terminate()
        for r in self.running.values():
            try:
                r.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                r.proc.kill()
            r.log_file.close()


def run_jobs(jobs: Sequence[Job], *, workers: int, log_dir: Path, threads: int | None,
             log: Callable[[str], None], status_every: float = 60.0) -> dict[str, str]:
    """Run the jobs; returns {name: 'done' | 'cached' | 'failed: ...' | 'skipped: ...'}.

    A failed job fails nothing but the jobs that depend on it. On KeyboardInterrupt every running
    child gets SIGTERM (trainers checkpoint and exit), then the interrupt propagates.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    pool = _Pool(jobs, workers, log_dir, threads, log)
    last_status = pool.t_start
    try:
        while pool.pending or pool.running:
            pool.launch_ready()
            if not pool.running and pool.pending:
                raise ExperimentError(f"jobs wait on unknown dependencies: {[j.name for j in pool.pending]}")
            time.sleep(0.25)
            pool.reap()
            if pool.running and time.perf_counter() - last_status > status_every:
                last_status = time.perf_counter()
                pool.report_running()
    except KeyboardInterrupt:
        pool.terminate()
        raise
    return pool.state


def clear_dirs(out: Path, names: Iterable[str]) -> None:
    """Remove each directory ``out / name`` that exists (what a family's ``--fresh`` starts over)."""
    for name in names:
        if (out / name).exists():
            shutil.rmtree(out / name)


def run_family_jobs(cfg: ExperimentsConfig, out: Path, log: Callable[[str], None],
                    jobs: Sequence[Job]) -> tuple[dict[str, str], float]:
    """:func:`run_jobs` with the config's workers and threads, the jobs' logs in ``out / "logs"``;
    returns its state and the wall seconds it took."""
    t0 = time.perf_counter()
    state = run_jobs(jobs, workers=cfg.workers, log_dir=out / "logs", threads=cfg.run.threads, log=log)
    return state, time.perf_counter() - t0


def unfinished(state: dict[str, str]) -> dict[str, str]:
    """The jobs of a :func:`run_jobs` state that did not finish: {name: 'failed: ...' | 'skipped: ...'}."""
    return {k: v for k, v in state.items() if not v.startswith(("done", "cached"))}


def failed_notes(state: dict[str, str]) -> list[str]:
    """One note per job of ``state`` that did not finish: ``"<name>: <why>"``, in the state's order."""
    return [f"{k}: {v}" for k, v in unfinished(state).items()]


def raise_unfinished(state: dict[str, str], n_jobs: int, log_dir: Path) -> None:
    """Raise :class:`ExperimentError` naming the jobs of ``state`` that did not finish (a runner calls
    it once its report is written: the report covers the rest); nothing when every job finished."""
    failed = unfinished(state)
    if failed:
        raise ExperimentError(f"{len(failed)} of {n_jobs} jobs did not finish ({', '.join(sorted(failed))}); "
                              f"the report covers the rest; logs in {log_dir}; rerun to resume")
