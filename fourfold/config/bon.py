"""`fourfold bon`: best-of-n sampling as a method (no training). The policy, prompts and sampling
are `fourfold generate`'s sections (model, data, generation), the scorer is `fourfold score`'s model
section (here `scorer`), and the `bon` section holds n and the optional embedded task whose gold
evaluates the choice.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from fourfold.config.inference import GenerateDataConfig, GenerateModelConfig, GenerateSamplingConfig, ScoreModelConfig
from fourfold.config.loader import require
from fourfold.config.run import RunConfig


@dataclasses.dataclass
class BonAlgoConfig:
    """Best-of-n: how many samples per prompt, and the gold that evaluates the one chosen."""

    n: int = 4
    """Responses sampled per prompt; the one the scorer ranks highest is chosen (the first sampled
    on ties). n = 1 is plain sampling (the completions of `fourfold generate` with the same seed).
    The summary line prints the analytic KL of the choice to the policy, log n - (n - 1)/n nats."""
    score_batch_size: int = 64
    """Responses scored in one forward pass of the reward model (or one reward_fn call)."""
    task: Optional[str] = None
    """An embedded task with a gold reward (e.g. 'review', the demo's world): every candidate gets
    its `gold` column and the summary the chosen responses' mean gold beside plain sampling's (the
    mean over all candidates); null = no gold."""
    task_options: dict = dataclasses.field(default_factory=dict)
    """Options of `task` (as the demo's task_options, e.g. {labeler_length_bias: 0.0})."""

    def validate(self, prefix: str = "bon") -> None:
        require(self.n >= 1, f"{prefix}.n", "must be >= 1 (responses per prompt)")
        require(self.score_batch_size >= 1, f"{prefix}.score_batch_size", "must be >= 1")
        require(self.task is not None or not self.task_options, f"{prefix}.task_options",
                f"are options of {prefix}.task, which is null; set {prefix}.task (e.g. review) or remove them")


@dataclasses.dataclass
class BonConfig:
    """`fourfold bon`: the best of bon.n sampled responses per prompt, written to
    `run.output_dir/bon.jsonl` (prompt, response, score, candidates with their scores)."""

    model: GenerateModelConfig = dataclasses.field(default_factory=GenerateModelConfig)
    """The policy that samples (as `fourfold generate`'s model section)."""
    scorer: ScoreModelConfig = dataclasses.field(default_factory=ScoreModelConfig)
    """What ranks the candidates: a reward-model directory (scorer.reward), a reward function
    (scorer.reward_fn, given the prompt row's columns it names) or several, weighted
    (scorer.reward_fns), as `fourfold score`'s model section and through its one loader; a reward
    model scores exactly as PPO and `fourfold score` do."""
    data: GenerateDataConfig = dataclasses.field(default_factory=GenerateDataConfig)
    """The prompts (as `fourfold generate`'s; data.batch_size counts sampled responses, so a batch
    holds data.batch_size / bon.n prompts' candidates when n divides it)."""
    generation: GenerateSamplingConfig = dataclasses.field(default_factory=GenerateSamplingConfig)
    """Sampling settings (as `fourfold generate`'s)."""
    bon: BonAlgoConfig = dataclasses.field(default_factory=BonAlgoConfig)
    """n, and the optional gold."""
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs/bon"))

    def validate(self, prefix: str = "") -> None:
        require(not self.run.resume, "run.resume", "bon has nothing to resume; rerun to write the file again")
        require(not (self.generation.greedy and self.bon.n > 1), "generation.greedy",
                "greedy decoding gives n identical candidates; best-of-n needs sampling (greedy=false) or bon.n=1")
