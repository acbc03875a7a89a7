"""The reward sources in the config (model.reward_fn, reward_fns, reward_weight, reward_url and its
client's keys): one line naming the key for each bad value, a callable accepted in Python, the
parts' names and the plan's parts."""
import pytest

from fourfold.config import PPOConfig, RewardFnConfig, ScoreConfig, config_to_dict, load_config, validate_tree
from fourfold.errors import ConfigError

BASE = ["model.policy=a", "data.prompts=p", "model.critic_init=policy"]


def err(overrides, cls=PPOConfig):
    with pytest.raises(ConfigError) as e:
        load_config(cls, None, overrides)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("overrides,message", [
    ([], "model.reward: no reward: set model.reward (a reward-model directory), model.reward_fn, model.reward_fns "
         "or model.reward_url"),
    (["model.reward_fns=[{fn: a.py:f, wieght: 0.5}]"],
     "model.reward_fns[0].wieght: unknown key (did you mean 'model.reward_fns[0].weight'?)"),
    (["model.reward_fns=[{weight: 2}]"], "model.reward_fns[0].fn: missing: 'module:function' or 'path/to/file.py:function'"),
    (["model.reward_fns=[{fn: nocolon}]"], "model.reward_fns[0].fn: expected 'module:function' or 'file.py:function'"),
    (["model.reward_fns=[{fn: a.py:f, weight: .nan}]"], "model.reward_fns[0].weight: must be a finite number, got nan"),
    (["model.reward_fns=[{fn: a.py:f, weight: heavy}]"], "model.reward_fns[0].weight: expected float"),
    (["model.reward_fns=[{fn: a.py:f, options: 3}]"], "model.reward_fns[0].options: expected dict, got 3"),
    (["model.reward_fns=[{fn: a.py:f}, {fn: b.py:f}]"],
     "model.reward_fns[1].name: 'f' is already the name of model.reward_fns[0]; give each part its own name"),
    (["model.reward_fns=[{fn: a.py:score}]", "model.reward=rm"],
     "model.reward_fns[0].name: 'score': reward/score_mean is another metric's name"),
    (["model.reward_fns=[{fn: a.py:f, name: Big}]", "model.reward=rm"],
     "model.reward_fns[0].name: 'Big': a part's name (in reward/<name>_mean) is lower-case letters, digits and _"),
    (["model.reward_fn=a.py:f", "model.reward_fns=[{fn: b.py:g}]"],
     "model.reward_fn: set, and so is model.reward_fns: list the function in model.reward_fns"),
    (["model.reward_fn=a.py:f", "model.reward=rm"], "model.reward: model.reward (a reward-model directory) and "
                                                    "model.reward_fn are both set; keep one"),
    (["model.reward_fn=5"], "model.reward_fn: expected str or a function (in Python) or null, got 5"),
    (["model.reward_fn=a.py:f", "model.reward_weight=2"], "model.reward_weight: set, but model.reward is null"),
    (["model.reward_url=localhost:8000"], "model.reward_url: expected http://host:port of a reward server"),
    (["model.reward_url=http://h:1", "model.reward_timeout_s=0"], "model.reward_timeout_s: must be > 0, got 0.0"),
    (["model.reward_url=http://h:1", "model.reward_retries=-1"], "model.reward_retries: must be >= 0, got -1"),
    (["model.reward_url=http://h:1", "model.reward_backoff_s=-1"], "model.reward_backoff_s: must be >= 0"),
    (["model.reward_fn=a.py:f", "model.reward_url_weight=0.5"], "model.reward_url_weight: set, but model.reward_url is null"),
])
def test_bad_reward_sources_are_one_line_naming_the_key(overrides, message):
    assert message in err(BASE + overrides)


def test_critic_init_reward_still_needs_a_reward_model():
    assert "model.critic_init: 'reward' needs model.reward; use critic_init=policy with a reward function or a " \
           "reward server" in err(["model.policy=a", "data.prompts=p", "model.reward_url=http://h:1", "model.critic_init=reward"])


def test_the_sources_that_load_and_their_parts():
    from fourfold.models.plan import FUNCTION_PART, MODEL, REMOTE, is_weighted, plan_roles

    cfg = load_config(PPOConfig, None, ["model.policy=a", "data.prompts=p", "model.reward=rm", "model.reward_weight=0.5",
                                        "model.reward_fns=[{fn: 'a.py:f', weight: 2, options: {k: 1}}, "
                                        "{fn: 'b.py:g', name: fmt}]", "model.reward_url=http://127.0.0.1:9"])
    parts = plan_roles("ppo", cfg).reward_parts
    assert [(p.name, p.kind, p.weight, p.key) for p in parts] == [
        ("rm", MODEL, 0.5, "model.reward"), ("f", FUNCTION_PART, 2.0, "model.reward_fns[0].fn"),
        ("fmt", FUNCTION_PART, 1.0, "model.reward_fns[1].fn"), ("remote", REMOTE, 1.0, "model.reward_url")]
    assert parts[1].options == (("k", 1),) and dict(parts[3].settings) == {"timeout_s": 60.0, "retries": 3,
                                                                             "backoff_s": 1.0}
    assert is_weighted(parts)
    one = load_config(PPOConfig, None, BASE + ["model.reward_fn=a.py:score"])  # one source: its name is free
    assert not is_weighted(plan_roles("ppo", one).reward_parts)
    assert not is_weighted(plan_roles("ppo", load_config(PPOConfig, None, BASE + ["model.reward_url=http://h:1"])
                                      ).reward_parts)


def test_a_callable_in_python_and_its_record_in_the_resolved_config():
    def correct(prompts, responses, answer):
        return [0.0] * len(responses)

    cfg = load_config(PPOConfig, None, BASE + ["model.reward_fn=x.py:f"])
    cfg.model.reward_fn = correct
    validate_tree(cfg)
    assert config_to_dict(cfg)["model"]["reward_fn"] == f"python:{__name__}.{correct.__qualname__}"
    cfg.model.reward_fn, cfg.model.reward_fns = None, [RewardFnConfig(fn=correct, weight=0.5)]
    validate_tree(cfg)
    cfg.model.reward_fns = [{"fn": "a.py:f"}]  # a mapping in Python: the section type is asked for
    with pytest.raises(ConfigError, match=r"model.reward_fns: expected list of RewardFnConfig"):
        validate_tree(cfg)
    cfg.model.reward_fns = [RewardFnConfig(fn=lambda p, r: r)]  # several parts: a lambda needs a name
    cfg.model.reward = "rm"
    with pytest.raises(ConfigError, match=r"model.reward_fns\[0\].name: the function has no usable name"):
        validate_tree(cfg)


def test_score_takes_the_weighted_functions_too():
    cfg = load_config(ScoreConfig, None, ["data.rows=r.jsonl", "model.reward=rm", "model.reward_weight=0.5",
                                          "model.reward_fns=[{fn: 'a.py:f', weight: 2}]"])
    assert cfg.model.reward_fns[0].weight == 2.0
    assert "model.reward_fns[0].fn: missing" in err(["data.rows=r.jsonl", "model.reward_fns=[{weight: 1}]"], ScoreConfig)
