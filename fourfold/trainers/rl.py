"""The steps around the language-model RL loops (PPO and REINFORCE), written once: the counterpart
of the supervised loop's :class:`~fourfold.trainers.supervised.SupervisedSteps`. Each loop keeps
its algorithm (steps 5-6: advantages or returns, the update) and its metrics::

    roles = stage_roles(run, "ppo", cfg, device, {...})     # 0. the roles, placed on the ranks
    opt = ...                                                #    the loop's optimisers and schedules
    rl = RLSteps(run, cfg, roles, device, section="ppo", ...)  #    engine, prompt stream, resume
    with rl.loop("ppo") as logger:
        for it in rl.iterations():
            col = rl.rollout(it, kl_coef=...)                # 1-4. prompts, generate, score, rewards
            ...                                              # 5-6. the loop's own
            rl.log(logger, it, metrics, col)                 # 7. metrics row, sample completions
            run.checkpoint_if_due(it)
        rl.export()                                          # the final models
    return rl.finish(last)                                   # the summary line and dict

The rollout itself (one call from the next batch to a scored trajectory batch,
:class:`~fourfold.trainers.rollouts.Collected`) is the run's source
(:func:`fourfold.trainers.env_rollouts.rollout_source`): the prompts' single turns
(:func:`fourfold.trainers.rollouts.collect`), or with ``env.factory`` one environment per row
(:func:`fourfold.trainers.env_rollouts.collect_turns`, docs/environments.md). The loops never ask
which: they take their advantages and returns over the policy's tokens of either.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Optional, Sequence

import torch

from fourfold.config import validate_tree
from fourfold.data import prompt_columns
from fourfold.errors import ConfigError
from fourfold.models.build import Roles
from fourfold.models.levers import autocast_region
from fourfold.models.plan import plan_roles
from fourfold.models.reward_parts import load_functions
from fourfold.rollout.engine import make_engine
from fourfold.run.export import save_trained
from fourfold.trainers.ahead import RunAhead
from fourfold.trainers.env_rollouts import rollout_source
from fourfold.trainers.practice import staleness_notes
from fourfold.trainers.prompts import PromptStream
from fourfold.trainers.rollouts import KEY_METRICS, Collected, Probe, sample_rows


@dataclass
class PreparedRewards:
    """What :func:`prepare_rewards` found: the reward functions loaded and matched against the
    prompts' columns (name -> role), and the warning lines on columns a function cannot receive."""

    functions: Optional[dict] = None
    notes: list = field(default_factory=list)


def prepare_rewards(stage: str, cfg, prompts: Optional[Sequence[str]] = None,
                    roles: Optional[Roles] = None) -> PreparedRewards:
    """Before anything else of a run (no run directory yet, no model loaded): the config checked,
    each reward function of the plan loaded and its parameters matched against the columns of the
    ``data.prompts`` file (``prompts`` passed as a list carry none), so that a function naming a
    column the file lacks is one ConfigError line. Nothing to prepare when ``roles`` come ready-made."""
    if roles is not None:
        return PreparedRewards()
    validate_tree(cfg)
    parts = plan_roles(stage, cfg).reward_parts
    if prompts is not None:
        columns, source = (), "the prompts passed to the trainer"
    else:
        columns, source = (prompt_columns(cfg.data.prompts) if cfg.data.prompts is not None else ()), cfg.data.prompts
    functions, notes = load_functions(parts, columns, str(source))
    return PreparedRewards(functions, notes)


class RLSteps:
    """Step 0 of a language-model RL stage after its roles, on the run scaffold ``run``: the rollout
    engine of ``generation.engine`` (:func:`~fourfold.rollout.engine.make_engine`), the prompt stream
    (``n_prompts`` different prompts a batch, from ``prompts`` or the ``data.prompts`` file), and the
    checkpoints' contents: ``trained`` (name -> (module, optimizer, schedule)), ``state`` (name ->
    an object with ``state_dict()``/``load_state_dict()``, e.g. the KL controller), the iteration,
    the prompt stream's position and the guard's count; resumed from the newest checkpoint when
    asked (a checkpoint past ``<section>.iterations`` refused). ``section``: the stage's config
    section (``ppo``, ``reinforce``); ``probe``: the extra measurements of every batch."""

    def __init__(self, run, cfg, roles: Roles, device: torch.device, *, section: str, n_prompts: int,
                 trained: Mapping[str, tuple], prompts: Optional[Sequence[str]] = None,
                 state: Optional[Mapping[str, object]] = None, probe: Optional[Probe] = None,
                 notes: Sequence[str] = ()):
        self.run_ctx, self.cfg, self.roles, self.device, self.probe = run, cfg, roles, device, probe
        self.notes = list(notes)
        self.total = getattr(cfg, section).iterations
        self.engine = make_engine(cfg.generation, precision=cfg.model.precision, max_prompt_len=cfg.data.max_prompt_len)
        self.stream = PromptStream(cfg.data, roles.tokenizer, n_prompts, cfg.run.seed, prompts=prompts,
                                   batch_key=f"{section}.rollout_batch_size")
        self.source = rollout_source(cfg, self.stream, probe, device)
        """The run's rollout: the prompts' single turns, or an environment per row (``env.factory``)."""
        self.ahead = self._run_ahead(run, cfg, roles, section)
        """The sampler running ahead (``rollout.max_staleness`` >= 1, :mod:`fourfold.trainers.ahead`); None: synchronous."""
        extra = dict(state or {}) if self.ahead is None else {**(state or {}), "ahead": self.ahead}
        run.track(modules={k: v[0] for k, v in trained.items()}, optimizers={k: v[1] for k, v in trained.items()},
                  schedulers={k: v[2] for k, v in trained.items()},
                  state=lambda it: {"iteration": it, **{k: v.state_dict() for k, v in extra.items()},
                                    "prompts": self.stream.state_dict(), "nonfinite_total": run.guard.total})
        resumed = run.resume()
        self.start = 0
        if resumed is not None:
            run.require_not_past(resumed["iteration"], self.total, f"{section}.iterations", "iteration")
            for k, v in extra.items():
                v.load_state_dict(resumed.get(k) if k == "ahead" else resumed[k])
            if self.ahead is None and resumed.get("ahead", {}).get("batches"):
                raise ConfigError(f"rollout.max_staleness: 0, but the checkpoint resumed was written with "
                                  f"{resumed['ahead']['max_staleness']}; resume with that value")
            self.stream.load_state_dict(resumed["prompts"])
            self.start = resumed["iteration"]
        self._written: dict = {}
        self._outputs: dict = {}

    def _run_ahead(self, run, cfg, roles: Roles, section: str) -> Optional[RunAhead]:
        """The sampler of ``rollout.max_staleness`` k >= 1 (under torchrun: one per rank; its warning when
        nothing corrects the staleness, :func:`~fourfold.trainers.practice.staleness_notes`), else None."""
        k = cfg.rollout.max_staleness
        if k == 0:
            return None
        self.notes += staleness_notes(cfg, section)
        pad = roles.tokenizer.pad_token_id
        return RunAhead(k, cfg.generation, precision=cfg.model.precision, max_prompt_len=cfg.data.max_prompt_len,
                        seed=cfg.run.seed, total=self.total, gather=lambda result: self.source.gather_ahead(result, pad))

    @contextmanager
    def loop(self, desc: str) -> Iterator:
        """The run's loop context (:meth:`RunScaffold.loop`: the metrics logger, the stop signal),
        after saying how many bad prompt rows were skipped and the prompts' other notes; a sampler
        running ahead is stopped when it ends."""
        try:
            with self.run_ctx.loop(total=self.total, desc=desc, key_metrics=KEY_METRICS) as logger:
                self.run_ctx.warn_skipped(logger, self.stream.skipped, self.stream.notes + self.notes)
                yield logger
        finally:
            if self.ahead is not None:
                self.ahead.close()

    def iterations(self) -> range:
        """The iterations left: from the one after the resumed checkpoint's to the last."""
        return range(self.start + 1, self.total + 1)

    def rollout(self, it: int, *, kl_coef: float, kl_estimator: str, samples_per_prompt: int = 1,
                concurrent: bool = False, draw: int = 0) -> Collected:
        """Steps 1-4 of iteration ``it``: the engine given the policy's weights after the last update
        (its collectives before any of the user's code runs), then the run's source
        (:attr:`source`): the next batch, each prompt or environment row on ``samples_per_prompt``
        consecutive rows, generated (pi_old), scored and given per-token rewards with ``kl_coef`` x
        the ``kl_estimator`` KL, with the iteration's per-row noise, under the run's autocast (the
        weights fixed: the cast cache kept). ``draw`` > 0: a further rollout of the same iteration
        (PPO's filter_groups), its noise seeded ``run.seed + draw``; with a sampler running ahead,
        batch ``it`` (draw 0) is the sampler's and a further one is sampled here and now, with the
        trainer's weights (no lag: the sampler cannot have known it would be needed)."""
        if self.ahead is not None and draw == 0:
            return self._rollout_ahead(it, kl_coef, kl_estimator, samples_per_prompt, concurrent)
        self.engine.sync(self.roles.policy)
        with autocast_region(self.cfg.model.precision, self.device.type):
            return self.source.collect(self.roles, self.engine, it, kl_coef=kl_coef, kl_estimator=kl_estimator,
                                       samples_per_prompt=samples_per_prompt, concurrent=concurrent, draw=draw)

    def _rollout_ahead(self, it: int, kl_coef: float, kl_estimator: str, samples_per_prompt: int,
                       concurrent: bool) -> Collected:
        """:meth:`rollout` with a sampler running ahead: batch ``it`` from the sampler (sampled with
        the weights of version max(0, it - 1 - k)), the batches after it handed over, then scored
        here; ``rollout/version_lag`` and ``time/sampler_wait_s`` join its metrics."""
        got = self.ahead.next(it, self.roles.policy, lambda: self.source.ahead_job(self.roles, samples_per_prompt))
        with autocast_region(self.cfg.model.precision, self.device.type):
            col = self.source.score_ahead(self.roles, got.result, got.generate_s, kl_coef=kl_coef,
                                          kl_estimator=kl_estimator, concurrent=concurrent)
        col.version = got.version
        col.metrics.update({"rollout/version_lag": float(it - 1 - got.version), "time/sampler_wait_s": got.wait_s})
        return col

    def log(self, logger, it: int, metrics: dict, col: Collected) -> None:
        """Step 7's log: the metrics row of iteration ``it``, and a few rows of its batch (decoded
        only now; an environment run's: each turn with its reward and the observation after it) when
        ``run.samples_every`` says so (:func:`~fourfold.trainers.rollouts.sample_rows`)."""
        logger.log(it, metrics)
        if self.run_ctx.samples_due(it, self.total):
            logger.samples(it, sample_rows(col, self.roles.tokenizer, self.probe))

    def export(self, critic: Optional[torch.nn.Module] = None) -> None:
        """After the loop, inside its context: refuse a run in which no update went through, then
        write the final policy (and ``critic``) as ``policy/`` (``critic/``), loadable with plain
        transformers (LoRA: merged, and the adapters beside)."""
        run, tok = self.run_ctx, self.roles.tokenizer
        run.require_an_update(self.total - self.start)
        self._written = save_trained(run, self.roles.policy, tok, run.out / "policy")
        self._outputs = {"model": run.out / "policy"}
        if critic is not None:
            save_trained(run, critic, tok, run.out / "critic")
            self._outputs["critic"] = run.out / "critic"

    def finish(self, last: dict) -> dict:
        """End the run after :meth:`export`: the summary line, and the summary dict (the output
        directory, the policy's path (and its adapter's), ``last``: the final metrics row)."""
        run, written = self.run_ctx, self._written
        return run.finish({"output_dir": str(run.out), "policy": written["model"], "final": last,
                           **({"policy_adapter": written["adapter"]} if "adapter" in written else {})},
                          **self._outputs)
