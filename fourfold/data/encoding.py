"""The pieces every ``encode_*`` shares (:mod:`fourfold.data.collate`, :mod:`fourfold.data.responses`).

* :class:`RowSink` raises or collects a row's problem, as ``on_error`` says, and keeps the tied
  preference pairs and the notes on the data as a whole (:func:`unknown_token_note`).
* :func:`row_location` names a record ``file:line`` in messages.
* :func:`special_id` / :func:`require_special_id`: a tokenizer's BOS, EOS or pad id.
* :func:`encode_texts` tokenises texts without added special tokens, a typed special-token
  string kept as text (a text with something in it that the tokenizer reads as no tokens at all
  is a problem); :func:`with_bos` puts BOS first.
* :func:`unknown_token_note`: one warning line when most tokens of the first rows are UNK.
* :func:`start_rows` and :func:`tokenized_rows`: the start and the per-row loop of an ``encode_*``
  of prompt + reply records (``max_len`` checked, the prompt and each reply field tokenised, BOS
  first, rows the tokenizer failed on handed to the sink).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from fourfold.data.io import check_on_error, location, one_line
from fourfold.data.literal import as_text, special_ids
from fourfold.errors import DataError

__all__ = [
    "RowSink",
    "UNKNOWN_CHECK_ROWS",
    "row_location",
    "data_source",
    "unknown_token_note",
    "special_id",
    "require_special_id",
    "encode_texts",
    "with_bos",
    "start_rows",
    "tokenized_rows",
]


def _out_list(given: list[str] | None, records: Any, name: str) -> list[str]:
    """``given``, else the list ``records.<name>`` (a LoadResult's), else a new list."""
    if given is not None:
        return given
    found = getattr(records, name, None)
    return found if isinstance(found, list) else []


class RowSink:
    """Raise or collect per-row problems, as ``on_error`` says; and, whatever it says, collect
    tied preference pairs (:meth:`tie`: they are left out, never an error) and notes on the data
    as a whole (:meth:`note`). Each list is the one given, else the records' own (a LoadResult's
    ``skipped``, ``ties``, ``notes``), else a new one."""

    def __init__(self, on_error: str, skipped: list[str] | None, records: Any, *,
                 ties: list[str] | None = None, notes: list[str] | None = None):
        check_on_error(on_error)
        self.on_error = on_error
        self.skipped = _out_list(skipped, records, "skipped")
        self.ties = _out_list(ties, records, "ties")
        self.notes = _out_list(notes, records, "notes")

    def bad(self, where: str, problem: str) -> None:
        msg = f"{where}: {problem}"
        if self.on_error == "raise":
            raise DataError(msg)
        self.skipped.append(msg)

    def tie(self, where: str, problem: str) -> None:
        self.ties.append(f"{where}: {problem}")

    def note(self, message: str | None) -> None:
        if message is not None:
            self.notes.append(message)


def row_location(rec: Any, i: int, default_source: str | None = None, line: int | None = None) -> str:
    """``source:line`` of record ``i``: its own ``source`` and ``line`` when it has them, else
    ``default_source`` (``<records>``) and ``line`` (the 1-based position ``i + 1``)."""
    source = getattr(rec, "source", "") or default_source or "<records>"
    ln = getattr(rec, "line", None) if line is None else line
    return location(source, ln if ln is not None else i + 1)


def data_source(records: Any, default: str | None = None) -> str:
    """The name of the data ``records`` came from, for messages: a LoadResult's ``source``, else
    the first record's, else ``default`` (``<records>``)."""
    source = getattr(records, "source", None)
    if not source and len(records):
        source = getattr(records[0], "source", None)
    return source or default or "<records>"


def special_id(tokenizer: Any, name: str) -> int | None:
    """``tokenizer.<name>`` (e.g. ``bos_token_id``) as an int, or None when it has none."""
    value = getattr(tokenizer, name, None)
    return int(value) if value is not None else None


def require_special_id(tokenizer: Any, name: str, why: str) -> int:
    """``tokenizer.<name>`` as an int; a ValueError saying ``why`` it is needed when it has none."""
    value = special_id(tokenizer, name)
    if value is None:
        raise ValueError(f"the tokenizer has no {name.replace('_id', '')} ({why})")
    return value


def _no_tokens(text: str, ids: list[int] | str, what: str) -> list[int] | str:
    """``ids``, or a problem when the text has something in it but the tokenizer read no token at
    all (a tokenizer that does not fit the text: e.g. a model directory whose tokenizer files load
    as another tokenizer class)."""
    if isinstance(ids, str) or ids or not text.strip():
        return ids
    return (f"the {what} encodes to no tokens: the tokenizer reads nothing in its {len(text.strip())} characters "
            "(is it the model's own tokenizer?)")


def encode_texts(tokenizer: Any, texts: Sequence[str], wheres: Sequence[str], what: str) -> list[list[int] | str]:
    """Ids per text without added special tokens, a typed special-token string kept as text
    (:func:`fourfold.data.literal.as_text`); a problem string where the tokenizer itself failed, or
    where a text that is not blank encodes to no tokens."""
    if not texts:
        return []
    special, unk = special_ids(tokenizer)
    try:
        out = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return [_no_tokens(t, as_text(tokenizer, t, list(map(int, ids)), special, unk, what), what)
                for t, ids in zip(texts, out)]
    except Exception:  # find the text it choked on, and say which line that was
        pass
    result: list[list[int] | str] = []
    for text, _where in zip(texts, wheres):
        try:
            ids = list(map(int, tokenizer(text, add_special_tokens=False)["input_ids"]))
            result.append(_no_tokens(text, as_text(tokenizer, text, ids, special, unk, what), what))
        except Exception as e:
            result.append(f"tokenizer failed on the {what}: {type(e).__name__}: {one_line(e, 120)}")
    return result


UNKNOWN_CHECK_ROWS = 100
"""How many rows (the first ones) :func:`unknown_token_note` counts the tokens of."""


def unknown_token_note(tokenizer: Any, columns: Sequence[Sequence[list[int] | str]], source: str) -> str | None:
    """One warning line when more than half of the tokens of the first :data:`UNKNOWN_CHECK_ROWS`
    rows are the tokenizer's unknown token (a tokenizer that does not know this text: another
    model's, or a small vocabulary); None otherwise, and for a tokenizer without one. ``columns``:
    :func:`encode_texts`' results per text field (rows with a problem do not count)."""
    unk = special_id(tokenizer, "unk_token_id")
    if unk is None:
        return None
    rows = min((len(c) for c in columns), default=0)
    rows = min(rows, UNKNOWN_CHECK_ROWS)
    id_lists = [ids for column in columns for ids in column[:rows] if not isinstance(ids, str)]
    total = sum(len(ids) for ids in id_lists)
    unknown = sum(ids.count(unk) for ids in id_lists)
    if unknown * 2 <= total:
        return None
    return (f"{source}: {unknown} of the {total} tokens of the first {rows} rows are the tokenizer's unknown token "
            f"{getattr(tokenizer, 'unk_token', None) or unk!r}: it does not know most of this text "
            "(is it the model's own tokenizer?)")


def with_bos(ids: list[int], bos: int | None) -> list[int]:
    """``ids`` with BOS first, unless there is no BOS or they already start with it."""
    if bos is None or (ids and ids[0] == bos):
        return ids
    return [bos] + ids


def start_rows(
    records: Any, tokenizer: Any, max_len: int, *, add_bos: bool, on_error: str, skipped: list[str] | None,
    ties: list[str] | None = None, notes: list[str] | None = None,
) -> tuple[RowSink, int | None]:
    """The start of an ``encode_*`` of prompt + reply records: ``max_len >= 2`` (else ValueError),
    then ``(sink, bos)``: the :class:`RowSink` for ``on_error`` (and ``skipped``, ``ties``, ``notes``)
    and the BOS id (None without ``add_bos`` or when the tokenizer has none)."""
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2, got {max_len}")
    sink = RowSink(on_error, skipped, records, ties=ties, notes=notes)
    return sink, special_id(tokenizer, "bos_token_id") if add_bos else None


def tokenized_rows(
    records: Sequence[Any], tokenizer: Any, sink: RowSink, bos: int | None, replies: Sequence[tuple[str, str]]
) -> Iterator[tuple[int, Any, str, list[int], list[list[int]]]]:
    """``(index, record, where, prompt_ids, reply_ids)`` per record, in order: the record's
    ``prompt`` tokenised, BOS first, and one id list per ``(attribute, what)`` of ``replies``
    (each field tokenised as one batch, the prompts first; ``what`` names it in messages). A
    record the tokenizer failed on (or read a field of as no tokens) goes to ``sink`` (the first
    failed field's message) instead; a note goes to it when most tokens are UNK."""
    wheres = [row_location(r, i) for i, r in enumerate(records)]
    columns = [encode_texts(tokenizer, [r.prompt for r in records], wheres, "prompt")]
    columns += [encode_texts(tokenizer, [getattr(r, attr) for r in records], wheres, what) for attr, what in replies]
    sink.note(unknown_token_note(tokenizer, columns, data_source(records)))
    for i, rec in enumerate(records):
        ids = [column[i] for column in columns]
        problem = next((x for x in ids if isinstance(x, str)), None)
        if problem is not None:
            sink.bad(wheres[i], problem)
            continue
        yield i, rec, wheres[i], with_bos(ids[0], bos), ids[1:]
