"""Reading raw records from a user's data: a local JSONL or Parquet file, a local ``datasets``
directory, or (online) a Hugging Face hub dataset.

Every problem becomes a one-line :class:`~fourfold.errors.DataError` of the form
``"<file>:<line>: <problem>"`` (or ``"<file>: <problem>"`` for a whole-file problem), never a
traceback from inside the JSON decoder or Arrow. :func:`location` writes the ``<file>:<line>`` part.

* JSONL (``.jsonl``, ``.ndjson``): read as bytes and decoded as UTF-8 one line at a time, so a bad
  byte is reported with its line and column. Blank lines are skipped (they keep their number, so
  line numbers always match an editor's). A UTF-8 byte-order mark at the start of the file is
  ignored. Each non-blank line must be one JSON object.
* Parquet (``.parquet``): read with pyarrow (installed with ``datasets``; imported lazily). Rows are
  numbered from 1 and reported as "lines" in messages. Nothing is cached or written anywhere.
* A ``datasets`` directory (written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``):
  ``DIR`` or ``DIR:SPLIT``. A DatasetDict's split is SPLIT, default ``train``; a single Dataset takes
  no split. The source is named ``DIR[SPLIT]`` (a single Dataset: its own split name, else ``all``)
  and rows are named ``DIR[SPLIT]:row N``, N being the row's index (``dataset[N]``, from 0). A null
  in such a row counts as an absent field (Arrow fills the columns a row lacks with null).
* A hub dataset, when the name is neither a local file nor a directory: ``NAME`` or ``NAME:SPLIT``
  (``owner/name`` too; split default ``train``), loaded with ``datasets.load_dataset`` (it needs
  the network, or the hub cache with ``HF_HUB_OFFLINE=1``); rows are named as for a directory.

This module never writes to disk (a hub dataset is cached by ``datasets`` itself).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from fourfold.errors import DataError

__all__ = ["read_records", "read_source", "location", "JSONL_SUFFIXES", "PARQUET_SUFFIXES", "json_type_name",
           "one_line", "line_of", "no_usable_rows"]

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
_ON_ERROR = ("raise", "skip")
# Extensions of files a user may mean: a missing path with one of these is "file not found", never a
# hub dataset name.
_FILE_LIKE = JSONL_SUFFIXES + PARQUET_SUFFIXES + (".json", ".csv", ".tsv", ".txt", ".arrow", ".gz", ".zip", ".yaml")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?(:[^/\s]+)?$")


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


def no_usable_rows(source: str, what: str, skipped: Sequence[str], ties: Sequence[str] = ()) -> str:
    """The message for data that left nothing to use: every row a tie (a preference pair with
    ``chosen`` identical to ``rejected``), or "no usable ``what``" with the counts of skipped rows
    and ties and the first skipped row."""
    if ties and not skipped:
        return (f"{source}: every preference pair is a tie ({len(ties)} with 'chosen' identical to 'rejected'): "
                "no preference to learn")
    counts = f"{len(skipped)} skipped" + (f", {len(ties)} ties" if ties else "")
    return f"{source}: no usable {what} ({counts}{f'; first: {skipped[0]}' if skipped else ''})"

def location(source: str, line: int) -> str:
    """Where a record is, for messages: ``file:line`` for a file, ``DIR[SPLIT]:row N`` for a
    ``datasets`` source (whose names :func:`read_source` makes end with ``]``; a file's name always
    ends with its extension)."""
    return f"{source}:row {line}" if source.endswith("]") else f"{source}:{line}"


def read_records(
    path: str | os.PathLike,
    *,
    on_error: str = "raise",
    skipped: list[str] | None = None,
) -> list[tuple[int, dict]]:
    """Read every record of a JSONL or Parquet file (or a ``datasets`` source, see
    :func:`read_source`) as ``(line_number, record)`` pairs.

    Line numbers count from 1 (Parquet: row numbers from 1; ``datasets``: row indices from 0). With
    ``on_error="skip"`` a line that is not valid UTF-8, not valid JSON or not a JSON object is left
    out and its one-line message is appended to ``skipped`` (when given) instead of raised.
    Whole-file problems (missing file, unknown extension, unreadable Parquet, a file with no records
    at all) always raise :class:`DataError`. Under ``"skip"`` the result may be empty when every
    line was bad.
    """
    return read_source(path, on_error=on_error, skipped=skipped)[1]


def read_source(
    path: str | os.PathLike,
    *,
    on_error: str = "raise",
    skipped: list[str] | None = None,
) -> tuple[str, list[tuple[int, dict]]]:
    """``(source name, records)`` of a JSONL/Parquet file, a local ``datasets`` directory (``DIR`` or
    ``DIR:SPLIT``) or a hub dataset (``NAME`` or ``NAME:SPLIT``); see the module docstring.

    The source name is the path as given for a file and ``DIR[SPLIT]`` / ``NAME[SPLIT]`` for a
    dataset; pass it with a record's number to :func:`location` for messages.
    """
    check_on_error(on_error)
    name = os.fspath(path)
    directory, split = _datasets_dir(name)
    if directory is not None:
        return _read_datasets_dir(directory, split)
    if not Path(name).exists() and _looks_like_hub_name(name):
        return _read_hub(name)
    return name, _read_file(name, on_error, skipped)


def _read_file(name: str, on_error: str, skipped: list[str] | None) -> list[tuple[int, dict]]:
    p = Path(name)
    suffix = p.suffix.lower()
    if suffix not in JSONL_SUFFIXES + PARQUET_SUFFIXES:
        hint = " (convert a JSON array to one object per line)" if suffix == ".json" else ""
        raise DataError(
            f"{name}: unsupported file extension {suffix or '(none)'!r}; expected "
            f"{', '.join(JSONL_SUFFIXES + PARQUET_SUFFIXES)} or a `datasets` directory{hint}"
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


# ------------------------------------------------------------------------------ datasets sources


def _is_datasets_dir(p: Path) -> bool:
    """What ``save_to_disk`` writes: ``dataset_dict.json`` (DatasetDict) or ``state.json`` (Dataset)."""
    return (p / "dataset_dict.json").is_file() or (p / "state.json").is_file()


def _datasets_dir(name: str) -> tuple[str | None, str | None]:
    """``(directory, split or None)`` when ``name`` is ``DIR`` or ``DIR:SPLIT`` of a ``datasets``
    directory; ``(None, None)`` otherwise. A plain directory (that is not a data file's name) is
    an error saying what a ``datasets`` directory is."""
    base, sep, split = name.rpartition(":")
    for directory, chosen in [(name, None)] + ([(base, split)] if sep and base and split else []):
        p = Path(directory)
        if not p.is_dir():
            continue
        if _is_datasets_dir(p):
            return directory, chosen
        if p.suffix.lower() not in JSONL_SUFFIXES + PARQUET_SUFFIXES:
            raise DataError(f"{directory}: is a directory but not a `datasets` directory (no dataset_dict.json "
                            f"or state.json; write one with Dataset.save_to_disk)")
    return None, None


def _looks_like_hub_name(name: str) -> bool:
    """``name``, ``owner/name``, optionally ``:split``, not ending in a data-file extension."""
    return bool(_HUB_NAME.match(name)) and Path(name.split(":", 1)[0]).suffix.lower() not in _FILE_LIKE


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return one_line(text.splitlines()[0] if text else type(e).__name__, 160)


def _import_datasets(name: str):
    try:
        import datasets  # lazy: only users of datasets sources pay for it
    except ImportError:  # pragma: no cover - datasets is a dependency
        raise DataError(f"{name}: reading a `datasets` source needs the datasets package (pip install datasets)") from None
    return datasets


def _read_datasets_dir(directory: str, split: str | None) -> tuple[str, list[tuple[int, dict]]]:
    datasets = _import_datasets(directory)
    try:
        loaded = datasets.load_from_disk(directory)
    except Exception as e:  # a damaged directory: Arrow, JSON or file errors
        raise DataError(f"{directory}: not a readable `datasets` directory ({_first_line(e)})") from None
    if isinstance(loaded, datasets.DatasetDict):
        chosen = split or "train"
        if chosen not in loaded:
            raise DataError(f"{directory}: no split {chosen!r} (it has {', '.join(map(repr, loaded))}); "
                            f"choose one as {directory}:SPLIT")
        ds = loaded[chosen]
    else:
        if split is not None:
            raise DataError(f"{directory}: holds a single Dataset, which has no splits; drop ':{split}'")
        ds, chosen = loaded, str(loaded.split) if loaded.split else "all"
    source = f"{directory}[{chosen}]"
    return source, _dataset_rows(ds, source)


def _read_hub(name: str) -> tuple[str, list[tuple[int, dict]]]:
    repo, _, split = name.partition(":")
    split = split or "train"
    datasets = _import_datasets(name)
    try:
        ds = datasets.load_dataset(repo, split=split)
    except Exception as e:  # offline, unknown name, unknown split, a broken download: one line
        raise DataError(f"{name}: no such file or directory, and not loadable as a hub dataset "
                        f"({type(e).__name__}: {_first_line(e)})") from None
    source = f"{repo}[{split}]"
    return source, _dataset_rows(ds, source)


def _dataset_rows(ds, source: str) -> list[tuple[int, dict]]:
    """``(row index, row without its null fields)`` for every row of a ``datasets.Dataset``."""
    try:
        rows = ds.to_list()
    except Exception as e:  # pragma: no cover - Arrow could not convert a column to Python
        raise DataError(f"{source}: rows cannot be read ({_first_line(e)})") from None
    if not rows:
        raise DataError(f"{source}: no records (the dataset is empty)")
    return [(i, {k: v for k, v in row.items() if v is not None}) for i, row in enumerate(rows)]


# ------------------------------------------------------------------------------------ files


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
