"""The RL trainers take prompts (a list, or the data.prompts file) and an optional probe, logged
every iteration under its own names; they never see a task."""
import pytest

from fourfold.config import ReinforceConfig
from fourfold.errors import ConfigError
from fourfold.reporting import read_metrics


def _cfg(tiny_lm, out, *extra):
    from fourfold.config import load_config

    return load_config(ReinforceConfig, None, [
        f"model.policy={tiny_lm / 'sft'}", f"model.reward={tiny_lm / 'rm'}",
        f"data.prompts={tiny_lm / 'prompts.jsonl'}",
        "reinforce.iterations=2", "reinforce.rollout_batch_size=4", "generation.max_new_tokens=4",
        f"run.output_dir={out}", "run.progress=false", "run.tensorboard=false", "run.device=cpu", *extra,
    ])


def test_in_memory_prompts_and_a_probe(tiny_lm, tmp_path):
    from fourfold.trainers.reinforce import train

    prompts = ["w1 w2", "w3", "w4 w5 w6", "w7 w8"]
    seen = []

    def probe(batch_prompts, responses):
        seen.append((batch_prompts, responses))
        return {"probe/words": sum(len(r.split()) for r in responses) / len(responses)}

    train(_cfg(tiny_lm, tmp_path / "run"), prompts=prompts, probe=probe)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(seen) == 2 and all(sorted(p) == sorted(prompts) for p, _ in seen)  # the list, not the file
    assert all(len(r) == 4 and all(isinstance(x, str) for x in r) for _, r in seen)  # decoded responses
    assert [row["probe/words"] for row in rows] == [sum(len(x.split()) for x in r) / 4 for _, r in seen]


def test_no_prompts_at_all_is_a_config_error(tiny_lm, tmp_path):
    from fourfold.trainers.reinforce import train

    with pytest.raises(ConfigError, match="data.prompts"):
        train(_cfg(tiny_lm, tmp_path / "run", "data.prompts=null", "data.task=review"))
