"""`fourfold generate` and `fourfold score`: a trained model used on its own, with the conventions
of training (the prompt format and tokenisation of PPO, its sampling settings, and the reward
model's scoring position).

The sampling section extends PPO's :class:`GenerationConfig` (same keys, same meaning) and the run
section is the shared :class:`RunConfig`; a model section and a data section are specific to each
command.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

from fourfold.config.loader import require
from fourfold.config.ppo import GenerationConfig, require_one_reward
from fourfold.config.rewards import RewardSourcesConfig
from fourfold.config.run import RunConfig
from fourfold.config.sampling import filters_said, truncates


@dataclasses.dataclass
class GenerateModelConfig:
    """The causal language model that generates."""

    path: Optional[str] = None
    """HF directory of a causal LM (the `model/` of `fourfold sft` or `fourfold ppo`), or a hub
    name when online."""
    tokenizer: Optional[str] = None
    """Tokenizer directory; null = `path`'s."""
    trust_remote_code: bool = False
    """Allow model code from the model's repository. Off unless you trust the source."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights dtype. float32 on CPU; bfloat16 on recent GPUs."""

    def validate(self, prefix: str = "model") -> None:
        require(self.path is not None, f"{prefix}.path", "missing: path to the model directory")


@dataclasses.dataclass
class GenerateDataConfig:
    """The prompts, read and tokenised exactly as PPO reads `data.prompts`."""

    prompts: Optional[str] = None
    """JSONL or Parquet file with a `prompt` (or chat `messages`) field per row, a `datasets`
    directory (`DIR` or `DIR:SPLIT`) or, online, a hub dataset (`NAME:SPLIT`)."""
    max_prompt_len: int = 64
    """Prompts longer than this many tokens are an error naming the file and line."""
    on_error: Literal["raise", "skip"] = "raise"
    """Bad rows: stop with an error naming file and line, or skip them (counted on the console)."""
    batch_size: int = 16
    """Prompts generated together (one batched sampling loop)."""

    def validate(self, prefix: str = "data") -> None:
        require(self.prompts is not None, f"{prefix}.prompts", "missing: a prompts file or datasets directory")
        require(self.max_prompt_len >= 1, f"{prefix}.max_prompt_len", "must be >= 1")
        require(self.batch_size >= 1, f"{prefix}.batch_size", "must be >= 1")


@dataclasses.dataclass
class GenerateSamplingConfig(GenerationConfig):
    """PPO's generation settings (max_new_tokens, temperature, the filters top_k, top_p, min_p,
    stop_at_eos, and the engine: engine, weights, compile, stop_check_every), plus greedy decoding. Either engine gives the same
    completions from the same seed (the static engine's cache holds data.max_prompt_len +
    max_new_tokens positions)."""

    greedy: bool = False
    """Take the most likely token at every step instead of sampling (temperature is then unused)."""

    def validate(self, prefix: str = "generation") -> None:
        super().validate(prefix)
        require(self.missing_eos_score is None, f"{prefix}.missing_eos_score",
                "is a PPO scoring setting, not used by generate; remove it")
        require(not (self.greedy and truncates(self)), f"{prefix}.greedy",
                f"takes the most likely token, which every filter keeps: {filters_said(self, prefix)} would change "
                "nothing; set greedy false or the filters off")


@dataclasses.dataclass
class GenerateConfig:
    """`fourfold generate`: completions of a prompts file, written to `run.output_dir/completions.jsonl`."""

    model: GenerateModelConfig = dataclasses.field(default_factory=GenerateModelConfig)
    data: GenerateDataConfig = dataclasses.field(default_factory=GenerateDataConfig)
    generation: GenerateSamplingConfig = dataclasses.field(default_factory=GenerateSamplingConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs/generate"))

    def validate(self, prefix: str = "") -> None:
        require(not self.run.resume, "run.resume", "generate has nothing to resume; rerun to write the file again")


@dataclasses.dataclass
class ScoreModelConfig(RewardSourcesConfig):
    """What scores: the reward sources of PPO's `model` section, the same keys with the same meaning
    (:class:`~fourfold.config.rewards.RewardSourcesConfig`: a reward model, reward functions given
    the rows' other columns as PPO gives the prompts file's, a reward server, one or weighted)."""

    tokenizer: Optional[str] = None
    """Tokenizer directory; null = the reward model's. A reward function scores chat `messages`
    rows rendered with this tokenizer's chat template, as PPO renders them with the policy's: set it
    (the policy's directory) to score chat rows without a reward model."""
    trust_remote_code: bool = False
    """Allow model code from the model's repository. Off unless you trust the source."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights dtype. float32 on CPU; bfloat16 on recent GPUs."""

    def validate(self, prefix: str = "model") -> None:
        require_one_reward(self, prefix)


@dataclasses.dataclass
class ScoreDataConfig:
    """The rows to score: `prompt` + `response` (optional `finished`), or chat `messages`."""

    rows: Optional[str] = None
    """JSONL or Parquet file (e.g. the completions.jsonl of `fourfold generate`), a `datasets`
    directory (`DIR` or `DIR:SPLIT`) or, online, a hub dataset (`NAME:SPLIT`)."""
    max_len: Optional[int] = None
    """Reward model: longest prompt + response in tokens (BOS and EOS included); a longer row is an
    error naming its file and line. null = the model's max_position_embeddings (512 when its config
    has none); more than that is an error."""
    on_error: Literal["raise", "skip"] = "raise"
    """Bad rows: stop with an error naming file and line, or skip them (counted on the console)."""
    batch_size: int = 16
    """Rows scored in one forward pass (or one reward_fn call)."""

    def validate(self, prefix: str = "data") -> None:
        require(self.rows is not None, f"{prefix}.rows", "missing: a file or datasets directory of prompt/response rows")
        require(self.max_len is None or self.max_len >= 2, f"{prefix}.max_len", "must be >= 2 or null")
        require(self.batch_size >= 1, f"{prefix}.batch_size", "must be >= 1")


@dataclasses.dataclass
class ScoreConfig:
    """`fourfold score`: the rows plus a `score`, written to `run.output_dir/scores.jsonl`."""

    model: ScoreModelConfig = dataclasses.field(default_factory=ScoreModelConfig)
    data: ScoreDataConfig = dataclasses.field(default_factory=ScoreDataConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs/score"))

    def validate(self, prefix: str = "") -> None:
        require(not self.run.resume, "run.resume", "score has nothing to resume; rerun to write the file again")


@dataclasses.dataclass
class ServeRewardConfig:
    """`fourfold serve-reward` given keys (`model.*` on the command line or in `--config FILE`), beside
    or instead of its --model/--fn flags: the scorer is `fourfold score`'s model section, so every
    reward source PPO takes can be served (a reward model or LoRA reward adapter, functions given
    the request's columns, weighted parts, a reward model with its own tokenizer)."""

    model: ScoreModelConfig = dataclasses.field(default_factory=ScoreModelConfig)
