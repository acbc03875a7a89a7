"""The overoptimization family (``fourfold experiments --config examples/overoptimization.yaml``):
reward hacking as a law, Gao, Schulman and Hilton's curves measured against an exact gold.

For each reward-model size of ``overoptimization.rm_pairs`` (preference pairs the RM is trained on)
its own demo stages (pairs, reward model) over one SFT model (trained in the first size's directory
and copied into the others, :func:`~fourfold.apps.experiments.unbiased.seed_sft_stage`); then, per seed:

* best-of-n: ``bon_n`` SFT samples of each of ``bon_prompts`` held-out prompts, scored by every RM
  and by gold, the curve n = 1..N by the unbiased estimator (``bon-curve``,
  :mod:`fourfold.apps.experiments.overopt_eval`); d = sqrt(log n - (n - 1)/n);
* PPO with ``kl_coef`` (0 by default) and ``lr_multiplier`` x the demo's learning rates against
  each RM, its checkpoints every ``eval_every`` iterations evaluated on ``curve_prompts`` held-out
  prompts (gold, proxy, d = sqrt of the KL to the SFT model, ``ppo-curve``; then all but the last
  checkpoint deleted);
* with ``default_kl``, PPO at the demo's kl_coef against each RM, its final policy evaluated alike.

All run as subprocess jobs, ``workers`` at a time, cached and resumable as the other families. The
fits, summaries and claims: :mod:`fourfold.apps.experiments.overopt_claims`. Output in
``run.output_dir``: ``results.json``, ``summary.md``, ``report.html`` and ``overoptimization.png``
(gold and proxy against d per size, the paper's figure 1 layout). Docs: docs/experiments.md.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

from fourfold.apps.cache import digest, done_key, read_done, read_json
from fourfold.apps.experiments.arms import Arm, run_config, run_key
from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.family import FAMILY_QUICK, FamilyRun, PromptFamilyJobs, claim_run_dir, world_dir
from fourfold.apps.experiments.final_eval import eval_prompts, eval_sample_seed
from fourfold.apps.experiments.jobs import Job
from fourfold.apps.experiments.overopt_claims import METHODS, compute_overopt_claims, summarize_curves
from fourfold.apps.experiments.sweep import family_quick_config
from fourfold.config import DemoConfig, config_to_dict

OVEROPT_QUICK: dict[str, Any] = {  # --quick: the pipeline end to end on the quick demo's budgets
    **FAMILY_QUICK,
    "iterations": 16,
    "overoptimization.bon_n": 16,
    "overoptimization.bon_prompts": 64,
    "overoptimization.curve_prompts": 64,
    "overoptimization.eval_every": 2,
    "overoptimization.lr_multiplier": 0.25,  # 16 iterations at 0.25x: about 4 at the demo's rate, past the gold peak
}
DEFAULT_OVEROPT_OUTPUT = "runs/overoptimization"
DEFAULT_OVEROPT_DEMO = "runs/demo-overopt"


def overopt_quick_config(cfg: ExperimentsConfig) -> ExperimentsConfig:
    """The --quick settings: the quick demo's budgets, OVEROPT_QUICK, '-quick' on default paths."""
    return family_quick_config(cfg, OVEROPT_QUICK, DEFAULT_OVEROPT_OUTPUT, "overoptimization.demo_dir", DEFAULT_OVEROPT_DEMO)


def size_demo(cfg: ExperimentsConfig, pairs: int) -> DemoConfig:
    """The demo config of the reward model trained on ``pairs`` preference pairs."""
    d = cfg.demo
    out = world_dir(cfg.overoptimization.demo_dir, f"p{pairs}")
    return dataclasses.replace(d, pairs=dataclasses.replace(d.pairs, pairs=pairs),
                               run=dataclasses.replace(d.run, output_dir=out, progress=False))


class Overopt(PromptFamilyJobs):
    """What the family's jobs share."""

    @property
    def sizes(self) -> list[int]:
        return sorted(self.cfg.overoptimization.rm_pairs)

    def demo_dir(self, pairs: int) -> Path:
        return Path(size_demo(self.cfg, pairs).run.output_dir).resolve()

    def sft_dir(self) -> Path:
        return self.demo_dir(self.sizes[0]) / "sft"

    def rm_dir(self, pairs: int) -> Path:
        return self.demo_dir(pairs) / "reward"

    def gen(self) -> dict:
        g = self.cfg.demo.generation
        return {"max_new_tokens": g.max_new_tokens, "temperature": g.temperature,
                "task_options": self.cfg.demo.task_options, "threads": self.cfg.run.threads or 1}

    def size_demo_job(self, pairs: int) -> Job:
        """The demo stages of size ``pairs`` (the first size's SFT stage copied into the others)."""
        first = self.sizes[0]
        src = None if pairs == first else size_demo(self.cfg, first)
        return self.demo_job(f"demo/p{pairs}", f"p{pairs}", size_demo(self.cfg, pairs), src,
                             deps=() if pairs == first else (f"demo/p{first}",))

    def bon_job(self, seed: int) -> Job:
        o = self.cfg.overoptimization

        def prepare() -> list[list[str]]:
            spec = {"sft": str(self.sft_dir()), "rms": {str(p): str(self.rm_dir(p)) for p in self.sizes},
                    "prompts": self.prompts[: o.bon_prompts], "N": o.bon_n,
                    "sample_seed": self.sample_seed + seed, **self.gen()}
            key = digest({**spec, "rm_keys": [done_key(self.demo_dir(p), "reward") for p in self.sizes],
                          "sft_key": done_key(self.demo_dir(self.sizes[0]), "sft"), "threads": None})
            dest = self.out / "bon" / f"seed{seed}.json"
            if (read_json(dest) or {}).get("key") == key:
                return []
            return [self.spec_cmd("bon-curve", f"seed{seed}", {**spec, "key": key, "out": str(dest)})]

        return Job(f"bon/seed{seed}", prepare, deps=tuple(f"demo/p{p}" for p in self.sizes))

    def run_dir(self, kind: str, pairs: int, seed: int) -> Path:
        return self.out / "runs" / kind / f"p{pairs}" / f"seed{seed}"

    def ppo_job(self, kind: str, pairs: int, seed: int) -> Job:
        """``kind`` 'ppo' (kl_coef of the section, checkpoints every eval_every evaluated) or
        'default' (the demo's kl_coef, the final policy evaluated)."""
        o, cfg = self.cfg.overoptimization, self.cfg
        wcfg = dataclasses.replace(cfg, demo=size_demo(cfg, pairs))
        lrs = {"lr": cfg.demo.ppo.lr * o.lr_multiplier, "critic_lr": cfg.demo.ppo.critic_lr * o.lr_multiplier}
        arm = (Arm("ppo-overopt", "ppo", f"PPO, beta={o.kl_coef:g}, lr x{o.lr_multiplier:g}",
                   ppo={"kl_coef": o.kl_coef, "adaptive_kl": False, **lrs})
               if kind == "ppo" else Arm("ppo", "ppo", f"PPO, beta={cfg.demo.ppo.kl_coef:g}"))
        name = f"{kind}/p{pairs}/seed{seed}"

        def prepare() -> list[list[str]]:
            rd = self.run_dir(kind, pairs, seed)
            rcfg = run_config(wcfg, arm, seed, sft=self.sft_dir(), rm=self.rm_dir(pairs), run_dir=rd)
            every = o.eval_every if kind == "ppo" else 0
            rcfg.run = dataclasses.replace(rcfg.run, save_every=every,
                                           keep_checkpoints=cfg.iterations // max(every, 1) + 2)
            key = digest({"run": run_key(rcfg, "ppo", {"sft": done_key(self.demo_dir(self.sizes[0]), "sft"),
                                                       "reward": done_key(self.demo_dir(pairs), "reward")}),
                          "save_every": every})
            claim_run_dir(rd, key, {"name": name})
            cmds = [] if (rd / "policy" / "config.json").is_file() else [self.ppo_cmd(name, rcfg)]
            ekey = digest({"run": key, "prompts": self.prompts[: o.curve_prompts], "seed": self.sample_seed,
                           **self.gen(), "threads": None})
            dest = rd / "curve.json"
            if not cmds and (read_json(dest) or {}).get("key") != ekey and (rd / "PRUNED").exists():
                shutil.rmtree(rd)  # its checkpoints were deleted after another evaluation: train again
                claim_run_dir(rd, key, {"name": name})
                cmds.append(self.ppo_cmd(name, rcfg))
            if cmds or (read_json(dest) or {}).get("key") != ekey:
                spec = {"sft": str(self.sft_dir()), "rm": str(self.rm_dir(pairs)), "init": kind == "ppo",
                        "prompts": self.prompts[: o.curve_prompts], "sample_seed": self.sample_seed, **self.gen(),
                        "run_dir": str(rd), "key": ekey, "out": str(dest), "prune": kind == "ppo"}
                cmds.append(self.spec_cmd("ppo-curve", name, spec))
            return cmds

        return Job(name, prepare, deps=(f"demo/p{pairs}",))

    def jobs(self) -> list[Job]:
        o = self.cfg.overoptimization
        jobs = [self.size_demo_job(p) for p in self.sizes] + [self.bon_job(s) for s in self.cfg.seeds]
        kinds = ["ppo"] + (["default"] if o.default_kl else [])
        return jobs + [self.ppo_job(k, p, s) for s in self.cfg.seeds for p in self.sizes for k in kinds]


def collect(fam: Overopt, state: dict[str, str]) -> dict:
    """The curves of every finished job: {bon: {size: [seed curve]}, ppo: {...}, default: {size:
    [final point]}, sft_gold_std}."""
    bon: dict[int, list] = {}
    ppo: dict[int, list] = {}
    default: dict[int, list] = {}
    gold_std = []
    for s in fam.cfg.seeds:
        rec = read_json(fam.out / "bon" / f"seed{s}.json")
        if rec and state.get(f"bon/seed{s}") in ("done", "cached"):
            gold_std.append(rec["gold_std"])
            for size, c in rec["curves"].items():
                bon.setdefault(int(size), []).append({"seed": s, **_means(c)})
        for p in fam.sizes:
            for kind, into in (("ppo", ppo), ("default", default)):
                rec = read_json(fam.run_dir(kind, p, s) / "curve.json")
                if not rec or state.get(f"{kind}/p{p}/seed{s}") not in ("done", "cached"):
                    continue
                pts = rec["points"]
                if kind == "ppo":
                    into.setdefault(p, []).append({"seed": s, **{k: [pt[k] for pt in pts]
                                                               for k in ("iteration", "d", "gold", "proxy", "kl")}})
                else:
                    into.setdefault(p, []).append({"seed": s, **_means(pts[-1])})
    return {"bon": bon, "ppo": ppo, "default": default,
            "sft_gold_std": sum(gold_std) / len(gold_std) if gold_std else None}


def _means(rec: dict) -> dict:
    """A curve or point without its per-prompt gold (kept in the run's own files for
    fourfold.core.curve_fits.peak_test; the family's record holds the means)."""
    return {k: v for k, v in rec.items() if k != "gold_by_prompt"}


def write_overopt_report(out: Path, cfg: ExperimentsConfig, record: dict) -> None:
    """summary.md, overoptimization.png and report.html from the record (runs nothing)."""
    from fourfold.apps.experiments.overopt_report import write_overopt_outputs

    write_overopt_outputs(out, cfg, record)


def run_overopt(cfg: ExperimentsConfig) -> dict:
    """Run (or resume) the overoptimization family and write its report; returns {output_dir,
    claims, notes, summaries}."""
    if cfg.overoptimization.design == "goodhart":  # issue 41's re-posed design: its own runner
        from fourfold.apps.experiments.goodhart import run_goodhart

        return run_goodhart(cfg)
    run = FamilyRun.start("overoptimization", cfg, overopt_quick_config, ("runs", "bon", "configs", "logs"))
    cfg, out = run.cfg, run.out
    fam = Overopt(cfg, out, run.log, eval_prompts(cfg), eval_sample_seed(cfg))
    state = run.run_jobs(fam.jobs(), f"RM sizes {fam.sizes} pairs, {len(cfg.seeds)} seeds, "
                         f"best-of-{cfg.overoptimization.bon_n}, PPO {cfg.iterations} iterations")
    curves = collect(fam, state)
    sd = curves["sft_gold_std"] or 1.0
    summaries = {m: {p: summarize_curves(c, m, sd) for p, c in curves[m].items()} for m in METHODS}
    claims, notes = compute_overopt_claims(summaries, curves["default"], cfg.overoptimization.claims,
                                           expected_sizes=fam.sizes)
    record = {"config": config_to_dict(cfg), "curves": curves, "summaries": summaries, "claims": claims,
              "notes": notes, "rm": {p: (read_done(fam.demo_dir(p), "reward") or {}).get("result", {}) for p in fam.sizes},
              "default_kl_coef": cfg.demo.ppo.kl_coef}
    run.finish(record, lambda rec: write_overopt_report(out, cfg, rec))
    return {"output_dir": str(out), "claims": claims, "notes": notes, "summaries": summaries}
