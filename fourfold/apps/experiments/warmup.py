"""The warm-up family (``fourfold experiments --config examples/warmup.yaml``): the critic's start and
its warm-up, measured where the critic pays (issue 39, item 5; docs/experiments.md, "The critic's
warm-up, where the critic pays").

One world: the horizon family's longest horizon ``h<k>`` (``warmup.horizon_config``: that family's
config and world builder, :func:`fourfold.apps.experiments.staleness.horizon_world_demo`, and its
cached demo stages). Its arms (:func:`warmup_arms`), each the demo's PPO otherwise:

- ``rm``: the critic from the reward model (``model.critic_init`` unset: the default), no warm-up;
- ``rm-warmup``: the same, ``ppo.critic_warmup`` = ``warmup.warmup`` (W) critic-only iterations first;
- ``policy`` / ``policy-warmup``: ``model.critic_init: policy`` (a zero value head), without / with W;
- ``ceiling``: the reward-model start, ``warmup.ceiling_warmup`` critic-only iterations, then one
  policy iteration (the least a run allows): its warm-up's EV plateau is the ceiling;
- ``ppo-no-critic`` (``warmup.no_critic``): whitened returns, no critic.

A warm-up arm's ``ppo.iterations`` is the family's ``iterations`` + W, so every arm but the ceiling
takes the same policy updates. The world is a :class:`~fourfold.apps.experiments.sweep.Sweep` of
these arms (its own summary.md and report.html under ``<output_dir>/<world>/``); the jobs run
``workers`` at a time, resumable. Per run the family reads its per-iteration metrics
(:data:`~fourfold.apps.experiments.warmup_claims.CURVE_METRICS`) into
:func:`~fourfold.apps.experiments.warmup_claims.run_stats`; its claims:
:func:`~fourfold.apps.experiments.warmup_claims.compute_warmup_claims`; its report:
:mod:`~fourfold.apps.experiments.warmup_report`. Thresholds were fixed before the first run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fourfold.apps.cache import read_done
from fourfold.apps.demo import pipeline as demo
from fourfold.apps.experiments.arms import Arm
from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.family import FAMILY_QUICK, FamilyRun, PromptFamilyJobs
from fourfold.apps.experiments.final_eval import eval_prompts, eval_sample_seed
from fourfold.apps.experiments.horizon_claims import world_label
from fourfold.apps.experiments.jobs import ExperimentError, Job
from fourfold.apps.experiments.staleness import horizon_world_demo, read_run_curves
from fourfold.apps.experiments.sweep import Results, Sweep, collect_results, write_outputs
from fourfold.apps.experiments.unbiased import unbiased_demo_config
from fourfold.apps.experiments.warmup_claims import (
    CEILING,
    CURVE_METRICS,
    NO_CRITIC,
    POLICY,
    POLICY_WARMUP,
    RM,
    RM_WARMUP,
    compute_warmup_claims,
    run_stats,
)
from fourfold.apps.experiments.warmup_report import write_warmup_report
from fourfold.config import DemoConfig, config_to_dict

WARMUP_QUICK: dict[str, Any] = {  # --quick: the pipeline end to end on the quick demo's h6 stages
    **FAMILY_QUICK,
    "iterations": 3,
    "warmup.warmup": 2,
    "warmup.ceiling_warmup": 4,
    "warmup.claims.plateau_iterations": 2,
    "warmup.claims.early_iterations": 2,
}
DEFAULT_WARMUP_OUTPUT = "runs/warmup"


def warmup_quick_config(cfg: ExperimentsConfig) -> ExperimentsConfig:
    """The --quick settings: WARMUP_QUICK over ``cfg``, '-quick' on the default output path (the
    world's demo takes the quick demo's budgets in its own '-quick' directory: :func:`world_demo`)."""
    cfg = demo.apply_quick(cfg, WARMUP_QUICK)
    if cfg.run.output_dir == DEFAULT_WARMUP_OUTPUT:
        cfg = demo.apply_quick(cfg, {"run.output_dir": DEFAULT_WARMUP_OUTPUT + "-quick"})
    return cfg


def warmup_arms(cfg: ExperimentsConfig) -> list[Arm]:
    """The family's arms (:data:`~fourfold.apps.experiments.warmup_claims.ARMS` order)."""
    wc, n = cfg.warmup, cfg.iterations
    w, c = wc.warmup, wc.ceiling_warmup
    pol = {"critic_init": "policy"}
    warm = {"critic_warmup": w, "iterations": n + w}
    arms = [Arm(RM, "ppo", "PPO, the critic from the reward model (the default), no warm-up"),
            Arm(RM_WARMUP, "ppo", f"PPO, the critic from the reward model, {w} critic-only iterations first", ppo=warm),
            Arm(POLICY, "ppo", "PPO, the critic from the policy (a zero value head), no warm-up", model=pol),
            Arm(POLICY_WARMUP, "ppo", f"PPO, the critic from the policy, {w} critic-only iterations first",
                model=pol, ppo=dict(warm)),
            Arm(CEILING, "ppo", f"the critic from the reward model trained {c} critic-only iterations on the SFT "
                                "policy's samples, then one policy iteration (its plateau: the ceiling)",
                ppo={"critic_warmup": c, "iterations": c + 1})]
    if wc.no_critic:
        arms.append(Arm(NO_CRITIC, "ppo", "PPO without a critic (whitened returns as advantages)",
                        ppo={"use_critic": False}))
    return arms


def arm_warmup(arm: Arm) -> int:
    """The arm's ppo.critic_warmup (0 when it sets none)."""
    return int(arm.ppo.get("critic_warmup", 0))


def world_demo(cfg: ExperimentsConfig) -> tuple[int, DemoConfig]:
    """(k, the world's demo config): the horizon family's longest horizon; under --quick on the quick
    demo's budgets in '<its directory>-quick'."""
    k, dcfg = horizon_world_demo(cfg.warmup)
    if cfg.quick:
        dcfg = demo.apply_quick(dcfg)
        dcfg = dataclasses.replace(dcfg, run=dataclasses.replace(dcfg.run, output_dir=dcfg.run.output_dir + "-quick"))
    return k, dataclasses.replace(dcfg, run=dataclasses.replace(dcfg.run, progress=False))


@dataclasses.dataclass
class WarmupWorld:
    """The world: its demo stages' job and the sweep of the family's arms over them."""

    label: str
    demo_job: str
    sweep: Sweep
    what: str


class Family(PromptFamilyJobs):
    """What the family's jobs share: settings, output directory, log, evaluation prompts."""

    def world(self, k: int, dcfg: DemoConfig) -> WarmupWorld:
        cfg, label = self.cfg, world_label(k)
        wcfg = dataclasses.replace(cfg, family="claims", demo=dcfg, arms=["ppo"],
                                   run=dataclasses.replace(cfg.run, output_dir=str(self.out / label)),
                                   claims=dataclasses.replace(cfg.claims, groups=[], quick=False))
        sw = Sweep(wcfg, self.out / label, self.log, warmup_arms(cfg), Path(dcfg.run.output_dir).resolve(),
                   unbiased_demo_config(wcfg), self.prompts, self.sample_seed)
        return WarmupWorld(label, f"stages/{label}", sw, f"the horizon family's longest horizon (gold wants {k} sentences, "
                                                         f"responses up to {dcfg.generation.max_new_tokens} tokens)")

    def jobs(self, w: WarmupWorld) -> list[Job]:
        """The world's demo stages, then its jobs (after them)."""
        jobs = [self.demo_job(w.demo_job, w.label, w.sweep.cfg.demo, None)]
        return jobs + [dataclasses.replace(j, name=f"{w.label}/{j.name}",
                                           deps=tuple(f"{w.label}/{d}" for d in j.deps) + (w.demo_job,))
                       for j in w.sweep.jobs()]


def make_family(cfg: ExperimentsConfig, out: Path, log) -> tuple[Family, WarmupWorld]:
    """The family's jobs and its world (the evaluation prompts and sampling seed the world's demo's)."""
    k, dcfg = world_demo(cfg)
    dc = dataclasses.replace(cfg, demo=dcfg)
    fam = Family(cfg, out, log, eval_prompts(dc), eval_sample_seed(dc))
    return fam, fam.world(k, dcfg)


def world_stats(w: WarmupWorld, res: Results) -> dict[str, dict[int, dict]]:
    """{arm: {seed: run_stats}} of the world's runs that have a final evaluation."""
    sw, c = w.sweep, w.sweep.cfg.warmup.claims
    out: dict[str, dict[int, dict]] = {}
    for arm in sw.arms:
        for row in res.finals.get(arm.name, []):
            curves = read_run_curves(sw.run_dir(arm, row["seed"]), CURVE_METRICS)
            out.setdefault(arm.name, {})[row["seed"]] = run_stats(curves, arm_warmup(arm), c)
    return out


def run_warmup(cfg: ExperimentsConfig) -> dict:
    """Run (or resume) the warm-up family and write its report; returns {output_dir, claims, notes, summaries}."""
    run = FamilyRun.start("warmup", cfg, warmup_quick_config,
                          lambda out: ["logs", "configs"] + [p.name for p in out.iterdir() if (p / "runs").is_dir()])
    cfg, out = run.cfg, run.out
    fam, w = make_family(cfg, out, run.log)
    w.sweep.check_runs("warm-up", w.label)
    wc = cfg.warmup
    run.run_jobs(fam.jobs(w), f"{w.label}, {len(w.sweep.arms)} arms x {len(cfg.seeds)} seeds, {cfg.iterations} policy "
                              f"iterations (+{wc.warmup} warm-up; ceiling {wc.ceiling_warmup} + 1) x "
                              f"{w.sweep.cfg.demo.ppo.rollout_batch_size} samples")
    sub = {n[len(w.label) + 1:]: v for n, v in run.state.items() if n.startswith(w.label + "/")}
    notes, finals, sft, stats, summaries = [], {}, {}, {}, {}
    try:
        res = collect_results(w.sweep, sub)
    except ExperimentError as e:
        notes.append(f"{w.label}: {e}")
    else:
        d_res = {"output_dir": str(w.sweep.demo_dir),
                 **{f"{s}_result": (read_done(w.sweep.demo_dir, s) or {}).get("result", {}) for s in ("sft", "reward")}}
        write_outputs(w.sweep, res, d_res, sub, total_s=run.elapsed(), jobs_s=run.jobs_s, made=run.made)
        finals, sft, stats, summaries = res.finals, res.sft, world_stats(w, res), res.summaries
    claims, claim_notes = compute_warmup_claims(finals, sft, stats, wc.claims, quick=cfg.quick)
    record = {"config": config_to_dict(cfg), "world": {"label": w.label, "what": w.what, "demo": str(w.sweep.demo_dir)},
              "arms": {a.name: a.what for a in w.sweep.arms}, "sft": sft, "finals": finals, "stats": stats,
              "summaries": summaries, "claims": claims, "notes": claim_notes + notes,
              "rollout_batch_size": w.sweep.cfg.demo.ppo.rollout_batch_size}
    run.finish(record, lambda rec: write_warmup_report(out, cfg, rec))
    return {"output_dir": str(out), "claims": claims, "notes": record["notes"], "summaries": summaries}


def warmup_run_config(cfg: ExperimentsConfig, arm: str, seed: int, tmp: Path):
    """The PPOConfig of one arm x seed as the family writes it (for tests and a smoke run; model paths under ``tmp``)."""
    from fourfold.apps.experiments.arms import run_config

    fam, w = make_family(cfg, tmp / "out", lambda *a, **k: None)
    a = next(a for a in w.sweep.arms if a.name == arm)
    return run_config(w.sweep.cfg, a, seed, sft=tmp / "sft", rm=tmp / "rm", run_dir=tmp / "run")
