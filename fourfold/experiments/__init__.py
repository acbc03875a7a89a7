"""`fourfold experiments`: the method's claims, measured.

Each claim the project makes about PPO-based RLHF is an experiment on the demo's review task
(`fourfold demo`), whose hidden gold reward says what the reward model cannot:

* ``ppo``             the default: demo.ppo (kl_coef beta, 4 epochs per batch, critic);
* ``ppo-beta0``       beta = 0: nothing holds the policy near the SFT model (reward hacking);
* ``ppo-beta-high``   beta x ``beta_high_multiplier`` (100): the policy never moves;
* ``ppo-1epoch``      one epoch per batch (sample efficiency of the PPO epochs);
* ``ppo-no-critic``   advantages from whitened returns, no value baseline;
* ``reinforce-lrMx``  naive REINFORCE (sequence reward + KL, no critic, no clip, one step per
                      batch) at M x PPO's learning rate, one arm per ``reinforce_lr_multipliers``;
* ``ppo-unbiased-rm`` PPO against an RM trained on labels from unbiased labelers (the demo's
                      stages again with ``unbiased_task_options``, cached in their own directory);
* ``ppo-adaptive-kl`` (optional) the adaptive KL controller with demo.ppo.kl_target.

What :func:`run` does, in order:

1. the demo's SFT, pairs and reward stages (``fourfold.demo.run(cfg.demo, stop_after="reward")``:
   cached, shared with ``fourfold demo`` in ``runs/demo``);
2. a job per arm x seed, ``workers`` at a time, each a subprocess (``python -m fourfold.cli ppo
   --config ...`` then ``python -m fourfold.experiments evaluate ...``), so that a crash or a kill
   of one loses nothing else. Every run is resumable (``run.resume=true``, ``run.save_every``); a
   rerun skips finished runs and evaluations (keyed by their settings and the demo stages they
   start from) and resumes unfinished ones;
3. the final evaluation of every saved policy, and of the SFT model, on the same held-out prompts
   with :func:`fourfold.demo.evaluate_policy` (proxy, gold, KL, length, well-formed, repetition);
4. ``summary.md`` and ``report.html``: per-arm mean +- sd over seeds, curves from each run's
   ``metrics.jsonl``, the gold-vs-KL frontier, samples, and the claims table, computed from the
   numbers by :func:`compute_claims`.

Layout of ``run.output_dir`` (default ``runs/experiments``): ``summary.md``, ``report.html``,
``results.json`` (every number of the report), ``configs/`` (each run's resolved config),
``runs/<arm>/seed<k>/`` (each trainer's run directory plus ``final_eval.json``), ``baseline/``
(the SFT model's evaluation), ``logs/`` (each job's stdout and stderr).
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from fourfold.atomic import write_text_atomic
from fourfold.config import (
    DemoConfig,
    ExperimentsClaimsConfig,
    ExperimentsConfig,
    GenerationConfig,
    LMModelConfig,
    PPOConfig,
    PromptDataConfig,
    ReinforceAlgoConfig,
    ReinforceConfig,
    RunConfig,
    config_to_dict,
    save_config,
)
from fourfold.errors import FourfoldError

QUICK: dict[str, Any] = {  # --quick: the robust claims only, in about 5 minutes on 2 cores
    "seeds": [0],
    "arms": ["ppo", "ppo-beta0", "ppo-beta-high"],
    "iterations": 24,
    "eval_prompts": 128,
    "claims.groups": ["beta0", "beta-high"],
}
DEFAULT_OUTPUT = "runs/experiments"
DEFAULT_DEMO_OUTPUT = "runs/demo"
EVAL_PROMPT_SEED_OFFSET = 4  # the demo's eval prompts: task.sample_prompts(n, Random(demo seed + 4))
EVAL_SAMPLE_SEED_OFFSET = 5  # torch.manual_seed(demo seed + 5) before sampling, as the demo's eval
ARM_ORDER = ("ppo", "ppo-beta0", "ppo-beta-high", "ppo-1epoch", "ppo-no-critic", "reinforce",
             "ppo-unbiased-rm", "ppo-adaptive-kl")


class ExperimentError(FourfoldError, RuntimeError):
    """Some runs of the sweep failed (the report is still written from the others)."""


def apply_quick(cfg: ExperimentsConfig) -> ExperimentsConfig:
    """The --quick settings: QUICK over cfg, demo.quick=true, '-quick' on default output paths."""
    cfg = dataclasses.replace(cfg, seeds=list(QUICK["seeds"]), arms=list(QUICK["arms"]),
                              iterations=QUICK["iterations"], eval_prompts=QUICK["eval_prompts"],
                              claims=dataclasses.replace(cfg.claims, groups=list(QUICK["claims.groups"])))
    demo_run = cfg.demo.run
    if demo_run.output_dir == DEFAULT_DEMO_OUTPUT:
        demo_run = dataclasses.replace(demo_run, output_dir=DEFAULT_DEMO_OUTPUT + "-quick")
    cfg.demo = dataclasses.replace(cfg.demo, quick=True, run=demo_run)
    if cfg.run.output_dir == DEFAULT_OUTPUT:
        cfg.run = dataclasses.replace(cfg.run, output_dir=DEFAULT_OUTPUT + "-quick")
    return cfg


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------


def _key(obj: Any) -> str:
    from fourfold.stages import digest

    return digest(obj)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _sd(xs: Sequence[float]) -> float:
    """Sample standard deviation (n - 1); 0 for a single value, nan for none."""
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return math.nan
    if len(xs) == 1:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{digits}f}"


def _signed(x: float, digits: int = 2) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:+.{digits}f}"


def _duration(s: float) -> str:
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.1f}min"


def _stage_key(demo_dir: Path, stage: str) -> str | None:
    from fourfold.stages import done_key

    return done_key(demo_dir, stage)


def _tail(path: Path, n: int = 8) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


# ---------------------------------------------------------------------------------------------
# the arms
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Arm:
    """One arm: its trainer ('ppo' or 'reinforce'), how its config differs, which RM it uses."""

    name: str
    stage: str
    what: str
    ppo: dict = dataclasses.field(default_factory=dict)
    """PPOAlgoConfig fields changed from demo.ppo (ppo arms)."""
    lr_multiplier: float = 1.0
    """REINFORCE: learning rate = this x demo.ppo.lr."""
    rm: str = "biased"
    """'biased' (the demo's RM) or 'unbiased' (the RM of the unbiased labelers)."""


def _mult(m: float) -> str:
    return f"{m:g}x"


def build_arms(cfg: ExperimentsConfig) -> list[Arm]:
    """The arms cfg.arms names, in a fixed order ('reinforce' expands to one arm per multiplier)."""
    beta = cfg.demo.ppo.kl_coef
    out: list[Arm] = []
    for name in ARM_ORDER:
        if name not in cfg.arms:
            continue
        if name == "ppo":
            out.append(Arm(name, "ppo", f"PPO, beta={beta:g}, {cfg.demo.ppo.ppo_epochs} epochs, critic"))
        elif name == "ppo-beta0":
            out.append(Arm(name, "ppo", "PPO, beta=0 (no KL penalty)", ppo={"kl_coef": 0.0, "adaptive_kl": False}))
        elif name == "ppo-beta-high":
            b = beta * cfg.beta_high_multiplier
            out.append(Arm(name, "ppo", f"PPO, beta={b:g} ({cfg.beta_high_multiplier:g}x)",
                           ppo={"kl_coef": b, "adaptive_kl": False}))
        elif name == "ppo-1epoch":
            out.append(Arm(name, "ppo", "PPO, 1 epoch per batch", ppo={"ppo_epochs": 1}))
        elif name == "ppo-no-critic":
            out.append(Arm(name, "ppo", "PPO without a critic (whitened returns as advantages)",
                           ppo={"use_critic": False}))
        elif name == "reinforce":
            for m in cfg.reinforce_lr_multipliers:
                out.append(Arm(f"reinforce-lr{_mult(m)}", "reinforce",
                               f"naive REINFORCE, lr={m:g}x PPO's ({cfg.demo.ppo.lr * m:g})", lr_multiplier=m))
        elif name == "ppo-unbiased-rm":
            out.append(Arm(name, "ppo", "PPO against the RM of unbiased labelers", rm="unbiased"))
        elif name == "ppo-adaptive-kl":
            out.append(Arm(name, "ppo", f"PPO, adaptive KL (target {cfg.demo.ppo.kl_target:g} nats)",
                           ppo={"adaptive_kl": True}))
    return out


def run_config(cfg: ExperimentsConfig, arm: Arm, seed: int, *, sft: Path, rm: Path, run_dir: Path):
    """The PPOConfig / ReinforceConfig of one arm x seed (every arm shares generation, prompts,
    batch size and number of iterations: the same sample budget)."""
    d = cfg.demo
    run = RunConfig(output_dir=str(run_dir), seed=seed, device=cfg.run.device, threads=cfg.run.threads,
                    save_every=cfg.run.save_every, keep_checkpoints=1, resume=True, progress=False,
                    tensorboard=False, max_consecutive_skips=cfg.run.max_consecutive_skips,
                    concurrent_roles=cfg.run.concurrent_roles)
    data = PromptDataConfig(task="review", max_prompt_len=16)
    if arm.stage == "ppo":
        algo = dataclasses.replace(d.ppo, iterations=cfg.iterations, **arm.ppo)
        return PPOConfig(model=LMModelConfig(policy=str(sft), reward=str(rm), critic_init="reward"),
                         data=data, generation=d.generation, ppo=algo, run=run)
    algo = ReinforceAlgoConfig(
        iterations=cfg.iterations, rollout_batch_size=d.ppo.rollout_batch_size, lr=d.ppo.lr * arm.lr_multiplier,
        kl_coef=d.ppo.kl_coef, kl_estimator=d.ppo.kl_estimator, baseline="none", max_grad_norm=None,
        lr_schedule=d.ppo.lr_schedule)
    return ReinforceConfig(model=LMModelConfig(policy=str(sft), reward=str(rm)), data=data,
                           generation=d.generation, reinforce=algo, run=run)


def _run_key(run_cfg, stage: str, demo_keys: Mapping[str, Any]) -> str:
    """What a run's result depends on: its algorithm/generation/data settings, its seed and the demo
    stages its models come from (paths, device, threads and logging do not count)."""
    d = config_to_dict(run_cfg)
    return _key({"stage": stage, "algo": d.get("ppo") or d.get("reinforce"), "generation": d["generation"],
                 "data": d["data"], "critic_init": d["model"].get("critic_init"), "seed": d["run"]["seed"],
                 "demo": demo_keys})


# ---------------------------------------------------------------------------------------------
# the unbiased-labeler demo: the same SFT model, a different RM
# ---------------------------------------------------------------------------------------------


def unbiased_demo_config(cfg: ExperimentsConfig) -> DemoConfig:
    out = cfg.unbiased_demo_dir or cfg.demo.run.output_dir.rstrip("/") + "-unbiased"
    return dataclasses.replace(cfg.demo, task_options={**cfg.demo.task_options, **cfg.unbiased_task_options},
                               run=dataclasses.replace(cfg.demo.run, output_dir=out))


def _sft_stage_key(demo_cfg: DemoConfig) -> str:
    """The key fourfold.demo gives its SFT stage (its settings come from demo.sft_stage_settings)."""
    from fourfold.demo import sft_stage_key

    return sft_stage_key(demo_cfg)


def seed_sft_stage(src: DemoConfig, dst: DemoConfig) -> bool:
    """Give ``dst``'s demo directory ``src``'s finished SFT stage when both key it alike.

    The SFT stage's key holds only the options that change the corpus (demo.sft_stage_settings), so
    labeler options leave it alone: the SFT model is the same, and copying it saves the SFT stage
    and makes ppo-unbiased-rm start from exactly the model the other arms start from. Returns True
    when the stage was seeded (or already was).
    """
    d_key = _sft_stage_key(dst)
    if dst.fresh or d_key != _sft_stage_key(src):
        return False
    s_dir, d_dir = Path(src.run.output_dir), Path(dst.run.output_dir)
    s_done = _read_json(s_dir / "stages" / "sft" / "DONE")
    if not s_done or s_done.get("key") != d_key:
        return False  # the source is not finished, or demo.py keys its stage differently now
    d_done = _read_json(d_dir / "stages" / "sft" / "DONE")
    if d_done and d_done.get("key") == d_key:
        return True
    for name in ("sft", "tokenizer"):
        if (d_dir / name).exists():
            shutil.rmtree(d_dir / name)
        shutil.copytree(s_dir / name, d_dir / name)
    for name in ("sft_train.jsonl", "sft_eval.jsonl"):
        (d_dir / "data").mkdir(parents=True, exist_ok=True)
        shutil.copy2(s_dir / "data" / name, d_dir / "data" / name)
    stage_dir = d_dir / "stages" / "sft"
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    write_text_atomic(stage_dir / "DONE", json.dumps({"key": d_key, "result": {**s_done.get("result", {}),
                                                                           "seeded_from": str(s_dir)}}, sort_keys=True))
    return True


# ---------------------------------------------------------------------------------------------
# the final evaluation (run in a subprocess: `python -m fourfold.experiments evaluate SPEC.json`)
# ---------------------------------------------------------------------------------------------


def eval_prompts(cfg: ExperimentsConfig) -> list[str]:
    """The held-out prompts every policy is evaluated on (the demo's eval prompts)."""
    from fourfold.tasks import get_task

    task = get_task("review", **cfg.demo.task_options)
    return task.sample_prompts(cfg.eval_prompts, random.Random(cfg.demo.run.seed + EVAL_PROMPT_SEED_OFFSET))


def evaluate_spec(spec: Mapping[str, Any]) -> dict:
    """Evaluate one saved policy as the spec says; writes and returns {key, summary, rows}.

    spec: policy, reference, reward (directories), task_options, prompts, sample_seed,
    max_new_tokens, temperature, out (JSON path), key, threads.
    """
    import torch

    from fourfold.evaluation import evaluate_policy
    from fourfold.models.loading import load_causal_lm, load_sequence_scorer, load_tokenizer
    from fourfold.models.roles import FrozenReference, ScalarModel
    from fourfold.tasks import get_task
    from fourfold.trainers.common import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(int(spec.get("threads") or 1))
    task = get_task("review", **spec["task_options"])
    tok = load_tokenizer(spec["reference"])
    ref = FrozenReference(load_causal_lm(spec["reference"]))
    rm = ScalarModel(load_sequence_scorer(spec["reward"])).eval()
    policy = ref.model if spec["policy"] == spec["reference"] else load_causal_lm(spec["policy"])
    gen = GenerationConfig(max_new_tokens=spec["max_new_tokens"], temperature=spec["temperature"])
    prompts = list(spec["prompts"])
    torch.manual_seed(spec["sample_seed"])
    t0 = time.perf_counter()
    summary, rows = evaluate_policy(policy, ref, rm, tok, task, prompts, gen)
    lengths = [len(r["response"].split()) for r in rows]
    summary.update({"n": len(rows), "length_std": _sd(lengths), "kl_std": _sd([r["kl"] for r in rows]),
                    "eval_s": round(time.perf_counter() - t0, 2)})
    result = {"key": spec["key"], "summary": summary, "rows": rows}
    write_text_atomic(Path(spec["out"]), json.dumps(result, sort_keys=True))
    return result


# ---------------------------------------------------------------------------------------------
# jobs: subprocesses, `workers` at a time, with dependencies
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Job:
    """A named chain of commands run in one worker slot, after the jobs named in ``deps``.
    ``prepare()`` runs in this process right before the job starts and returns the commands (an
    empty list when everything is already done)."""

    name: str
    prepare: Callable[[], list[list[str]]]
    deps: tuple[str, ...] = ()
    progress: Callable[[], str] | None = None


def _child_env(threads: int | None) -> dict:
    env = dict(os.environ)
    n = str(threads or 1)
    env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    return env


def run_jobs(jobs: Sequence[Job], *, workers: int, log_dir: Path, threads: int | None,
             log: Callable[[str], None], status_every: float = 60.0) -> dict[str, str]:
    """Run the jobs; returns {name: 'done' | 'cached' | 'failed: ...' | 'skipped: ...'}.

    A failed job fails nothing but the jobs that depend on it. On KeyboardInterrupt every running
    child gets SIGTERM (trainers checkpoint and exit), then the interrupt propagates.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    env = _child_env(threads)
    pending = list(jobs)
    names = {j.name for j in jobs}
    state: dict[str, str] = {}
    running: dict[str, tuple[Job, subprocess.Popen, list[list[str]], float, Any]] = {}
    t_start = last_status = time.perf_counter()
    total = len(jobs)

    def start(job: Job, cmds: list[list[str]], t0: float) -> None:
        f = open(log_dir / f"{job.name.replace('/', '_')}.log", "a", encoding="utf-8")
        f.write(f"\n$ {' '.join(cmds[0])}\n")
        f.flush()
        proc = subprocess.Popen(cmds[0], stdout=f, stderr=subprocess.STDOUT, env=env)
        running[job.name] = (job, proc, cmds[1:], t0, f)

    try:
        while pending or running:
            for job in list(pending):
                if len(running) >= workers:
                    break
                bad = [d for d in job.deps if d in names and state.get(d, "").startswith(("failed", "skipped"))]
                if bad:
                    pending.remove(job)
                    state[job.name] = f"skipped: {bad[0]} did not finish"
                    log(f"  skip {job.name} ({bad[0]} did not finish)")
                    continue
                if any(d in names and state.get(d) not in ("done", "cached") for d in job.deps):
                    continue
                pending.remove(job)
                try:
                    cmds = job.prepare()
                except Exception as e:  # noqa: BLE001 - one bad job must not stop the sweep
                    state[job.name] = f"failed: {type(e).__name__}: {e}"
                    log(f"  [red]fail[/red] {job.name}: {e}")
                    continue
                if not cmds:
                    state[job.name] = "cached"
                    continue
                log(f"  start {job.name}")
                start(job, cmds, time.perf_counter())
            if not running and pending:
                raise ExperimentError(f"jobs wait on unknown dependencies: {[j.name for j in pending]}")
            time.sleep(0.25)
            for name in list(running):
                job, proc, rest, t0, f = running[name]
                rc = proc.poll()
                if rc is None:
                    continue
                f.close()
                del running[name]
                if rc != 0:
                    state[name] = f"failed: exit status {rc} (log: {log_dir / (name.replace('/', '_') + '.log')})"
                    log(f"  [red]fail[/red] {name} (exit status {rc}); last lines of its log:\n"
                        + _tail(log_dir / f"{name.replace('/', '_')}.log"))
                elif rest:
                    start(job, rest, t0)
                else:
                    state[name] = "done"
                    n_done = sum(1 for s in state.values() if s in ("done", "cached"))
                    log(f"  done  {name} in {_duration(time.perf_counter() - t0)}  "
                        f"[{n_done}/{total}, {_duration(time.perf_counter() - t_start)} so far]")
            if running and time.perf_counter() - last_status > status_every:
                last_status = time.perf_counter()
                parts = [f"{n} {j.progress()}" if j.progress else n for n, (j, *_) in running.items()]
                log(f"  ... running: {', '.join(parts)}")
    except KeyboardInterrupt:
        for name, (_, proc, _, _, f) in running.items():
            if proc.poll() is None:
                proc.terminate()
        for name, (_, proc, _, _, f) in running.items():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            f.close()
        raise
    return state


# ---------------------------------------------------------------------------------------------
# results: final evaluations and curves
# ---------------------------------------------------------------------------------------------

CURVE_KEYS = ("reward/gold_mean", "reward/score_mean", "kl/k1", "rollout/response_length")


def read_curves(run_dir: Path) -> dict[str, list[float]]:
    """Per-iteration series of CURVE_KEYS (plus 'iteration' and 'time/iteration_s') of one run."""
    from fourfold.reporting import read_metrics

    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "iteration" in r]
    by_it: dict[int, dict] = {}
    for r in rows:
        by_it[int(r["iteration"])] = r  # a resumed run may repeat an iteration: the last one counts
    its = sorted(by_it)
    out = {"iteration": [float(i) for i in its]}
    for k in CURVE_KEYS + ("time/iteration_s",):
        out[k] = [math.nan if by_it[i].get(k) is None else float(by_it[i][k]) for i in its]
    return out


def _sd_units(x: float, base: float, sd: float) -> float:
    return (x - base) / sd if sd and sd > 0 else math.nan


def summarize_arm(finals: Sequence[Mapping], curves: Sequence[Mapping], sft: Mapping, proxy_sft: Mapping) -> dict:
    """Mean and sd over seeds of the final evaluation (raw and in SFT sd units), and the spread of
    gold across seeds (final evaluation) and across iterations (training batches, last quarter)."""
    out: dict[str, Any] = {"seeds": len(finals)}
    for k in ("proxy", "gold", "kl", "length", "well_formed", "repetition"):
        vals = [f[k] for f in finals]
        out[k], out[k + "_sd"] = _mean(vals), _sd(vals)
    gold_u = [_sd_units(f["gold"], sft["gold"], sft["gold_std"]) for f in finals]
    proxy_u = [_sd_units(f["proxy"], proxy_sft["proxy"], proxy_sft["proxy_std"]) for f in finals]
    out["gold_delta_sd"], out["gold_delta_sd_sd"] = _mean(gold_u), _sd(gold_u)
    out["proxy_delta_sd"], out["proxy_delta_sd_sd"] = _mean(proxy_u), _sd(proxy_u)
    out["gold_spread_seeds_sd"] = _sd(gold_u) if len(gold_u) > 1 else math.nan  # undefined for one seed
    within = []
    for c in curves:
        g = [x for x in c.get("reward/gold_mean", []) if math.isfinite(x)]
        tail = g[len(g) - max(2, len(g) // 4):] if len(g) >= 2 else []
        if tail:
            within.append(_sd(tail) / sft["gold_std"] if sft["gold_std"] else math.nan)
    out["gold_spread_iters_sd"] = _mean(within)
    times = [t for c in curves for t in c.get("time/iteration_s", []) if math.isfinite(t)]
    out["s_per_iteration"] = _mean(times)
    return out


# ---------------------------------------------------------------------------------------------
# the claims, computed from the numbers
# ---------------------------------------------------------------------------------------------


def _by_seed(rows: Sequence[Mapping]) -> dict[int, Mapping]:
    return {int(r.get("seed", i)): r for i, r in enumerate(rows)}


def _paired(finals: Mapping[str, Sequence[Mapping]], *arms: str) -> list[tuple[int, tuple[Mapping, ...]]]:
    """Seeds present in every named arm, with each arm's row for that seed."""
    maps = [_by_seed(finals[a]) for a in arms]
    seeds = sorted(set.intersection(*(set(m) for m in maps)))
    return [(s, tuple(m[s] for m in maps)) for s in seeds]


def _se(row: Mapping, key: str) -> float:
    """Standard error of an evaluation mean (per-sample sd / sqrt(n); a share uses p(1-p))."""
    n = max(int(row.get("n", 1)), 1)
    if key in ("well_formed", "repetition"):
        p = float(row[key])
        return math.sqrt(max(p * (1 - p), 0.0) / n)
    return float(row.get(f"{key}_std", 0.0)) / math.sqrt(n)


def _seeds_txt(ok: Sequence[bool]) -> str:
    return f"{sum(ok)}/{len(ok)} seeds"


def _list(xs: Sequence[float], digits: int = 2, signed: bool = True) -> str:
    return ", ".join(_signed(x, digits) if signed else _fmt(x, digits) for x in xs)


def compute_claims(finals: Mapping[str, Sequence[Mapping]], sft: Mapping, claims: ExperimentsClaimsConfig, *,
                   kl_coef: float, ppo_epochs: int = 4,
                   proxy_sft: Mapping[str, Mapping] | None = None) -> tuple[list[dict], list[str]]:
    """The claims table from the final evaluations.

    finals: {arm: [per-seed summary]} with keys seed, n, proxy, gold, kl, length, well_formed,
    repetition, gold_std, length_std; sft: the SFT model's summary on the same prompts (plus
    proxy_std); proxy_sft: {arm: SFT summary under that arm's RM} (default: sft) for proxy units;
    kl_coef, ppo_epochs: ppo's beta and epochs. Returns (rows, notes): rows have claim, measured, threshold, holds ('yes' or
    'no') and group; notes say which claim groups could not be checked and why.
    """
    c = claims
    proxy_sft = proxy_sft or {}
    gsd = sft["gold_std"] if sft.get("gold_std") else math.nan
    rows: list[dict] = []
    notes: list[str] = []

    def need(group: str, *arms: str) -> bool:
        if group not in c.groups:
            return False
        missing = [a for a in arms if not finals.get(a)]
        if missing:
            notes.append(f"claims '{group}' not checked: arm {', '.join(missing)} did not run or has no results")
            return False
        if not _paired(finals, *arms):
            notes.append(f"claims '{group}' not checked: arms {', '.join(arms)} share no seed")
            return False
        return True

    def add(group: str, claim: str, measured: str, threshold: str, holds: bool) -> None:
        rows.append({"group": group, "claim": claim, "measured": measured, "threshold": threshold,
                     "holds": "yes" if holds else "no"})

    def gold_u(row: Mapping) -> float:
        return (row["gold"] - sft["gold"]) / gsd

    def beats(a: str, b: str) -> tuple[list[float], list[float], list[bool]]:
        """Per seed: gold difference a - b (sd), its noise threshold (sd), and whether it is beyond."""
        diffs, thr, ok = [], [], []
        for _, (ra, rb) in _paired(finals, a, b):
            d = (ra["gold"] - rb["gold"]) / gsd
            t = c.noise_z * math.hypot(_se(ra, "gold"), _se(rb, "gold")) / gsd
            diffs.append(d), thr.append(t), ok.append(d > t)
        return diffs, thr, ok

    def spread(arm: str) -> str:
        g = [gold_u(r) for r in finals[arm]]
        return f"{arm} {_signed(_mean(g))} +- {_fmt(_sd(g), 2)} sd"

    if need("ppo", "ppo"):
        ppo = sorted(finals["ppo"], key=lambda r: r.get("seed", 0))
        gains = [gold_u(r) for r in ppo]
        add("ppo", "ppo raises gold reward above the SFT model's",
            f"gold gain {_list(gains)} sd ({_seeds_txt([g >= c.ppo_min_gold_gain_sd for g in gains])})",
            f">= {c.ppo_min_gold_gain_sd:g} sd in every seed", all(g >= c.ppo_min_gold_gain_sd for g in gains))
        psft = proxy_sft.get("ppo", sft)
        bounds = [(r["proxy"] - psft["proxy"]) / kl_coef if kl_coef > 0 else math.inf for r in ppo]
        kls = [r["kl"] for r in ppo]
        ok = [k <= b for k, b in zip(kls, bounds)]
        add("ppo", "ppo's KL to the reference stays bounded by the penalty (its KL-regularised objective "
                   "proxy - beta*KL is not below the SFT model's)",
            f"KL {_list(kls, 1, False)} nats; proxy gain / beta {_list(bounds, 1, False)} nats ({_seeds_txt(ok)})",
            "KL <= proxy gain / beta in every seed", all(ok))
        ratios = [r["well_formed"] / sft["well_formed"] if sft["well_formed"] > 0 else math.inf for r in ppo]
        add("ppo", "ppo keeps responses well formed",
            f"well-formed {_list([r['well_formed'] for r in ppo], 2, False)} vs SFT {_fmt(sft['well_formed'], 2)} "
            f"(ratio {_list(ratios, 2, False)})",
            f">= {c.ppo_min_well_formed_ratio:g} x SFT's in every seed",
            all(x >= c.ppo_min_well_formed_ratio for x in ratios))

    if need("beta0", "ppo", "ppo-beta0"):
        pairs = _paired(finals, "ppo-beta0", "ppo")
        below_sft = [-gold_u(b) for _, (b, p) in pairs]
        below_ppo = [(p["gold"] - b["gold"]) / gsd for _, (b, p) in pairs]
        ok = [s >= c.beta0_min_gold_drop_sd and q >= c.beta0_min_gold_drop_sd for s, q in zip(below_sft, below_ppo)]
        add("beta0", "beta = 0 hacks the reward model: gold falls below the SFT model's and ppo's",
            f"below SFT by {_list(below_sft)} sd, below ppo by {_list(below_ppo)} sd ({_seeds_txt(ok)})",
            f">= {c.beta0_min_gold_drop_sd:g} sd below both in every seed", all(ok))
        ratios = [b["kl"] / p["kl"] if p["kl"] > 0 else math.inf for _, (b, p) in pairs]
        add("beta0", "beta = 0 drifts far from the reference",
            f"KL {_list([b['kl'] for _, (b, p) in pairs], 1, False)} vs ppo {_list([p['kl'] for _, (b, p) in pairs], 1, False)} "
            f"nats (ratio {_list(ratios, 1, False)})",
            f">= {c.beta0_min_kl_ratio:g} x ppo's in every seed", all(r >= c.beta0_min_kl_ratio for r in ratios))
        wf = [p["well_formed"] - b["well_formed"] for _, (b, p) in pairs]
        rep = [b["repetition"] - p["repetition"] for _, (b, p) in pairs]
        ok = [max(w, r) >= c.beta0_min_degeneration for w, r in zip(wf, rep)]
        add("beta0", "beta = 0 degenerates (well-formed share or repetition clearly worse than ppo's)",
            f"well-formed lower by {_list(wf)}, repetition higher by {_list(rep)} ({_seeds_txt(ok)})",
            f"either >= {c.beta0_min_degeneration:g} in every seed", all(ok))
        psft = proxy_sft.get("ppo", sft)
        psd = psft.get("proxy_std") or math.nan
        dp = [(b["proxy"] - p["proxy"]) / psd for _, (b, p) in pairs]
        add("beta0", "beta = 0 still scores as high on the proxy (the RM is fooled)",
            f"proxy minus ppo's {_list(dp)} sd ({_seeds_txt([d >= -c.beta0_proxy_margin_sd for d in dp])})",
            f">= -{c.beta0_proxy_margin_sd:g} sd in every seed", all(d >= -c.beta0_proxy_margin_sd for d in dp))

    if need("beta-high", "ppo-beta-high"):
        hi = sorted(finals["ppo-beta-high"], key=lambda r: r.get("seed", 0))
        kls = [r["kl"] for r in hi]
        add("beta-high", "a very high beta keeps the policy at the SFT model (KL)",
            f"KL {_list(kls, 3, False)} nats per response",
            f"< {c.beta_high_max_kl:g} nats in every seed", all(k < c.beta_high_max_kl for k in kls))
        for key, unit in (("gold", "sd"), ("length", "words")):
            m = _mean([r[key] for r in hi])
            n_all = sum(int(r.get("n", 1)) for r in hi)
            var = _mean([float(r.get(f"{key}_std", 0.0)) ** 2 for r in hi])
            se = math.hypot(math.sqrt(var / max(n_all, 1)), _se(sft, key))
            diff, thr = m - sft[key], c.noise_z * se
            scale = gsd if key == "gold" else 1.0
            add("beta-high", f"a very high beta keeps the policy at the SFT model ({key})",
                f"{key} {_signed(diff / scale)} {unit} from SFT's (mean over {len(hi)} seeds)",
                f"within +-{_fmt(thr / scale, 2)} {unit} ({c.noise_z:g} standard errors of the evaluation)",
                abs(diff) <= thr)

    if need("epochs", "ppo", "ppo-1epoch"):
        d, t, ok = beats("ppo", "ppo-1epoch")
        add("epochs", f"{ppo_epochs} epochs per batch beat 1 epoch on gold at equal samples",
            f"gold difference {_list(d)} sd ({_seeds_txt(ok)}); {spread('ppo')}, {spread('ppo-1epoch')}",
            f"> {c.noise_z:g} evaluation standard errors ({_list(t, 2, False)} sd) in every seed", all(ok))

    rf = sorted((a for a in finals if a.startswith("reinforce-lr") and finals[a]), key=_lr_of)
    if "reinforce" in c.groups:
        if not rf:
            notes.append("claims 'reinforce' not checked: no reinforce arm has results")
        elif need("reinforce", "ppo", *rf):
            same = [a for a in rf if _lr_of(a) == 1.0]
            if same:
                a = same[0]
                diffs = [(p["gold"] - r["gold"]) / gsd for _, (p, r) in _paired(finals, "ppo", a)]
                ok = [x >= c.clear_margin_sd for x in diffs]
                add("reinforce", "ppo clearly beats naive REINFORCE at the same learning rate",
                    f"gold difference {_list(diffs)} sd ({_seeds_txt(ok)}); {spread('ppo')}, {spread(a)}",
                    f">= {c.clear_margin_sd:g} sd in every seed", all(ok))
            else:
                notes.append("claim 'ppo clearly beats REINFORCE at the same learning rate' not checked: "
                             "reinforce_lr_multipliers has no 1.0")
            best = max(rf, key=lambda a: _mean([r["gold"] for r in finals[a]]))
            d, t, ok = beats("ppo", best)
            add("reinforce", f"ppo beats REINFORCE at its best learning rate tried ({best}, of {', '.join(rf)})",
                f"gold difference {_list(d)} sd ({_seeds_txt(ok)}); spread over seeds: {spread('ppo')}, {spread(best)}",
                f"> {c.noise_z:g} evaluation standard errors ({_list(t, 2, False)} sd) in every seed", all(ok))

    if need("critic", "ppo", "ppo-no-critic"):
        d, t, ok = beats("ppo", "ppo-no-critic")
        add("critic", "the critic's baseline helps: ppo beats ppo-no-critic on gold",
            f"gold difference {_list(d)} sd ({_seeds_txt(ok)}); {spread('ppo')}, {spread('ppo-no-critic')}",
            f"> {c.noise_z:g} evaluation standard errors ({_list(t, 2, False)} sd) in every seed", all(ok))

    if need("length", "ppo", "ppo-unbiased-rm"):
        pairs = _paired(finals, "ppo", "ppo-unbiased-rm")
        drift_b = [p["length"] - sft["length"] for _, (p, u) in pairs]
        drift_u = [u["length"] - sft["length"] for _, (p, u) in pairs]
        thr = [c.noise_z * math.hypot(_se(p, "length"), _se(u, "length")) for _, (p, u) in pairs]
        ok = [b - u > t for b, u, t in zip(drift_b, drift_u, thr)]
        add("length", "the labelers' length bias makes ppo verbose: its length drift exceeds "
                      "ppo-unbiased-rm's",
            f"length drift vs SFT: ppo {_list(drift_b, 1)}, unbiased RM {_list(drift_u, 1)} words ({_seeds_txt(ok)})",
            f"difference > {c.noise_z:g} evaluation standard errors ({_list(thr, 1, False)} words) in every seed",
            all(ok))
    return rows, notes


def _lr_of(arm: str) -> float:
    try:
        return float(arm[len("reinforce-lr"):].rstrip("x"))
    except ValueError:
        return math.nan


# ---------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------

RESULT_COLUMNS = (
    ("arm", "arm"), ("seeds", "seeds"), ("proxy", "proxy (RM)"), ("proxy_delta_sd", "proxy - SFT (sd)"),
    ("gold", "gold"), ("gold_delta_sd", "gold - SFT (sd)"), ("kl", "KL (nats)"), ("length", "length (words)"),
    ("well_formed", "well-formed"), ("repetition", "repetition"), ("gold_spread_seeds_sd", "gold sd over seeds (sd)"),
    ("gold_spread_iters_sd", "gold sd over iterations (sd)"),
)


def _cell(row: Mapping, key: str) -> str:
    if key in ("arm", "seeds"):
        return str(row.get(key, ""))
    v = row.get(key)
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    digits = 1 if key in ("length", "kl") else 2 if key.endswith("_sd") or key in ("well_formed", "repetition") else 3
    sd = row.get(key + "_sd") if key not in ("gold_spread_seeds_sd", "gold_spread_iters_sd") else None
    text = f"{v:+.{digits}f}" if key.endswith("delta_sd") else f"{v:.{digits}f}"
    if sd is not None and row.get("seeds", 1) > 1 and math.isfinite(sd):
        text += f" ± {sd:.{digits}f}"
    return text


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(esc(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "\n".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    c = f' class="{cls}"' if cls else ""
    return f"<table{c}>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def _smooth(xs: Sequence[float], w: int) -> list[float]:
    out = []
    for i in range(len(xs)):
        win = [x for x in xs[max(0, i - w + 1): i + 1] if math.isfinite(x)]
        out.append(sum(win) / len(win) if win else math.nan)
    return out


def _seed_band(curves: Sequence[Mapping], key: str, w: int) -> tuple[list[float], list[float], list[float], list[float]]:
    """(iterations, mean, min, max) over seeds of a smoothed per-iteration series."""
    n = min((len(c.get(key, [])) for c in curves), default=0)
    if n == 0:
        return [], [], [], []
    its = list(curves[0]["iteration"][:n])
    series = [_smooth(c[key][:n], w) for c in curves]
    cols = list(zip(*series))
    mean = [_mean(col) for col in cols]
    lo = [min((x for x in col if math.isfinite(x)), default=math.nan) for col in cols]
    hi = [max((x for x in col if math.isfinite(x)), default=math.nan) for col in cols]
    return its, mean, lo, hi


def _colors(arms: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {a: cmap(i % 10) for i, a in enumerate(arms)}


def _curves_figure(curves: Mapping[str, Sequence[Mapping]], sft: Mapping, iterations: int) -> str:
    from matplotlib.figure import Figure

    from fourfold.reporting import fig_to_data_uri

    w = max(1, round(iterations / 12))
    arms = [a for a in curves if curves[a]]
    col = _colors(arms)
    fig = Figure(figsize=(12, 7.2))
    panels = (("reward/gold_mean", "gold reward (training batches)"), ("reward/score_mean", "proxy: RM score"),
              ("kl/k1", "KL to the reference (nats, k1)"), ("rollout/response_length", "response length (tokens)"))
    for i, (key, title) in enumerate(panels):
        ax = fig.add_subplot(2, 2, i + 1)
        for a in arms:
            its, m, lo, hi = _seed_band(curves[a], key, w)
            if not its:
                continue
            ax.plot(its, m, label=a, color=col[a], linewidth=1.4)
            if len(curves[a]) > 1:
                ax.fill_between(its, lo, hi, color=col[a], alpha=0.15, linewidth=0)
        if key == "reward/gold_mean":
            ax.axhline(sft["gold"], color="black", linestyle=":", linewidth=1, label="SFT (final evaluation)")
        if key == "kl/k1":
            ax.set_yscale("symlog", linthresh=0.1)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("iteration (same samples per iteration for every arm)", fontsize=8)
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"mean over seeds (line) and min-max band; moving average over {w} iterations", fontsize=9)
    fig.tight_layout()
    return fig_to_data_uri(fig, dpi=80)


def _frontier_figure(curves: Mapping[str, Sequence[Mapping]], finals: Mapping[str, Sequence[Mapping]],
                     sft: Mapping, iterations: int) -> str:
    from matplotlib.figure import Figure

    from fourfold.reporting import fig_to_data_uri

    w = max(3, iterations // 8)
    arms = [a for a in curves if curves[a]]
    col = _colors(arms)
    fig = Figure(figsize=(12, 4.2))
    for i, (key, fkey, title) in enumerate((("reward/score_mean", "proxy", "proxy (RM score) vs KL"),
                                            ("reward/gold_mean", "gold", "gold reward vs KL"))):
        ax = fig.add_subplot(1, 2, i + 1)
        for a in arms:
            for c in curves[a]:  # every training batch of every seed
                ax.scatter(c["kl/k1"], c[key], color=col[a], s=6, alpha=0.3, linewidth=0)
            _, kl, _, _ = _seed_band(curves[a], "kl/k1", w)
            _, y, _, _ = _seed_band(curves[a], key, w)
            if kl:
                ax.plot(kl, y, color=col[a], linewidth=1.5, label=a, alpha=0.9)
            fin = finals.get(a) or []
            if fin:
                ax.scatter([f["kl"] for f in fin], [f[fkey] for f in fin], color=col[a], marker="o", s=18,
                           edgecolor="black", linewidth=0.5, zorder=3)
        ax.scatter([0.0], [sft[fkey]], color="black", marker="*", s=80, zorder=4, label="SFT (eval)")
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("KL to the reference (nats per response)", fontsize=8)
        ax.grid(alpha=0.3)
        if i == 1:
            ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"the over-optimisation frontier: small dots are training batches, lines their seed mean "
                 f"(moving average over {w} iterations), ringed dots each seed's final evaluation", fontsize=9)
    fig.tight_layout()
    return fig_to_data_uri(fig, dpi=80)


def write_summary_md(path: Path, *, header: str, result_rows: Sequence[Mapping], claims: Sequence[Mapping],
                     notes: Sequence[str]) -> None:
    table = _md_table([h for _, h in RESULT_COLUMNS], [[_cell(r, k) for k, _ in RESULT_COLUMNS] for r in result_rows])
    claim_table = _md_table(["claim", "measured", "threshold", "holds"],
                            [[c["claim"], c["measured"], c["threshold"], c["holds"]] for c in claims])
    parts = [header, "## Results at the end of the budget", "", table, ""]
    if notes:
        parts += ["## Not checked", ""] + [f"- {n}" for n in notes] + [""]
    parts += ["## Claims", "", claim_table, ""]
    write_text_atomic(path, "\n".join(parts))


def _samples_html(finals_rows: Mapping[str, list[dict]], sft_rows: list[dict], n: int) -> str:
    if n <= 0 or not sft_rows:
        return ""
    parts = []
    for i, base in enumerate(sft_rows[:n]):
        rows = [["SFT", base["response"], _fmt(base["proxy"], 2), _fmt(base["gold"], 2)]]
        for arm, rs in finals_rows.items():
            if i < len(rs):
                r = rs[i]
                rows.append([arm, r["response"], _fmt(r["proxy"], 2), _fmt(r["gold"], 2)])
        parts.append(f"<h3>prompt: <code>{html.escape(base['prompt'])}</code></h3>"
                     + _html_table(["model", "response", "proxy", "gold"], rows, cls="samples"))
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------------------------


def run(cfg: ExperimentsConfig) -> dict:
    """Run (or resume) the sweep and write the report; returns {output_dir, claims, summaries}."""
    from rich.console import Console

    from fourfold import demo

    t_start = time.perf_counter()
    if cfg.quick:
        cfg = apply_quick(cfg)
    if cfg.demo.quick:  # the quick demo's settings (its PPO batch too) are what the arms start from
        cfg = dataclasses.replace(cfg, demo=demo.apply_quick(cfg.demo))
    console = Console(stderr=True, highlight=False)
    log = console.print if cfg.run.progress else (lambda *a, **k: None)
    out = Path(cfg.run.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    if cfg.fresh:
        for name in ("runs", "baseline", "configs", "logs"):
            if (out / name).exists():
                shutil.rmtree(out / name)
    gold_opts = [k for k in cfg.demo.task_options if not k.startswith("labeler_")]
    if gold_opts:
        log(f"[yellow]note[/yellow]: the training curves' gold (reward/gold_mean) uses the default review task; "
            f"task options {gold_opts} apply to the final evaluation only")
    arms = build_arms(cfg)
    log(f"[bold]fourfold experiments[/bold]: {len(arms)} arms x {len(cfg.seeds)} seeds, {cfg.iterations} iterations "
        f"x {cfg.demo.ppo.rollout_batch_size} samples each, {cfg.workers} workers -> {out}")

    # 1. the demo's SFT model and reward model (cached; shared with `fourfold demo`)
    log("[bold]1/4 demo stages[/bold] (SFT, pairs, reward model; cached in "
        f"{cfg.demo.run.output_dir})")
    d_res = demo.run(cfg.demo, stop_after="reward")
    demo_dir = Path(d_res["output_dir"]).resolve()
    sft_dir, rm_dir = demo_dir / "sft", demo_dir / "reward"
    ucfg = unbiased_demo_config(cfg)
    u_dir = Path(ucfg.run.output_dir).resolve()
    need_unbiased = any(a.rm == "unbiased" for a in arms)

    def demo_keys(which: str) -> dict:
        d = demo_dir if which == "biased" else u_dir
        return {"sft": _stage_key(demo_dir, "sft"), "reward": _stage_key(d, "reward"),
                "rm_task": cfg.demo.task_options if which == "biased" else ucfg.task_options}

    # 2. the jobs
    prompts = eval_prompts(cfg)
    sample_seed = cfg.demo.run.seed + EVAL_SAMPLE_SEED_OFFSET
    gen = cfg.demo.generation
    eval_settings = {"prompts": prompts, "sample_seed": sample_seed, "max_new_tokens": gen.max_new_tokens,
                     "temperature": gen.temperature, "gold_task": cfg.demo.task_options}
    py = sys.executable
    jobs: list[Job] = []

    def eval_cmd(spec: dict) -> list[str]:
        p = out / "configs" / f"eval-{spec['name']}.json"
        write_text_atomic(p, json.dumps(spec, sort_keys=True))
        return [py, "-m", "fourfold.experiments", "evaluate", str(p)]

    def eval_spec(name: str, policy: Path, rm: Path, key: str, dest: Path) -> dict:
        return {"name": name, "policy": str(policy), "reference": str(sft_dir), "reward": str(rm),
                "task_options": cfg.demo.task_options, "prompts": prompts, "sample_seed": sample_seed,
                "max_new_tokens": gen.max_new_tokens, "temperature": gen.temperature, "out": str(dest),
                "key": key, "threads": cfg.run.threads or 1}

    if need_unbiased:
        def prep_unbiased() -> list[list[str]]:
            seeded = seed_sft_stage(cfg.demo, ucfg)
            if not seeded:
                log("  (the unbiased demo trains its own SFT model: its SFT stage could not be copied)")
            p = out / "configs" / "demo-unbiased.yaml"
            save_config(ucfg, p)
            return [[py, "-m", "fourfold.experiments", "prepare-demo", str(p)]]

        jobs.append(Job("demo-unbiased", prep_unbiased))

    for which in (["biased", "unbiased"] if need_unbiased else ["biased"]):
        def prep_baseline(which=which) -> list[list[str]]:
            rm = rm_dir if which == "biased" else u_dir / "reward"
            key = _key({"eval": eval_settings, "demo": demo_keys(which), "policy": "sft"})
            dest = out / "baseline" / f"sft-{which}-rm.json"
            rec = _read_json(dest)
            if rec and rec.get("key") == key:
                return []
            return [eval_cmd(eval_spec(f"sft-{which}-rm", sft_dir, rm, key, dest))]

        jobs.append(Job(f"sft/{which}-rm", prep_baseline, deps=("demo-unbiased",) if which == "unbiased" else ()))

    run_dirs: dict[tuple[str, int], Path] = {}
    for seed in cfg.seeds:
        for arm in arms:
            run_dir = out / "runs" / arm.name / f"seed{seed}"
            run_dirs[(arm.name, seed)] = run_dir

            def prep_run(arm=arm, seed=seed, run_dir=run_dir) -> list[list[str]]:
                rm = rm_dir if arm.rm == "biased" else u_dir / "reward"
                rcfg = run_config(cfg, arm, seed, sft=sft_dir, rm=rm, run_dir=run_dir)
                key = _run_key(rcfg, arm.stage, demo_keys(arm.rm))
                marker = run_dir / "EXPERIMENT.json"
                rec = _read_json(marker)
                if run_dir.exists() and (not rec or rec.get("key") != key):
                    shutil.rmtree(run_dir)  # another config's run: never resume across configs
                    rec = None
                if rec is None:
                    write_text_atomic(marker, json.dumps({"key": key, "arm": arm.name, "seed": seed}, sort_keys=True))
                cmds = []
                if not (run_dir / "policy" / "config.json").is_file():
                    p = out / "configs" / f"{arm.name}-seed{seed}.yaml"
                    save_config(rcfg, p)
                    cmds.append([py, "-m", "fourfold.cli", arm.stage, "--config", str(p)])
                ekey = _key({"run": key, "eval": eval_settings, "rm": demo_keys(arm.rm)})
                dest = run_dir / "final_eval.json"
                rec = _read_json(dest)
                if cmds or not rec or rec.get("key") != ekey:
                    cmds.append(eval_cmd(eval_spec(f"{arm.name}-seed{seed}", run_dir / "policy", rm, ekey, dest)))
                return cmds

            def progress(run_dir=run_dir) -> str:
                c = read_curves(run_dir) if (run_dir / "metrics.jsonl").is_file() else {"iteration": []}
                return f"(it {int(c['iteration'][-1]) if c['iteration'] else 0}/{cfg.iterations})"

            jobs.append(Job(f"{arm.name}/seed{seed}", prep_run,
                            deps=("demo-unbiased",) if arm.rm == "unbiased" else (), progress=progress))

    log(f"[bold]2/4 runs[/bold] {len(jobs)} jobs, {cfg.workers} at a time (logs in {out / 'logs'})")
    t_jobs = time.perf_counter()
    state = run_jobs(jobs, workers=cfg.workers, log_dir=out / "logs", threads=cfg.run.threads, log=log)
    jobs_s = time.perf_counter() - t_jobs

    # 3. collect the final evaluations and curves
    log("[bold]3/4 results[/bold]")
    base = {}
    for which in ("biased", "unbiased"):
        rec = _read_json(out / "baseline" / f"sft-{which}-rm.json")
        if rec:
            base[which] = rec
    if "biased" not in base:
        raise ExperimentError(f"the SFT model's evaluation failed ({state.get('sft/biased-rm')}); "
                              f"see {out / 'logs'}")
    sft = base["biased"]["summary"]
    finals: dict[str, list[dict]] = {}
    rows_by_arm: dict[str, list[dict]] = {}
    curves: dict[str, list[dict]] = {}
    proxy_sft: dict[str, dict] = {}
    for arm in arms:
        proxy_sft[arm.name] = base.get(arm.rm, base["biased"])["summary"]
        for seed in cfg.seeds:
            rd = run_dirs[(arm.name, seed)]
            rec = _read_json(rd / "final_eval.json")
            if not rec or state.get(f"{arm.name}/seed{seed}") not in ("done", "cached"):
                continue
            finals.setdefault(arm.name, []).append({"seed": seed, **rec["summary"]})
            if arm.name not in rows_by_arm:
                rows_by_arm[arm.name] = rec["rows"]
            curves.setdefault(arm.name, []).append(read_curves(rd))
    summaries = {a: summarize_arm(finals[a], curves.get(a, []), sft, proxy_sft[a]) for a in finals}
    claims, notes = compute_claims(finals, sft, cfg.claims, kl_coef=cfg.demo.ppo.kl_coef,
                                   ppo_epochs=cfg.demo.ppo.ppo_epochs, proxy_sft=proxy_sft)
    failed = {k: v for k, v in state.items() if not v.startswith(("done", "cached"))}
    for name, why in failed.items():
        notes.append(f"{name}: {why}")

    # 4. the report
    log("[bold]4/4 report[/bold]")
    total_s = time.perf_counter() - t_start
    sft_row = {"arm": "SFT (reference)", "seeds": 1, **{k: sft[k] for k in ("proxy", "gold", "kl", "length",
                                                                        "well_formed", "repetition")},
               "gold_delta_sd": 0.0, "proxy_delta_sd": 0.0}
    result_rows = [sft_row] + [{"arm": a, **s} for a, s in summaries.items()]
    r_rm = d_res.get("reward_result", {})
    samples_per_run = cfg.iterations * cfg.demo.ppo.rollout_batch_size
    header = "\n".join([
        "# fourfold experiments", "",
        f"{len(arms)} arms x {len(cfg.seeds)} seeds (seeds {', '.join(map(str, cfg.seeds))}); every run "
        f"{cfg.iterations} iterations x {cfg.demo.ppo.rollout_batch_size} = {samples_per_run} sampled responses. "
        f"Final evaluation: {len(prompts)} held-out prompts, the same for every run and for the SFT model. "
        f"Gold and proxy differences are in units of the SFT model's per-sample sd on those prompts "
        f"(gold sd {_fmt(sft['gold_std'])}, proxy sd {_fmt(sft['proxy_std'])}). Values are mean ± sd over seeds.",
        "",
        f"Demo stages: {demo_dir} (RM held-out accuracy vs labelers {_fmt(r_rm.get('accuracy_vs_labelers'))}, "
        f"vs gold {_fmt(r_rm.get('accuracy_vs_gold'))})" + (f"; unbiased-labeler RM: {u_dir}" if need_unbiased else "")
        + f". ppo: kl_coef {cfg.demo.ppo.kl_coef:g}, {cfg.demo.ppo.ppo_epochs} epochs, lr {cfg.demo.ppo.lr:g}.",
        "",
        f"This invocation took {_duration(total_s)} (of which jobs {_duration(jobs_s)}, {cfg.workers} workers; "
        "finished runs are skipped on a rerun); mean seconds per training iteration by arm: "
        + ", ".join(f"{a} {_fmt(s['s_per_iteration'], 2)}" for a, s in summaries.items()) + ".",
        "",
    ])
    write_summary_md(out / "summary.md", header=header, result_rows=result_rows, claims=claims, notes=notes)
    results = {"config": config_to_dict(cfg), "sft": sft, "sft_unbiased_rm": base.get("unbiased", {}).get("summary"),
               "finals": finals, "summaries": summaries, "claims": claims, "notes": notes, "jobs": state,
               "wall_s": round(total_s, 1), "jobs_s": round(jobs_s, 1), "demo": {k: v for k, v in d_res.items()}}
    write_text_atomic(out / "results.json", json.dumps(results, indent=1, sort_keys=True, default=str))
    _write_report(out / "report.html", cfg=cfg, arms=arms, header=header, result_rows=result_rows, claims=claims,
                  notes=notes, curves=curves, finals=finals, sft=sft, rows_by_arm=rows_by_arm,
                  sft_rows=base["biased"]["rows"])
    held = sum(c["holds"] == "yes" for c in claims)
    log(f"\nclaims: {held}/{len(claims)} hold")
    for c in claims:
        log(f"  [{'green' if c['holds'] == 'yes' else 'red'}]{c['holds']:3s}[/] {c['claim']}: {c['measured']}")
    log(f"\nreport: {out / 'report.html'}\nsummary: {out / 'summary.md'}   ({_duration(total_s)})")
    if failed:
        raise ExperimentError(f"{len(failed)} of {len(jobs)} jobs did not finish ({', '.join(sorted(failed))}); "
                              f"the report covers the rest; logs in {out / 'logs'}; rerun to resume")
    return {"output_dir": str(out), "claims": claims, "summaries": summaries, "notes": notes}


def _write_report(path: Path, *, cfg: ExperimentsConfig, arms: Sequence[Arm], header: str,
                  result_rows: Sequence[Mapping], claims: Sequence[Mapping], notes: Sequence[str],
                  curves: Mapping, finals: Mapping, sft: Mapping, rows_by_arm: Mapping, sft_rows: list) -> None:
    from fourfold.reporting import html_image, html_page

    def md_to_html(text: str) -> str:
        return "\n".join(f"<p>{html.escape(p)}</p>" for p in text.split("\n\n")[1:] if p.strip())

    claim_rows = "\n".join(
        f"<tr><td>{html.escape(c['claim'])}</td><td>{html.escape(c['measured'])}</td>"
        f"<td>{html.escape(c['threshold'])}</td>"
        f"<td style=\"font-weight:bold;color:{'#186a18' if c['holds'] == 'yes' else '#a01010'}\">{c['holds']}</td></tr>"
        for c in claims)
    body = [md_to_html(header),
            "<h2>Arms</h2>", _html_table(["arm", "what"], [[a.name, a.what] for a in arms]),
            "<h2>Claims</h2>",
            "<p>Computed from the final evaluations by <code>fourfold.experiments.compute_claims</code>; "
            "thresholds are config keys (<code>claims.*</code>).</p>",
            "<table><thead><tr><th>claim</th><th>measured</th><th>threshold</th><th>holds</th></tr></thead>"
            f"<tbody>{claim_rows}</tbody></table>"]
    if notes:
        body.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    body += ["<h2>Results at the end of the budget</h2>",
             _html_table([h for _, h in RESULT_COLUMNS], [[_cell(r, k) for k, _ in RESULT_COLUMNS] for r in result_rows]),
             "<p>gold sd over seeds: spread of the final gold across seeds; gold sd over iterations: spread of "
             "the training batches' gold over the last quarter of the run (mean over seeds); both in SFT sd.</p>"]
    if curves:
        body += ["<h2>Training curves</h2>", html_image(_curves_figure(curves, sft, cfg.iterations), "curves"),
                 "<h2>Gold vs KL</h2>",
                 "<p>As the policy moves away from the reference the proxy keeps rising while gold turns down: "
                 "that is over-optimisation of the reward model.</p>",
                 html_image(_frontier_figure(curves, finals, sft, cfg.iterations), "frontier")]
    if rows_by_arm and cfg.samples_in_report:
        body += [f"<h2>Samples at the end (seed {cfg.seeds[0]})</h2>",
                 _samples_html(rows_by_arm, sft_rows, cfg.samples_in_report)]
    write_text_atomic(path, html_page("fourfold experiments", "\n".join(body)))


# ---------------------------------------------------------------------------------------------
# the subprocess entry points
# ---------------------------------------------------------------------------------------------


def _main(argv: Sequence[str]) -> int:
    """``python -m fourfold.experiments evaluate SPEC.json`` | ``prepare-demo DEMO.yaml``."""
    if len(argv) != 2 or argv[0] not in ("evaluate", "prepare-demo"):
        print("usage: python -m fourfold.experiments evaluate SPEC.json | prepare-demo DEMO.yaml", file=sys.stderr)
        return 2
    try:
        if argv[0] == "evaluate":
            res = evaluate_spec(json.loads(Path(argv[1]).read_text(encoding="utf-8")))
            s = res["summary"]
            print(json.dumps({k: s[k] for k in ("proxy", "gold", "kl", "length", "well_formed", "repetition")}))
        else:
            from fourfold import demo
            from fourfold.config import load_config

            cfg = load_config(DemoConfig, argv[1])
            res = demo.run(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, progress=False)), stop_after="reward")
            print(json.dumps({k: res[k] for k in ("sft", "reward")}))
    except FourfoldError as e:
        print(f"fourfold experiments {argv[0]}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
