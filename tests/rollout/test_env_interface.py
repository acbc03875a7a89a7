"""The environment interface (fourfold.rollout.env, the env config section): loading the factory,
checked calls, and the user's errors as one line naming the environment and the row."""

import textwrap
import typing

import pytest

from fourfold.config import EnvConfig, validate_tree
from fourfold.core.turns import TRUNCATION_MODES
from fourfold.errors import ConfigError, UserCodeError
from fourfold.rollout.env import check_observation, load_env_factory, make_envs

ENV_FILE = textwrap.dedent('''
    class Guess:
        def __init__(self, row):
            self.answer = row["answer"]
            self.turns = 0

        def reset(self):
            return [{"role": "user", "content": "guess " + row_prompt(self)}]

        def step(self, action):
            self.turns += 1
            if action.strip() == self.answer:
                return "right", 1.0, True
            if action == "boom":
                raise KeyError("no such move")
            if action == "bad-reward":
                return "x", "1", False
            if action == "bad-done":
                return "x", 1.0, "yes"
            if action == "bad-shape":
                return "x", 1.0
            return "wrong", 0, False

    def row_prompt(env):
        return "a number"

    def make_env(row):
        return Guess(row)

    def broken(row):
        return row["missing"]

    def not_an_env(row):
        return 3
''')


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "envs.py"
    path.write_text(ENV_FILE)
    return path


def test_the_config_section_and_its_one_line_errors():
    validate_tree(EnvConfig(factory="envs.py:make_env"), "env")
    assert typing.get_args(typing.get_type_hints(EnvConfig)["truncation"]) == TRUNCATION_MODES
    cases = [
        (EnvConfig(factory="envs.py"), "env.factory: 'envs.py': expected 'file.py:make_env' or 'module:make_env'"),
        (EnvConfig(max_turns=0), "env.max_turns: must be >= 1, got 0"),
        (EnvConfig(max_tokens=1), "env.max_tokens: must be >= 2, got 1"),
        (EnvConfig(stop=["</a>", ""]), "env.stop[1]: must be a non-empty string, got ''"),
        (EnvConfig(observation_role=" "), "env.observation_role: must be a role name"),
    ]
    for cfg, message in cases:
        with pytest.raises(ConfigError) as e:
            validate_tree(cfg, "env")
        assert str(e.value).startswith(message) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="env.truncation: expected one of 'bootstrap', 'terminal'"):
        validate_tree(EnvConfig(truncation="cut"), "env")


def test_an_environment_from_a_file_steps_with_checked_values(env_file):
    (env,) = make_envs(f"{env_file}:make_env", [{"prompt": "p", "answer": "7"}], ["prompts.jsonl:3"])
    assert env.reset() == [{"role": "user", "content": "guess a number"}]
    assert env.step("3") == ("wrong", 0.0, False)
    obs, reward, done = env.step(" 7 ")
    assert (obs, reward, done) == ("right", 1.0, True) and type(reward) is float and type(done) is bool


def test_a_python_callable_is_a_factory():
    class Echo:
        def reset(self):
            return "say something"

        def step(self, action):
            return action, float(len(action)), True

    rows = [{"prompt": "a"}, {"prompt": "b"}]
    envs = make_envs(lambda row: Echo(), rows, ["<rows>:1", "<rows>:2"])
    assert [e.step("hi") for e in envs] == [("hi", 2.0, True)] * 2
    fn, name = load_env_factory(make_envs)
    assert fn is make_envs and name == "make_envs"


def test_the_users_errors_name_the_environment_and_the_row(env_file):
    spec = f"{env_file}:make_env"
    (env,) = make_envs(spec, [{"answer": "7"}], ["prompts.jsonl:3"])
    with pytest.raises(UserCodeError) as e:
        env.step("boom", turn=2)
    assert str(e.value) == (f"env.factory: {spec}: step() of turn 2 of the environment of row prompts.jsonl:3 raised "
                            "KeyError: 'no such move' (the traceback of the user's code follows)")
    assert isinstance(e.value.__cause__, KeyError) and e.value.__cause__.__traceback__ is not None
    with pytest.raises(UserCodeError, match=r"broken raised KeyError making the environment of row p.jsonl:9: 'missing'") as e:
        make_envs(f"{env_file}:broken", [{"answer": "1"}], ["p.jsonl:9"])
    assert isinstance(e.value.__cause__, KeyError)
    bad = {
        "bad-reward": "returned reward str '1'; expected a real number",
        "bad-done": "returned done str 'yes'; expected a bool",
        "bad-shape": "returned tuple ('x', 1.0); expected a tuple (observation, reward, done)",
    }
    for action, message in bad.items():
        with pytest.raises(ConfigError) as e:
            env.step(action, turn=1)
        assert str(e.value) == f"env.factory: {spec}: step() of turn 1 of row prompts.jsonl:3 {message}"
    with pytest.raises(ConfigError, match="returned int 3 for row p.jsonl:1, which has no reset\\(\\) and no step\\(\\)"):
        make_envs(f"{env_file}:not_an_env", [{}], ["p.jsonl:1"])


def test_loading_errors_are_config_errors(tmp_path, env_file):
    with pytest.raises(ConfigError, match=r"env.factory: .*nope.py: no such file"):
        load_env_factory(f"{tmp_path / 'nope.py'}:make_env")
    with pytest.raises(ConfigError, match=r"env.factory: .*envs.py has no function 'make_it'"):
        load_env_factory(f"{env_file}:make_it")
    with pytest.raises(ConfigError, match="env.factory: 'make_env': expected"):
        load_env_factory("make_env")
    (tmp_path / "raises.py").write_text("raise RuntimeError('at import')\n")
    with pytest.raises(UserCodeError, match="env.factory: importing .*raises.py raised RuntimeError: at import"):
        load_env_factory(f"{tmp_path / 'raises.py'}:make_env")


def test_observations_are_strings_or_messages():
    assert check_observation("x", "reset()") == "x"
    for bad in ([], [{"role": "user"}], 3, None, [{"role": "user", "content": 1}]):
        with pytest.raises(ConfigError, match="reset\\(\\) returned .*expected an observation"):
            check_observation(bad, "reset()")
