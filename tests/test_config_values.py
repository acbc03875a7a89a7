"""Config values checked beyond their types: finite numbers, one key per mapping, lengths against
the model's config.json, and the same checks for a config built in Python."""
import json
import math

import pytest

from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.config import (
    ConfigError,
    GymConfig,
    LMModelConfig,
    PPOAlgoConfig,
    PPOConfig,
    PromptDataConfig,
    RunConfig,
    SFTConfig,
    load_config,
    validate_tree,
)
from fourfold.config.loader import DuplicateKeyError, parse_yaml
from fourfold.config.model_limits import position_limit

OK = ["model.policy=sft", "model.reward=rm", "data.prompts=p.jsonl"]


def _ppo(**algo) -> PPOConfig:
    return PPOConfig(model=LMModelConfig(policy="sft", reward="rm"), data=PromptDataConfig(prompts="p.jsonl"),
                     ppo=PPOAlgoConfig(**algo))


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_config_built_in_python_refuses_non_finite_numbers(value):
    with pytest.raises(ConfigError, match=r"^ppo\.lr: must be a finite number"):
        validate_tree(_ppo(lr=value))
    with pytest.raises(ConfigError, match=r"^reinforce_lr_multipliers\[1\]: must be a finite number"):
        validate_tree(ExperimentsConfig(reinforce_lr_multipliers=[1.0, value]))


@pytest.mark.parametrize("field,value,message", [
    ("iterations", "3", "ppo.iterations: expected int, got '3'"),
    ("lr", "1e-5", "ppo.lr: expected float, got '1e-5'"),
    ("whiten_advantages", 1, "ppo.whiten_advantages: expected bool, got 1"),
    ("kl_estimator", "k9", "ppo.kl_estimator: expected one of 'k1', 'k2', 'k3', 'abs'"),
    ("max_grad_norm", [1.0], "ppo.max_grad_norm: expected float or null"),
])
def test_a_config_built_in_python_is_type_checked_as_a_loaded_one(field, value, message):
    with pytest.raises(ConfigError) as e:
        validate_tree(_ppo(**{field: value}))
    assert message in str(e.value)


def test_python_values_the_loader_would_also_accept():
    validate_tree(_ppo(lr=1))  # an int where a float goes
    cfg = PPOConfig(model=LMModelConfig(policy="sft", reward="rm"), data=PromptDataConfig(prompts="p.jsonl"),
                    run=RunConfig(seed=2**63 - 1))
    validate_tree(cfg)
    with pytest.raises(ConfigError, match=r"^run: expected a RunConfig section, got dict"):
        validate_tree(PPOConfig(model=cfg.model, data=cfg.data, run={"seed": 1}))


def test_duplicate_keys_at_any_depth_and_merge_keys_are_fine():
    with pytest.raises(DuplicateKeyError, match=r"line 4: duplicate key 'lam' \(first at line 3\)"):
        parse_yaml("ppo:\n  lr: 1\n  lam: 0.9\n  lam: 0.8\n")
    with pytest.raises(DuplicateKeyError, match="duplicate key 'x'"):
        parse_yaml("{x: 1, x: 2}")
    assert parse_yaml("base: &b\n  lr: 1\nppo:\n  <<: *b\n  lr: 2\n") == {"base": {"lr": 1}, "ppo": {"lr": 2}}
    assert parse_yaml("a: 1\nb: {a: 2}\n") == {"a": 1, "b": {"a": 2}}  # the same name in two mappings


def test_duplicate_key_in_an_override_value():
    with pytest.raises(ConfigError, match=r"override 'ppo=\{lr: 1, lr: 2\}': line 1: duplicate key 'lr'"):
        load_config(PPOConfig, None, OK + ["ppo={lr: 1, lr: 2}"])


@pytest.mark.parametrize("override,shown,why,quoted", [
    ("data.prompts=a #b", "'a'", "' #b' is a YAML comment", "data.prompts='a #b'"),
    ("data.prompts=#b", "null", "all a YAML comment", "data.prompts='#b'"),
    ("ppo.kl_coef=0.02 # tuned", "0.02", "' # tuned' is a YAML comment", "ppo.kl_coef='0.02 # tuned'"),
    ("data.prompts=[a, b] #c", "['a', 'b']", "' #c' is a YAML comment", "data.prompts='[a, b] #c'"),
    ("data.prompts= p.jsonl", "'p.jsonl'", "spaces at its ends", "data.prompts=' p.jsonl'"),
    ("data.prompts=p.jsonl ", "'p.jsonl'", "spaces at its ends", "data.prompts='p.jsonl '"),
    ("data.prompts=--- p", "'p'", "YAML drops '---'", "data.prompts='--- p'"),
    ("data.prompts=&x p", "'p'", "YAML syntax", "data.prompts='&x p'"),
    ("data.prompts=it's #1", "\"it's\"", "YAML comment", "data.prompts='it''s #1'"),
])
def test_an_override_yaml_would_not_keep_as_typed_is_an_error_naming_the_key(override, shown, why, quoted):
    with pytest.raises(ConfigError) as e:
        load_config(PPOConfig, None, OK + [override])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"override {override!r}: YAML reads {override.split('=')[0]} as {shown} ")
    assert why in msg and msg.endswith(f"to keep the text as written, quote it: {quoted}"), msg
    # the form the message gives is read as the text typed
    if override.startswith("data.prompts="):
        assert load_config(PPOConfig, None, OK + [quoted]).data.prompts == override.split("=", 1)[1]


def test_every_override_form_reads_as_before():
    cfg = load_config(PPOConfig, None, [
        "model.policy=a#b", "model.reward='runs/x #2'", 'data.prompts="p q.jsonl"', "ppo.kl_coef=1e-3",
        "ppo.vf_clip_eps=null", "ppo.whiten_advantages=false", "run.threads=2", "ppo.lr= 0.5", "run.seed=7 ",
        "model.lora={r: 4, target_modules: [q_proj, v_proj]}", "generation.stop_at_eos=true",
    ])
    assert (cfg.model.policy, cfg.model.reward, cfg.data.prompts) == ("a#b", "runs/x #2", "p q.jsonl")
    assert cfg.ppo.kl_coef == 1e-3 and cfg.ppo.vf_clip_eps is None and cfg.ppo.whiten_advantages is False
    assert cfg.run.threads == 2 and cfg.ppo.lr == 0.5 and cfg.run.seed == 7 and cfg.generation.stop_at_eos is True
    assert cfg.model.lora.r == 4 and list(cfg.model.lora.target_modules) == ["q_proj", "v_proj"]
    # text YAML cannot parse stays as typed, as before
    assert load_config(PPOConfig, None, OK[:2] + ["data.prompts=[p"]).data.prompts == "[p"


def test_settings_are_set_as_given_never_read_as_yaml():
    cfg = load_config(SFTConfig, None, ["model.path=m", "data.train=t.jsonl"],
                      settings={"run.output_dir": "runs/x #2 ", "run.seed": 3})
    assert cfg.run.output_dir == "runs/x #2 " and cfg.run.seed == 3


def test_position_limits_are_read_from_config_json_only(tmp_path):
    def model(name, cfg):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        return str(d)

    assert position_limit(model("llama", {"max_position_embeddings": 2048, "n_positions": 5})) == (
        "max_position_embeddings", 2048)
    assert position_limit(model("gpt2", {"n_positions": 1024})) == ("n_positions", 1024)
    assert position_limit(model("vlm", {"text_config": {"max_position_embeddings": 512}})) == (
        "max_position_embeddings", 512)
    assert position_limit(model("none", {"hidden_size": 8})) is None
    assert position_limit(str(tmp_path / "missing")) is None  # left to the loader's own error
    assert position_limit("Qwen/Qwen2-0.5B") is None  # a hub name: nothing read, nothing downloaded
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    assert position_limit(str(bad)) is None


def test_lengths_that_fit_pass(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 96}))
    load_config(PPOConfig, None, [f"model.policy={d}", "model.reward_fn=f.py:f", "model.critic_init=policy",
                                  "data.prompts=p", "data.max_prompt_len=64", "generation.max_new_tokens=32"])
    load_config(SFTConfig, None, [f"model.path={d}", "data.train=t", "train.max_len=96"])
    with pytest.raises(ConfigError, match=r"^command line: train\.max_len = 97 tokens is more than model\.path's"):
        load_config(SFTConfig, None, [f"model.path={d}", "data.train=t", "train.max_len=97"])


def test_gym_defaults_and_every_example_stay_valid():
    validate_tree(GymConfig())
    validate_tree(ExperimentsConfig())
