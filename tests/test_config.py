"""Configs: YAML + overrides, one-line errors naming the key, defaults kept, examples valid."""
import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fourfold.config import (
    ConfigError,
    DemoConfig,
    GymConfig,
    PPOConfig,
    ReinforceConfig,
    RewardConfig,
    SFTConfig,
    load_config,
)

ROOT = Path(__file__).resolve().parents[1]
OK = ["model.policy=sft", "model.reward=rm", "data.prompts=p.jsonl"]


def err(overrides, cls=PPOConfig, path=None):
    with pytest.raises(ConfigError) as e:
        load_config(cls, path, overrides)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_overrides_parse_yaml_scalars():
    cfg = load_config(PPOConfig, None, OK + ["ppo.kl_coef=1e-3", "ppo.vf_clip_eps=null", "run.threads=2"])
    assert cfg.ppo.kl_coef == 0.001 and cfg.ppo.vf_clip_eps is None and cfg.run.threads == 2


def test_unknown_key_suggests_the_right_one():
    assert "ppo.kl_coeff: unknown key (did you mean 'ppo.kl_coef'?)" in err(OK + ["ppo.kl_coeff=0.1"])
    assert "unknown key" in err(OK + ["nonsense=1"])


@pytest.mark.parametrize("override,fragment", [
    ("ppo.minibatch_size=128", "ppo.minibatch_size: 128 is larger than rollout_batch_size=64"),
    ("ppo.minibatch_size=24", "ppo.rollout_batch_size: 64 is not divisible by minibatch_size=24"),
    ("ppo.clip_eps=0", "ppo.clip_eps: must be > 0"),
    ("ppo.kl_coef=-0.1", "ppo.kl_coef: must be >= 0"),
    ("generation.temperature=0", "generation.temperature: must be > 0"),
    ("ppo.ppo_epochs=abc", "ppo.ppo_epochs: expected int, got 'abc'"),
    ("ppo.whiten_advantages=maybe", "ppo.whiten_advantages: expected bool"),
    ("ppo.kl_estimator=k9", "ppo.kl_estimator: expected one of 'k1', 'k2', 'k3', 'abs'"),
    ("run.device=tpu", "run.device: expected 'auto', 'cpu', 'cuda' or 'cuda:N'"),
])
def test_impossible_values_are_one_line_errors(override, fragment):
    assert fragment in err(OK + [override])


def test_missing_paths_are_named_before_any_model_loads():
    assert "model.policy: missing" in err(["model.reward=rm", "data.prompts=p"])
    assert "data.prompts: missing" in err(["model.policy=a", "model.reward=rm"])
    assert "model.reward: no reward: set model.reward (a reward-model directory)" in err(["model.policy=a", "data.prompts=p"])


def test_yaml_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("ppo:\n  kl_coef: [1,\n")
    assert f"{bad}: line" in err([], path=bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    assert "expected a mapping at the top level" in err([], path=lst)
    assert "config file not found" in err([], path=tmp_path / "missing.yaml")
    typo = tmp_path / "typo.yaml"
    typo.write_text("ppo:\n  lamda: 0.9\n")
    msg = err(OK, path=typo)
    assert str(typo) in msg and "ppo.lamda: unknown key (did you mean 'ppo.lam'?)" in msg


def test_partial_section_keeps_stage_defaults():
    cfg = load_config(PPOConfig, None, OK + ["run.seed=3"])
    assert cfg.run.output_dir == "runs/ppo" and cfg.run.seed == 3
    demo = load_config(DemoConfig, None, ["ppo.kl_coef=0"])
    assert demo.ppo.iterations == DemoConfig().ppo.iterations and demo.ppo.kl_coef == 0


@pytest.mark.parametrize("name,cls", [("ppo", PPOConfig), ("reinforce", ReinforceConfig), ("sft", SFTConfig),
                                      ("reward", RewardConfig), ("cartpole", GymConfig), ("acrobot", GymConfig),
                                      ("demo", DemoConfig)])
def test_examples_load(name, cls):
    cfg = load_config(cls, ROOT / "examples" / f"{name}.yaml")
    assert dataclasses.is_dataclass(cfg)


def test_demo_example_is_the_default():
    assert load_config(DemoConfig, ROOT / "examples" / "demo.yaml") == DemoConfig()


_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 300), st.floats(allow_nan=True),
                    st.text(max_size=8), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
_keys = st.sampled_from(["ppo.kl_coef", "ppo.minibatch_size", "ppo.rollout_batch_size", "ppo.clip_eps", "ppo.lam",
                         "generation.temperature", "generation.max_new_tokens", "run.device", "run.threads", "model.policy",
                         "model.dtype", "ppo.kl_estimator", "ppo", "run", "data.on_error", "ppo.kl_coeff", "modle.policy"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_keys, _values, max_size=5))
def test_fuzzed_configs_fail_only_with_config_errors(tmp_path_factory, entries):
    """Random values at random keys: either a valid config or a one-line ConfigError, never another error."""
    import yaml

    tree: dict = {}
    for key, value in entries.items():
        node = tree
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {}) if isinstance(node.get(p, {}), dict) else {}
        node[parts[-1]] = value
    path = tmp_path_factory.mktemp("fuzz") / "c.yaml"
    path.write_text(yaml.safe_dump(tree))
    try:
        load_config(PPOConfig, path, OK)
    except ConfigError as e:
        assert str(e) and "\n" not in str(e)


# The classic-control PPO section takes the language-model section's names; each old (CleanRL)
# key is refused with its new name, from a file and from the command line.
RENAMED_GYM_KEYS = [("anneal_lr", "lr_schedule"), ("gae_lambda", "lam"), ("num_minibatches", "minibatch_size"),
                    ("update_epochs", "ppo_epochs"), ("norm_adv", "whiten_advantages"), ("clip_coef", "clip_eps"),
                    ("clip_vloss", "vf_clip_eps"), ("ent_coef", "entropy_coef")]


@pytest.mark.parametrize("old,new", RENAMED_GYM_KEYS)
def test_renamed_gym_ppo_keys_name_the_new_key(old, new, tmp_path):
    path = tmp_path / "cartpole.yaml"
    path.write_text(f"algo: ppo\nppo:\n  total_timesteps: 2048\n  {old}: 1\n")
    assert err([], cls=GymConfig, path=path).startswith(f"{path}: ppo.{old}: renamed to ppo.{new}")
    assert err([f"ppo.{old}=1"], cls=GymConfig).startswith(f"command line: ppo.{old}: renamed to ppo.{new}")


def test_gym_and_lm_ppo_sections_share_one_vocabulary():
    from fourfold.config import GymPPOConfig, PPOAlgoConfig

    gym_keys = {f.name for f in dataclasses.fields(GymPPOConfig)}
    lm_keys = {f.name for f in dataclasses.fields(PPOAlgoConfig)}
    shared = {"lr", "lr_schedule", "gamma", "lam", "minibatch_size", "ppo_epochs", "whiten_advantages", "clip_eps",
              "vf_clip_eps", "entropy_coef", "max_grad_norm"}
    assert shared <= gym_keys and shared <= lm_keys
    assert not {old for old, _ in RENAMED_GYM_KEYS} & (gym_keys | lm_keys)
    # a renamed key's value keeps its meaning under the new name (old example values)
    cfg = load_config(GymConfig, None, ["ppo.lr_schedule=constant", "ppo.minibatch_size=64", "ppo.vf_clip_eps=0.2"])
    assert cfg.num_minibatches == 4 and cfg.ppo.vf_clip_eps == 0.2 and GymConfig().num_minibatches == 1
    assert "ppo.minibatch_size: 96 does not divide the batch" in err(["ppo.minibatch_size=96"], cls=GymConfig)
