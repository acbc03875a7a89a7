"""Configs of `fourfold generate` and `fourfold score`: examples load, sections reuse PPO's keys,
impossible values are one-line errors naming the key."""
import dataclasses
from pathlib import Path

import pytest

from fourfold.cli import STAGES, build_parser
from fourfold.config import (
    ConfigError,
    GenerateConfig,
    GenerateSamplingConfig,
    GenerationConfig,
    RunConfig,
    ScoreConfig,
    load_config,
)

ROOT = Path(__file__).resolve().parents[1]
GEN_OK = ["model.path=m", "data.prompts=p.jsonl"]
SCORE_OK = ["model.reward=rm", "data.rows=r.jsonl"]


def err(cls, overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(cls, None, overrides)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("name,cls", [("generate", GenerateConfig), ("score", ScoreConfig)])
def test_examples_load_and_are_cli_stages(name, cls):
    cfg = load_config(cls, ROOT / "examples" / f"{name}.yaml")
    assert isinstance(cfg, cls)
    assert STAGES[name].config == f"fourfold.config:{cls.__name__}"
    assert build_parser().parse_args([name, "a=1"]).stage == name


def test_sections_reuse_ppo_generation_and_the_shared_run_section():
    ppo_keys = [f.name for f in dataclasses.fields(GenerationConfig)]
    assert [f.name for f in dataclasses.fields(GenerateSamplingConfig)] == ppo_keys + ["greedy"]
    assert isinstance(GenerateConfig().run, RunConfig) and GenerateConfig().run.output_dir == "runs/generate"
    assert ScoreConfig().run.output_dir == "runs/score"
    cfg = load_config(GenerateConfig, None, GEN_OK + ["generation.temperature=0.7", "generation.greedy=true"])
    assert cfg.generation.temperature == 0.7 and cfg.generation.greedy and cfg.generation.max_new_tokens == 32
    assert cfg.generation.engine == "eager"  # the default engine, as PPO's
    cfg = load_config(GenerateConfig, None, GEN_OK + ["generation.engine=static", "generation.compile=true",
                                                      "generation.stop_check_every=4", "generation.weights=copy"])
    assert (cfg.generation.engine, cfg.generation.compile, cfg.generation.stop_check_every,
            cfg.generation.weights) == ("static", True, 4, "copy")


@pytest.mark.parametrize("cls,overrides,fragment", [
    (GenerateConfig, ["data.prompts=p.jsonl"], "model.path: missing"),
    (GenerateConfig, ["model.path=m"], "data.prompts: missing"),
    (GenerateConfig, GEN_OK + ["data.batch_size=0"], "data.batch_size: must be >= 1"),
    (GenerateConfig, GEN_OK + ["data.max_prompt_len=0"], "data.max_prompt_len: must be >= 1"),
    (GenerateConfig, GEN_OK + ["generation.temperature=0"], "generation.temperature: must be > 0"),
    (GenerateConfig, GEN_OK + ["generation.missing_eos_score=-1"], "generation.missing_eos_score: is a PPO scoring setting"),
    (GenerateConfig, GEN_OK + ["generation.greedy=sometimes"], "generation.greedy: expected bool"),
    (GenerateConfig, GEN_OK + ["generation.engine=vllm"], "generation.engine: expected one of"),
    (GenerateConfig, GEN_OK + ["generation.compile=true"], "generation.compile: compiles the static engine's step"),
    (GenerateConfig, GEN_OK + ["generation.engine=static", "generation.stop_check_every=0"],
     "generation.stop_check_every: must be >= 1"),
    (GenerateConfig, GEN_OK + ["run.resume=true"], "run.resume: generate has nothing to resume"),
    (GenerateConfig, GEN_OK + ["model.policy=m"], "model.policy: unknown key"),
    (ScoreConfig, ["data.rows=r.jsonl"], "model.reward: no reward: set model.reward (a reward-model directory), model.reward_fn, model.reward_fns or model.reward_url"),
    (ScoreConfig, SCORE_OK + ["model.reward_fn=f.py:g"], "model.reward: model.reward (a reward-model directory) and model.reward_fn are both set"),
    (ScoreConfig, ["model.reward=rm"], "data.rows: missing"),
    (ScoreConfig, SCORE_OK + ["data.max_len=1"], "data.max_len: must be >= 2 or null"),
    (ScoreConfig, SCORE_OK + ["data.batch_size=0"], "data.batch_size: must be >= 1"),
    (ScoreConfig, SCORE_OK + ["run.resume=true"], "run.resume: score has nothing to resume"),
    (ScoreConfig, SCORE_OK + ["generation.temperature=1"], "generation: unknown key"),
])
def test_impossible_values_are_one_line_errors(cls, overrides, fragment):
    assert fragment in err(cls, overrides)
