"""Typed, validated configs: dataclasses loaded from YAML with command-line overrides.

Convention (one for every subcommand):

    fourfold ppo --config examples/ppo.yaml ppo.kl_coef=0.02 run.seed=3

* A config is a dataclass whose fields are plain values or nested dataclasses (sections).
* YAML gives a mapping of the same shape; ``section.key=value`` overrides are applied after the
  file, values parsed as YAML scalars (``1e-5``, ``true``, ``null``, ``[1, 2]``). A value YAML
  would not keep as typed (``data.train=a #b`` reads as ``a``: `` #b`` is a comment; spaces at the
  ends of a string) is an error that shows the quoted form (``data.train='a #b'``). The CLI's
  ``--output-dir`` is taken as typed, never read as YAML.
* Every field has a docstring-style comment in its class; unknown keys are refused with a
  "did you mean" suggestion, a key given twice in one YAML mapping names its line, wrong types
  name the key and the type expected, every number must be finite, and each stage's
  ``validate()`` checks ranges and derived sizes (prompt + response against the models'
  ``config.json``) once, before any model is loaded. Trainers run the same ``validate_tree`` on
  the config they are given, so the Python API refuses what the CLI refuses.

Layout: ``loader`` reads YAML, applies overrides and builds/validates any config dataclass
(``config_yaml``: the resolved config as YAML, what ``--print-config`` prints); ``keys`` lists a
config's keys with their types, defaults and docstrings (``fourfold <stage> --help``); one
schema module per stage holds its sections (``run``: the shared RunConfig; ``dist``: placement
of the models under torchrun, on sft, reward, dpo, ppo and reinforce; ``lora``: the
``model.lora`` section of the language-model stages; ``sft``: the SFT stage
and the initial-model and training-loop sections the reward stage and DPO reuse; ``reward``;
``dpo`` (with reward's preference data); ``rewards``: the reward sources of the RL stages and
``score`` (``model.reward_fns``, the parts' names); ``critic``: ``model.critic_init``'s rule
(only with a critic; its unset default resolved); ``ppo``: the language-model sections shared with
``reinforce`` and ``demo``; ``reinforce``; ``gym``; ``demo``; ``inference``: ``generate`` and
``score``; ``bon``: best-of-n over generate's and score's sections). Every name is importable
from ``fourfold.config`` itself. The experiments' own settings live with them, in ``fourfold.apps.experiments.config``.

This package imports only the standard library and PyYAML.
"""

from fourfold.config.bon import BonAlgoConfig, BonConfig
from fourfold.config.demo import (
    DemoConfig,
    DemoEvalConfig,
    DemoLoraConfig,
    DemoModelConfig,
    DemoPairsConfig,
    DemoRewardConfig,
    DemoSFTConfig,
)
from fourfold.config.dist import LMDistConfig, TrainedDistConfig
from fourfold.config.dpo import DPOAlgoConfig, DPOConfig
from fourfold.config.env import EnvConfig
from fourfold.config.gym import (
    GymAgentConfig,
    GymConfig,
    GymEnvConfig,
    GymEvalConfig,
    GymPPOConfig,
    GymReinforceConfig,
)
from fourfold.config.inference import (
    GenerateConfig,
    GenerateDataConfig,
    GenerateModelConfig,
    GenerateSamplingConfig,
    ScoreConfig,
    ScoreDataConfig,
    ScoreModelConfig,
    ServeRewardConfig,
)
from fourfold.config.loader import (
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
    require,
    save_config,
    validate_tree,
)
from fourfold.config.lora import LoraConfig
from fourfold.config.ppo import GenerationConfig, LMModelConfig, PPOAlgoConfig, PPOConfig, PromptDataConfig
from fourfold.config.reinforce import ReinforceAlgoConfig, ReinforceConfig
from fourfold.config.reward import PreferenceDataConfig, RewardConfig, RewardLossConfig
from fourfold.config.rewards import RewardFnConfig
from fourfold.config.rollout import RolloutConfig
from fourfold.config.run import RunConfig
from fourfold.config.sft import InitModelConfig, SFTConfig, SFTDataConfig, TrainLoopConfig
from fourfold.errors import ConfigError

__all__ = [
    # the loader
    "ConfigError",
    "load_config",
    "config_from_dict",
    "config_to_dict",
    "save_config",
    "apply_overrides",
    "require",
    "validate_tree",
    # shared
    "RunConfig",
    # dist (placement of the models under torchrun)
    "TrainedDistConfig",
    "LMDistConfig",
    # LoRA (model.lora of sft, reward, ppo and reinforce)
    "LoraConfig",
    # sft (and the supervised stages' shared sections)
    "InitModelConfig",
    "TrainLoopConfig",
    "SFTDataConfig",
    "SFTConfig",
    # reward
    "PreferenceDataConfig",
    "RewardLossConfig",
    "RewardConfig",
    # dpo
    "DPOAlgoConfig",
    "DPOConfig",
    # env (a multi-turn environment: the env section of ppo and reinforce)
    "EnvConfig",
    "RolloutConfig",
    # ppo (and the language-model sections shared with reinforce and demo)
    "LMModelConfig",
    "PromptDataConfig",
    "GenerationConfig",
    "PPOAlgoConfig",
    "PPOConfig",
    "RewardFnConfig",
    # reinforce
    "ReinforceAlgoConfig",
    "ReinforceConfig",
    # gym
    "GymEnvConfig",
    "GymAgentConfig",
    "GymPPOConfig",
    "GymReinforceConfig",
    "GymEvalConfig",
    "GymConfig",
    # demo
    "DemoModelConfig",
    "DemoSFTConfig",
    "DemoPairsConfig",
    "DemoRewardConfig",
    "DemoEvalConfig",
    "DemoLoraConfig",
    "DemoConfig",
    # inference: generate and score
    "GenerateModelConfig",
    "GenerateDataConfig",
    "GenerateSamplingConfig",
    "GenerateConfig",
    "ScoreModelConfig",
    "ServeRewardConfig",
    # bon
    "BonConfig",
    "BonAlgoConfig",
    "ScoreDataConfig",
    "ScoreConfig",
]
