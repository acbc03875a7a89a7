"""The skeleton the experiment families share (horizon, overoptimization, turns): what their jobs
hold and the commands they write (:class:`FamilyJobs`), a run directory kept only for its own
config (:func:`claim_run_dir`), and a family run's steps (:class:`FamilyRun`: the start with
--quick, the output directory and --fresh; the jobs; the end with results.json, the report,
provenance, the claims logged). Each family keeps what is its own: its worlds, jobs, claims and report.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from fourfold.apps.cache import done_key, read_json
from fourfold.apps.demo import pipeline as demo
from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.jobs import Job, clear_dirs, failed_notes, raise_unfinished, run_family_jobs
from fourfold.apps.experiments.sweep import log_claims, open_output
from fourfold.apps.experiments.unbiased import seed_sft_stage
from fourfold.apps.provenance import provenance, write_provenance
from fourfold.atomic import write_text_atomic
from fourfold.config import DemoConfig, save_config

FAMILY_QUICK: dict[str, Any] = {"seeds": [0], "eval_prompts": 128}
"""What every family's --quick table holds: one seed, 128 evaluation prompts."""


def world_dir(base: str, label: str) -> str:
    """Where a world's cached stages live: '<base>-<label>' (``base`` a family's demo_dir or world_dir)."""
    return f"{base.rstrip('/')}-{label}"


@dataclasses.dataclass
class FamilyJobs:
    """What a family's jobs share: its settings, output directory and log."""

    cfg: ExperimentsConfig
    out: Path
    log: Callable[..., Any]
    py: str = dataclasses.field(default=sys.executable, kw_only=True)

    def spec_cmd(self, kind: str, name: str, spec: dict) -> list[str]:
        """``python -m fourfold.apps.experiments <kind> <spec>``, the spec written to configs/<kind>-<name>.json."""
        p = self.out / "configs" / f"{kind}-{name.replace('/', '-')}.json"
        write_text_atomic(p, json.dumps(spec, sort_keys=True))
        return [self.py, "-m", "fourfold.apps.experiments", kind, str(p)]

    def ppo_cmd(self, name: str, rcfg) -> list[str]:
        """``fourfold ppo`` of run ``name``, its config written to configs/<name>.yaml."""
        p = self.out / "configs" / f"{name.replace('/', '-')}.yaml"
        save_config(rcfg, p)
        return [self.py, "-m", "fourfold.cli", "ppo", "--config", str(p)]

    def demo_job(self, name: str, label: str, dcfg: DemoConfig, src: Optional[DemoConfig],
                 deps: tuple[str, ...] = ()) -> Job:
        """Prepare ``dcfg``'s demo stages up to its reward model (nothing when they are cached); a
        variant first gets ``src``'s SFT stage (the same SFT model)."""

        def prepare() -> list[list[str]]:
            if not dcfg.fresh and done_key(Path(dcfg.run.output_dir).resolve(), "reward") == demo.reward_stage_key(dcfg):
                return []
            if src is not None and not seed_sft_stage(src, dcfg):
                self.log(f"  ({label} trains its own SFT model: the SFT stage could not be copied)")
            p = self.out / "configs" / f"demo-{label}.yaml"
            save_config(dcfg, p)
            return [[self.py, "-m", "fourfold.apps.experiments", "prepare-demo", str(p)]]

        return Job(name, prepare, deps=deps)


@dataclasses.dataclass
class PromptFamilyJobs(FamilyJobs):
    """A family whose worlds share the demo's evaluation prompts and sampling seed."""

    prompts: list[str]
    sample_seed: int


def claim_run_dir(run_dir: Path, key: str, record: dict) -> None:
    """Keep ``run_dir`` only if its EXPERIMENT.json has ``key`` (another config's run is removed:
    never resume across configs); write the marker when there is none."""
    marker = run_dir / "EXPERIMENT.json"
    rec = read_json(marker)
    if run_dir.exists() and (not rec or rec.get("key") != key):
        shutil.rmtree(run_dir)
        rec = None
    if rec is None:
        write_text_atomic(marker, json.dumps({"key": key, **record}, sort_keys=True))


@dataclasses.dataclass
class FamilyRun:
    """One run of a family, the skeleton its ``run_*`` follows: :meth:`start` (--quick, the output
    directory, --fresh), :meth:`run_jobs` (the plan logged, the jobs run), then the family's own
    results and claims, and :meth:`finish` (results.json, the report, provenance, the claims logged)."""

    name: str
    cfg: ExperimentsConfig
    out: Path
    log: Callable[..., Any]
    t_start: float
    made: dict
    jobs: Sequence[Job] = ()
    state: dict[str, str] = dataclasses.field(default_factory=dict)
    jobs_s: float = 0.0

    @classmethod
    def start(cls, name: str, cfg: ExperimentsConfig, quick: Callable[[ExperimentsConfig], ExperimentsConfig],
              fresh: Union[Sequence[str], Callable[[Path], Sequence[str]]]) -> "FamilyRun":
        """The family ``name`` started: the effective config (``quick`` applied under --quick), the
        output directory and the log; with --fresh the output's directories ``fresh`` (or ``fresh(out)``)
        cleared."""
        t_start, made = time.perf_counter(), provenance()
        if cfg.quick:
            cfg = quick(cfg)
        out, log = open_output(cfg)
        if cfg.fresh:
            clear_dirs(out, fresh(out) if callable(fresh) else fresh)
        return cls(name, cfg, out, log, t_start, made)

    def run_jobs(self, jobs: Sequence[Job], plan: str) -> dict[str, str]:
        """Log the plan (``plan``: what the family runs), run ``jobs`` (resumed, ``workers`` at a time);
        returns their states."""
        self.jobs = jobs
        self.log(f"[bold]fourfold experiments ({self.name})[/bold]: {plan}; {len(jobs)} jobs, {self.cfg.workers} at a "
                 f"time -> {self.out}")
        self.state, self.jobs_s = run_family_jobs(self.cfg, self.out, self.log, list(jobs))
        return self.state

    def elapsed(self) -> float:
        """Seconds since :meth:`start`."""
        return time.perf_counter() - self.t_start

    def finish(self, record: dict, write_report: Callable[[dict], None]) -> None:
        """The end: ``record`` (its claims and notes in) gets the notes on the jobs that failed, the
        jobs' states and the times, and goes to results.json; then the report (``write_report(record)``),
        provenance.json, the claims logged; ExperimentError if a job did not finish."""
        record["notes"] += failed_notes(self.state)
        total_s = self.elapsed()
        record.update(jobs=self.state, wall_s=round(total_s, 1), jobs_s=round(self.jobs_s, 1))
        write_text_atomic(self.out / "results.json", json.dumps(record, indent=1, sort_keys=True, default=str))
        write_report(record)
        write_provenance(self.out, self.made)
        log_claims(self.log, record["claims"], self.out, total_s)
        raise_unfinished(self.state, len(self.jobs), self.out / "logs")
