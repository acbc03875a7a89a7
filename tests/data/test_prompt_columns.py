"""A prompts file's other columns: kept on each record, listed in first-seen order (a column some rows
lack gives None there), read before any tokeniser."""
import json

from fourfold.data import RESPONSE_FIELDS, column_names, load_prompts, other_columns, prompt_columns


def test_records_keep_their_other_columns_and_the_file_lists_them(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{"prompt": "a", "answer": "1", "id": 7},
            {"messages": [{"role": "user", "content": "b"}], "answer": "2", "source": "x"},
            {"promt": "typo", "extra": 1},  # no prompt: a bad row, and no columns from it
            {"prompt": "c"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert prompt_columns(path) == ("answer", "id", "source")
    loaded = load_prompts(path, on_error="skip")
    assert [r.columns for r in loaded] == [{"answer": "1", "id": 7}, {"answer": "2", "source": "x"}, {}]
    assert column_names(r.columns for r in loaded) == ("answer", "id", "source")
    scored = tmp_path / "rows.jsonl"
    scored.write_text(json.dumps({"prompt": "a", "response": "b", "finished": True, "answer": "1"}) + "\n")
    assert other_columns(scored, RESPONSE_FIELDS) == ("answer",)

