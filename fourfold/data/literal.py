"""User text stays text: a special-token string a user typed (``<pad>``, ``<|endoftext|>``, a
chat template's ``<|im_end|>`` inside a message) is never encoded as that special token.

The usual text contains no such string and keeps exactly the ids the tokenizer gives it: only a
text whose plain encoding holds a special id is encoded again, as text. A chat template's own
rendering (:class:`~fourfold.data.chat.TemplateText`) keeps its special tokens; only the
strings a user typed inside its messages (its ``literal_spans``) are encoded as text.
"""

from __future__ import annotations

from typing import Any

from fourfold.data.chat import TemplateText


def _id(tokenizer: Any, name: str) -> int | None:
    value = getattr(tokenizer, name, None)
    return int(value) if value is not None else None


def special_ids(tokenizer: Any) -> tuple[set[int], int | None]:
    """(ids of the tokenizer's special tokens that user text must never produce, the id a typed
    special-token string becomes where the tokenizer has no other way to write it: UNK, unless
    UNK is itself one of those special tokens, as in GPT-2)."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", None) or [] if i is not None}
    unk = _id(tokenizer, "unk_token_id")
    others = {_id(tokenizer, n) for n in ("bos_token_id", "eos_token_id", "pad_token_id")}
    if unk is not None and unk not in others:
        ids.discard(unk)
        return ids, unk
    return ids, None


def literal_ids(tokenizer: Any, text: str, special: set[int], unk: int | None, what: str) -> list[int] | str:
    """Ids of user text in which special-token strings stay text: split_special_tokens, then any
    special id the vocabulary still maps a typed string to (a word-level vocabulary holds
    ``<pad>`` as a word) becomes UNK; a problem string when there is no UNK to use."""
    try:
        ids = list(map(int, tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]))
    except TypeError:  # a tokenizer without split_special_tokens
        ids = list(map(int, tokenizer(text, add_special_tokens=False)["input_ids"]))
    if special.isdisjoint(ids):
        return ids
    if unk is None:
        names = sorted({tokenizer.convert_ids_to_tokens(i) for i in ids if i in special})
        return f"the {what} contains {', '.join(map(repr, names))}, which this tokenizer can only read as a special token"
    return [unk if i in special else i for i in ids]


def as_text(tokenizer: Any, text: str, ids: list[int], special: set[int], unk: int | None,
            what: str) -> list[int] | str:
    """One text's ids with user-typed special-token strings kept as text (``ids``: its plain
    encoding, returned unchanged in the usual case of no special id in it). In the text a chat
    template wrote (:class:`TemplateText`) the template's special tokens stay special and only its
    ``literal_spans`` are encoded as text."""
    if isinstance(text, TemplateText):
        if not text.literal_spans:
            return ids
        out: list[int] = []
        pos = 0
        for start, end in text.literal_spans:
            if start > pos:
                out += list(map(int, tokenizer(text[pos:start], add_special_tokens=False)["input_ids"]))
            piece = literal_ids(tokenizer, text[start:end], special, unk, what)
            if isinstance(piece, str):
                return piece
            out += piece
            pos = end
        if pos < len(text):
            out += list(map(int, tokenizer(text[pos:], add_special_tokens=False)["input_ids"]))
        return out
    return ids if special.isdisjoint(ids) else literal_ids(tokenizer, text, special, unk, what)
