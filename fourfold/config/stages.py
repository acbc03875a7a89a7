"""The one table of stages: what each ``fourfold <stage>`` is, read by the CLI (its sub-commands and
flags), the run scaffold (the stage's name in its summary line, which stages run under torchrun) and
the memory estimate (which stages it covers). Standard library only; the config classes and stage
functions are named as ``module:attribute`` and imported only when a stage runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional


@dataclass(frozen=True)
class Stage:
    """One stage of the command line."""

    name: str
    config: str
    """Its config class, ``module:Class``."""
    run: str
    """What runs it, ``module:function(config, **inputs) -> summary dict``."""
    help: str
    run_dir: bool = False
    """It trains into one run directory (``run.output_dir``): ``--overwrite`` replaces a finished
    run there, and the run ends with the scaffold's summary line."""
    torchrun: bool = False
    """It runs under ``torchrun`` (every rank the same stage, FSDP2-sharded models)."""
    rollout_batch: Optional[str] = None
    """A language-model RL stage: the key of its rollout batch size, which also sizes the prompts an
    embedded task (``data.task``) supplies, and its config has a memory estimate."""
    cache: bool = False
    """An application with a stage cache of its own (``--quick``, ``--fresh``)."""
    tasks: tuple = ()
    """Other embedded worlds the stage runs on (``--task NAME``): ``(name, config, run)`` triples,
    ``config`` and ``run`` as above; without ``--task`` the stage's own ``config`` and ``run``."""
    task: str = ""
    """The name of the world the stage's own ``config`` and ``run`` are for (``--task``'s default)."""

    def for_task(self, name: Optional[str]) -> "Stage":
        """This stage with the ``config`` and ``run`` of world ``name`` (None or its own: itself)."""
        if not name or name == self.task:
            return self
        for task, config, run in self.tasks:
            if task == name:
                return replace(self, config=config, run=run)
        raise ValueError(f"{self.name}: no task {name!r}")


STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("sft", "fourfold.config:SFTConfig", "fourfold.trainers.sft:train",
          "supervised fine-tuning on prompt/completion pairs", run_dir=True, torchrun=True),
    Stage("reward", "fourfold.config:RewardConfig", "fourfold.trainers.reward:train",
          "reward model from preference pairs (Bradley-Terry)", run_dir=True, torchrun=True),
    Stage("dpo", "fourfold.config:DPOConfig", "fourfold.trainers.dpo:train",
          "DPO from preference pairs (no reward model, no sampling; the SFT model is the reference)",
          run_dir=True, torchrun=True),
    Stage("ppo", "fourfold.config:PPOConfig", "fourfold.trainers.ppo:train",
          "PPO with policy, reference, reward model and critic", run_dir=True, torchrun=True,
          rollout_batch="ppo.rollout_batch_size"),
    Stage("reinforce", "fourfold.config:ReinforceConfig", "fourfold.trainers.reinforce:train",
          "naive REINFORCE baseline", run_dir=True, torchrun=True, rollout_batch="reinforce.rollout_batch_size"),
    Stage("gym", "fourfold.config:GymConfig", "fourfold.trainers.gym:train",
          "PPO / REINFORCE on a Gymnasium environment", run_dir=True),
    Stage("demo", "fourfold.config:DemoConfig", "fourfold.apps.demo.pipeline:run",
          "the embedded default: SFT -> RM -> PPO on the review task (--task arithmetic: SFT -> GRPO with a "
          "verifiable reward)", cache=True, task="review",
          tasks=(("arithmetic", "fourfold.apps.demo.arithmetic_config:ArithmeticDemoConfig",
                  "fourfold.apps.demo.arithmetic:run"),)),
    Stage("experiments", "fourfold.apps.experiments.config:ExperimentsConfig", "fourfold.apps.experiments:run",
          "the method's claims as measured experiments", cache=True),
    Stage("generate", "fourfold.config:GenerateConfig", "fourfold.apps.inference:generate",
          "completions of a prompts file with a trained model (JSONL out)"),
    Stage("score", "fourfold.config:ScoreConfig", "fourfold.apps.inference:score",
          "scores of prompt/response rows by a reward model or reward_fn (JSONL out)"),
    Stage("bon", "fourfold.config:BonConfig", "fourfold.apps.bon:best_of_n",
          "best-of-n: the highest-scored of n sampled responses per prompt (JSONL out; no training)"),
)}


def stage_of(cfg) -> Optional[Stage]:
    """The stage whose config class ``cfg`` is an instance of (by class name; None for another)."""
    name = type(cfg).__name__
    return next((stage for stage in STAGES.values() if stage.config.rpartition(":")[2] == name), None)


def torchrun_stages() -> list[str]:
    """The stages that run under torchrun, in table order."""
    return [s.name for s in STAGES.values() if s.torchrun]


def rollout_stages() -> list[str]:
    """The language-model RL stages (a rollout batch, a task's prompts, a memory estimate)."""
    return [s.name for s in STAGES.values() if s.rollout_batch]
