"""Fuzz: malformed files thrown at every loader (and on at tokenisation). Every failure is a one-line
DataError naming the file; nothing else escapes; an earlier run's output directory is untouched."""
import hashlib
import itertools
import json
import os

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fourfold.data import (
    encode_preferences,
    encode_prompts,
    encode_sft,
    load_preferences,
    load_prompts,
    load_sft,
)
from fourfold.errors import DataError

KEYS = ["prompt", "promt", "Prompt", "completion", "completon", "response", "text", "txt", "messages",
        "chosen", "choosen", "rejected", "rejectd", "role", "content", "", "id", "a\nb"]
ROLES = ["user", "assistant", "system", "", "tool", "Assistant"]
WORDS = ["hello world", "a b c", "the answer", "good", "bad", "what is two plus four", "zzz", "a b c d e f g a b c d e f g"]
ODD_STRINGS = ["", " ", "\n", "\t \r\n", "\ud800", "ok \udfff", "\x00", "é", "{", "\u2028", "<bos>", "<eos> a"]

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
strings = st.sampled_from(WORDS) | st.sampled_from(ODD_STRINGS) | st.text(max_size=12)
message = st.fixed_dictionaries(
    {},
    optional={"role": st.sampled_from(ROLES) | json_scalars, "content": strings | json_scalars, "name": strings},
) | json_values
messages = st.lists(message, max_size=4) | st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": strings}), min_size=1, max_size=4
)
field_value = strings | messages | json_values
record = st.dictionaries(st.sampled_from(KEYS), field_value, max_size=5)
raw_line = st.binary(max_size=24) | st.sampled_from(
    [b"\xff", b'{"prompt": "\xc3"}', b'{"prompt": "x",}', b"[", b"[]", b"null", b"1e999", b"{" * 3, b"\xef\xbb\xbf{}", b"\r"]
)
U = {"role": "user", "content": "what is two plus four"}
A = {"role": "assistant", "content": "good answer"}
B = {"role": "assistant", "content": "bad"}
TEMPLATES = [  # one valid record of each accepted form; mutated below
    {"prompt": "hello world"},
    {"messages": [{"role": "system", "content": "a"}, U]},
    {"prompt": "what is two plus four", "completion": "good"},
    {"prompt": "a b", "response": "c d e f g"},
    {"text": "the answer"},
    {"messages": [U, A]},
    {"prompt": "what is two plus four", "chosen": "good", "rejected": "bad"},
    {"prompt": "a b c d e f g a b", "chosen": "a", "rejected": "b"},
    {"chosen": [U, A], "rejected": [U, B]},
    {"prompt": [U], "chosen": [A], "rejected": [B]},
]


@st.composite
def near_valid(draw):
    """A valid record with zero to three mutations: a dropped, misspelled or extra key, a value
    swapped for another type / an empty or odd string / a broken message, chosen copied to rejected."""
    rec = json.loads(json.dumps(draw(st.sampled_from(TEMPLATES))))
    for _ in range(draw(st.integers(0, 3))):
        keys = sorted(rec)
        op = draw(st.sampled_from(["drop", "rename", "value", "extra", "same", "message"]))
        if op == "drop" and keys:
            rec.pop(draw(st.sampled_from(keys)))
        elif op == "rename" and keys:
            k = draw(st.sampled_from(keys))
            rec[draw(st.sampled_from(KEYS))] = rec.pop(k)
        elif op == "value" and keys:
            rec[draw(st.sampled_from(keys))] = draw(strings | json_values | messages)
        elif op == "extra":
            rec[draw(st.sampled_from(KEYS) | st.text(max_size=6))] = draw(field_value)
        elif op == "same" and "chosen" in rec:
            rec["rejected"] = rec["chosen"]
        elif op == "message":
            lists = [k for k in keys if isinstance(rec[k], list) and rec[k]]
            if lists:
                k = draw(st.sampled_from(lists))
                i = draw(st.integers(0, len(rec[k]) - 1))
                rec[k][i] = draw(message)
    return rec


line = st.one_of(
    near_valid().map(lambda r: json.dumps(r).encode()),
    near_valid().map(lambda r: json.dumps(r).encode()),
    near_valid().map(lambda r: json.dumps(r).encode()),
    record.map(lambda r: json.dumps(r).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    raw_line,
)
file_bytes = st.lists(line, max_size=6).map(lambda ls: b"\n".join(ls))

LOADERS = [("prompts", load_prompts), ("sft", load_sft), ("preferences", load_preferences)]
counter = itertools.count()


def _tree_hash(root):
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            h.update(p.encode())
            with open(p, "rb") as f:
                h.update(f.read())
            h.update(str(os.stat(p).st_mtime_ns).encode())
    return h.hexdigest()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    out = root / "runs" / "earlier"  # an earlier run's outputs
    (out / "checkpoints").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    (out / "checkpoints" / "state.pt").write_bytes(os.urandom(64))
    (root / "inputs").mkdir()
    before = _tree_hash(root / "runs")
    yield root
    assert _tree_hash(root / "runs") == before, "an earlier run's outputs were touched"


def _check(err: DataError, path) -> None:
    msg = str(err)
    assert msg and "\n" not in msg and "\r" not in msg, repr(msg)
    assert os.path.basename(path) in msg, msg


def _tokenise(kind, res, tokenizer, mode):
    if kind == "prompts":
        out = encode_prompts(res, tokenizer, 6, on_error=mode)
    elif kind == "sft":
        out = encode_sft(res, tokenizer, 8, max_prompt_len=6, on_error=mode)
    else:
        out = encode_preferences(res, tokenizer, 8, max_prompt_len=6, on_error=mode)
    assert all(0 <= e.index < len(res) for e in out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=file_bytes)
def test_malformed_files_only_ever_raise_data_error(data, workdir, tokenizer):
    path = workdir / "inputs" / f"data{next(counter)}.jsonl"
    path.write_bytes(data)
    try:
        for kind, loader in LOADERS:
            for mode in ("raise", "skip"):
                try:
                    res = loader(path, on_error=mode)
                except DataError as e:
                    _check(e, path)
                    event(f"{kind}/{mode}: " + " ".join(str(e).split(": ", 1)[1].split()[:3]))
                    continue
                event(f"{kind}/{mode}: loaded")
                assert len(res) >= 1 and all(r.line >= 1 and r.source == str(path) for r in res)
                for m in res.skipped:
                    assert m.startswith(f"{path}:") and "\n" not in m
                for tmode in ("raise", "skip"):
                    try:
                        _tokenise(kind, res, tokenizer, tmode)
                        event(f"{kind}: tokenised ({tmode})")
                    except DataError as e:
                        _check(e, path)
                        event(f"{kind}: tokenise error ({tmode})")
    finally:
        path.unlink()
    assert sorted(os.listdir(workdir / "inputs")) == []  # nothing written next to the input


parquet_value = st.none() | st.sampled_from(WORDS) | st.sampled_from(ODD_STRINGS[:4])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    columns=st.dictionaries(st.sampled_from(KEYS[:13]), st.sampled_from(["string", "int", "list"]), max_size=4),
    rows=st.integers(0, 4),
    data=st.data(),
)
def test_malformed_parquet_only_ever_raises_data_error(columns, rows, data, workdir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = {}
    for name, kind in columns.items():
        if kind == "string":
            table[name] = pa.array(data.draw(st.lists(parquet_value, min_size=rows, max_size=rows)), pa.string())
        elif kind == "int":
            table[name] = pa.array(data.draw(st.lists(st.integers(-5, 5), min_size=rows, max_size=rows)), pa.int64())
        else:
            table[name] = pa.array(data.draw(st.lists(st.lists(st.sampled_from(WORDS), max_size=2), min_size=rows, max_size=rows)))
    path = workdir / "inputs" / f"data{next(counter)}.parquet"
    pq.write_table(pa.table(table) if table else pa.table({"x": pa.array([], pa.int64())}), path)
    try:
        for _, loader in LOADERS:
            for mode in ("raise", "skip"):
                try:
                    loader(path, on_error=mode)
                except DataError as e:
                    _check(e, path)
    finally:
        path.unlink()
