"""The re-posed overoptimization family's runner (issue 41; ``overoptimization.design: goodhart``,
examples/overoptimization-goodhart.yaml; docs/experiments.md, "Overoptimization that can turn over").

The job graph, all subprocesses in one pool (``workers`` at a time, cached and resumable):

* ``demo/<world>-p<pairs>``: the demo's stages up to the reward model for each world of
  ``goodhart.worlds`` and level of ``goodhart.rm_pairs``, in ``<goodhart.demo_dir>-<world>-p<pairs>``
  (:func:`level_demo`). The SFT stage is trained once per *corpus* (:func:`corpus_key`: the task
  options that change the SFT corpus; the two designed worlds change only gold's length terms and
  the labelers, so one SFT model serves both) in its first world's smallest level and copied into
  the others (:func:`~fourfold.apps.experiments.unbiased.seed_sft_stage`). Each level trains on
  exactly its pairs: its held-out pairs are ``min(demo.pairs.eval_pairs, pairs // 4)``
  (:func:`level_eval_pairs`; the demo stage keeps at most a fifth of its rows for evaluation, so
  with 500 the 100-pair level would have trained on 480).
* ``bon/seed<s>`` (one per corpus and seed): ``bon_n`` SFT samples of each of ``bon_prompts``
  held-out prompts, sampled once, scored by every world's gold and every RM of every world, then
  :func:`~fourfold.apps.experiments.goodhart_eval.bon_measures` per world (``goodhart-bon``).
* ``ppo/<world>/<reward>/kl<c>/seed<s>``: each run of ``GoodhartConfig.ppo_runs()`` (kl_coef 0
  against every level's RM, the other coefficients against ``sweep_pairs``' RM, and the gold arm),
  all at ``lr_multiplier`` x the demo's learning rates, a checkpoint every iteration
  (``run.save_every = 1``); then ``goodhart-curve``: the SFT model and the checkpoints of
  :func:`~fourfold.core.overopt_measures.checkpoint_schedule` (``dense_checkpoints``,
  ``checkpoint_every``, and the last; the kl_coef > 0 runs only their last unless ``kl_curves``),
  ``accuracy_samples`` samples of each of ``curve_prompts``
  held-out prompts at each, scored by the world's gold, KL to the SFT model and every RM of the
  world (gold per prompt, d, each RM's pair accuracy on the policy's own samples); then every
  checkpoint but the last is deleted.

**The gold arm** trains PPO on the world's gold itself (``model.reward_fns``:
``fourfold.tasks.review:gold_reward_fn`` with the world's task options), kl_coef 0, the same rates.
It has no reward model, so its critic starts as the policy's backbone with a zero value head
(``model.critic_init: policy``); the proxy arms' critics start from their RM (the demo's default).
The two differ in that too, which the report says.

:func:`collect` builds the record :func:`~fourfold.apps.experiments.goodhart_claims.compute_goodhart_claims`
reads (curves are means over seeds; each RM's accuracy pooled over every evaluated checkpoint,
iteration >= 1, of every run of its world); :func:`run_goodhart` writes results.json, summary.md
and report.html (:mod:`~fourfold.apps.experiments.goodhart_report`).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path
from typing import Any, Optional, Union

from fourfold.apps.cache import digest, done_key, read_done, read_json
from fourfold.apps.demo import pipeline as demo
from fourfold.apps.experiments.arms import Arm, run_config, run_key
from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.family import FAMILY_QUICK, FamilyRun, PromptFamilyJobs, claim_run_dir, world_dir
from fourfold.apps.experiments.final_eval import eval_prompts, eval_sample_seed
from fourfold.apps.experiments.goodhart_claims import compute_goodhart_claims
from fourfold.apps.experiments.goodhart_config import GOODHART_WORLDS, GoodhartConfig
from fourfold.apps.experiments.goodhart_eval import mean_curve, pooled_accuracy, ppo_curve
from fourfold.apps.experiments.jobs import Job
from fourfold.config import DemoConfig, PPOConfig, RewardFnConfig, config_to_dict
from fourfold.core.overopt_measures import checkpoint_schedule

GOODHART_QUICK: dict[str, Any] = {  # --quick: every job kind end to end on tiny budgets (one world)
    **FAMILY_QUICK,
    "iterations": 6,
    "overoptimization.goodhart.worlds": {"extremal": dict(GOODHART_WORLDS["extremal"])},
    "overoptimization.goodhart.rm_pairs": [100, 200, 400, 800],
    "overoptimization.goodhart.sweep_pairs": 400,
    "overoptimization.goodhart.kl_coefs": [0.0, 0.05],
    "overoptimization.goodhart.bon_n": 64,
    "overoptimization.goodhart.bon_prompts": 16,
    "overoptimization.goodhart.curve_prompts": 16,
    "overoptimization.goodhart.accuracy_samples": 4,
    "overoptimization.goodhart.dense_checkpoints": 2,
    "overoptimization.goodhart.checkpoint_every": 2,
    "overoptimization.goodhart.claims.bootstrap_reps": 20,
    "overoptimization.goodhart.claims.null_draws": 10,
}
DEFAULT_GOODHART_OUTPUT = "runs/overoptimization-goodhart"
DEFAULT_GOODHART_DEMO = "runs/demo-goodhart"
GOLD_FN = "fourfold.tasks.review:gold_reward_fn"
"""The gold arm's reward function (with the world's task options)."""
GOLD = "gold"
"""The gold arm's reward label (where a run's reward is an RM level)."""


def goodhart_quick_config(cfg: ExperimentsConfig) -> ExperimentsConfig:
    """The --quick settings: the quick demo's budgets (demo.QUICK), GOODHART_QUICK over them,
    '-quick' on the default output and demo paths (its own directories)."""
    cfg = dataclasses.replace(cfg, demo=demo.apply_quick(cfg.demo))
    table = {k: (dict(v) if isinstance(v, dict) else v) for k, v in GOODHART_QUICK.items()}
    cfg = demo.apply_quick(cfg, table)
    if cfg.run.output_dir == DEFAULT_GOODHART_OUTPUT:
        cfg = demo.apply_quick(cfg, {"run.output_dir": DEFAULT_GOODHART_OUTPUT + "-quick"})
    if cfg.overoptimization.goodhart.demo_dir == DEFAULT_GOODHART_DEMO:
        cfg = demo.apply_quick(cfg, {"overoptimization.goodhart.demo_dir": DEFAULT_GOODHART_DEMO + "-quick"})
    return cfg


def level_eval_pairs(eval_pairs: int, pairs: int) -> int:
    """The held-out pairs of a level trained on ``pairs``: ``min(eval_pairs, pairs // 4)`` (at least
    1). The demo's pairs stage samples pairs + eval pairs and keeps at most a fifth of the rows for
    evaluation, so this many leaves exactly ``pairs`` for training (less the identical pairs it drops)."""
    return max(1, min(eval_pairs, pairs // 4))


def corpus_key(task_options: dict) -> str:
    """What of a world's task options changes the SFT corpus: ReviewTaskConfig.CORPUS_FIELDS and
    the lower end of length_range (the corpus keeps only reviews of at least that many response
    words, fourfold.tasks.review). Worlds with one key share one SFT model and one best-of-n sampling."""
    from fourfold.tasks import ReviewTaskConfig

    c = ReviewTaskConfig(**task_options)
    return digest({**{f: getattr(c, f) for f in ReviewTaskConfig.CORPUS_FIELDS}, "length_lo": c.length_range[0]})


def level_demo(cfg: ExperimentsConfig, world: str, pairs: int) -> DemoConfig:
    """The demo config of ``world``'s reward model on ``pairs`` preference pairs."""
    d, g = cfg.demo, cfg.overoptimization.goodhart
    return dataclasses.replace(
        d, task_options={**d.task_options, **g.worlds[world]},
        pairs=dataclasses.replace(d.pairs, pairs=pairs, eval_pairs=level_eval_pairs(d.pairs.eval_pairs, pairs)),
        run=dataclasses.replace(d.run, output_dir=world_dir(g.demo_dir, f"{world}-p{pairs}"), progress=False))


def reward_label(reward: Union[int, str]) -> str:
    """'p<pairs>' of an RM level, 'gold' of the gold arm."""
    return GOLD if reward == GOLD else f"p{reward}"


def run_name(world: str, reward: Union[int, str], coef: float, seed: int) -> str:
    """A PPO run's job name: 'ppo/<world>/<p<pairs> | gold>/kl<coef>/seed<seed>'."""
    return f"ppo/{world}/{reward_label(reward)}/kl{coef:g}/seed{seed}"


class Goodhart(PromptFamilyJobs):
    """What the family's jobs share: the settings, output directory, log and held-out prompts."""

    @property
    def g(self) -> GoodhartConfig:
        return self.cfg.overoptimization.goodhart

    @property
    def levels(self) -> list[int]:
        return sorted(self.g.rm_pairs)

    def corpora(self) -> dict[str, list[str]]:
        """{corpus key: its worlds, in config order}, in the order first seen."""
        out: dict[str, list[str]] = {}
        for w in self.g.worlds:
            out.setdefault(corpus_key({**self.cfg.demo.task_options, **self.g.worlds[w]}), []).append(w)
        return out

    def corpus_of(self, world: str) -> tuple[int, str, list[str]]:
        """(index, key, worlds) of ``world``'s corpus."""
        for k, (key, ws) in enumerate(self.corpora().items()):
            if world in ws:
                return k, key, ws
        raise KeyError(world)

    def demo_dir(self, world: str, pairs: int) -> Path:
        return Path(level_demo(self.cfg, world, pairs).run.output_dir).resolve()

    def sft_source(self, world: str) -> tuple[str, int]:
        """(world, pairs) of the demo directory that trains ``world``'s SFT model."""
        return self.corpus_of(world)[2][0], self.levels[0]

    def sft_dir(self, world: str) -> Path:
        return self.demo_dir(*self.sft_source(world)) / "sft"

    def sft_key(self, world: str) -> Optional[str]:
        return done_key(self.demo_dir(*self.sft_source(world)), "sft")

    def rm_dir(self, world: str, pairs: int) -> Path:
        return self.demo_dir(world, pairs) / "reward"

    def rm_keys(self, world: str) -> dict[str, Optional[str]]:
        return {str(p): done_key(self.demo_dir(world, p), "reward") for p in self.levels}

    def gen(self) -> dict:
        g = self.cfg.demo.generation
        return {"max_new_tokens": g.max_new_tokens, "temperature": g.temperature, "threads": self.cfg.run.threads or 1}

    def demo_name(self, world: str, pairs: int) -> str:
        return f"demo/{world}-p{pairs}"

    def level_job(self, world: str, pairs: int) -> Job:
        src_w, src_p = self.sft_source(world)
        first = (world, pairs) == (src_w, src_p)
        return self.demo_job(self.demo_name(world, pairs), f"{world}-p{pairs}", level_demo(self.cfg, world, pairs),
                             None if first else level_demo(self.cfg, src_w, src_p),
                             deps=() if first else (self.demo_name(src_w, src_p),))

    def bon_name(self, corpus: int, seed: int) -> str:
        return f"bon/seed{seed}" if len(self.corpora()) == 1 else f"bon/c{corpus}/seed{seed}"

    def bon_path(self, corpus: int, seed: int) -> Path:
        return self.out / "bon" / f"{self.bon_name(corpus, seed)[len('bon/'):].replace('/', '-')}.json"

    def bon_job(self, corpus: int, worlds: list[str], seed: int) -> Job:
        g = self.g

        def prepare() -> list[list[str]]:
            spec = {"sft": str(self.sft_dir(worlds[0])), "prompts": self.prompts[: g.bon_prompts], "N": g.bon_n,
                    "grid": g.grid(), "sample_seed": self.sample_seed + seed, "batch_size": 512, **self.gen(),
                    "worlds": {w: {"task_options": {**self.cfg.demo.task_options, **g.worlds[w]},
                                   "rms": {str(p): str(self.rm_dir(w, p)) for p in self.levels}} for w in worlds}}
            key = digest({**spec, "threads": None, "sft_key": self.sft_key(worlds[0]),
                          "rm_keys": {w: self.rm_keys(w) for w in worlds}})
            dest = self.bon_path(corpus, seed)
            if (read_json(dest) or {}).get("key") == key:
                return []
            return [self.spec_cmd("goodhart-bon", self.bon_name(corpus, seed)[len("bon/"):].replace("/", "-"),
                                  {**spec, "key": key, "out": str(dest)})]

        return Job(self.bon_name(corpus, seed), prepare,
                   deps=tuple(self.demo_name(w, p) for w in worlds for p in self.levels))

    def run_dir(self, world: str, reward: Union[int, str], coef: float, seed: int) -> Path:
        return self.out / "runs" / world / reward_label(reward) / f"kl{coef:g}" / f"seed{seed}"

    def schedule(self) -> list[int]:
        return checkpoint_schedule(self.cfg.iterations, self.g.dense_checkpoints, self.g.checkpoint_every)

    def run_config(self, world: str, reward: Union[int, str], coef: float, seed: int) -> PPOConfig:
        """The PPOConfig of one run: the world's task options, kl_coef ``coef`` (not adaptive), the one
        learning rate, a checkpoint every iteration, all kept until the evaluation; the gold arm
        rewarded by gold itself, its critic from the policy."""
        cfg, g = self.cfg, self.g
        level = g.sweep_pairs if reward == GOLD else int(reward)
        wcfg = dataclasses.replace(cfg, demo=level_demo(cfg, world, level))
        ppo = {"kl_coef": coef, "adaptive_kl": False, "lr": cfg.demo.ppo.lr * g.lr_multiplier,
               "critic_lr": cfg.demo.ppo.critic_lr * g.lr_multiplier}
        model = {} if reward != GOLD else {
            "reward": None, "critic_init": "policy",
            "reward_fns": [RewardFnConfig(fn=GOLD_FN, name="gold_fn", options={"task_options": dict(wcfg.demo.task_options)})]}
        arm = Arm(reward_label(reward), "ppo", f"PPO on {reward_label(reward)}, kl_coef {coef:g}", ppo=ppo, model=model)
        rd = self.run_dir(world, reward, coef, seed)
        rcfg = run_config(wcfg, arm, seed, sft=self.sft_dir(world), rm=self.rm_dir(world, level), run_dir=rd)
        rcfg.run = dataclasses.replace(rcfg.run, save_every=1, keep_checkpoints=cfg.iterations + 1)
        return rcfg

    def ppo_job(self, world: str, reward: Union[int, str], coef: float, seed: int) -> Job:
        g = self.g
        name = run_name(world, reward, coef, seed)

        def prepare() -> list[list[str]]:
            rd = self.run_dir(world, reward, coef, seed)
            rcfg = self.run_config(world, reward, coef, seed)
            rm_key = GOLD if reward == GOLD else self.rm_keys(world)[str(reward)]
            key = digest({"run": run_key(rcfg, "ppo", {"sft": self.sft_key(world), "reward": rm_key}), "save_every": 1})
            claim_run_dir(rd, key, {"name": name})
            cmds = [] if (rd / "policy" / "config.json").is_file() else [self.ppo_cmd(name, rcfg)]
            spec = {"sft": str(self.sft_dir(world)), "rms": {str(p): str(self.rm_dir(world, p)) for p in self.levels},
                    "trained_on": GOLD if reward == GOLD else str(reward), "run_dir": str(rd),
                    "schedule": self.schedule() if coef == 0 or g.kl_curves else [],  # [] = the last alone
                    "prompts": self.prompts[: g.curve_prompts], "A": g.accuracy_samples,
                    "task_options": dict(rcfg.data.task_options), "sample_seed": self.sample_seed, **self.gen()}
            ekey = digest({**spec, "run": key, "rm_keys": self.rm_keys(world), "run_dir": None, "threads": None})
            dest = rd / "curve.json"
            stale = (read_json(dest) or {}).get("key") != ekey
            if not cmds and stale and (rd / "PRUNED").exists():
                shutil.rmtree(rd)  # its checkpoints were deleted after another evaluation: train again
                claim_run_dir(rd, key, {"name": name})
                cmds.append(self.ppo_cmd(name, rcfg))
            if cmds or stale:
                cmds.append(self.spec_cmd("goodhart-curve", name[len("ppo/"):],
                                          {**spec, "key": ekey, "out": str(dest), "prune": True}))
            return cmds

        return Job(name, prepare, deps=tuple(self.demo_name(world, p) for p in self.levels))

    def jobs(self) -> list[Job]:
        """The demo stages (each corpus's SFT source first), the best-of-n samplings, then seed by
        seed the PPO runs (ppo_runs() order)."""
        jobs = [self.level_job(w, p) for w in self.g.worlds for p in self.levels]
        jobs.sort(key=lambda j: j.deps != ())  # the SFT sources first: every other stage waits on one
        jobs += [self.bon_job(k, ws, s) for s in self.cfg.seeds for k, ws in enumerate(self.corpora().values())]
        return jobs + [self.ppo_job(w, r, c, s) for s in self.cfg.seeds for w, r, c in self.g.ppo_runs()]


def _ok(state: dict[str, str], name: str) -> bool:
    return state.get(name) in ("done", "cached")


def mean_bon(measures: list[dict]) -> dict:
    """The mean over seeds of one world's best-of-n measures (bon_measures records on the same
    prompts and grid): each level's and the ceiling's curves (mean_curve), each level's accuracy."""
    first = measures[0]
    keys = ("d", "gold", "proxy", "kl_empirical")
    out = {"n": first["n"], "d_analytic": first["d_analytic"], "seeds": len(measures),
           "distinct": {"mean": sum(m["distinct"]["mean"] for m in measures) / len(measures),
                        "min": min(m["distinct"]["min"] for m in measures), "max": max(m["distinct"]["max"] for m in measures)},
           "gold_ceiling": mean_curve([m["gold_ceiling"] for m in measures], keys), "levels": {}}
    for p in first["levels"]:
        lv = mean_curve([m["levels"][p] for m in measures], keys)
        lv["accuracy"] = sum(m["levels"][p]["accuracy"] for m in measures) / len(measures)
        out["levels"][p] = lv
    for k in ("gold_std", "length", "well_formed", "repetition"):
        if all(k in m for m in measures):
            out[k] = sum(m[k] for m in measures) / len(measures)
    return out


def collect(fam: Goodhart, state: dict[str, str]) -> dict:
    """From the finished jobs' files: {record (what compute_goodhart_claims reads: per world bon,
    ppo, accuracy, kl, sweep_pairs), runs ({world: {reward label: {kl_coef: the mean curve over
    seeds, with its points' accuracies}}}), accuracy ({world: pooled_accuracy}), rm ({world:
    {pairs: the reward stage's result}}), notes}."""
    g, notes = fam.g, []
    record: dict[str, dict] = {}
    runs: dict[str, dict] = {}
    accuracy: dict[str, dict] = {}
    for k, ws in enumerate(fam.corpora().values()):
        per_world: dict[str, list] = {w: [] for w in ws}
        for s in fam.cfg.seeds:
            rec = read_json(fam.bon_path(k, s))
            if rec and _ok(state, fam.bon_name(k, s)):
                for w in ws:
                    per_world[w].append(rec["worlds"][w])
        for w in ws:
            record[w] = {"sweep_pairs": g.sweep_pairs, "ppo": {}, "kl": {}}
            if per_world[w]:
                record[w]["bon"] = mean_bon(per_world[w])
    for w in g.worlds:
        points: list[dict] = []
        runs[w] = {}
        for world, reward, coef in g.ppo_runs():
            if world != w:
                continue
            curves = []
            for s in fam.cfg.seeds:
                rec = read_json(fam.run_dir(w, reward, coef, s) / "curve.json")
                if rec and _ok(state, run_name(w, reward, coef, s)):
                    curves.append(ppo_curve(rec["points"]))
                    points += [p for p in rec["points"] if p["iteration"] > 0]
            if not curves:
                continue
            try:
                mc = mean_curve(curves)
            except ValueError as e:
                notes.append(f"{w} {reward_label(reward)} kl_coef {coef:g}: {e}; the first seed's curve kept")
                mc = dict(curves[0], seeds=1)
            runs[w].setdefault(reward_label(reward), {})[f"{coef:g}"] = mc
            if reward != GOLD and coef == 0:
                record[w]["ppo"][str(reward)] = {"d": mc["d"], "gold_by_prompt": mc["gold_by_prompt"]}
            elif reward == g.sweep_pairs and coef > 0:
                record[w]["kl"][f"{coef:g}"] = {"d": mc["d"][-1], "gold_by_prompt": [row[-1] for row in mc["gold_by_prompt"]]}
        accuracy[w] = pooled_accuracy(points)
        acc = {p: v["accuracy"] for p, v in accuracy[w].items() if math.isfinite(v["accuracy"])}
        if acc:
            record[w]["accuracy"] = acc
    rm = {w: {str(p): (read_done(fam.demo_dir(w, p), "reward") or {}).get("result", {}) for p in fam.levels}
          for w in g.worlds}
    return {"record": record, "runs": runs, "accuracy": accuracy, "rm": rm, "notes": notes}


def run_goodhart(cfg: ExperimentsConfig) -> dict:
    """Run (or resume) the re-posed overoptimization family and write its report; returns
    {output_dir, claims, notes}."""
    from fourfold.apps.experiments.goodhart_report import write_goodhart_outputs

    run = FamilyRun.start("overoptimization", cfg, goodhart_quick_config, ("runs", "bon", "configs", "logs"))
    cfg, out = run.cfg, run.out
    fam = Goodhart(cfg, out, run.log, eval_prompts(cfg), eval_sample_seed(cfg))
    g = fam.g
    run.run_jobs(fam.jobs(), f"design goodhart: worlds {', '.join(g.worlds)}; RM levels {fam.levels} pairs; "
                             f"best-of-{g.bon_n} on {g.bon_prompts} prompts; {len(g.ppo_runs())} PPO runs a seed x "
                             f"{len(cfg.seeds)} seeds, {cfg.iterations} iterations, {len(fam.schedule())} checkpoints evaluated")
    res = collect(fam, run.state)
    claims, notes = compute_goodhart_claims(res["record"], g.claims)
    record = {"config": config_to_dict(cfg), "design": "goodhart", "worlds": {w: dict(o) for w, o in g.worlds.items()},
              "schedule": fam.schedule(), **res, "claims": claims, "notes": res["notes"] + notes}
    run.finish(record, lambda rec: write_goodhart_outputs(out, cfg, rec))
    return {"output_dir": str(out), "claims": claims, "notes": record["notes"]}
