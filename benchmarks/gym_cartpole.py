"""PPO vs REINFORCE on CartPole-v1 over several seeds; prints one JSON line.

Runs ``fourfold.trainers.gym.train`` one run at a time (one torch thread each) for every
(config, seed), then reads each run's greedy-evaluation curve and reports, per config, the mean,
min and max over seeds of the evaluation return at each milestone (the first evaluation at or
after the milestone; the run's last evaluation for the final one), the env steps at which each
seed first reached the solved threshold, and the wall time per run. Writes the multi-seed plot.

    python benchmarks/gym_cartpole.py                                  # docs/gym.md's table
    python benchmarks/gym_cartpole.py --configs examples/acrobot.yaml --milestones 25000 50000 100000
    python benchmarks/gym_cartpole.py --seeds 1 --set ppo.ppo_epochs=10   # a quick variant
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
from pathlib import Path


def _at(evals: list, milestone: int, last: bool) -> float:
    """Eval return at the first evaluation at or after ``milestone`` (the last one if ``last``)."""
    if last:
        return evals[-1][1]
    for step, mean, _ in evals:
        if step >= milestone:
            return mean
    return evals[-1][1]


def _train_return(run_dir: str, milestone: int, window: int, last: bool) -> float:
    """Mean return of the sampled-action training episodes logged in (milestone - window,
    milestone] (the run's last ``window`` steps if ``last`` or the run ended before)."""
    from fourfold.reporting import read_metrics

    rows = [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if r.get("gym/episodic_return") is not None]
    end = rows[-1]["step"] if last else min(milestone, rows[-1]["step"])
    vals = [r["gym/episodic_return"] for r in rows if end - window < r["step"] <= end]
    return statistics.fmean(vals) if vals else float("nan")


def _stays_solved(evals: list, threshold) -> "int | None":
    """Env steps of the first evaluation from which every later evaluation reached the threshold."""
    if threshold is None:
        return None
    for i, (step, _, _) in enumerate(evals):
        if all(mean >= threshold for _, mean, _ in evals[i:]):
            return step
    return None


def _spread(vals: list) -> dict:
    return {"mean": statistics.fmean(vals), "min": min(vals), "max": max(vals), "std": statistics.pstdev(vals),
            "per_seed": vals}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["examples/cartpole.yaml", "examples/cartpole_reinforce.yaml"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--milestones", nargs="+", type=int, default=[25_000, 50_000, 100_000])
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides applied to every config")
    p.add_argument("--window", type=int, default=5000, help="env steps averaged for train_return")
    p.add_argument("--out", default="runs/bench_gym", help="parent directory of the runs")
    p.add_argument("--plot", default="docs/img/cartpole_seeds.png", help="multi-seed PNG ('' to skip)")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from fourfold.config import GymConfig, load_config
    from fourfold.trainers.gym import solved_threshold, train
    from fourfold.trainers.gym_plots import plot_seeds

    results, groups, threshold = {}, {}, None
    for config in args.configs:
        name = Path(config).stem
        runs = []
        for seed in args.seeds:
            out = Path(args.out) / f"{name}_seed{seed}"
            cfg = load_config(GymConfig, config, ["run.overwrite=true", *args.set, f"run.seed={seed}", f"run.output_dir={out}",
                                                  "run.progress=false", "run.tensorboard=false"])
            threshold = solved_threshold(cfg)
            with contextlib.redirect_stdout(io.StringIO()):  # train() prints its own JSON line
                summary = train(cfg)
            runs.append(summary)
            print(f"{name} seed {seed}: solved at {summary['first_solved_step']}, final "
                  f"{summary['eval_return_mean']:.1f}, {summary['wall_s']:.1f} s", file=sys.stderr)
        groups[f"{runs[0]['algo']} ({name})"] = [r["run_dir"] for r in runs]
        evals, train_returns = {}, {}
        for i, m in enumerate(args.milestones):
            last = i == len(args.milestones) - 1
            evals[str(m)] = _spread([_at(r["evals"], m, last) for r in runs])
            train_returns[str(m)] = _spread([_train_return(r["run_dir"], m, args.window, last) for r in runs])
        results[name] = {
            "algo": runs[0]["algo"], "env": runs[0]["env"], "seeds": args.seeds,
            "eval_return": evals,
            "train_return": train_returns,
            "first_solved_step": [r["first_solved_step"] for r in runs],
            "stays_solved_step": [_stays_solved(r["evals"], r["solved_threshold"]) for r in runs],
            "solved_all": all(r["first_solved_step"] is not None for r in runs),
            "env_steps": [r["env_steps"] for r in runs],
            "wall_s": [r["wall_s"] for r in runs],
        }
    if args.plot:
        env = next(iter(results.values()))["env"]
        plot_seeds(groups, args.plot, keys=("gym/eval_return", "gym/episodic_return"), threshold=threshold,
                   smooth_steps=args.window, title=f"{env}, {len(args.seeds)} seeds (band: min-max)")
    line = {"benchmark": "gym", "overrides": args.set, "results": results}
    print(json.dumps(line))
    return line


if __name__ == "__main__":
    main()
