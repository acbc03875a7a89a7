"""A user's reward function at the boundary: a file that does not compile, a function that cannot
take two lists or returns the wrong thing is one line naming the function and what it returned; an
exception inside the user's own code keeps its traceback, under a line saying whose code it was.
And an unknown or uninstallable Gymnasium env is one line."""
import numpy as np
import pytest
import torch
from errortest_utils import RUN, cli, one_line_error, reinforce_args

from fourfold.errors import ConfigError, UserCodeError
from fourfold.models.reward_fn import call_reward_fn, check_scores, load_reward_fn
from fourfold.models.roles import FunctionReward


def _reward_file(tmp_path, body: str) -> str:
    path = tmp_path / "my_reward.py"
    path.write_text(body)
    return str(path)


def test_a_reward_file_with_a_syntax_error(zoo, tmp_path, capsys):
    path = _reward_file(tmp_path, "def score(prompts, responses):\n    return [1.0 for r in responses\n")
    one_line_error(capsys, reinforce_args(zoo, tmp_path / "a", f"model.reward_fn={path}:score"),
                   "model.reward_fn", f"{path}:2", "syntax error")


def test_a_reward_function_that_does_not_take_two_lists(zoo, tmp_path, capsys):
    path = _reward_file(tmp_path, "def score(responses):\n    return [1.0] * len(responses)\n")
    one_line_error(capsys, reinforce_args(zoo, tmp_path / "a", f"model.reward_fn={path}:score"),
                   f"{path}:score", "must take two lists", "score(responses)")


@pytest.mark.parametrize("returned, shown", [
    ("[1.0]", "1 scores for 2 responses"),
    ("['good'] * len(responses)", "str 'good' as score 0"),
    ("None", "returned None"),
    ("[[1.0]] * len(responses)", "list [1.0] as score 0"),
    ("{r: 1.0 for r in responses}", "returned dict {"),
    ("'1.0'", "returned str '1.0'"),
])
def test_a_reward_function_returning_the_wrong_thing(zoo, tmp_path, capsys, returned, shown):
    path = _reward_file(tmp_path, f"def score(prompts, responses):\n    return {returned}\n")
    one_line_error(capsys, reinforce_args(zoo, tmp_path / "a", f"model.reward_fn={path}:score"),
                   f"model.reward_fn: {path}:score returned", shown)


def test_an_exception_inside_the_users_function_keeps_its_traceback(zoo, tmp_path, capsys):
    path = _reward_file(tmp_path, "def helper(r):\n    return 1 / 0\n\n"
                                  "def score(prompts, responses):\n    return [helper(r) for r in responses]\n")
    code, err = cli(capsys, reinforce_args(zoo, tmp_path / "a", f"model.reward_fn={path}:score"))
    assert code == 2
    first, rest = err.split("\n", 1)
    assert first.startswith("fourfold reinforce: error: model.reward_fn: ") and "raised ZeroDivisionError" in first
    assert "user's code" in first
    assert rest.startswith("Traceback") and f'File "{path}", line 2, in helper' in rest
    assert rest.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "fourfold/" not in rest  # the user's frames only


@pytest.mark.parametrize("stage", ["reinforce", "ppo"])
def test_a_run_where_no_update_goes_through_exits_with_one_line(zoo, tmp_path, capsys, stage):
    """A reward function that returns only NaN, in a run shorter than run.max_consecutive_skips:
    every iteration is skipped, and the run ends non-zero saying so, exporting no policy."""
    path = _reward_file(tmp_path, "def score(prompts, responses):\n    return [float('nan')] * len(responses)\n")
    out = tmp_path / "run"
    argv = reinforce_args(zoo, out, f"model.reward_fn={path}:score", "reinforce.iterations=2")
    if stage == "ppo":
        argv = ["ppo", *[a for a in argv[1:] if not a.startswith("reinforce.")], "ppo.iterations=2",
                "ppo.rollout_batch_size=2", "ppo.minibatch_size=2", "model.critic_init=policy"]
    one_line_error(capsys, argv, "no update went through in 2 step(s)", "reward_score", "nothing was exported")
    assert not (out / "policy").exists()
    events = (out / "events.jsonl").read_text()
    assert events.count("nonfinite_skip") == 2


def test_an_exception_while_importing_the_users_file(tmp_path):
    path = _reward_file(tmp_path, "raise RuntimeError('no config')\n")
    with pytest.raises(UserCodeError, match="importing .*my_reward.py raised RuntimeError: no config") as info:
        load_reward_fn(f"{path}:score")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_a_file_is_executed_once_per_content(tmp_path):
    """Loading the same file twice returns the same function and runs its import-time code once
    (the server loads a function per column set); a changed file runs anew; an import that raised
    is not kept, so the fixed file loads."""
    log = tmp_path / "imports.txt"
    body = f"open({str(log)!r}, 'a').write('x')\ndef score(prompts, responses):\n    return [1.0] * len(responses)\n"
    path = _reward_file(tmp_path, body)
    first, again = load_reward_fn(f"{path}:score"), load_reward_fn(f"{path}:score", "reward.parts[0]")
    assert first is again and log.read_text() == "x"
    _reward_file(tmp_path, body.replace("1.0", "2.0"))
    changed = load_reward_fn(f"{path}:score")
    assert changed is not first and changed([""], ["a"]) == [2.0] and log.read_text() == "xx"
    _reward_file(tmp_path, "raise RuntimeError('not yet')\n")
    with pytest.raises(UserCodeError):
        load_reward_fn(f"{path}:score")
    _reward_file(tmp_path, body)
    assert load_reward_fn(f"{path}:score") is first and log.read_text() == "xx"


def test_scores_that_pass():
    assert check_scores([1, 2.5, True], 3, "f") == [1.0, 2.5, 1.0]
    assert check_scores(np.array([0.5, 1.5]), 2, "f") == [0.5, 1.5]
    assert check_scores(torch.tensor([0.5, 1.5]), 2, "f") == [0.5, 1.5]
    assert check_scores((np.float32(2.0),), 1, "f") == [2.0]
    with pytest.raises(ConfigError, match=r"f returned an array of shape \(2, 1\)"):
        check_scores(np.zeros((2, 1)), 2, "f")
    reward = FunctionReward(lambda p, r: [len(x) for x in r])  # named after the function by default
    assert reward.name == "test_scores_that_pass.<locals>.<lambda>"
    assert reward(torch.zeros(2, 1), None, ["a", "b"], ["xy", "z"]).tolist() == [2.0, 1.0]
    with pytest.raises(UserCodeError, match="boom raised KeyError"):
        call_reward_fn(lambda p, r: {}["x"], ["a"], ["b"], "boom")


@pytest.mark.parametrize("env_id, shown", [
    ("NoSuchEnv-v0", "doesn't exist"),
    ("CartPole-v9", "version"),
    ("fourfold_no_such_package:Env-v0", "No module named 'fourfold_no_such_package'"),
])
def test_an_unknown_or_uninstallable_gym_env(tmp_path, capsys, env_id, shown):
    one_line_error(capsys, ["gym", f"env.id={env_id}", "ppo.total_timesteps=256", f"run.output_dir={tmp_path / 'g'}",
                            *RUN], "env.id", env_id, shown)


def test_gym_env_kwargs_it_does_not_take(tmp_path, capsys):
    one_line_error(capsys, ["gym", "env.kwargs={bogus: 1}", "ppo.total_timesteps=256",
                            f"run.output_dir={tmp_path / 'g'}", *RUN], "env.kwargs", "bogus")
