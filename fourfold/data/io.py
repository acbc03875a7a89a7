"""Reading raw records from a user's local JSONL or Parquet file.

Every problem becomes a one-line :class:`~fourfold.errors.DataError` of the form
``"<file>:<line>: <problem>"`` (or ``"<file>: <problem>"`` for a whole-file problem), never a
traceback from inside the JSON decoder or Arrow.

* JSONL (``.jsonl``, ``.ndjson``): read as bytes and decoded as UTF-8 one line at a time, so a bad
  byte is reported with its line and column. Blank lines are skipped (they keep their number, so
  line numbers always match an editor's). A UTF-8 byte-order mark at the start of the file is
  ignored. Each non-blank line must be one JSON object.
* Parquet (``.parquet``): read with pyarrow (installed with ``datasets``; imported lazily). Rows are
  numbered from 1 and reported as "lines" in messages. Nothing is cached or written anywhere.

This module never writes to disk.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from fourfold.errors import DataError

__all__ = ["read_records", "JSONL_SUFFIXES", "PARQUET_SUFFIXES", "json_type_name", "one_line", "line_of"]

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
_ON_ERROR = ("raise", "skip")


def json_type_name(value: object) -> str:
    """The name a user knows a value's type by: ``object``, ``list``, ``string``, ``number``, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    return type(value).__name__


def one_line(text: object, limit: int = 200) -> str:
    """``text`` squeezed onto one line (newlines escaped) and cut to ``limit`` characters."""
    s = str(text).replace("\r", "\\r").replace("\n", "\\n")
    return s if len(s) <= limit else s[: limit - 3] + "..."


def line_of(message: str) -> int:
    """The line number of a ``file:line: problem`` message (0 when it has none): sorts skipped rows
    into file order."""
    m = re.match(r"^.*?:(\d+): ", message)
    return int(m.group(1)) if m else 0


def check_on_error(on_error: str) -> None:
    if on_error not in _ON_ERROR:
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")


def read_records(
    path: str | os.PathLike,
    *,
    on_error: str = "raise",
    skipped: list[str] | None = None,
) -> list[tuple[int, dict]]:
    """Read every record of a JSONL or Parquet file as ``(line_number, record)`` pairs.

    Line numbers count from 1 (Parquet: row numbers from 1). With ``on_error="skip"`` a line that is
    not valid UTF-8, not valid JSON or not a JSON object is left out and its one-line message is
    appended to ``skipped`` (when given) instead of raised. Whole-file problems (missing file,
    unknown extension, unreadable Parquet, a file with no records at all) always raise
    :class:`DataError`. Under ``"skip"`` the result may be empty when every line was bad.
    """
    check_on_error(on_error)
    name = os.fspath(path)
    p = Path(name)
    suffix = p.suffix.lower()
    if suffix not in JSONL_SUFFIXES + PARQUET_SUFFIXES:
        hint = " (convert a JSON array to one object per line)" if suffix == ".json" else ""
        raise DataError(
            f"{name}: unsupported file extension {suffix or '(none)'!r}; expected "
            f"{', '.join(JSONL_SUFFIXES + PARQUET_SUFFIXES)}{hint}"
        )
    if not p.exists():
        raise DataError(f"{name}: file not found")
    if p.is_dir():
        raise DataError(f"{name}: is a directory, expected a file")
    if suffix in PARQUET_SUFFIXES:
        records = _read_parquet(name)
    else:
        records = _read_jsonl(name, on_error, skipped)
    if not records and on_error == "raise":
        raise DataError(f"{name}: no records (the file is empty or has only blank lines)")
    return records


def _read_jsonl(name: str, on_error: str, skipped: list[str] | None) -> list[tuple[int, dict]]:
    try:
        data = Path(name).read_bytes()
    except OSError as e:
        raise DataError(f"{name}: cannot read ({one_line(e.strerror or e)})") from None
    if not data.strip():
        raise DataError(f"{name}: no records (the file is empty or has only blank lines)")
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark, as some editors write
        data = data[3:]

    out: list[tuple[int, dict]] = []
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        problem, record = _parse_line(raw)
        if problem is None and record is None:  # blank line
            continue
        if problem is not None:
            msg = f"{name}:{lineno}: {problem}"
            if on_error == "raise":
                raise DataError(msg)
            if skipped is not None:
                skipped.append(msg)
            continue
        out.append((lineno, record))
    return out


def _parse_line(raw: bytes) -> tuple[str | None, dict | None]:
    """``(problem, None)`` for a bad line, ``(None, record)`` for a good one, ``(None, None)`` blank."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})", None
    if not text.strip():
        return None, None
    try:
        value = json.loads(text)
    except RecursionError:
        return "invalid JSON (nested too deeply)", None
    except ValueError as e:  # JSONDecodeError, and ints over Python's digit limit
        if isinstance(e, json.JSONDecodeError):
            detail = f"{e.msg} at column {e.colno}"
        else:
            detail = one_line(e, 120)
        return f"invalid JSON ({detail})", None
    if not isinstance(value, dict):
        return f"expected a JSON object, got {json_type_name(value)}", None
    return None, value


def _read_parquet(name: str) -> list[tuple[int, dict]]:
    try:
        import pyarrow.parquet as pq  # lazy: only Parquet users pay for Arrow
    except ImportError:  # pragma: no cover - pyarrow comes with datasets
        raise DataError(f"{name}: reading Parquet needs pyarrow (pip install datasets)") from None
    try:
        rows = pq.read_table(name).to_pylist()
    except Exception as e:  # ArrowInvalid, OSError, ...: the file is not usable Parquet
        first = one_line(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__, 160)
        raise DataError(f"{name}: not a readable Parquet file ({first})") from None
    return [(i, row) for i, row in enumerate(rows, start=1)]
