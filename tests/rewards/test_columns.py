"""A reward function sees the prompts file's other columns: by name, or all of them through
``**columns``; a named column the file lacks is one line; nothing is dropped without a word."""

import warnings

import pytest

from fourfold.errors import ConfigError
from fourfold.models.reward_fn import call_reward_fn, column_plan

COLUMNS = ("answer", "id")


def positional(prompts, responses):
    return [0.0] * len(responses)


def named(prompts, responses, answer):
    return [float(r == a) for r, a in zip(responses, answer)]


def optional(prompts, responses, answer=None, hint="none"):
    return [float(hint == "none")] * len(responses)


def everything(prompts, responses, **columns):
    return [float(len(columns))] * len(responses)


def missing(prompts, responses, solution):
    return [0.0] * len(responses)


def test_the_plan_of_each_signature():
    p = column_plan(positional, "f.py:positional", COLUMNS, "p.jsonl")
    assert (p.named, p.rest, p.unused) == ((), False, ("answer", "id"))
    p = column_plan(named, "f.py:named", COLUMNS, "p.jsonl")
    assert (p.named, p.rest, p.unused) == (("answer",), False, ("id",))
    p = column_plan(everything, "f.py:everything", COLUMNS, "p.jsonl")
    assert (p.named, p.rest, p.unused) == ((), True, ())
    with pytest.warns(UserWarning, match=r"f.py:optional takes 'hint' but p.jsonl has no such column: it keeps its default 'none'"):
        p = column_plan(optional, "f.py:optional", COLUMNS, "p.jsonl")
    assert p.named == ("answer",)


def test_a_named_column_the_file_lacks_is_one_line():
    with pytest.raises(ConfigError) as e:
        column_plan(missing, "f.py:missing", COLUMNS, "data/p.jsonl")
    assert str(e.value) == ("model.reward_fn: f.py:missing takes 'solution', but data/p.jsonl has no column 'solution' "
                            "(its columns: answer, id)")
    with pytest.raises(ConfigError, match=r"its columns: none besides the prompt"):
        column_plan(missing, "f.py:missing", (), "data/p.jsonl")


def test_each_call_gets_its_columns_aligned_with_the_responses():
    cols = {"answer": ["a", "b", "b"], "id": [1, 2, 2]}  # the second prompt's K=2 samples repeat its row
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan_named = column_plan(named, "f.py:named", COLUMNS, "p.jsonl")
        plan_all = column_plan(everything, "f.py:everything", COLUMNS, "p.jsonl")
    assert call_reward_fn(named, ["p"] * 3, ["a", "a", "b"], "named", plan_named.select(cols)) == [1.0, 0.0, 1.0]
    assert call_reward_fn(everything, ["p"] * 3, ["x"] * 3, "everything", plan_all.select(cols)) == [2.0, 2.0, 2.0]
    assert call_reward_fn(positional, ["p"], ["x"], "positional") == [0.0]  # the two-list form, unchanged
