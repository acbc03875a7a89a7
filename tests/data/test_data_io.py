"""read_records: JSONL and Parquet rows with line numbers; every bad file is a one-line DataError."""
import pytest
from datatest_utils import write_jsonl

from fourfold.data import line_of, read_records
from fourfold.errors import DataError, FourfoldError


def _err(path, **kw) -> str:
    with pytest.raises(DataError) as info:
        read_records(path, **kw)
    msg = str(info.value)
    assert "\n" not in msg and isinstance(info.value, FourfoldError)
    return msg


def test_jsonl_line_numbers_skip_blank_lines(tmp_path):
    p = write_jsonl(tmp_path / "data.jsonl", [{"a": 1}, "", "   ", {"b": 2}])
    assert read_records(p) == [(1, {"a": 1}), (4, {"b": 2})]


def test_crlf_and_bom_are_fine(tmp_path):
    p = tmp_path / "data.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n{"b": "\xc3\xa9"}\r\n')
    assert read_records(p) == [(1, {"a": 1}), (2, {"b": "é"})]


def test_invalid_utf8_names_line_byte_and_column(tmp_path):
    p = write_jsonl(tmp_path / "data.jsonl", [{"a": 1}] * 6 + [b'{"prompt": "\xff"}'])
    msg = _err(p)
    assert msg == f"{p}:7: not valid UTF-8 (byte 0xff at column 13)"


def test_invalid_json(tmp_path):
    p = write_jsonl(tmp_path / "data.jsonl", [{"a": 1}, {"a": 2}, '{"prompt": "x",}'])
    msg = _err(p)
    assert msg.startswith(f"{p}:3: invalid JSON (") and "column" in msg


@pytest.mark.parametrize(
    "line,kind", [("[1, 2]", "list"), ('"text"', "string"), ("3", "number"), ("null", "null"), ("true", "boolean")]
)
def test_non_object(tmp_path, line, kind):
    p = write_jsonl(tmp_path / "data.jsonl", [line])
    assert _err(p) == f"{p}:1: expected a JSON object, got {kind}"


def test_deep_nesting_and_huge_ints_are_data_errors(tmp_path):
    p = write_jsonl(tmp_path / "deep.jsonl", ["[" * 100_000 + "]" * 100_000])
    assert f"{p}:1: invalid JSON" in _err(p)
    p = write_jsonl(tmp_path / "big.jsonl", ['{"a": ' + "9" * 5000 + "}"])
    assert f"{p}:1: invalid JSON" in _err(p)


def test_skip_mode_collects_bad_lines(tmp_path):
    p = write_jsonl(tmp_path / "data.jsonl", [{"a": 1}, "nope", b"\xfe", "[]", {"b": 2}])
    skipped = []
    assert read_records(p, on_error="skip", skipped=skipped) == [(1, {"a": 1}), (5, {"b": 2})]
    assert [s.split(": ")[0] for s in skipped] == [f"{p}:2", f"{p}:3", f"{p}:4"]


def test_file_level_errors(tmp_path):
    assert "file not found" in _err(tmp_path / "missing.jsonl")
    assert str(tmp_path / "missing.jsonl") in _err(tmp_path / "missing.jsonl")
    (tmp_path / "d.jsonl").mkdir()
    assert "is a directory" in _err(tmp_path / "d.jsonl")
    (tmp_path / "data.csv").write_text("a,b\n")
    msg = _err(tmp_path / "data.csv")
    assert "data.csv" in msg and "unsupported file extension '.csv'" in msg
    (tmp_path / "data.json").write_text("[]")
    assert "one object per line" in _err(tmp_path / "data.json")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert "empty.jsonl: no records" in _err(tmp_path / "empty.jsonl")
    (tmp_path / "blank.jsonl").write_bytes(b"\n  \n\r\n")
    assert "blank.jsonl: no records" in _err(tmp_path / "blank.jsonl", on_error="skip")


def test_bad_on_error_value(tmp_path):
    with pytest.raises(ValueError, match="on_error"):
        read_records(tmp_path / "x.jsonl", on_error="ignore")


def test_parquet_rows_numbered_from_one(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "prefs.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "chosen": ["x", None]}), p)
    assert read_records(p) == [(1, {"prompt": "a", "chosen": "x"}), (2, {"prompt": "b", "chosen": None})]


def test_parquet_not_parquet_and_empty(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    assert f"{bad}: not a readable Parquet file" in _err(bad)
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), empty)
    assert f"{empty}: no records" in _err(empty)


def test_line_of_reads_the_line_of_a_message():
    assert line_of("data.jsonl:12: field 'prompt' missing") == 12
    assert line_of(r"C:\runs\data.jsonl:4: prompt is 70 tokens") == 4
    assert line_of("data.jsonl: no usable rows") == 0
