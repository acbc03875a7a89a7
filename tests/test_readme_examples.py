"""Every training, generate and score command the README shows (``fourfold STAGE --config
examples/X.yaml [its overrides]``) runs to exit 0 with the README's own overrides, on the tiny
models (paths and budgets overridden first, the README's overrides last so they win)."""

import json
import re
from pathlib import Path

import pytest

from fourfold.cli import main

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"^fourfold (sft|reward|dpo|ppo|reinforce|generate|score) +--config (examples/\S+\.yaml)(.*)$")
RUN = ["run.device=cpu", "run.threads=1", "run.progress=false"]


def readme_commands() -> list[tuple[str, str, list[str]]]:
    """(stage, config, overrides) of each command line of the README's code blocks, plus the
    configs and overrides its text and the examples' comments name (rloo.yaml, reinforce_pp.yaml,
    grpo.yaml's reward function)."""
    found = [("ppo", "examples/rloo.yaml", []), ("ppo", "examples/reinforce_pp.yaml", []),
             ("ppo", "examples/grpo.yaml", ["model.reward=null", "model.reward_fn=REWARD_FN"])]
    for line in (ROOT / "README.md").read_text().splitlines():
        m = COMMAND.match(line.strip())
        if m:
            found.append((m.group(1), m.group(2), m.group(3).split("#")[0].split()))
    return found


def tiny(stage: str, root: Path, out: Path) -> list[str]:
    sft, rm = f"model.path={root / 'sft'}", root / "rm"
    train = ["train.max_steps=1", "train.batch_size=2", "train.max_len=64", "run.tensorboard=false"]
    if stage == "sft":
        return [sft, f"data.train={root / 'sft.jsonl'}", *train]
    if stage in ("reward", "dpo"):
        return [sft, f"data.train={root / 'prefs.jsonl'}", "data.eval_fraction=0.25", *train]
    if stage == "ppo":
        return [f"model.policy={root / 'sft'}", f"model.reward={rm}", f"data.prompts={root / 'prompts.jsonl'}",
                "ppo.iterations=1", "ppo.rollout_batch_size=8", "ppo.minibatch_size=4", "ppo.ppo_epochs=1",
                "generation.max_new_tokens=3", "run.tensorboard=false"]
    if stage == "reinforce":
        return [f"model.policy={root / 'sft'}", f"model.reward={rm}", f"data.prompts={root / 'prompts.jsonl'}",
                "reinforce.iterations=1", "reinforce.rollout_batch_size=4", "generation.max_new_tokens=3",
                "run.tensorboard=false"]
    if stage == "generate":
        return [sft, f"data.prompts={root / 'prompts.jsonl'}", "generation.max_new_tokens=3"]
    return [f"model.reward={rm}", f"data.rows={root / 'rows.jsonl'}"]


def test_the_readme_shows_the_examples():
    configs = {c for _, c, _ in readme_commands()}
    assert {"examples/sft.yaml", "examples/reward.yaml", "examples/ppo.yaml", "examples/grpo.yaml",
            "examples/reinforce.yaml", "examples/generate.yaml", "examples/score.yaml"} <= configs


@pytest.mark.parametrize("stage, config, overrides", readme_commands(),
                         ids=lambda v: v if isinstance(v, str) else " ".join(v) or "-")
def test_a_readme_command_runs_with_its_overrides(stage, config, overrides, tiny_lm, tmp_path, capsys):
    root = tiny_lm
    if not (root / "sft.jsonl").exists():
        rows = [json.loads(line) for line in (root / "prompts.jsonl").read_text().splitlines()][:8]
        (root / "sft.jsonl").write_text("".join(json.dumps({"prompt": r["prompt"], "completion": "w7 w1"}) + "\n"
                                                for r in rows))
        (root / "prefs.jsonl").write_text("".join(json.dumps({"prompt": r["prompt"], "chosen": "w7", "rejected": "w2"})
                                                  + "\n" for r in rows))
        (root / "rows.jsonl").write_text("".join(json.dumps({"prompt": r["prompt"], "response": "w7"}) + "\n"
                                                 for r in rows))
    out = tmp_path / "run"
    overrides = [o.replace("REWARD_FN", f"{root / 'reward_fn.py'}:reward") for o in overrides]
    argv = [stage, "--config", str(ROOT / config), *tiny(stage, root, out), *RUN, f"run.output_dir={out}", *overrides]
    code = main(argv)
    assert code == 0, (argv, capsys.readouterr().err[-2000:])
