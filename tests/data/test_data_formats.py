"""Loaders: typed records, one-line errors naming file, line and problem; skip mode; chat rendering."""
import pytest
from datatest_utils import write_jsonl

from fourfold.data import (
    LoadResult,
    PreferenceRecord,
    PromptRecord,
    SFTRecord,
    chat_template_renderer,
    load_preferences,
    load_prompts,
    load_sft,
    plain_chat_render,
)
from fourfold.errors import DataError

GOOD_PREF = {"prompt": "what is two plus two", "chosen": "four", "rejected": "five"}


def _bad(loader, tmp_path, rows, line, *needles, name="data.jsonl", **kw) -> str:
    """Write ``rows`` (the bad one at ``line``), load, and check the message names file:line: + needles."""
    p = write_jsonl(tmp_path / name, rows)
    with pytest.raises(DataError) as info:
        loader(p, **kw)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{p}:{line}: "), msg
    assert f"{name}:{line}:" in msg
    for n in needles:
        assert n in msg, msg
    return msg


# ------------------------------------------------------------------------------ good records


def test_load_prompts_records(tmp_path):
    p = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello", "id": 7}, "", {"prompt": "world"}])
    res = load_prompts(p)
    assert isinstance(res, LoadResult) and len(res) == 2 and res.skipped == []
    assert list(res) == [PromptRecord("hello", 1, str(p)), PromptRecord("world", 3, str(p))]
    assert res[1].line == 3 and res.summary() == f"{p}: 2 records, 0 skipped"


def test_load_sft_all_forms(tmp_path):
    rows = [
        {"prompt": "q", "completion": "a"},
        {"prompt": "q", "response": "r"},
        {"text": "whole text"},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
    ]
    res = load_sft(write_jsonl(tmp_path / "sft.jsonl", rows))
    assert [(r.prompt, r.completion, r.line) for r in res] == [
        ("q", "a", 1),
        ("q", "r", 2),
        ("", "whole text", 3),
        ("user: hi\nassistant: ", "hello", 4),
    ]
    assert all(isinstance(r, SFTRecord) for r in res)


def test_load_preferences_string_and_chat_forms(tmp_path):
    user = {"role": "user", "content": "two plus two"}
    rows = [
        GOOD_PREF,
        # implicit prompt: the shared conversation before the last assistant message
        {"chosen": [user, {"role": "assistant", "content": "four"}], "rejected": [user, {"role": "assistant", "content": "5"}]},
        # explicit prompt as messages, replies as one-message lists
        {"prompt": [user], "chosen": [{"role": "assistant", "content": "four"}], "rejected": [{"role": "assistant", "content": "5"}]},
        # explicit prompt repeated inside chosen/rejected
        {"prompt": [user], "chosen": [user, {"role": "assistant", "content": "four"}], "rejected": [user, {"role": "assistant", "content": "5"}]},
    ]
    res = load_preferences(write_jsonl(tmp_path / "prefs.jsonl", rows))
    assert res[0] == PreferenceRecord("what is two plus two", "four", "five", 1, str(tmp_path / "prefs.jsonl"))
    chat = "user: two plus two\nassistant: "
    assert [(r.prompt, r.chosen, r.rejected) for r in res.records[1:]] == [(chat, "four", "5")] * 3


# -------------------------------------------------------------------------------- bad records


def test_missing_field_with_did_you_mean(tmp_path):
    msg = _bad(load_prompts, tmp_path, [{"prompt": "ok"}, {"prompt": "ok"}, {"promt": "typo"}], 3, "missing field 'prompt'", "'promt'", "did you mean 'prompt'")
    assert msg.count("did you mean") == 1
    _bad(load_preferences, tmp_path, [{**GOOD_PREF}, {"prompt": "p", "chosen": "a", "rejectd": "b"}], 2, "missing field 'rejected'", "did you mean 'rejected'")
    _bad(load_sft, tmp_path, [{"prompt": "p", "completon": "c"}], 1, "missing field 'completion'", "did you mean 'completion'")
    _bad(load_sft, tmp_path, [{"txt": "all"}], 1, "no SFT fields", "did you mean 'text'")


def test_missing_field_lists_keys_when_nothing_is_close(tmp_path):
    _bad(load_prompts, tmp_path, [{"question": "q", "id": 1}], 1, "missing field 'prompt'", "'question'", "'id'")
    _bad(load_prompts, tmp_path, [{}], 1, "missing field 'prompt'", "empty object")


def test_wrong_types(tmp_path):
    _bad(load_preferences, tmp_path, [GOOD_PREF, {**GOOD_PREF, "chosen": 42}], 2, "field 'chosen'", "got number (42)")
    _bad(load_prompts, tmp_path, [{"prompt": ["a"]}], 1, "prompt[0]", "got string")
    _bad(load_prompts, tmp_path, [{"prompt": None}], 1, "field 'prompt' must be a string, got null")
    _bad(load_sft, tmp_path, [{"prompt": "p", "completion": {"x": 1}}], 1, "field 'completion' must be a string, got object")
    _bad(load_sft, tmp_path, [{"messages": "hi"}], 1, "field 'messages' must be a list of messages, got string")


def test_empty_fields(tmp_path):
    _bad(load_prompts, tmp_path, [{"prompt": "ok"}, {"prompt": "   "}], 2, "field 'prompt' is empty")
    _bad(load_preferences, tmp_path, [{**GOOD_PREF, "prompt": ""}], 1, "field 'prompt' is empty")
    _bad(load_preferences, tmp_path, [{**GOOD_PREF, "chosen": ""}], 1, "field 'chosen' is empty")
    _bad(load_preferences, tmp_path, [{**GOOD_PREF, "rejected": "\n"}], 1, "field 'rejected' is empty")
    _bad(load_sft, tmp_path, [{"prompt": "", "completion": "c"}], 1, "field 'prompt' is empty", "text")
    _bad(load_sft, tmp_path, [{"prompt": "p", "completion": ""}], 1, "field 'completion' is empty")
    _bad(load_sft, tmp_path, [{"text": ""}], 1, "field 'text' is empty")


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_identical_chosen_and_rejected_is_a_tie_left_out(tmp_path, on_error):
    """A tie carries no preference: left out and counted whatever on_error says, never an error..."""
    tie = {**GOOD_PREF, "rejected": "four "}
    p = write_jsonl(tmp_path / "prefs.jsonl", [GOOD_PREF, tie, {**GOOD_PREF, "prompt": "again"}, tie])
    res = load_preferences(p, on_error=on_error)
    assert [r.line for r in res] == [1, 3] and res.skipped == []
    assert res.ties == [f"{p}:{i}: 'chosen' and 'rejected' are identical" for i in (2, 4)]


def test_a_file_of_nothing_but_ties_is_an_error_naming_it(tmp_path):
    """... unless every row is one."""
    p = write_jsonl(tmp_path / "ties.jsonl", [{**GOOD_PREF, "rejected": "four"}] * 3)
    for on_error in ("raise", "skip"):
        with pytest.raises(DataError) as info:
            load_preferences(p, on_error=on_error)
        assert str(info.value) == (f"{p}: every preference pair is a tie (3 with 'chosen' identical to 'rejected'): "
                                   "no preference to learn")
    # ties and bad rows, nothing usable: the counts of both
    p = write_jsonl(tmp_path / "mixed.jsonl", [{**GOOD_PREF, "rejected": "four"}, {**GOOD_PREF, "chosen": 1}])
    with pytest.raises(DataError, match=r"mixed\.jsonl: no usable records \(1 skipped, 1 ties; first: .*mixed\.jsonl:2: "):
        load_preferences(p, on_error="skip")


def test_ambiguous_forms(tmp_path):
    _bad(load_sft, tmp_path, [{"text": "t", "prompt": "p"}], 1, "both 'text' and 'prompt'")
    _bad(load_sft, tmp_path, [{"prompt": "p", "completion": "c", "response": "r"}], 1, "both 'completion' and 'response'")
    _bad(load_prompts, tmp_path, [{"prompt": "p", "messages": [{"role": "user", "content": "x"}]}], 1, "both 'messages' and 'prompt'")


def test_bad_messages(tmp_path):
    _bad(load_sft, tmp_path, [{"messages": [{"role": "user", "content": "hi"}]}], 1, "last message must have role 'assistant'")
    _bad(load_sft, tmp_path, [{"messages": []}], 1, "empty list of messages")
    _bad(load_sft, tmp_path, [{"messages": [{"role": "user"}]}], 1, "messages[0] has no 'content'")
    _bad(load_sft, tmp_path, [{"messages": [{"role": "user", "content": 3}]}], 1, "messages[0].content must be a string, got number")
    _bad(load_sft, tmp_path, [{"messages": [7]}], 1, "messages[0] must be an object")
    _bad(load_prompts, tmp_path, [{"messages": [{"role": "assistant", "content": "hi"}]}], 1, "must not end with an assistant")
    u = {"role": "user", "content": "q"}
    _bad(
        load_preferences, tmp_path,
        [{"chosen": [u, {"role": "assistant", "content": "a"}], "rejected": [{"role": "user", "content": "other"}, {"role": "assistant", "content": "b"}]}],
        1, "differ before their last message",
    )
    _bad(load_preferences, tmp_path, [{"chosen": [u], "rejected": "b", "prompt": "p"}], 1, "last message of 'chosen' must have role 'assistant'")
    _bad(load_preferences, tmp_path, [{"chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"}], 1, "missing field 'prompt'")


def test_lone_surrogate_is_rejected_at_load(tmp_path):
    _bad(load_prompts, tmp_path, ['{"prompt": "ok \\ud800 then"}'], 1, "field 'prompt' is not valid Unicode", "\\ud800")


def test_parquet_rows_are_reported_as_lines(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "prefs.parquet"
    pq.write_table(pa.table({"prompt": ["q", "q"], "chosen": ["a", "b"], "rejected": ["b", ""]}), p)
    with pytest.raises(DataError, match=r"prefs\.parquet:2: field 'rejected' is empty"):
        load_preferences(p)
    assert len(load_preferences(p, on_error="skip")) == 1


# -------------------------------------------------------------------------------------- skip


def test_skip_keeps_good_rows_and_counts_bad_ones(tmp_path):
    rows = [GOOD_PREF, {"promt": "x"}, b"\xff", "{oops", {**GOOD_PREF, "chosen": 1}, "", {**GOOD_PREF, "prompt": "second"}]
    p = write_jsonl(tmp_path / "prefs.jsonl", rows)
    res = load_preferences(p, on_error="skip")
    assert [r.line for r in res] == [1, 7] and res.num_skipped == 4
    assert [m.split(": ", 1)[0] for m in res.skipped] == [f"{p}:{i}" for i in (2, 3, 4, 5)]
    assert res.summary().endswith("2 records, 4 skipped")


def test_skip_with_nothing_usable_is_an_error(tmp_path):
    p = write_jsonl(tmp_path / "prompts.jsonl", [{"promt": "x"}, {"prompt": ""}])
    with pytest.raises(DataError, match=r"prompts\.jsonl: no usable records \(2 skipped; first: .*prompts\.jsonl:1: missing field 'prompt'"):
        load_prompts(p, on_error="skip")


def test_on_error_must_be_known(tmp_path):
    with pytest.raises(ValueError):
        load_sft(tmp_path / "x.jsonl", on_error="warn")


# -------------------------------------------------------------------------------------- chat


def test_chat_with_a_fake_render_function(tmp_path):
    seen = []

    def render(messages):
        seen.append(messages)
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    rows = [{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}]
    res = load_sft(write_jsonl(tmp_path / "sft.jsonl", rows), chat_template=render)
    assert (res[0].prompt, res[0].completion) == ("<system>s<user>u<assistant>", "a")
    assert [m["role"] for m in seen[0]] == ["system", "user"]
    res = load_prompts(write_jsonl(tmp_path / "p.jsonl", [{"messages": [{"role": "user", "content": "u"}]}]), chat_template=render)
    assert res[0].prompt == "<user>u<assistant>"


def test_plain_fallback_rendering():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert plain_chat_render(msgs) == "system: be brief\nuser: hi\nassistant: "


def test_render_failure_is_a_data_error(tmp_path):
    def render(messages):
        raise RuntimeError("Conversation roles must alternate\nuser/assistant")

    rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}]
    _bad(load_prompts, tmp_path, rows, 1, "chat template failed: RuntimeError: Conversation roles must alternate", chat_template=render)


def test_chat_template_renderer(tokenizer):
    assert chat_template_renderer(tokenizer) is None

    class WithTemplate:
        chat_template = "{{ messages }}"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            return "|".join(m["content"] for m in messages) + "|>"

    render = chat_template_renderer(WithTemplate())
    assert render([{"role": "user", "content": "x"}]) == "x|>"


def test_real_chat_template_through_the_tokenizer(tmp_path):
    from datatest_utils import make_tokenizer

    tok = make_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<assistant> {% endif %}"
    )
    render = chat_template_renderer(tok)
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}]
    res = load_sft(write_jsonl(tmp_path / "sft.jsonl", rows), chat_template=render)
    assert (res[0].prompt, res[0].completion) == ("<user> hi <assistant> ", "hello")
