"""fourfold.config as a package: the public names it had as one module, the exact resolved-config
output of every stage (stage caches hash it), and its stdlib-only imports."""
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

import fourfold.config as config
from fourfold.apps.experiments import config as experiments_config
from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.config import (
    DemoConfig,
    GymConfig,
    PPOConfig,
    ReinforceConfig,
    RewardConfig,
    SFTConfig,
    config_to_dict,
    save_config,
)

GOLDEN = Path(__file__).resolve().parent / "golden" / "config"

# Every config class, constant and loader function of the single module fourfold/config.py had
# (commit 590530b); each must stay importable from fourfold.config, except the experiments'
# vocabulary, which moved to the experiments (fourfold.apps.experiments.config).
OLD_CLASSES = [
    "RunConfig", "GymEnvConfig", "GymAgentConfig", "GymPPOConfig", "GymReinforceConfig", "GymEvalConfig", "GymConfig",
    "LMModelConfig", "PromptDataConfig", "GenerationConfig", "PPOAlgoConfig", "PPOConfig", "ReinforceAlgoConfig",
    "ReinforceConfig", "InitModelConfig", "TrainLoopConfig", "SFTDataConfig", "SFTConfig", "PreferenceDataConfig",
    "RewardLossConfig", "RewardConfig", "DemoModelConfig", "DemoSFTConfig", "DemoPairsConfig", "DemoRewardConfig",
    "DemoEvalConfig", "DemoConfig",
]
MOVED_TO_EXPERIMENTS = ["ExperimentsClaimsConfig", "ExperimentsConfig", "EXPERIMENT_ARMS", "CLAIM_GROUPS"]
OLD_FUNCTIONS = ["load_config", "config_from_dict", "config_to_dict", "save_config", "apply_overrides", "require",
                 "validate_tree"]

STAGES = [SFTConfig, RewardConfig, PPOConfig, ReinforceConfig, GymConfig, DemoConfig, ExperimentsConfig]


def test_every_old_public_name_is_importable():
    for name in OLD_CLASSES:
        assert dataclasses.is_dataclass(getattr(config, name)), name
    for name in OLD_FUNCTIONS:
        assert callable(getattr(config, name)), name
    for name in MOVED_TO_EXPERIMENTS:
        assert hasattr(experiments_config, name) and not hasattr(config, name), name
    from fourfold.errors import ConfigError

    assert config.ConfigError is ConfigError
    assert set(OLD_CLASSES + OLD_FUNCTIONS + ["ConfigError"]) <= set(config.__all__)
    assert all(hasattr(config, name) for name in config.__all__)


@pytest.mark.parametrize("cls", STAGES, ids=lambda c: c.__name__)
def test_resolved_config_is_byte_identical_to_the_golden_file(cls, tmp_path):
    """save_config of each stage's defaults, byte for byte: field order, names and defaults. The
    golden files were written by the single-module config of 590530b (GymConfig's after the PPO
    keys took the language-model names). A change here changes every stage-cache key: update the
    golden file only on purpose."""
    save_config(cls(), tmp_path / "config.yaml")
    assert (tmp_path / "config.yaml").read_bytes() == (GOLDEN / f"{cls.__name__}.yaml").read_bytes()
    assert list(config_to_dict(cls())) == [f.name for f in dataclasses.fields(cls)]


def test_config_imports_only_the_standard_library():
    """A fresh interpreter imports fourfold.config: every module it adds is the standard library,
    fourfold.config.*, fourfold.errors, fourfold.names (the zoo's names, torch-free) or fourfold
    itself (PyYAML is imported only when a file is read or written)."""
    code = ("import sys; before = set(sys.modules); import fourfold.config; "
            "print('\\n'.join(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    added = out.split()
    assert "fourfold.config.loader" in added
    allowed_fourfold = {"fourfold", "fourfold.errors", "fourfold.names"}
    bad = [m for m in added if not (m.split(".")[0] in sys.stdlib_module_names or m in allowed_fourfold
                                    or m == "fourfold.config" or m.startswith("fourfold.config."))]
    assert bad == []
