"""`fourfold experiments`: the method's claims, measured.

Each claim the project makes about PPO-based RLHF is an experiment on the demo's review task
(`fourfold demo`), whose hidden gold reward says what the reward model cannot:

* ``ppo``             the default: demo.ppo (kl_coef beta, 4 epochs per batch, critic);
* ``ppo-beta0``       beta = 0: nothing holds the policy near the SFT model (reward hacking);
* ``ppo-beta-high``   beta x ``beta_high_multiplier`` (100): the policy never moves;
* ``ppo-1epoch``      one epoch per batch (sample efficiency of the PPO epochs);
* ``ppo-no-critic``   advantages from whitened returns, no value baseline;
* ``grpo``, ``rloo``  no critic: the baseline is the group of ``group_size`` samples of a prompt
                      (group mean and std; leave-one-out mean), the same responses per iteration;
* ``reinforce-pp``    no critic: returns whitened over the batch (REINFORCE++);
* ``reinforce-lrMx``  naive REINFORCE (sequence reward + KL, no critic, no clip, one step per
                      batch) at M x PPO's learning rate, one arm per ``reinforce_lr_multipliers``;
* ``dpo``             ``fourfold dpo`` on the demo's preference pairs from the SFT model (no RM, no
                      sampling; the RM's data budget);
* ``ppo-unbiased-rm`` PPO against an RM trained on labels from unbiased labelers (the demo's
                      stages again with ``unbiased_task_options``, cached in their own directory);
* ``ppo-adaptive-kl`` (optional) the adaptive KL controller with demo.ppo.kl_target.

What :func:`run` does, in order:

1. the demo's SFT, pairs and reward stages (``fourfold.apps.demo.pipeline.run(cfg.demo, stop_after="reward")``:
   cached, shared with ``fourfold demo`` in ``runs/demo``);
2. a job per arm x seed, ``workers`` at a time, each a subprocess (``python -m fourfold.cli
   ppo|reinforce|dpo --config ...`` then ``python -m fourfold.apps.experiments evaluate ...``), so that a
   crash or a kill of one loses nothing else; the job runner records each training subprocess's
   peak resident memory (``peak_memory.json``). Every run is resumable (``run.resume=true``,
   ``run.save_every``); a rerun skips finished runs and evaluations (keyed by their settings and the
   demo stages they start from) and resumes unfinished ones;
3. the final evaluation of every saved policy, and of the SFT model, on the same held-out prompts
   with :func:`fourfold.apps.evaluation.evaluate_policy` (proxy, gold, KL, length, well-formed, repetition);
4. ``summary.md`` and ``report.html``: per-arm mean +- sd over seeds and the cost of each arm
   (models in memory, peak memory, seconds per iteration), curves from each run's
   ``metrics.jsonl``, the gold-vs-KL frontier, samples, and the claims table, computed from the
   numbers by :func:`compute_claims`.

Layout of ``run.output_dir`` (default ``runs/experiments``): ``summary.md``, ``report.html``,
``results.json`` (every number of the report), ``configs/`` (each run's resolved config),
``runs/<arm>/seed<k>/`` (each trainer's run directory plus ``final_eval.json``), ``baseline/``
(the SFT model's evaluation), ``logs/`` (each job's stdout and stderr).

The package, by room: :mod:`~fourfold.apps.experiments.arms` (the arms and each run's config),
:mod:`~fourfold.apps.experiments.unbiased` (the unbiased-labeler demo), :mod:`~fourfold.apps.experiments.jobs`
(the subprocess pool), :mod:`~fourfold.apps.experiments.final_eval` (what the subprocesses run;
``python -m fourfold.apps.experiments`` is :mod:`~fourfold.apps.experiments.__main__`),
:mod:`~fourfold.apps.experiments.results` (curves and per-arm summaries), :mod:`~fourfold.apps.experiments.claims`
(the claims and their statistics), :mod:`~fourfold.apps.experiments.report` (summary.md and report.html)
and :mod:`~fourfold.apps.experiments.sweep` (:func:`run`, step by step).

The horizon family (``family: horizon``, examples/horizon.yaml: when does the critic pay, as the
response length gold wants grows?) runs on the same pieces: :mod:`~fourfold.apps.experiments.horizon`
(one sweep per horizon and variant, one pool of jobs), :mod:`~fourfold.apps.experiments.horizon_claims`,
:mod:`~fourfold.apps.experiments.horizon_report` and :mod:`~fourfold.apps.experiments.credit` (the token-credit
view: GAE vs the group's flat advantage on the same responses).
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
    :func:`~fourfold.apps.experiments.horizon.run_horizon`), run or resumed, its report written."""
    return run_horizon(cfg) if cfg.family == "horizon" else run_claims(cfg)
