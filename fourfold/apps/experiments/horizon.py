"""The horizon family (``fourfold experiments --config examples/horizon.yaml``): when does the critic pay?

PPO keeps a fourth model, the critic, because a reward given once at the end of a long response
needs a learned value baseline to credit each token. The family measures that on the review task
with its horizon knob (``sentences = k``: gold wants k sentences, each positive, 1/k of the reward
each; :mod:`fourfold.tasks.review`): for each horizon k of ``horizon.horizons`` its own demo stages
(SFT on reviews of about k sentences, pairs, reward model; responses up to
``horizon.tokens_per_sentence`` x (k + 1) tokens), and the arms of ``horizon.arms`` on them exactly as
the claims family defines them (:mod:`fourfold.apps.experiments.arms`). At the longest horizon also: the
same arms against a noisier reward (``horizon.noisy_task_options``: a reward model fitted to noisier
labels over the same SFT model) and the group arm at other group sizes (``horizon.group_sizes``).

Each (horizon, variant) is a *world*: a :class:`~fourfold.apps.experiments.sweep.Sweep` of the claims
family over that world's demo directory, with its own ``summary.md`` and ``report.html`` under
``<output_dir>/<world>/``. All their jobs, the worlds' demo stages (``python -m fourfold.apps.experiments
prepare-demo``, skipped when cached) and the token-credit view (:mod:`fourfold.apps.experiments.credit`)
run in one pool, ``workers`` at a time, resumable as the claims family is. The family's own
``summary.md``, ``report.html`` (results per horizon and arm with the cost columns, gold gain and KL
against the horizon, the credit view) and ``results.json`` go to ``<output_dir>/``, its claims
computed by :func:`fourfold.apps.experiments.horizon_claims.compute_horizon_claims`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

from fourfold.apps.cache import digest, read_done, read_json
from fourfold.apps.demo.credit import CREDIT_SEED
from fourfold.apps.experiments.arms import build_arms, run_config
from fourfold.apps.experiments.config import GROUP_ARMS, ExperimentsConfig
from fourfold.apps.experiments.family import FAMILY_QUICK, FamilyRun, PromptFamilyJobs, world_dir
from fourfold.apps.experiments.final_eval import eval_prompts, eval_sample_seed
from fourfold.apps.experiments.horizon_claims import compute_horizon_claims, world_label
from fourfold.apps.experiments.horizon_report import write_horizon_report
from fourfold.apps.experiments.jobs import ExperimentError, Job
from fourfold.apps.experiments.sweep import Results, Sweep, collect_results, family_quick_config, write_outputs
from fourfold.apps.experiments.unbiased import unbiased_demo_config
from fourfold.atomic import write_text_atomic
from fourfold.config import DemoConfig, config_to_dict, save_config

HORIZON_QUICK: dict[str, Any] = {  # --quick: the pipeline end to end, and the one claim its budget settles
    **FAMILY_QUICK,
    "iterations": 12,
    "horizon.horizons": [1, 3],
    "horizon.arms": ["ppo", "grpo"],
    "horizon.noisy_task_options": {},
    "horizon.group_sizes": [],
    "horizon.credit_prompts": 2,
}
DEFAULT_HORIZON_OUTPUT = "runs/horizon"
DEFAULT_HORIZON_DEMO = "runs/demo-horizon"


def horizon_quick_config(cfg: ExperimentsConfig) -> ExperimentsConfig:
    """The --quick settings: the quick demo's budgets (demo.QUICK, applied here), HORIZON_QUICK over
    them, '-quick' on the default output paths."""
    return family_quick_config(cfg, HORIZON_QUICK, DEFAULT_HORIZON_OUTPUT, "horizon.demo_dir", DEFAULT_HORIZON_DEMO)


def horizon_demo(cfg: ExperimentsConfig, k: int, variant: str = "", extra: Optional[dict] = None) -> DemoConfig:
    """The demo config of horizon ``k`` (``variant``: its directory's suffix, ``extra``: task options
    over the horizon's)."""
    d, h = cfg.demo, cfg.horizon
    task = {**d.task_options, **h.task_options, **(extra or {}), "sentences": k}
    gen = dataclasses.replace(d.generation, max_new_tokens=h.tokens_per_sentence * (k + 1))
    out = world_dir(h.demo_dir, world_label(k, variant))
    return dataclasses.replace(d, task_options=task, generation=gen,
                               run=dataclasses.replace(d.run, output_dir=out, progress=False))


@dataclasses.dataclass
class HorizonWorld:
    """One horizon (or variant at the longest horizon): its demo stages and the sweep of its arms."""

    label: str
    horizon: int
    demo_job: str
    """The job that prepares its demo stages (a variant of group size shares its horizon's)."""
    sweep: Sweep
    what: str

    @property
    def demo_dir(self) -> Path:
        return self.sweep.demo_dir


class Family(PromptFamilyJobs):
    """What the family's jobs share: settings, output directory, log, evaluation prompts."""

    def world(self, label: str, k: int, dcfg: DemoConfig, arms: list[str], group_size: int, what: str,
              demo_job: str) -> HorizonWorld:
        """A world: the claims family's sweep of ``arms`` over ``dcfg``'s demo, in <out>/<label>."""
        cfg = self.cfg
        main = label == world_label(k) and not cfg.quick
        groups = [g for g, need in (("critic", {"ppo", "ppo-no-critic"}), ("critic-free", {"ppo"}))
                  if main and need <= set(arms)]
        wcfg = dataclasses.replace(
            cfg, family="claims", demo=dcfg, arms=list(arms), group_size=group_size,
            run=dataclasses.replace(cfg.run, output_dir=str(self.out / label)),
            claims=dataclasses.replace(cfg.claims, groups=groups, quick=False))
        sw = Sweep(wcfg, self.out / label, self.log, build_arms(wcfg), Path(dcfg.run.output_dir).resolve(),
                   unbiased_demo_config(wcfg), self.prompts, self.sample_seed)
        return HorizonWorld(label, k, demo_job, sw, what)

    def worlds(self) -> list[HorizonWorld]:
        """Every horizon; then at the longest, the noisier reward and the other group sizes."""
        cfg, h = self.cfg, self.cfg.horizon
        ks = sorted(h.horizons)
        out = [self.world(world_label(k), k, horizon_demo(cfg, k), h.arms, cfg.group_size,
                          f"gold wants {k} sentence{'s' if k > 1 else ''}", f"demo/{world_label(k)}") for k in ks]
        k = ks[-1]
        if h.noisy_task_options:
            noisy = world_label(k, "noisy")
            out.append(self.world(noisy, k, horizon_demo(cfg, k, "noisy", h.noisy_task_options), h.noisy_arms,
                                  cfg.group_size, f"{k} sentences, labelers {h.noisy_task_options}", f"demo/{noisy}"))
        for size in h.group_sizes:
            out.append(self.world(world_label(k, f"k{size}"), k, horizon_demo(cfg, k), [h.group_arm], size,
                                  f"{k} sentences, {h.group_arm} with K = {size}", f"demo/{world_label(k)}"))
        return out

    def credit_job(self, w: HorizonWorld) -> Optional[Job]:
        """The token-credit view: ``w``'s ppo and group-arm runs of the first seed, same prompts."""
        h, seed = self.cfg.horizon, self.cfg.seeds[0]
        arms = {a.name: a for a in w.sweep.arms}
        group = h.group_arm if h.group_arm in arms else next((a for a in GROUP_ARMS if a in arms), None)
        if h.credit_prompts == 0 or "ppo" not in arms or group is None:
            return None
        sw, ppo, g = w.sweep, arms["ppo"], arms[group]

        def prepare() -> list[list[str]]:
            keys = [(read_json(sw.run_dir(a, seed) / "EXPERIMENT.json") or {}).get("key") for a in (ppo, g)]
            prompts = [p for p in self.prompts[: h.credit_prompts] for _ in range(sw.cfg.group_size)]
            key = digest({"runs": keys, "prompts": prompts, "seed": CREDIT_SEED, "view": 1})
            dest = self.out / "credit.json"
            if (read_json(dest) or {}).get("key") == key:
                return []
            rcfg = run_config(sw.cfg, ppo, seed, sft=sw.sft_dir, rm=sw.rm_dir("biased"), run_dir=sw.run_dir(ppo, seed))
            save_config(rcfg, self.out / "configs" / "credit-ppo.yaml")
            spec = {"config": str(self.out / "configs" / "credit-ppo.yaml"), "prompts": prompts, "key": key,
                    "policies": [[a.name, str(sw.run_dir(a, seed) / "policy")] for a in (ppo, g)],
                    "critic": str(sw.run_dir(ppo, seed) / "critic"), "reference": str(sw.sft_dir),
                    "reward": str(sw.rm_dir("biased")), "group_ppo": g.ppo, "horizon": w.horizon,
                    "task_options": sw.cfg.demo.task_options, "out": str(dest), "threads": self.cfg.run.threads or 1}
            write_text_atomic(self.out / "configs" / "credit.json", json.dumps(spec, sort_keys=True))
            return [[self.py, "-m", "fourfold.apps.experiments", "credit", str(self.out / "configs" / "credit.json")]]

        return Job("credit", prepare, deps=(f"{w.label}/ppo/seed{seed}", f"{w.label}/{group}/seed{seed}"))

    def jobs(self, worlds: list[HorizonWorld]) -> list[Job]:
        """The demo stages of every world, then each world's jobs (after its demo), then the credit view."""
        by_dir: dict[Path, HorizonWorld] = {}
        jobs = []
        horizon_demos = {w.horizon: w.sweep.cfg.demo for w in worlds if w.label == world_label(w.horizon)}
        for w in worlds:
            if w.demo_dir not in by_dir:
                by_dir[w.demo_dir] = w
                src = None if w.label == world_label(w.horizon) else horizon_demos.get(w.horizon)
                jobs.append(self.demo_job(w.demo_job, w.label, w.sweep.cfg.demo, src,
                                          deps=(f"demo/{world_label(w.horizon)}",) if src else ()))
        for w in worlds:
            jobs += [dataclasses.replace(j, name=f"{w.label}/{j.name}",
                                         deps=tuple(f"{w.label}/{d}" for d in j.deps) + (w.demo_job,))
                     for j in w.sweep.jobs()]
        credit = self.credit_job(worlds[len(self.cfg.horizon.horizons) - 1])
        return jobs + ([credit] if credit is not None else [])


def _fresh_dirs(out: Path) -> list[str]:
    """What --fresh clears: the logs, the configs and every world's directory (each one holding runs/)."""
    return ["logs", "configs"] + [p.name for p in out.iterdir() if (p / "runs").is_dir()]


def _world_results(worlds: list[HorizonWorld], state: dict[str, str], total_s: float, jobs_s: float,
                   made: dict) -> tuple[dict[str, Results], list[str]]:
    """Each world's results (its own summary.md and report.html written), and notes on those missing."""
    results, notes = {}, []
    for w in worlds:
        sub = {n[len(w.label) + 1:]: v for n, v in state.items() if n.startswith(w.label + "/")}
        try:
            res = collect_results(w.sweep, sub)
        except ExperimentError as e:
            notes.append(f"{w.label}: {e}")
            continue
        d_res = {"output_dir": str(w.demo_dir),
                 **{f"{s}_result": (read_done(w.demo_dir, s) or {}).get("result", {}) for s in ("sft", "reward")},
                 "pairs": (read_done(w.demo_dir, "pairs") or {}).get("result", {})}
        write_outputs(w.sweep, res, d_res, sub, total_s=total_s, jobs_s=jobs_s, made=made)
        results[w.label] = res
    return results, notes


def run_horizon(cfg: ExperimentsConfig) -> dict:
    """Run (or resume) the horizon family and write its report; returns {output_dir, claims, worlds,
    notes}."""
    run = FamilyRun.start("horizon", cfg, horizon_quick_config, _fresh_dirs)
    cfg, out = run.cfg, run.out
    fam = Family(cfg, out, run.log, eval_prompts(cfg), eval_sample_seed(cfg))
    worlds = fam.worlds()
    state = run.run_jobs(fam.jobs(worlds), f"horizons {sorted(cfg.horizon.horizons)}, {len(worlds)} worlds, "
                         f"{len(cfg.seeds)} seeds, {cfg.iterations} iterations x {cfg.demo.ppo.rollout_batch_size} samples")
    results, notes = _world_results(worlds, state, run.elapsed(), run.jobs_s, run.made)
    finals = {label: r.finals for label, r in results.items()}
    sft = {label: r.sft for label, r in results.items()}
    claims, claim_notes = compute_horizon_claims(finals, sft, cfg.horizon, group_size=cfg.group_size, quick=cfg.quick)
    notes = claim_notes + notes
    record = {"config": config_to_dict(cfg), "worlds": {w.label: {"horizon": w.horizon, "what": w.what,
                                                                 "demo": str(w.demo_dir)} for w in worlds},
              "sft": sft, "finals": finals, "summaries": {label: r.summaries for label, r in results.items()},
              "claims": claims, "notes": notes,
              "rm": {w.label: (read_done(w.demo_dir, "reward") or {}).get("result", {}) for w in worlds}}
    run.finish(record, lambda rec: write_horizon_report(out, cfg, rec, read_json(out / "credit.json")))
    return {"output_dir": str(out), "claims": claims, "notes": notes,
            "worlds": {label: r.summaries for label, r in results.items()}}
