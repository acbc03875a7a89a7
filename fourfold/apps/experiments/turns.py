"""The turns family (``fourfold experiments --config examples/turns.yaml``): does the critic's
baseline pay more as the turns grow?

The lookup world (:mod:`fourfold.tasks.lookup`: ask a tool, then answer from its reply) at each
hops of ``turns.hops`` (perfect play takes hops + 1 turns: 0, 1, 3 = 1, 2, 4 turns) is a *world*:
its data (SFT episodes of imperfect play, RL prompts, rows of held-out chains), its word tokenizer
and its SFT model (``turns.sft_config``, ``turns.sft_steps_per_turn`` x turns steps), made once per
hops in ``<turns.world_dir>-h<hops>`` by one job (``python -m fourfold.apps.experiments
turns-world``, :mod:`fourfold.apps.experiments.turns_eval`) that also measures the SFT model's gold.
On each world every arm of ``turns.arms`` x seed is ``fourfold ppo`` over ``turns.rl_config`` with
``env.max_turns = hops + 1``, ``env.max_tokens = tokens_base + tokens_per_hop x hops`` and the same
trajectories per iteration (ppo.rollout_batch_size) for every arm, at the same rows x K (the rollout
batch / ``group_size`` rows, ``group_size`` trajectories each: 32 x 8 at 256):

* ``ppo``: a critic (initialised from the policy with a zero value head, ``turns.critic_lr``, an
  optional ``turns.critic_warmup`` of critic-only iterations before the policy's), GAE over the
  policy's tokens;
* ``ppo-no-critic``: the same without the critic (whitened returns, reinforce_pp);
* ``grpo`` / ``rloo``: the group of a row's ``group_size`` trajectories is the baseline;
* ``ppo-256x1`` (and ``ppo-no-critic-256x1``): the PPO arm at one trajectory a row (rollout batch
  rows x 1, the family's first design): the rows x K contrast, its own factor;

then its final policy's gold on the world's held-out rows, greedy and sampled (``turns-eval``).
Jobs run ``workers`` at a time, cached and resumable as the other families'. Claims:
:func:`fourfold.apps.experiments.turns_claims.compute_turns_claims`; output in ``run.output_dir``:
``results.json``, ``summary.md``, ``report.html``, ``turns.png`` (:mod:`~fourfold.apps.experiments.turns_report`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fourfold
from fourfold.apps.cache import digest, keyed, read_json
from fourfold.apps.experiments.arms import run_key
from fourfold.apps.experiments.config import TURNS_CRITIC_ARMS, ExperimentsConfig, TurnsConfig
from fourfold.apps.experiments.family import FAMILY_QUICK, FamilyJobs, FamilyRun, claim_run_dir, world_dir
from fourfold.apps.experiments.jobs import Job
from fourfold.apps.experiments.results import train_seconds
from fourfold.apps.experiments.sweep import family_quick_config
from fourfold.apps.experiments.turns_claims import compute_turns_claims, tail_mean, turns_label, turns_of
from fourfold.apps.report_kit import mean, std
from fourfold.checkpoint import checkpoint_dirs
from fourfold.config import PPOConfig, SFTConfig, config_to_dict, load_config, save_config

TURNS_QUICK: dict[str, Any] = {  # --quick: the pipeline end to end, and the one claim its budget settles
    **FAMILY_QUICK,
    "iterations": 8,
    "turns.hops": [0, 1],
    "turns.arms": ["ppo", "grpo"],
    "turns.sft_examples": 2000,
}
DEFAULT_TURNS_OUTPUT = "runs/turns"
DEFAULT_TURNS_WORLD = "runs/turns-world"
PROMPT_TOKENS = 16
"""data.max_prompt_len of every arm (hops 0's prompt, the fact and the request, is 10 tokens with its role word)."""
EVAL_SEED = 31
"""The sampling seed of every held-out evaluation (the same for every arm and seed: paired)."""
ROOT = Path(fourfold.__file__).resolve().parent.parent


def turns_quick_config(cfg: ExperimentsConfig) -> ExperimentsConfig:
    """The --quick settings: TURNS_QUICK, '-quick' on the default output and world paths."""
    return family_quick_config(cfg, TURNS_QUICK, DEFAULT_TURNS_OUTPUT, "turns.world_dir", DEFAULT_TURNS_WORLD)


def base_config(path: str) -> Path:
    """A base config: ``path`` from the working directory, else from the checkout."""
    p = Path(path)
    return p if p.is_file() or p.is_absolute() else ROOT / p


CRITIC = ["ppo.advantage=gae", "ppo.use_critic=true", "model.critic_init=policy"]
NO_CRITIC = ["ppo.advantage=gae", "ppo.use_critic=false"]
ARM_BASE = {"ppo": (CRITIC, False), "ppo-no-critic": (NO_CRITIC, False), "grpo": (["ppo.advantage=grpo"], False),
            "rloo": (["ppo.advantage=rloo"], False), "ppo-256x1": (CRITIC, True),
            "ppo-no-critic-256x1": (NO_CRITIC, True)}
"""{arm: (its estimator's overrides, whether it runs one trajectory a row)}."""


def arm_k(arm: str, group_size: int) -> int:
    """K, the trajectories per row of ``arm``: group_size, or 1 for the ``-256x1`` arms."""
    return 1 if ARM_BASE[arm][1] else group_size


def arm_overrides(arm: str, group_size: int, turns: TurnsConfig, iterations: int) -> list[str]:
    """How an arm's PPOConfig differs from turns.rl_config's. Every arm keeps its rollout_batch_size
    trajectories per iteration, at K = group_size a row (32 rows x 8 at 256) or, ``-256x1``, one a
    row; the critic arms take turns.critic_lr and turns.critic_warmup, their warm-up iterations
    before the ``iterations`` policy updates every arm takes, then turns.critic_overrides."""
    base, _ = ARM_BASE[arm]
    out = [*base, f"ppo.samples_per_prompt={arm_k(arm, group_size)}"]
    if arm in TURNS_CRITIC_ARMS:
        out += [f"ppo.critic_lr={turns.critic_lr!r}", f"ppo.critic_warmup={turns.critic_warmup}",
                f"ppo.iterations={iterations + turns.critic_warmup}", *turns.critic_overrides]
    return out


def arm_shape(arm: str, group_size: int, rollout_batch_size: int) -> str:
    """'rows x K' of an arm's iteration: '32x8', '256x1'."""
    k = arm_k(arm, group_size)
    return f"{rollout_batch_size // k}x{k}"


ARM_WHAT = {"ppo": "PPO with a critic (init from the policy, turns.critic_lr), GAE over the policy's tokens",
            "ppo-no-critic": "PPO without a critic (whitened returns: reinforce_pp)",
            "grpo": "GRPO: (R - group mean) / group std over a row's K trajectories",
            "rloo": "RLOO: baseline the mean of the row's other K - 1 trajectories",
            "ppo-256x1": "ppo at one trajectory a row (the rows x K contrast)",
            "ppo-no-critic-256x1": "ppo-no-critic at one trajectory a row (the rows x K contrast)"}


def base_rl(cfg: ExperimentsConfig) -> PPOConfig:
    """turns.rl_config with turns.rl_overrides: what every arm starts from."""
    return load_config(PPOConfig, base_config(cfg.turns.rl_config), list(cfg.turns.rl_overrides))


def limits(cfg: ExperimentsConfig, hops: int) -> dict:
    """env.max_turns, env.max_tokens of a world (and the turn length of the RL config)."""
    t = cfg.turns
    return {"max_turns": turns_of(hops), "max_tokens": t.tokens_base + t.tokens_per_hop * hops,
            "max_new_tokens": base_rl(cfg).generation.max_new_tokens}


class Turns(FamilyJobs):
    """What the family's jobs share."""

    @property
    def hops(self) -> list[int]:
        return sorted(self.cfg.turns.hops)

    def world_dir(self, hops: int) -> Path:
        return Path(world_dir(self.cfg.turns.world_dir, turns_label(hops))).resolve()

    def sft_config(self, hops: int) -> SFTConfig:
        t, w = self.cfg.turns, self.world_dir(hops)
        n = limits(self.cfg, hops)["max_tokens"]
        return load_config(SFTConfig, base_config(t.sft_config), [
            *t.sft_overrides, f"model.tokenizer={w / 'tokenizer'}", f"data.train={w / 'data' / 'sft_train.jsonl'}",
            f"run.output_dir={w / 'sft'}", f"run.seed={t.world_seed}", "run.progress=false", "run.tensorboard=false",
            f"run.threads={self.cfg.run.threads or 1}", f"model.max_positions={n}", f"train.max_len={n}",
            f"train.max_steps={t.sft_steps_per_turn * turns_of(hops)}"])

    def world_key(self, hops: int) -> str:
        t = self.cfg.turns
        sft = config_to_dict(self.sft_config(hops))
        sft.pop("run", None)  # paths, threads, logging; the seed is world_seed
        return digest({"task": self.task(hops), "seed": t.world_seed, "examples": t.sft_examples,
                       "prompts": t.prompts, "heldout": self.cfg.eval_prompts, "sft": sft, "eval": self.eval(hops)})

    def task(self, hops: int) -> dict:
        t = self.cfg.turns
        return {"hops": hops, "value_digits": t.value_digits, "error_rate": t.error_rate, "guess_share": t.guess_share}

    def eval(self, hops: int) -> dict:
        return {**limits(self.cfg, hops), "sample_seed": EVAL_SEED}

    def world_job(self, hops: int) -> Job:
        label, w = turns_label(hops), self.world_dir(hops)

        def prepare() -> list[list[str]]:
            key = self.world_key(hops)
            if (read_json(w / "world.json") or {}).get("key") == key and (w / "sft" / "model" / "config.json").is_file():
                return []
            p = self.out / "configs" / f"sft-{label}.yaml"
            save_config(self.sft_config(hops), p)
            t = self.cfg.turns
            spec = {"out": str(w), "task": self.task(hops), "seed": t.world_seed, "examples": t.sft_examples,
                    "prompts": t.prompts, "heldout": self.cfg.eval_prompts, "sft_config": str(p), "key": key,
                    "threads": self.cfg.run.threads or 1, **self.eval(hops)}
            return [self.spec_cmd("turns-world", label, spec)]

        return Job(f"world/{label}", prepare)

    def run_dir(self, hops: int, arm: str, seed: int) -> Path:
        return self.out / "runs" / turns_label(hops) / arm / f"seed{seed}"

    def run_config(self, hops: int, arm: str, seed: int) -> PPOConfig:
        cfg, t, w = self.cfg, self.cfg.turns, self.world_dir(hops)
        rd = self.run_dir(hops, arm, seed)
        resume = bool(checkpoint_dirs(rd))
        lim = limits(cfg, hops)
        return load_config(PPOConfig, base_config(t.rl_config), [
            *t.rl_overrides, f"model.policy={w / 'sft' / 'model'}", f"data.prompts={w / 'data' / 'prompts.jsonl'}",
            f"data.max_prompt_len={PROMPT_TOKENS}", f"env.max_turns={lim['max_turns']}", f"env.max_tokens={lim['max_tokens']}",
            f"ppo.iterations={cfg.iterations}", *arm_overrides(arm, cfg.group_size, t, cfg.iterations),
            f"run.output_dir={rd}", f"run.seed={seed}", f"run.threads={cfg.run.threads or 1}", "run.progress=false",
            "run.tensorboard=false", f"run.save_every={cfg.run.save_every}", "run.keep_checkpoints=1",
            f"run.resume={str(resume).lower()}", f"run.overwrite={str(not resume).lower()}", "run.samples_every=0"])

    def run_job(self, hops: int, arm: str, seed: int) -> Job:
        label = turns_label(hops)
        name = f"{label}/{arm}/seed{seed}"
        w = self.world_dir(hops)

        def prepare() -> list[list[str]]:
            rd = self.run_dir(hops, arm, seed)
            rcfg = self.run_config(hops, arm, seed)
            wkey = self.world_key(hops)
            key = digest({"run": run_key(rcfg, "ppo", {"world": wkey}), "env": keyed(rcfg.env)})
            claim_run_dir(rd, key, {"name": name})
            cmds = [] if (rd / "policy" / "config.json").is_file() else [self.ppo_cmd(name, rcfg)]
            ekey = digest({"run": key, "eval": self.eval(hops), "rows": wkey})
            dest = rd / "final_eval.json"
            if cmds or (read_json(dest) or {}).get("key") != ekey:
                spec = {"policy": str(rd / "policy"), "rows": str(w / "data" / "heldout.jsonl"), "key": ekey,
                        "out": str(dest), "threads": self.cfg.run.threads or 1, **self.eval(hops)}
                cmds.append(self.spec_cmd("turns-eval", name, spec))
            return cmds

        return Job(name, prepare, deps=(f"world/{label}",))

    def jobs(self) -> list[Job]:
        """The worlds (smallest first), then seed by seed the longest world's arms first."""
        jobs = [self.world_job(h) for h in self.hops]
        return jobs + [self.run_job(h, a, s) for s in self.cfg.seeds for h in reversed(self.hops)
                       for a in self.cfg.turns.arms]


def gold_row(gold: dict) -> dict:
    """One evaluation as a claims row: sampled gold (the claims' gold), greedy beside it."""
    s, g = gold["sampled"], gold["greedy"]
    return {"n": s["n"], "gold": s["gold"], "gold_greedy": g["gold"], "turns_mean": s["turns_mean"],
            "turns_greedy": g["turns_mean"]}


EV = "value/explained_variance"
"""The critic's explained variance of the returns, logged per iteration before its update."""


def ev_curve(metrics: list[dict]) -> list[float]:
    """A run's value/explained_variance per logged iteration (warm-up included; [] without a critic)."""
    return [float(r[EV]) for r in metrics if "iteration" in r and isinstance(r.get(EV), (int, float))]


def summarize(rows: list[dict], sft: dict) -> dict:
    """An arm's seeds at one world: means and sds of gold (sampled, greedy), gains over SFT, turns,
    and (critic arms) of the explained variance over the last iterations."""
    out: dict[str, Any] = {"seeds": len(rows)}
    for k in ("gold", "gold_greedy", "turns_mean", "train_s", "ev_tail"):
        xs = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
        if not xs:
            continue
        out[k], out[k + "_sd"] = mean(xs), std(xs) if len(xs) > 1 else None
    out["gain"], out["gain_greedy"] = out["gold"] - sft["gold"], out["gold_greedy"] - sft["gold_greedy"]
    return out


def collect(fam: Turns, state: dict[str, str]) -> dict:
    """{sft: {world: row}, finals: {world: {arm: [rows]}} (a critic arm's rows with ``ev``, its
    explained variance per iteration, and ``ev_tail``, their mean over the last
    turns.claims.ev_tail_share), curves: {world: {arm: [[return per iteration] per seed]}},
    ev_curves: {world: {arm: [[explained variance per iteration] per seed]}}, summaries, worlds,
    shapes: {arm: 'rows x K'}} of the finished jobs."""
    from fourfold.reporting import read_metrics

    sft, finals, curves, ev_curves, summaries, worlds = {}, {}, {}, {}, {}, {}
    share = fam.cfg.turns.claims.ev_tail_share
    for h in fam.hops:
        label = turns_label(h)
        rec = read_json(fam.world_dir(h) / "world.json")
        worlds[label] = {"hops": h, "turns": turns_of(h), "dir": str(fam.world_dir(h)), **fam.eval(h),
                         "sft_s": (rec or {}).get("sft_s")}
        if not rec or state.get(f"world/{label}") not in ("done", "cached"):
            continue
        sft[label] = gold_row(rec["gold"])
        for a in fam.cfg.turns.arms:
            for s in fam.cfg.seeds:
                rd = fam.run_dir(h, a, s)
                ev = read_json(rd / "final_eval.json")
                if not ev or state.get(f"{label}/{a}/seed{s}") not in ("done", "cached"):
                    continue
                m = rd / "metrics.jsonl"
                metrics = read_metrics(m) if m.is_file() else []
                row = {"seed": s, **gold_row(ev["gold"]), "train_s": train_seconds(rd)}
                if a in TURNS_CRITIC_ARMS:
                    evs = ev_curve(metrics)
                    row.update(ev=evs, ev_tail=tail_mean(evs, share))
                    ev_curves.setdefault(label, {}).setdefault(a, []).append(evs)
                finals.setdefault(label, {}).setdefault(a, []).append(row)
                curves.setdefault(label, {}).setdefault(a, []).append(
                    [r.get("env/return_mean") for r in metrics if "iteration" in r])
            if finals.get(label, {}).get(a):
                summaries.setdefault(label, {})[a] = summarize(finals[label][a], sft[label])
    rb = base_rl(fam.cfg).ppo.rollout_batch_size
    shapes = {a: arm_shape(a, fam.cfg.group_size, rb) for a in fam.cfg.turns.arms}
    return {"sft": sft, "finals": finals, "curves": curves, "ev_curves": ev_curves, "summaries": summaries,
            "worlds": worlds, "shapes": shapes}


def run_turns(cfg: ExperimentsConfig) -> dict:
    """Run (or resume) the turns family and write its report; returns {output_dir, claims, notes,
    summaries}."""
    from fourfold.apps.experiments.turns_report import write_turns_report

    run = FamilyRun.start("turns", cfg, turns_quick_config, ("runs", "configs", "logs"))
    cfg, out = run.cfg, run.out
    fam = Turns(cfg, out, run.log)
    state = run.run_jobs(fam.jobs(), f"hops {fam.hops} (turns {[turns_of(h) for h in fam.hops]}), arms "
                         f"{', '.join(cfg.turns.arms)}, {len(cfg.seeds)} seeds, {cfg.iterations} iterations")
    res = collect(fam, state)
    claims, notes = compute_turns_claims(res["finals"], res["sft"], cfg.turns.claims, hops=fam.hops,
                                         arms=cfg.turns.arms, quick=cfg.quick, shapes=res["shapes"])
    record = {"config": config_to_dict(cfg), **res, "claims": claims, "notes": notes,
              "arms": {a: f"{ARM_WHAT[a]}; {res['shapes'][a].replace('x', ' rows x ')}" for a in cfg.turns.arms}}
    run.finish(record, lambda rec: write_turns_report(out, cfg, rec))
    return {"output_dir": str(out), "claims": claims, "notes": notes, "summaries": res["summaries"]}
