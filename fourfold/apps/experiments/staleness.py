"""The staleness family (``fourfold experiments --config examples/staleness.yaml``): the corrections
for a sampler running ahead, measured where they matter (issue 42, item 5; docs/experiments.md,
"Running ahead: the corrections where they matter").

A sampler with a fixed lag k (``rollout.max_staleness``, :mod:`fourfold.trainers.ahead`) hands the
update samples from a policy k updates old. Each objective of ``staleness.objectives`` at each k of
``staleness.ks`` is an arm ``k<k>-<objective>`` (:func:`staleness_arms`): ``engine`` (pi_old the
sampler's log-probs: the clip around the behaviour policy), ``recompute`` (pi_old the trainer's,
no importance weight), ``decoupled`` (recompute and the behaviour-to-proximal weight truncated:
token TIS). At k = 0 the same objectives sample with ``generation.top_p`` (``topp-<objective>``):
the behaviour log-probs are then the renormalised distribution's, the trainer's the full policy's.
Every arm is the demo's PPO otherwise (a critic, the same samples per iteration).

The *worlds*: ``demo`` (the demo section's stages, the claims family's cache) and the horizon
family's longest horizon ``h<k>`` (``staleness.horizon_config``: that family's config and world
builder, :func:`fourfold.apps.experiments.horizon.horizon_demo`, and its cache). Each world is a
:class:`~fourfold.apps.experiments.sweep.Sweep` of these arms (its own summary.md and report.html
under ``<output_dir>/<world>/``); all jobs run in one pool, ``workers`` at a time, resumable. Per run
the family reads its per-iteration metrics (:data:`~fourfold.apps.experiments.staleness_claims.CURVE_METRICS`)
into :func:`~fourfold.apps.experiments.staleness_claims.run_stats`; its claims:
:func:`~fourfold.apps.experiments.staleness_claims.compute_staleness_claims`; its report:
:mod:`~fourfold.apps.experiments.staleness_report`. Thresholds were fixed before the first run.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Optional, Sequence

from fourfold.apps.cache import read_done
from fourfold.apps.demo import pipeline as demo
from fourfold.apps.experiments.arms import Arm
from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.family import FAMILY_QUICK, FamilyRun, PromptFamilyJobs
from fourfold.apps.experiments.final_eval import eval_prompts, eval_sample_seed
from fourfold.apps.experiments.horizon import horizon_demo
from fourfold.apps.experiments.horizon_claims import world_label
from fourfold.apps.experiments.jobs import ExperimentError, Job
from fourfold.apps.experiments.staleness_claims import CURVE_METRICS, arm_name, compute_staleness_claims, run_stats, topp_name
from fourfold.apps.experiments.staleness_config import StalenessConfig
from fourfold.apps.experiments.staleness_report import write_staleness_report
from fourfold.apps.experiments.sweep import Results, Sweep, collect_results, write_outputs
from fourfold.apps.experiments.turns import base_config
from fourfold.apps.experiments.unbiased import unbiased_demo_config
from fourfold.config import DemoConfig, config_to_dict, load_config

STALENESS_QUICK: dict[str, Any] = {  # --quick: the pipeline end to end, and the checks its budget settles
    **FAMILY_QUICK,
    "iterations": 12,
    "staleness.ks": [0, 1],
    "staleness.horizon_config": None,
}
DEFAULT_STALENESS_OUTPUT = "runs/staleness"
DEFAULT_DEMO_DIR = "runs/demo"
OBJECTIVE_PPO = {
    "engine": {"old_logprobs": "engine"},
    "recompute": {"old_logprobs": "recompute", "rollout_correction": "none"},
    "decoupled": {"old_logprobs": "recompute", "rollout_correction": "token_tis"},
}
"""Each objective's ppo settings (over demo.ppo; token TIS at its preset cap, 2)."""
OBJECTIVE_WHAT = {
    "engine": "pi_old the sampler's log-probs (the clip around the behaviour policy)",
    "recompute": "pi_old recomputed by the trainer, no importance weight",
    "decoupled": "pi_old recomputed (the clip around the proximal policy), the behaviour-to-proximal weight truncated (token TIS, cap 2)",
}


def staleness_quick_config(cfg: ExperimentsConfig) -> ExperimentsConfig:
    """The --quick settings: the quick demo's budgets, STALENESS_QUICK over them, '-quick' on the default
    output and demo paths (the demo's quick stages are then the claims family's --quick cache)."""
    cfg = dataclasses.replace(cfg, demo=demo.apply_quick(cfg.demo))
    cfg = demo.apply_quick(cfg, STALENESS_QUICK)
    if cfg.run.output_dir == DEFAULT_STALENESS_OUTPUT:
        cfg = demo.apply_quick(cfg, {"run.output_dir": DEFAULT_STALENESS_OUTPUT + "-quick"})
    if cfg.demo.run.output_dir == DEFAULT_DEMO_DIR:
        cfg = demo.apply_quick(cfg, {"demo.run.output_dir": DEFAULT_DEMO_DIR + "-quick"})
    return cfg


def staleness_arms(sc: StalenessConfig) -> list[Arm]:
    """Every objective at every lag (k order, then objective order), then the top-p arms at k = 0."""
    arms = [Arm(arm_name(o, k), "ppo", f"PPO, rollout.max_staleness {k}: {OBJECTIVE_WHAT[o]}", ppo=dict(OBJECTIVE_PPO[o]),
                rollout={"max_staleness": k} if k else {})
            for k in sorted(sc.ks) for o in sc.objectives]
    if sc.top_p < 1:
        arms += [Arm(topp_name(o), "ppo", f"PPO, generation.top_p {sc.top_p:g}, k = 0: {OBJECTIVE_WHAT[o]}",
                     ppo=dict(OBJECTIVE_PPO[o]), generation={"top_p": sc.top_p}) for o in sc.objectives]
    return arms


def arm_lag(arm: Arm) -> int:
    """The arm's rollout.max_staleness (0 when it sets none)."""
    return int(arm.rollout.get("max_staleness", 0))


@dataclasses.dataclass
class StaleWorld:
    """One world: its demo stages' job and the sweep of the family's arms over them."""

    label: str
    demo_job: str
    sweep: Sweep
    what: str


def horizon_world_demo(sc: StalenessConfig) -> tuple[int, DemoConfig]:
    """(the longest horizon k, its demo config) of the horizon family's config ``sc.horizon_config``."""
    hcfg = load_config(ExperimentsConfig, base_config(sc.horizon_config))
    k = max(hcfg.horizon.horizons)
    return k, horizon_demo(hcfg, k)


class Family(PromptFamilyJobs):
    """What the family's jobs share: settings, output directory, log, evaluation prompts."""

    def world(self, label: str, dcfg: DemoConfig, what: str) -> StaleWorld:
        cfg = self.cfg
        dcfg = dataclasses.replace(dcfg, run=dataclasses.replace(dcfg.run, progress=False))
        wcfg = dataclasses.replace(cfg, family="claims", demo=dcfg, arms=["ppo"],
                                   run=dataclasses.replace(cfg.run, output_dir=str(self.out / label)),
                                   claims=dataclasses.replace(cfg.claims, groups=[], quick=False))
        sw = Sweep(wcfg, self.out / label, self.log, staleness_arms(cfg.staleness), Path(dcfg.run.output_dir).resolve(),
                   unbiased_demo_config(wcfg), self.prompts, self.sample_seed)
        return StaleWorld(label, f"stages/{label}", sw, what)

    def worlds(self) -> list[StaleWorld]:
        """The demo's world (staleness.demo_world), then the horizon family's longest horizon."""
        sc, out = self.cfg.staleness, []
        if sc.demo_world:
            out.append(self.world("demo", self.cfg.demo, "the demo's review task"))
        if sc.horizon_config:
            k, dcfg = horizon_world_demo(sc)
            out.append(self.world(world_label(k), dcfg, f"the horizon family's longest horizon (gold wants {k} sentences, "
                                                        f"responses up to {dcfg.generation.max_new_tokens} tokens)"))
        return out

    def jobs(self, worlds: list[StaleWorld]) -> list[Job]:
        """Each world's demo stages, then its jobs (after them)."""
        jobs = [self.demo_job(w.demo_job, w.label, w.sweep.cfg.demo, None) for w in worlds]
        for w in worlds:
            jobs += [dataclasses.replace(j, name=f"{w.label}/{j.name}",
                                         deps=tuple(f"{w.label}/{d}" for d in j.deps) + (w.demo_job,))
                     for j in w.sweep.jobs()]
        return jobs


def check_runs(worlds: list[StaleWorld]) -> None:
    """Every world's every arm's run config validated before any job starts (:meth:`Sweep.check_runs`):
    a setting the trainer would refuse (e.g. a rollout_correction beside an arm's explicit old_logprobs
    engine) is one ConfigError line naming the arm and world, not a failed job per run."""
    for w in worlds:
        w.sweep.check_runs("staleness", w.label)


def read_run_curves(run_dir: Path, metrics: Sequence[str] = CURVE_METRICS) -> dict[str, list[float]]:
    """Per-iteration series of ``metrics`` (CURVE_METRICS; and 'iteration') from a run's metrics.jsonl
    (a resumed run's repeated iteration: the last row counts; nan where a row lacks a metric)."""
    from fourfold.reporting import read_metrics

    by_it = {int(r["iteration"]): r for r in read_metrics(run_dir / "metrics.jsonl") if "iteration" in r}
    its = sorted(by_it)
    out = {"iteration": [float(i) for i in its]}
    for k in metrics:
        out[k] = [math.nan if by_it[i].get(k) is None else float(by_it[i][k]) for i in its]
    return out


def world_stats(w: StaleWorld, res: Results) -> dict[str, dict[int, dict]]:
    """{arm: {seed: run_stats}} of the world's runs that have a final evaluation."""
    sw, c = w.sweep, w.sweep.cfg.staleness.claims
    out: dict[str, dict[int, dict]] = {}
    for arm in sw.arms:
        for row in res.finals.get(arm.name, []):
            curves = read_run_curves(sw.run_dir(arm, row["seed"]))
            out.setdefault(arm.name, {})[row["seed"]] = run_stats(curves, arm_lag(arm), res.sft["gold_std"], c)
    return out


def _world_results(run: FamilyRun, worlds: list[StaleWorld]) -> tuple[dict[str, Results], dict, list[str]]:
    """Each world's results (its own summary.md and report.html written), its runs' statistics, notes."""
    results, stats, notes = {}, {}, []
    for w in worlds:
        sub = {n[len(w.label) + 1:]: v for n, v in run.state.items() if n.startswith(w.label + "/")}
        try:
            res = collect_results(w.sweep, sub)
        except ExperimentError as e:
            notes.append(f"{w.label}: {e}")
            continue
        d_res = {"output_dir": str(w.sweep.demo_dir),
                 **{f"{s}_result": (read_done(w.sweep.demo_dir, s) or {}).get("result", {}) for s in ("sft", "reward")}}
        write_outputs(w.sweep, res, d_res, sub, total_s=run.elapsed(), jobs_s=run.jobs_s, made=run.made)
        results[w.label], stats[w.label] = res, world_stats(w, res)
    return results, stats, notes


def run_staleness(cfg: ExperimentsConfig) -> dict:
    """Run (or resume) the staleness family and write its report; returns {output_dir, claims, notes, worlds}."""
    run = FamilyRun.start("staleness", cfg, staleness_quick_config,
                          lambda out: ["logs", "configs"] + [p.name for p in out.iterdir() if (p / "runs").is_dir()])
    cfg, out = run.cfg, run.out
    fam = Family(cfg, out, run.log, eval_prompts(cfg), eval_sample_seed(cfg))
    worlds = fam.worlds()
    check_runs(worlds)
    arms = staleness_arms(cfg.staleness)
    run.run_jobs(fam.jobs(worlds), f"{len(worlds)} worlds x {len(arms)} arms x {len(cfg.seeds)} seeds, "
                                   f"{cfg.iterations} iterations x {cfg.demo.ppo.rollout_batch_size} samples")
    results, stats, notes = _world_results(run, worlds)
    finals = {label: r.finals for label, r in results.items()}
    sft = {label: r.sft for label, r in results.items()}
    claims, claim_notes = compute_staleness_claims(finals, sft, stats, cfg.staleness, quick=cfg.quick)
    record = {"config": config_to_dict(cfg), "worlds": {w.label: {"what": w.what, "demo": str(w.sweep.demo_dir)}
                                                      for w in worlds},
              "arms": {a.name: a.what for a in arms}, "sft": sft, "finals": finals, "stats": stats,
              "summaries": {label: r.summaries for label, r in results.items()},
              "claims": claims, "notes": claim_notes + notes}
    run.finish(record, lambda rec: write_staleness_report(out, cfg, rec))
    return {"output_dir": str(out), "claims": claims, "notes": record["notes"],
            "worlds": {label: r.summaries for label, r in results.items()}}


def staleness_run_config(cfg: ExperimentsConfig, world: Optional[str], arm: str, seed: int, tmp: Path):
    """The PPOConfig of one arm x seed of a world (the default: the first), as the family writes it
    (for tests and a smoke run; model paths under ``tmp``)."""
    from fourfold.apps.experiments.arms import run_config

    fam = Family(cfg, tmp / "out", lambda *a, **k: None, ["the blender"], 0)
    w = next(w for w in fam.worlds() if world in (None, w.label))
    a = next(a for a in w.sweep.arms if a.name == arm)
    return run_config(w.sweep.cfg, a, seed, sft=tmp / "sft", rm=tmp / "rm", run_dir=tmp / "run")
