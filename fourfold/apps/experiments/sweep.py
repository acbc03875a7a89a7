"""The sweep, step by step: :func:`run` (``fourfold experiments``); see the package docstring."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

from fourfold.apps.cache import digest, done_key, read_json
from fourfold.apps.claim_kit import counts_text
from fourfold.apps.demo import pipeline as demo
from fourfold.apps.experiments.arms import (
    Arm,
    build_arms,
    critic_warmup_iterations,
    models_in_memory,
    run_config,
    run_key,
)
from fourfold.apps.experiments.claims import compute_claims
from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.final_eval import eval_prompts, eval_sample_seed
from fourfold.apps.experiments.jobs import ExperimentError, Finished, Job, clear_dirs, failed_notes, raise_unfinished, run_family_jobs
from fourfold.apps.experiments.report import summary_header, write_report, write_summary_md
from fourfold.apps.experiments.results import read_curves, summarize_arm, summarize_costs, train_seconds
from fourfold.apps.experiments.unbiased import seed_sft_stage, unbiased_demo_config
from fourfold.apps.provenance import provenance, write_provenance
from fourfold.apps.report_kit import duration
from fourfold.atomic import write_text_atomic
from fourfold.config import DemoConfig, config_to_dict, save_config

QUICK: dict[str, Any] = {  # --quick: the claims its budget settles, in about 5 minutes on 2 cores
    "seeds": [0],
    "arms": ["ppo", "ppo-beta0", "grpo", "dpo"],
    "iterations": 16,  # ppo-beta0's gold and KL level off by iteration 12-16 (they carry 3 of its 4 claims)
    "eval_prompts": 128,
    "claims.groups": ["beta0", "dpo"],
    "claims.quick": True,
    "demo.quick": True,
}
DEFAULT_OUTPUT = "runs/experiments"
DEFAULT_DEMO_OUTPUT = "runs/demo"


def quick_config(cfg: ExperimentsConfig) -> ExperimentsConfig:
    """The --quick settings: QUICK over cfg (with demo.quick=true), '-quick' on default output paths."""
    cfg = demo.apply_quick(cfg, QUICK)
    if cfg.demo.run.output_dir == DEFAULT_DEMO_OUTPUT:
        cfg.demo = dataclasses.replace(cfg.demo, run=dataclasses.replace(cfg.demo.run,
                                                                          output_dir=DEFAULT_DEMO_OUTPUT + "-quick"))
    if cfg.run.output_dir == DEFAULT_OUTPUT:
        cfg.run = dataclasses.replace(cfg.run, output_dir=DEFAULT_OUTPUT + "-quick")
    return cfg


def family_quick_config(cfg: ExperimentsConfig, table: dict, default_output: str, demo_dir_key: str,
                        default_demo: str) -> ExperimentsConfig:
    """A family's --quick settings (the horizon and overoptimization families): the quick demo's
    budgets (demo.QUICK), ``table`` over them, '-quick' on the default paths of ``run.output_dir``
    (``default_output``) and ``demo_dir_key`` (``default_demo``)."""
    cfg = dataclasses.replace(cfg, demo=demo.apply_quick(cfg.demo))
    cfg = demo.apply_quick(cfg, table)
    for key, default in (("run.output_dir", default_output), (demo_dir_key, default_demo)):
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) == default:
            cfg = demo.apply_quick(cfg, {key: default + "-quick"})
    return cfg


@dataclasses.dataclass
class Sweep:
    """What every job of one invocation shares: settings, directories, the evaluation prompts. (The
    horizon family runs one per horizon and variant, over that world's demo stages.)"""

    cfg: ExperimentsConfig
    out: Path
    log: Callable[..., Any]
    arms: list[Arm]
    demo_dir: Path
    ucfg: DemoConfig
    prompts: list[str]
    sample_seed: int
    py: str = sys.executable

    @property
    def u_dir(self) -> Path:
        return Path(self.ucfg.run.output_dir).resolve()

    @property
    def need_unbiased(self) -> bool:
        return any(a.rm == "unbiased" for a in self.arms)

    @property
    def sft_dir(self) -> Path:
        return self.demo_dir / "sft"

    def rm_dir(self, which: str) -> Path:
        return self.demo_dir / "reward" if which == "biased" else self.u_dir / "reward"

    def run_dir(self, arm: Arm, seed: int) -> Path:
        return self.out / "runs" / arm.name / f"seed{seed}"

    def check_runs(self, what: str, where: str) -> None:
        """Every arm's run config (seed 0) validated before any job starts: a setting the trainer would
        refuse is one ConfigError line, ``<what> arm <name> (<where>): ...``, not a failed job per run."""
        from fourfold.config.loader import validate_tree
        from fourfold.errors import ConfigError

        for arm in self.arms:
            rc = run_config(self.cfg, arm, self.cfg.seeds[0], sft=self.sft_dir, rm=self.rm_dir("biased"),
                            run_dir=self.run_dir(arm, 0))
            try:
                validate_tree(rc)
            except ConfigError as e:
                raise ConfigError(f"{what} arm {arm.name} ({where}): {e}") from None

    def demo_keys(self, which: str) -> dict:
        """The demo stages a result depends on: the SFT model, and the RM of ``which`` labelers."""
        d = self.demo_dir if which == "biased" else self.u_dir
        return {"sft": done_key(self.demo_dir, "sft"), "reward": done_key(d, "reward"),
                "rm_task": self.cfg.demo.task_options if which == "biased" else self.ucfg.task_options}

    def train_keys(self, arm: Arm) -> dict:
        """The demo stages an arm's training depends on: the SFT model and its RM, or for dpo the
        SFT model and the pairs (the RM then only scores its evaluation)."""
        if arm.stage == "dpo":
            return {"sft": done_key(self.demo_dir, "sft"), "pairs": done_key(self.demo_dir, "pairs")}
        return self.demo_keys(arm.rm)

    @property
    def eval_settings(self) -> dict:
        gen = self.cfg.demo.generation
        return {"prompts": self.prompts, "sample_seed": self.sample_seed, "max_new_tokens": gen.max_new_tokens,
                "temperature": gen.temperature, "gold_task": self.cfg.demo.task_options}

    def eval_cmd(self, name: str, policy: Path, rm: Path, key: str, dest: Path) -> list[str]:
        """The command evaluating ``policy`` under ``rm`` into ``dest`` (its spec saved under configs/)."""
        gen = self.cfg.demo.generation
        spec = {"name": name, "policy": str(policy), "reference": str(self.sft_dir), "reward": str(rm),
                "task_options": self.cfg.demo.task_options, "prompts": self.prompts, "sample_seed": self.sample_seed,
                "max_new_tokens": gen.max_new_tokens, "temperature": gen.temperature, "out": str(dest),
                "key": key, "threads": self.cfg.run.threads or 1}
        p = self.out / "configs" / f"eval-{name}.json"
        write_text_atomic(p, json.dumps(spec, sort_keys=True))
        return [self.py, "-m", "fourfold.apps.experiments", "evaluate", str(p)]

    def prep_unbiased(self) -> list[list[str]]:
        if not seed_sft_stage(self.cfg.demo, self.ucfg):
            self.log("  (the unbiased demo trains its own SFT model: its SFT stage could not be copied)")
        p = self.out / "configs" / "demo-unbiased.yaml"
        save_config(self.ucfg, p)
        return [[self.py, "-m", "fourfold.apps.experiments", "prepare-demo", str(p)]]

    def prep_baseline(self, which: str) -> list[list[str]]:
        key = digest({"eval": self.eval_settings, "demo": self.demo_keys(which), "policy": "sft"})
        dest = self.out / "baseline" / f"sft-{which}-rm.json"
        rec = read_json(dest)
        if rec and rec.get("key") == key:
            return []
        return [self.eval_cmd(f"sft-{which}-rm", self.sft_dir, self.rm_dir(which), key, dest)]

    def prep_run(self, arm: Arm, seed: int) -> list[list[str]]:
        """Train (unless the final policy exists) and evaluate (unless done with these settings)."""
        run_dir, rm = self.run_dir(arm, seed), self.rm_dir(arm.rm)
        rcfg = run_config(self.cfg, arm, seed, sft=self.sft_dir, rm=rm, run_dir=run_dir)
        key = run_key(rcfg, arm.stage, self.train_keys(arm))
        marker = run_dir / "EXPERIMENT.json"
        rec = read_json(marker)
        if run_dir.exists() and (not rec or rec.get("key") != key):
            shutil.rmtree(run_dir)  # another config's run: never resume across configs
            rec = None
        if rec is None:
            write_text_atomic(marker, json.dumps({"key": key, "arm": arm.name, "seed": seed}, sort_keys=True))
        cmds = []
        if not (run_dir / arm.model_dir / "config.json").is_file():
            p = self.out / "configs" / f"{arm.name}-seed{seed}.yaml"
            save_config(rcfg, p)
            cmds.append([self.py, "-m", "fourfold.cli", arm.stage, "--config", str(p)])
        ekey = digest({"run": key, "eval": self.eval_settings, "rm": self.demo_keys(arm.rm)})
        dest = run_dir / "final_eval.json"
        rec = read_json(dest)
        if cmds or not rec or rec.get("key") != ekey:
            cmds.append(self.eval_cmd(f"{arm.name}-seed{seed}", run_dir / arm.model_dir, rm, ekey, dest))
        return cmds

    def record_peak(self, run_dir: Path, cmd: list[str], fin: Finished) -> None:
        """After a training command exits cleanly: its peak RSS and wall seconds into
        ``<run_dir>/peak_memory.json`` (a resumed run records its last process)."""
        if cmd[1:3] == ["-m", "fourfold.cli"] and fin.returncode == 0:
            write_text_atomic(run_dir / "peak_memory.json", json.dumps(
                {"peak_rss_mb": fin.peak_rss_mb, "seconds": round(fin.seconds, 1)}, sort_keys=True))

    def progress(self, arm: Arm, run_dir: Path) -> str:
        from fourfold.reporting import read_metrics

        if arm.stage == "dpo":
            steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] if (
                run_dir / "metrics.jsonl").is_file() else []
            return f"(step {steps[-1] if steps else 0}/{self.cfg.demo.reward.steps})"
        c = read_curves(run_dir) if (run_dir / "metrics.jsonl").is_file() else {"iteration": []}
        return f"(it {int(c['iteration'][-1]) if c['iteration'] else 0}/{self.cfg.iterations})"

    def jobs(self) -> list[Job]:
        """The unbiased demo (when an arm needs it), the SFT model's evaluations, then arm x seed."""
        unbiased = ("demo-unbiased",)
        jobs = [Job("demo-unbiased", self.prep_unbiased)] if self.need_unbiased else []
        for which in (["biased", "unbiased"] if self.need_unbiased else ["biased"]):
            jobs.append(Job(f"sft/{which}-rm", partial(self.prep_baseline, which),
                            deps=unbiased if which == "unbiased" else ()))
        for seed in self.cfg.seeds:
            for arm in self.arms:
                jobs.append(Job(f"{arm.name}/seed{seed}", partial(self.prep_run, arm, seed),
                                deps=unbiased if arm.rm == "unbiased" else (),
                                progress=partial(self.progress, arm, self.run_dir(arm, seed)),
                                finished=partial(self.record_peak, self.run_dir(arm, seed))))
        return jobs


@dataclasses.dataclass
class Results:
    """Step 3's numbers: the SFT model's evaluations, every arm's final evaluations and curves."""

    base: dict[str, dict]
    finals: dict[str, list[dict]]
    rows_by_arm: dict[str, list[dict]]
    curves: dict[str, list[dict]]
    summaries: dict[str, dict]
    claims: list[dict]
    notes: list[str]

    @property
    def sft(self) -> dict:
        return self.base["biased"]["summary"]


def collect_results(sw: Sweep, state: dict[str, str]) -> Results:
    """Read the final evaluations and curves of the finished runs; compute the claims. ``state``:
    each job's state by the names :meth:`Sweep.jobs` gives them."""
    base = {}
    for which in ("biased", "unbiased"):
        rec = read_json(sw.out / "baseline" / f"sft-{which}-rm.json")
        if rec:
            base[which] = rec
    if "biased" not in base:
        raise ExperimentError(f"the SFT model's evaluation failed ({state.get('sft/biased-rm')}); "
                              f"see {sw.out / 'logs'}")
    sft = base["biased"]["summary"]
    finals: dict[str, list[dict]] = {}
    rows_by_arm: dict[str, list[dict]] = {}
    curves: dict[str, list[dict]] = {}
    curves_by_seed: dict[str, dict[int, dict]] = {}
    costs: dict[str, list[dict]] = {}
    proxy_sft: dict[str, dict] = {}
    for arm in sw.arms:
        proxy_sft[arm.name] = base.get(arm.rm, base["biased"])["summary"]
        for seed in sw.cfg.seeds:
            rd = sw.run_dir(arm, seed)
            rec = read_json(rd / "final_eval.json")
            if not rec or state.get(f"{arm.name}/seed{seed}") not in ("done", "cached"):
                continue
            finals.setdefault(arm.name, []).append({"seed": seed, **rec["summary"]})
            if arm.name not in rows_by_arm:
                rows_by_arm[arm.name] = rec["rows"]
            if arm.stage != "dpo":  # dpo logs steps over pairs, no sampled batches
                curves.setdefault(arm.name, []).append(read_curves(rd))
                curves_by_seed.setdefault(arm.name, {})[seed] = curves[arm.name][-1]
            peak = read_json(rd / "peak_memory.json") or {}
            costs.setdefault(arm.name, []).append({"peak_rss_mb": peak.get("peak_rss_mb"), "train_s": train_seconds(rd)})
    summaries = {}
    for arm in sw.arms:
        if arm.name in finals:
            trained, frozen = models_in_memory(sw.cfg, arm)
            summaries[arm.name] = {**summarize_arm(finals[arm.name], curves.get(arm.name, []), sft, proxy_sft[arm.name]),
                                   **summarize_costs(costs[arm.name]), "models": f"{trained + frozen} ({trained}+{frozen})"}
    claims, notes = compute_claims(finals, sft, sw.cfg.claims, kl_coef=sw.cfg.demo.ppo.kl_coef,
                                   ppo_epochs=sw.cfg.demo.ppo.ppo_epochs, proxy_sft=proxy_sft,
                                   curves=curves_by_seed, critic_warmup=critic_warmup_iterations(sw.cfg))
    return Results(base, finals, rows_by_arm, curves, summaries, claims, notes + failed_notes(state))


def write_outputs(sw: Sweep, res: Results, d_res: dict, state: dict, *, total_s: float, jobs_s: float,
                  made: dict | None = None) -> None:
    """summary.md, results.json, report.html and provenance.json (``made``: taken when the sweep started)."""
    cfg, sft = sw.cfg, res.sft
    sft_row = {"arm": "SFT (reference)", "seeds": 1, **{k: sft[k] for k in ("proxy", "gold", "kl", "length",
                                                                        "well_formed", "repetition")},
               "gold_delta_sd": 0.0, "proxy_delta_sd": 0.0}
    result_rows = [sft_row] + [{"arm": a, **s} for a, s in res.summaries.items()]
    header = summary_header(cfg, sw.arms, n_prompts=len(sw.prompts), sft=sft, demo_dir=sw.demo_dir,
                            rm_result=d_res.get("reward_result", {}),
                            unbiased_dir=sw.u_dir if sw.need_unbiased else None, total_s=total_s, jobs_s=jobs_s)
    write_summary_md(sw.out / "summary.md", header=header, result_rows=result_rows, claims=res.claims, notes=res.notes)
    results = {"config": config_to_dict(cfg), "sft": sft,
               "sft_unbiased_rm": res.base.get("unbiased", {}).get("summary"), "finals": res.finals,
               "summaries": res.summaries, "claims": res.claims, "notes": res.notes, "jobs": state,
               "wall_s": round(total_s, 1), "jobs_s": round(jobs_s, 1), "demo": {k: v for k, v in d_res.items()}}
    write_text_atomic(sw.out / "results.json", json.dumps(results, indent=1, sort_keys=True, default=str))
    write_report(sw.out / "report.html", cfg=cfg, arms=sw.arms, header=header, result_rows=result_rows,
                 claims=res.claims, notes=res.notes, curves=res.curves, finals=res.finals, sft=sft,
                 rows_by_arm=res.rows_by_arm, sft_rows=res.base["biased"]["rows"])
    write_provenance(sw.out, made)


def open_output(cfg: ExperimentsConfig) -> tuple[Path, Callable[..., Any]]:
    """The output directory (created, with the effective config.yaml) and the log (the console on
    stdout, where every line of a run goes, :mod:`fourfold.sinks`; nothing without run.progress)."""
    from rich.console import Console

    console = Console(highlight=False)
    out = Path(cfg.run.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    return out, console.print if cfg.run.progress else (lambda *a, **k: None)


def _start(cfg: ExperimentsConfig) -> tuple[ExperimentsConfig, Path, Callable[..., Any]]:
    """The effective config (--quick, the quick demo), the output directory (cleared with --fresh), the log."""
    if cfg.quick:
        cfg = quick_config(cfg)
    if cfg.demo.quick:  # the quick demo's settings (its PPO batch too) are what the arms start from
        cfg = dataclasses.replace(cfg, demo=demo.apply_quick(cfg.demo))
    out, log = open_output(cfg)
    if cfg.fresh:
        clear_dirs(out, ("runs", "baseline", "configs", "logs"))
    return cfg, out, log


def log_claims(log: Callable[..., Any], claims: list[dict], out: Path, total_s: float) -> None:
    log(f"\nclaims: {counts_text(claims)}")
    for c in claims:
        log(f"  [{'green' if c['holds'] == 'yes' else 'red'}]{c['holds']:3s}[/] {c['claim']}: {c['measured']}")
    log(f"\nreport: {out / 'report.html'}\nsummary: {out / 'summary.md'}   ({duration(total_s)})")


def run_claims(cfg: ExperimentsConfig) -> dict:
    """Run (or resume) the claims sweep (``family: claims``) and write the report; returns
    {output_dir, claims, summaries}."""
    t_start, made = time.perf_counter(), provenance()
    cfg, out, log = _start(cfg)
    arms = build_arms(cfg)
    log(f"[bold]fourfold experiments[/bold]: {len(arms)} arms x {len(cfg.seeds)} seeds, {cfg.iterations} iterations "
        f"x {cfg.demo.ppo.rollout_batch_size} samples each, {cfg.workers} workers -> {out}")

    # 1. the demo's SFT model and reward model (cached; shared with `fourfold demo`)
    log("[bold]1/4 demo stages[/bold] (SFT, pairs, reward model; cached in "
        f"{cfg.demo.run.output_dir})")
    d_res = demo.run(cfg.demo, stop_after="reward")
    sw = Sweep(cfg, out, log, arms, Path(d_res["output_dir"]).resolve(), unbiased_demo_config(cfg),
                eval_prompts(cfg), eval_sample_seed(cfg))

    # 2. the jobs: every arm x seed trained and evaluated in subprocesses, `workers` at a time
    jobs = sw.jobs()
    log(f"[bold]2/4 runs[/bold] {len(jobs)} jobs, {cfg.workers} at a time (logs in {out / 'logs'})")
    state, jobs_s = run_family_jobs(cfg, out, log, jobs)

    # 3. collect the final evaluations and curves; the claims
    log("[bold]3/4 results[/bold]")
    res = collect_results(sw, state)

    # 4. the report
    log("[bold]4/4 report[/bold]")
    total_s = time.perf_counter() - t_start
    write_outputs(sw, res, d_res, state, total_s=total_s, jobs_s=jobs_s, made=made)
    log_claims(log, res.claims, out, total_s)
    raise_unfinished(state, len(jobs), out / "logs")
    return {"output_dir": str(out), "claims": res.claims, "summaries": res.summaries, "notes": res.notes}

