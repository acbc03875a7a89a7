"""The Python API validates exactly as the CLI does: each trainer's ``train(Config(...))`` refuses a
bad config with the CLI's one-line ConfigError, before it writes anything or loads a model."""
import math

import pytest

from fourfold.config import (
    ConfigError,
    GymConfig,
    GymPPOConfig,
    InitModelConfig,
    LMModelConfig,
    PPOAlgoConfig,
    PPOConfig,
    PreferenceDataConfig,
    PromptDataConfig,
    ReinforceAlgoConfig,
    ReinforceConfig,
    RewardConfig,
    RewardLossConfig,
    RunConfig,
    SFTConfig,
    SFTDataConfig,
    TrainLoopConfig,
    load_config,
)
from fourfold.config.loader import config_to_dict


def _lm(tiny_lm):
    return dict(model=LMModelConfig(policy=str(tiny_lm / "sft"), reward=str(tiny_lm / "rm")),
                data=PromptDataConfig(prompts=str(tiny_lm / "prompts.jsonl")))


CASES = {
    "ppo": lambda lm, run: PPOConfig(**lm, ppo=PPOAlgoConfig(lr=math.inf), run=run),
    "ppo-kl": lambda lm, run: PPOConfig(**lm, ppo=PPOAlgoConfig(kl_coef=math.inf), run=run),
    "reinforce": lambda lm, run: ReinforceConfig(**lm, reinforce=ReinforceAlgoConfig(iterations=0), run=run),
    "sft": lambda lm, run: SFTConfig(model=InitModelConfig(path=lm["model"].policy), data=SFTDataConfig(train="t.jsonl"),
                                     train=TrainLoopConfig(weight_decay=-0.1), run=run),
    "reward": lambda lm, run: RewardConfig(model=InitModelConfig(path=lm["model"].policy),
                                           data=PreferenceDataConfig(train="t.jsonl"),
                                           reward=RewardLossConfig(margin=math.inf), run=run),
    "gym": lambda lm, run: GymConfig(ppo=GymPPOConfig(lr=math.nan), run=run),
}
TRAINERS = {"ppo": "ppo", "ppo-kl": "ppo", "reinforce": "reinforce", "sft": "sft", "reward": "reward", "gym": "gym"}
KEYS = {"ppo": "ppo.lr", "ppo-kl": "ppo.kl_coef", "reinforce": "reinforce.iterations", "sft": "train.weight_decay",
        "reward": "reward.margin", "gym": "ppo.lr"}


@pytest.mark.parametrize("case", list(CASES))
def test_train_validates_as_the_cli_does(tiny_lm, tmp_path, case):
    import importlib

    out = tmp_path / "run"
    cfg = CASES[case](_lm(tiny_lm), RunConfig(output_dir=str(out), progress=False, tensorboard=False, device="cpu"))
    with pytest.raises(ConfigError) as api:
        importlib.import_module(f"fourfold.trainers.{TRAINERS[case]}").train(cfg)
    assert str(api.value).startswith(f"{KEYS[case]}: ") and "\n" not in str(api.value)
    assert not out.exists()  # nothing written
    # the CLI's loader says the same about the same settings
    stage_cls = type(cfg)
    with pytest.raises(ConfigError) as cli:
        load_config(stage_cls, None, [f"{k}={v}" for k, v in _flat(config_to_dict(cfg)).items()])
    assert str(cli.value) == f"command line: {api.value}"


def _flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v and k not in ("kwargs", "task_options"):
            out.update(_flat(v, f"{prefix}{k}."))
        elif v is not None and not isinstance(v, dict):
            out[f"{prefix}{k}"] = "[" + ", ".join(map(str, v)) + "]" if isinstance(v, list) else v
    return out
