"""Data sources beyond files: local `datasets` directories (every loader), hub names (offline: a
one-line error), and preference rows with an implicit prompt."""
import pytest
from datatest_utils import write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.data import (
    encode_prompts,
    load_preferences,
    load_prompts,
    load_responses,
    load_sft,
    location,
    read_source,
    split_common_prefix,
)
from fourfold.errors import DataError

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()

U = {"role": "user", "content": "what is two plus four"}


def _dataset(rows):
    return datasets.Dataset.from_list(rows)


def _err(fn, *args, **kw) -> str:
    with pytest.raises(DataError) as info:
        fn(*args, **kw)
    msg = str(info.value)
    assert msg and "\n" not in msg
    return msg


# ------------------------------------------------------------------------- datasets directories


def test_a_saved_dataset_loads_in_every_loader(tmp_path):
    cases = [
        (load_prompts, [{"prompt": "hello world"}, {"prompt": "a b"}], lambda r: r.prompt, ["hello world", "a b"]),
        (load_sft, [{"prompt": "q", "completion": "a"}], lambda r: (r.prompt, r.completion), [("q", "a")]),
        (load_preferences, [{"prompt": "q", "chosen": "good", "rejected": "bad"}],
         lambda r: (r.prompt, r.chosen, r.rejected), [("q", "good", "bad")]),
        (load_responses, [{"prompt": "q", "response": "a", "finished": False}],
         lambda r: (r.prompt, r.response, r.finished), [("q", "a", False)]),
    ]
    for i, (loader, rows, view, expected) in enumerate(cases):
        d = tmp_path / f"ds{i}"
        _dataset(rows).save_to_disk(str(d))
        res = loader(d)
        assert [view(r) for r in res] == expected
        assert res.source == f"{d}[all]" and [r.line for r in res] == list(range(len(rows)))


def test_dataset_dict_split_defaults_to_train_and_is_chosen_with_a_colon(tmp_path):
    d = tmp_path / "dd"
    datasets.DatasetDict({"train": _dataset([{"prompt": "a"}, {"prompt": "b"}]),
                          "test": _dataset([{"prompt": "c"}])}).save_to_disk(str(d))
    assert [r.prompt for r in load_prompts(d)] == ["a", "b"]
    assert load_prompts(d).source == f"{d}[train]"
    res = load_prompts(f"{d}:test")
    assert [r.prompt for r in res] == ["c"] and res.source == f"{d}[test]" and res[0].source == f"{d}[test]"
    assert f"{d}: no split 'validation' (it has 'train', 'test'); choose one as {d}:SPLIT" == _err(load_prompts, f"{d}:validation")
    only_test = tmp_path / "only_test"
    datasets.DatasetDict({"test": _dataset([{"prompt": "c"}])}).save_to_disk(str(only_test))
    assert "no split 'train'" in _err(load_prompts, only_test)


def test_a_single_dataset_takes_no_split(tmp_path):
    d = tmp_path / "one"
    _dataset([{"prompt": "a"}]).save_to_disk(str(d))
    assert _err(load_prompts, f"{d}:train") == f"{d}: holds a single Dataset, which has no splits; drop ':train'"


def test_bad_rows_of_a_dataset_are_named_dir_split_row(tmp_path):
    d = tmp_path / "dd"
    rows = [{"prompt": "fine", "chosen": "a", "rejected": "b"}, {"prompt": "fine", "chosen": "same", "rejected": ""},
            {"prompt": "fine", "chosen": "same", "rejected": "same"}]
    datasets.DatasetDict({"train": _dataset(rows)}).save_to_disk(str(d))
    assert _err(load_preferences, d) == f"{d}[train]:row 1: field 'rejected' is empty"
    res = load_preferences(d, on_error="skip")
    assert len(res) == 1 and res.skipped == [f"{d}[train]:row 1: field 'rejected' is empty"]
    assert res.ties == [f"{d}[train]:row 2: 'chosen' and 'rejected' are identical"]  # a tie: left out, no error
    # ... and so are problems found at tokenisation
    long = tmp_path / "long"
    _dataset([{"prompt": "a"}, {"prompt": "a b c d e f g"}]).save_to_disk(str(long))
    from datatest_utils import make_tokenizer

    msg = _err(encode_prompts, load_prompts(long).records, make_tokenizer(), 4)
    assert msg.startswith(f"{long}[all]:row 1: prompt has 8 tokens")


def test_nulls_in_dataset_rows_count_as_absent_fields(tmp_path):
    """Arrow gives every row every column; a row's null is a field it does not have."""
    d = tmp_path / "mixed"
    features = datasets.Features({
        "prompt": datasets.Value("string"),
        "messages": datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")}),
    })
    datasets.Dataset.from_list([{"prompt": "hello", "messages": None}, {"prompt": None, "messages": [U]}],
                               features=features).save_to_disk(str(d))
    assert [r.prompt for r in load_prompts(d)] == ["hello", "user: what is two plus four\nassistant: "]


def test_directories_that_are_not_datasets(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    assert "is a directory but not a `datasets` directory" in _err(load_prompts, plain)
    assert "is a directory but not a `datasets` directory" in _err(load_prompts, f"{plain}:train")
    (tmp_path / "d.jsonl").mkdir()
    assert "is a directory, expected a file" in _err(load_prompts, tmp_path / "d.jsonl")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "state.json").write_text("{not json")
    assert f"{broken}: not a readable `datasets` directory" in _err(load_prompts, broken)
    empty = tmp_path / "empty"  # datasets itself cannot read back an empty saved dataset
    _dataset([{"prompt": "x"}]).select([]).save_to_disk(str(empty))
    assert f"{empty}: not a readable `datasets` directory" in _err(load_prompts, empty)


def test_an_empty_dataset_is_an_error(tmp_path, monkeypatch):
    d = tmp_path / "d"
    _dataset([{"prompt": "x"}]).save_to_disk(str(d))
    monkeypatch.setattr(datasets, "load_from_disk", lambda path: _dataset([{"prompt": "x"}]).select([]))
    assert _err(load_prompts, d) == f"{d}[all]: no records (the dataset is empty)"


def test_hub_names_offline_are_one_line_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    msg = _err(load_prompts, "no-such-org/no-such-dataset:train")
    assert msg.startswith("no-such-org/no-such-dataset:train: no such file or directory, and not loadable as a hub dataset")
    # a missing path with a data-file extension stays "file not found", never a hub lookup
    assert _err(load_prompts, "missing.jsonl") == "missing.jsonl: file not found"


def test_location_names_files_by_line_and_datasets_by_row():
    assert location("data.jsonl", 3) == "data.jsonl:3"
    assert location("dir[train]", 0) == "dir[train]:row 0"


def test_read_source_names_the_source(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [{"x": 1}])
    assert read_source(p) == (str(p), [(1, {"x": 1})])


# ---------------------------------------------------------------------------- implicit prompt


def test_split_common_prefix_cuts_at_a_word():
    hh = "\n\nHuman: what is two plus four\n\nAssistant:"
    assert split_common_prefix(hh + " six", hh + " seven") == (hh, " six", " seven")
    assert split_common_prefix("the answer is yes", "the answer is yellow") == ("the answer is", " yes", " yellow")
    assert split_common_prefix("a b\nc", "a b d") == ("a b", "\nc", " d")
    assert split_common_prefix("hi there", "hi there friend") == ("hi", " there", " there friend")
    assert split_common_prefix("yes", "no") == ("", "yes", "no")
    assert split_common_prefix("yes sir", "yesterday") == ("", "yes sir", "yesterday")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab \n", max_size=12), st.text(alphabet="ab \n", max_size=8), st.text(alphabet="ab \n", max_size=8))
def test_split_common_prefix_properties(common, x, y):
    a, b = common + x, common + y
    prompt, ra, rb = split_common_prefix(a, b)
    assert prompt + ra == a and prompt + rb == b
    if prompt:  # it ends on a word, and each reply starts with the whitespace before its first word
        assert not prompt[-1].isspace() and ra[:1].isspace() and rb[:1].isspace()


def test_preferences_without_prompt_take_the_shared_start(tmp_path):
    hh = "\n\nHuman: what is two plus four\n\nAssistant:"
    rows = [
        {"chosen": hh + " six", "rejected": hh + " seven"},
        {"chosen": [U, {"role": "assistant", "content": "six"}], "rejected": [U, {"role": "assistant", "content": "seven"}]},
    ]
    res = load_preferences(write_jsonl(tmp_path / "hh.jsonl", rows))
    assert [(r.prompt, r.chosen, r.rejected) for r in res] == [
        (hh, " six", " seven"),
        ("user: what is two plus four\nassistant: ", "six", "seven"),
    ]


def test_preferences_that_share_nothing_are_an_error_naming_the_line(tmp_path):
    good = {"chosen": "q: a", "rejected": "q: b"}
    p = write_jsonl(tmp_path / "p.jsonl", [good, {"chosen": "yes please", "rejected": "no thanks"}])
    assert _err(load_preferences, p).startswith(f"{p}:2: missing field 'prompt' (and 'chosen' and 'rejected' share no words")
    p = write_jsonl(tmp_path / "m.jsonl", [{"chosen": [{"role": "assistant", "content": "a"}],
                                           "rejected": [{"role": "assistant", "content": "b"}]}])
    assert _err(load_preferences, p).startswith(f"{p}:1: missing field 'prompt' (and 'chosen' and 'rejected' hold only")
    # a misspelt prompt key is still named, not silently replaced by the shared start
    p = write_jsonl(tmp_path / "typo.jsonl", [{"promt": "q", **good}])
    assert "did you mean 'prompt'" in _err(load_preferences, p)
    # replies that are identical once the prompt is taken off (or whole texts that are) are ties
    p = write_jsonl(tmp_path / "same.jsonl", [good, {"chosen": "q: a", "rejected": "q: a "}, {"chosen": "yes", "rejected": "yes"}])
    res = load_preferences(p)
    assert len(res) == 1 and res.ties == [f"{p}:{i}: 'chosen' and 'rejected' are identical" for i in (2, 3)]


# --------------------------------------------------------------------------- rows to score


def test_load_responses_forms_and_errors(tmp_path):
    rows = [
        {"prompt": "q", "response": "a"},
        {"prompt": "q", "response": "", "finished": True, "id": 7},
        {"messages": [U, {"role": "assistant", "content": "six"}], "finished": False},
    ]
    res = load_responses(write_jsonl(tmp_path / "r.jsonl", rows))
    assert [(r.prompt, r.response, r.finished) for r in res] == [
        ("q", "a", True), ("q", "", True), ("user: what is two plus four\nassistant: ", "six", False)]
    assert res[1].row == rows[1]
    bad = [
        ({"prompt": "q", "response": "a", "finished": "yes"}, "field 'finished' must be true or false"),
        ({"prompt": "q", "respnse": "a"}, "did you mean 'response'"),
        ({"prompt": " ", "response": "a"}, "field 'prompt' is empty"),
        ({"messages": [U]}, "the last message must have role 'assistant'"),
        ({"messages": [{"role": "assistant", "content": "a"}]}, "prompt is empty"),
        ({"messages": [U, {"role": "assistant", "content": "a"}], "prompt": "q"}, "has both 'messages' and 'prompt'"),
    ]
    for i, (row, needle) in enumerate(bad):
        p = write_jsonl(tmp_path / f"bad{i}.jsonl", [rows[0], row])
        msg = _err(load_responses, p)
        assert msg.startswith(f"{p}:2: ") and needle in msg, msg
