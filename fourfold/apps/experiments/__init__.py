"""`fourfold experiments`: the method's claims, measured.

Each claim about PPO-based RLHF is an arm (``ppo``, its ablations, the critic-free estimators,
REINFORCE, DPO, an unbiased reward model) run over seeds on the demo's review task, evaluated
against its hidden gold reward, and summarised with the claims table. The arms, what runs, the
output layout and the claims: docs/experiments.md (its section "The code" names the module of
each room: arms, jobs, final_eval, results, claims, report, sweep, and the horizon, overoptimization, turns,
staleness and warm-up families').
"""

from fourfold.apps.experiments.arms import ARM_ORDER, Arm, build_arms, models_in_memory, run_config, run_key
from fourfold.apps.experiments.claims import QUICK_CLAIMS, compute_claims
from fourfold.apps.experiments.final_eval import eval_prompts, evaluate_spec
from fourfold.apps.experiments.horizon import HORIZON_QUICK, horizon_quick_config, run_horizon
from fourfold.apps.experiments.horizon_claims import compute_horizon_claims
from fourfold.apps.experiments.jobs import ExperimentError, Finished, Job, run_jobs
from fourfold.apps.experiments.report import write_report, write_summary_md
from fourfold.apps.experiments.results import CURVE_KEYS, read_curves, summarize_arm
from fourfold.apps.experiments.sweep import DEFAULT_DEMO_OUTPUT, DEFAULT_OUTPUT, QUICK, quick_config, run_claims
from fourfold.apps.experiments.unbiased import seed_sft_stage, unbiased_demo_config

__all__ = [
    "ARM_ORDER", "Arm", "build_arms", "models_in_memory", "run_config", "run_key", "QUICK_CLAIMS", "compute_claims",
    "eval_prompts", "evaluate_spec", "ExperimentError", "Finished", "Job", "run_jobs", "CURVE_KEYS", "read_curves",
    "summarize_arm", "DEFAULT_DEMO_OUTPUT", "DEFAULT_OUTPUT", "QUICK", "quick_config", "run", "run_claims", "seed_sft_stage",
    "unbiased_demo_config", "write_report", "write_summary_md", "HORIZON_QUICK", "horizon_quick_config", "run_horizon",
    "compute_horizon_claims",
]


def run(cfg) -> dict:
    """``fourfold experiments``: the family the config names (``family: claims``:
    :func:`~fourfold.apps.experiments.sweep.run_claims`; ``family: horizon``:
    :func:`~fourfold.apps.experiments.horizon.run_horizon`; ``family: overoptimization``:
    :func:`~fourfold.apps.experiments.overopt.run_overopt`; ``family: turns``:
    :func:`~fourfold.apps.experiments.turns.run_turns`; ``family: staleness``:
    :func:`~fourfold.apps.experiments.staleness.run_staleness`; ``family: warmup``:
    :func:`~fourfold.apps.experiments.warmup.run_warmup`), run or resumed, its report written."""
    if cfg.family == "warmup":
        from fourfold.apps.experiments.warmup import run_warmup

        return run_warmup(cfg)
    if cfg.family == "staleness":
        from fourfold.apps.experiments.staleness import run_staleness

        return run_staleness(cfg)
    if cfg.family == "turns":
        from fourfold.apps.experiments.turns import run_turns

        return run_turns(cfg)
    if cfg.family == "overoptimization":
        from fourfold.apps.experiments.overopt import run_overopt

        return run_overopt(cfg)
    return run_horizon(cfg) if cfg.family == "horizon" else run_claims(cfg)
