"""The data formats fourfold reads, as typed records, and their validating loaders
(``load_prompts``, ``load_sft``, ``load_responses``, ``load_preferences``).

The field names of each format, the chat forms, the validation and the sources are documented in
docs/data.md; each bad row is one line ``"<file>:<line>: <problem>"`` (``on_error="skip"`` leaves
it out and keeps the line in ``LoadResult.skipped``). Chat rendering is in :mod:`fourfold.data.chat`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from fourfold.data.chat import ChatRender, RenderedChat, TemplateText, plain_chat_render
from fourfold.data.io import check_on_error, json_type_name, location, no_usable_rows, one_line, read_source
from fourfold.errors import DataError

__all__ = [
    "PromptRecord",
    "SFTRecord",
    "PreferenceRecord",
    "ResponseRecord",
    "LoadResult",
    "load_prompts",
    "prompt_columns",
    "other_columns",
    "column_names",
    "load_sft",
    "load_preferences",
    "load_responses",
    "split_common_prefix",
    "PROMPT_FIELDS",
    "SFT_FIELDS",
    "PREFERENCE_FIELDS",
    "RESPONSE_FIELDS",
]

PROMPT_FIELDS = ("prompt", "messages")
SFT_FIELDS = ("prompt", "completion", "response", "text", "messages")
RESPONSE_FIELDS = ("prompt", "response", "messages", "finished")
PREFERENCE_FIELDS = ("prompt", "chosen", "rejected")


@dataclasses.dataclass(frozen=True)
class PromptRecord:
    """One prompt for generation (PPO / REINFORCE). ``line``: 1-based line (Parquet: row) number."""

    prompt: str
    line: int
    source: str = ""
    """The file the record came from (for error messages at tokenisation)."""
    columns: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    """The row's other fields (every key but ``prompt`` / ``messages``): what a reward function
    that names them receives (:func:`prompt_columns`)."""


@dataclasses.dataclass(frozen=True)
class SFTRecord:
    """One supervised example: the loss is taken on ``completion`` only (``prompt`` may be "")."""

    prompt: str
    completion: str
    line: int
    source: str = ""
    turns: tuple[tuple[str, bool], ...] = ()
    """With ``data.assistant_turns: all`` and several assistant messages: the text after
    ``prompt`` as segments ``(text, trained)``, each assistant message (trained) and the text the
    chat template puts between one and the next (not trained); () = ``completion`` alone."""


@dataclasses.dataclass(frozen=True)
class PreferenceRecord:
    """One preference pair for reward-model training: ``chosen`` is preferred over ``rejected``."""

    prompt: str
    chosen: str
    rejected: str
    line: int
    source: str = ""


@dataclasses.dataclass(frozen=True)
class ResponseRecord:
    """One prompt + response to score (``fourfold score``)."""

    prompt: str
    response: str
    """May be empty: a reply that was only EOS."""
    finished: bool
    """The response ended (with EOS, which tokenisation appends); false for a reply cut at the length limit."""
    line: int
    source: str = ""
    row: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    """The record as read (written back with its score)."""


R = TypeVar("R")


@dataclasses.dataclass
class LoadResult(Generic[R]):
    """What a loader returns: a list-like of records plus the messages of the rows it skipped."""

    records: list[R]
    skipped: list[str]
    """One-line message per skipped row (always empty under ``on_error="raise"``)."""
    source: str
    """The file name as given."""
    ties: list[str] = dataclasses.field(default_factory=list)
    """One-line message per preference pair left out as a tie (``chosen`` identical to ``rejected``)."""
    notes: list[str] = dataclasses.field(default_factory=list)
    """Warnings on the data as a whole, one line each (e.g. most tokens unknown), for the caller to show."""

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[R]:
        return iter(self.records)

    def __getitem__(self, i):
        return self.records[i]

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)

    def summary(self) -> str:
        """One line for the log, e.g. ``"data.jsonl: 998 records, 2 skipped"``."""
        return f"{self.source}: {len(self.records)} records, {len(self.skipped)} skipped"


# ---------------------------------------------------------------------------- validation core


class _Bad(Exception):
    """A problem with one row; the loader adds ``file:line:`` in front."""


class _Tie(_Bad):
    """A preference pair with nothing between chosen and rejected: left out, never an error."""


def _show(value: Any) -> str:
    """A short, one-line, printable view of a scalar (containers only by type, never repr'd)."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return " (" + one_line(repr(value), 40) + ")"
    return ""


def _missing(field: str, rec: dict, accepted: Sequence[str], wanted: Sequence[str] = ()) -> str:
    """``missing field 'x'`` plus a hint: a near-miss key (difflib against the accepted names)
    or, failing that, the keys the record does have."""
    wanted = tuple(wanted) or (field,)
    unknown = [k for k in rec if isinstance(k, str) and k not in accepted]
    for key in unknown:
        close = difflib.get_close_matches(key.lower(), list(accepted), n=1, cutoff=0.7)
        if close and close[0] in wanted:
            return f"missing field {field!r} (the record has {one_line(repr(key), 40)}: did you mean {close[0]!r}?)"
    if not rec:
        return f"missing field {field!r} (the record is an empty object)"
    keys = ", ".join(one_line(repr(k), 30) for k in list(rec)[:8])
    more = ", ..." if len(rec) > 8 else ""
    return f"missing field {field!r} (the record has {keys}{more})"


def _check_text(where: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _Bad(
            f"{where} is not valid Unicode text (lone surrogate {text[e.start]!a} at character {e.start + 1})"
        ) from None


def _string(rec: dict, key: str, accepted: Sequence[str], *, required_nonempty: bool = True) -> str:
    if key not in rec:
        raise _Bad(_missing(key, rec, accepted))
    value = rec[key]
    if not isinstance(value, str):
        raise _Bad(f"field {key!r} must be a string, got {json_type_name(value)}{_show(value)}")
    _check_text(f"field {key!r}", value)
    if required_nonempty and not value.strip():
        raise _Bad(f"field {key!r} is empty")
    return value


def _messages(value: Any, key: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _Bad(f"field {key!r} must be a list of messages, got {json_type_name(value)}{_show(value)}")
    if not value:
        raise _Bad(f"field {key!r} is an empty list of messages")
    out = []
    for i, m in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(m, dict):
            raise _Bad(f"{where} must be an object with 'role' and 'content', got {json_type_name(m)}{_show(m)}")
        for f in ("role", "content"):
            if f not in m:
                raise _Bad(f"{where} has no {f!r} (a message is {{'role': ..., 'content': ...}})")
            if not isinstance(m[f], str):
                raise _Bad(f"{where}.{f} must be a string, got {json_type_name(m[f])}{_show(m[f])}")
            _check_text(f"{where}.{f}", m[f])
        if not m["role"].strip():
            raise _Bad(f"{where}.role is empty")
        out.append(dict(m))
    return out


def _same_turns(a: list[dict], b: list[dict]) -> bool:
    return [(m["role"], m["content"]) for m in a] == [(m["role"], m["content"]) for m in b]


def _render(render: ChatRender | None, messages: list[dict[str, Any]]) -> str:
    fn = render or plain_chat_render
    try:
        text = fn(messages)
    except Exception as e:  # a chat template's own raise_exception, a KeyError, ...
        raise _Bad(f"chat template failed: {type(e).__name__}: {one_line(e, 120)}") from None
    if not isinstance(text, str):
        raise _Bad(f"chat template returned {type(text).__name__}, expected a string")
    _check_text("rendered chat", text)
    if render is not None and not isinstance(text, TemplateText):
        text = TemplateText(text, messages=messages)  # a caller's own template: its special tokens are meant
    elif not isinstance(text, RenderedChat):
        text = RenderedChat(text, messages)  # the messages travel with the text (a reward model's own template)
    return text


def _reply(value: Any, key: str) -> tuple[list[dict], str]:
    """A response given as a string, or as messages ending with the assistant's: ``(context, text)``."""
    if isinstance(value, str):
        _check_text(f"field {key!r}", value)
        return [], value
    if isinstance(value, list):
        msgs = _messages(value, key)
        if msgs[-1]["role"] != "assistant":
            raise _Bad(f"the last message of {key!r} must have role 'assistant', got {one_line(repr(msgs[-1]['role']), 30)}")
        return msgs[:-1], msgs[-1]["content"]
    raise _Bad(f"field {key!r} must be a string or a list of messages, got {json_type_name(value)}{_show(value)}")


def _only_one(rec: dict, first: str, others: Sequence[str]) -> None:
    clash = [k for k in others if k in rec]
    if clash:
        raise _Bad(f"has both {first!r} and {clash[0]!r}; use one form")


def _prompt_text(rec: dict, render: ChatRender | None, accepted: Sequence[str]) -> str:
    """``prompt`` as a string or a message list (rendered)."""
    if "prompt" not in rec:
        raise _Bad(_missing("prompt", rec, accepted))
    value = rec["prompt"]
    if isinstance(value, list):
        return _render(render, _messages(value, "prompt"))
    return _string(rec, "prompt", accepted, required_nonempty=False)


# ------------------------------------------------------------------------------ per-format rows


def _prompt_row(rec: dict, render: ChatRender | None) -> str:
    if "messages" in rec:
        _only_one(rec, "messages", ["prompt"])
        msgs = _messages(rec["messages"], "messages")
        if msgs[-1]["role"] == "assistant":
            raise _Bad("'messages' of a prompt must not end with an assistant message (is this SFT data?)")
        if not any(m["content"].strip() for m in msgs):
            raise _Bad("prompt is empty (every message has empty content)")
        return _render(render, msgs)
    prompt = _prompt_text(rec, render, PROMPT_FIELDS)
    if not prompt.strip():
        raise _Bad("field 'prompt' is empty")
    return prompt


def _sft_row(rec: dict, render: ChatRender | None) -> tuple[str, str]:
    if "messages" in rec:
        _only_one(rec, "messages", ["prompt", "completion", "response", "text"])
        msgs = _messages(rec["messages"], "messages")
        if msgs[-1]["role"] != "assistant":
            raise _Bad(f"the last message must have role 'assistant' (it is the completion), got {one_line(repr(msgs[-1]['role']), 30)}")
        completion = msgs[-1]["content"]
        if not completion.strip():
            raise _Bad("the last (assistant) message is empty")
        return _render(render, msgs[:-1]), completion
    if "text" in rec:
        _only_one(rec, "text", ["prompt", "completion", "response"])
        return "", _string(rec, "text", SFT_FIELDS)
    if "completion" in rec and "response" in rec:
        raise _Bad("has both 'completion' and 'response' (aliases); use one")
    if "prompt" not in rec and "completion" not in rec and "response" not in rec:
        hint = _missing("prompt", rec, SFT_FIELDS, wanted=SFT_FIELDS)
        raise _Bad(hint.replace("missing field 'prompt'", "no SFT fields: expected 'prompt'+'completion', 'text' or 'messages'", 1))
    prompt = _prompt_text(rec, render, SFT_FIELDS)
    if not prompt.strip():
        raise _Bad("field 'prompt' is empty (use {\"text\": ...} for data without a prompt)")
    key = "response" if "response" in rec else "completion"
    if key not in rec:
        raise _Bad(_missing("completion", rec, SFT_FIELDS, wanted=("completion", "response")))
    return prompt, _string(rec, key, SFT_FIELDS)


ASSISTANT_TURNS = ("last", "all")
"""The values of ``data.assistant_turns``: train on the last assistant message, or on all of them."""


def _sft_turns(rec: dict, render: ChatRender | None) -> tuple[str, str, tuple[tuple[str, bool], ...]]:
    """A ``messages`` row with several assistant messages as ``(prompt, completion, turns)``:
    ``prompt`` renders the messages before the first assistant message, ``turns`` alternates each
    assistant message (trained) with the text between it and the next one's reply (the rendering
    of everything up to the next assistant message, after this one's content: the end of its turn,
    the messages in between, the next generation prompt). Other rows: ``_sft_row`` and no turns."""
    prompt, completion = _sft_row(rec, render)
    msgs = _messages(rec["messages"], "messages") if "messages" in rec else []
    at = [j for j, m in enumerate(msgs) if m["role"] == "assistant"]
    if len(at) < 2:
        return prompt, completion, ()
    prompt = _render(render, msgs[: at[0]])
    turns: list[tuple[str, bool]] = []
    for k, j in enumerate(at):
        content = msgs[j]["content"]
        if not content.strip():
            raise _Bad(f"assistant message {k} (message {j}) is empty")
        turns.append((content, True))
        if k + 1 == len(at):
            break
        before, after = _render(render, msgs[:j]), _render(render, msgs[: at[k + 1]])
        if not after.startswith(before + content):
            raise _Bad(f"the chat template does not render assistant message {k} as it is before the next one "
                       "(data.assistant_turns: all needs each earlier reply rendered verbatim)")
        cut = len(before) + len(content)
        turns.append((after.tail(cut) if isinstance(after, TemplateText) else after[cut:], False))
    return prompt, completion, tuple(turns)


def split_common_prefix(a: str, b: str) -> tuple[str, str, str]:
    """``(prompt, reply_a, reply_b)`` with ``a == prompt + reply_a`` and ``b == prompt + reply_b``:
    the prompt is the longest common prefix of ``a`` and ``b`` cut back to a word boundary.

    When the common prefix ends inside a word (the next character of either text is not
    whitespace, or a text ends there), that partial word goes back to both replies; trailing
    whitespace moves to the replies too, so the prompt ends on a word and each reply begins with
    the whitespace before its first word. The prompt is ``""`` when the texts share no whole word.
    """
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    cut = n
    if cut and not a[cut - 1].isspace():
        inside_word = not (a[cut : cut + 1].isspace() and b[cut : cut + 1].isspace())
        if inside_word:
            while cut and not a[cut - 1].isspace():
                cut -= 1
    while cut and a[cut - 1].isspace():
        cut -= 1
    return a[:cut], a[cut:], b[cut:]


def _implicit_prompt(rec: dict) -> tuple[str, str, str]:
    """A row without ``prompt`` whose ``chosen`` and ``rejected`` are full texts: ``(prompt, chosen,
    rejected)`` split at their common start. A near-miss key (``promt``) stays an error."""
    hint = _missing("prompt", rec, PREFERENCE_FIELDS)
    if "did you mean 'prompt'" in hint:
        raise _Bad(hint)
    chosen, rejected = rec["chosen"], rec["rejected"]
    if not (isinstance(chosen, str) and isinstance(rejected, str)):  # reply-only message lists
        raise _Bad("missing field 'prompt' (and 'chosen' and 'rejected' hold only their replies, "
                   "no shared conversation to take it from)")
    if chosen.strip() == rejected.strip() and chosen.strip():
        raise _Tie("'chosen' and 'rejected' are identical")
    prompt, chosen, rejected = split_common_prefix(chosen, rejected)
    if not prompt.strip():
        raise _Bad("missing field 'prompt' (and 'chosen' and 'rejected' share no words at their start "
                   "to take it from)")
    return prompt, chosen, rejected


def _preference_row(rec: dict, render: ChatRender | None) -> tuple[str, str, str]:
    for key in ("chosen", "rejected"):
        if key not in rec:
            raise _Bad(_missing(key, rec, PREFERENCE_FIELDS))
    chosen_ctx, chosen = _reply(rec["chosen"], "chosen")
    rejected_ctx, rejected = _reply(rec["rejected"], "rejected")
    if not _same_turns(chosen_ctx, rejected_ctx):
        raise _Bad("'chosen' and 'rejected' differ before their last message; they must share the conversation")

    if "prompt" in rec:
        value = rec["prompt"]
        if isinstance(value, list):
            p_msgs = _messages(value, "prompt")
            # Either the prompt is repeated at the start of chosen/rejected, or they continue it.
            if len(chosen_ctx) >= len(p_msgs) and _same_turns(chosen_ctx[: len(p_msgs)], p_msgs):
                full = chosen_ctx
            else:
                full = p_msgs + chosen_ctx
            prompt = _render(render, full)
        else:
            prompt = _string(rec, "prompt", PREFERENCE_FIELDS, required_nonempty=False)
            if chosen_ctx:
                raise _Bad("'prompt' is a string but 'chosen' holds a conversation; give 'prompt' as messages too")
    elif chosen_ctx:
        prompt = _render(render, chosen_ctx)
    else:
        prompt, chosen, rejected = _implicit_prompt(rec)

    if isinstance(rec["chosen"], list) != isinstance(rec["rejected"], list):
        kinds = {k: "a list of messages" if isinstance(rec[k], list) else "a string" for k in ("chosen", "rejected")}
        raise _Bad(f"'chosen' is {kinds['chosen']} but 'rejected' is {kinds['rejected']}; give both in the same form")
    if not prompt.strip():
        raise _Bad("field 'prompt' is empty")
    if not chosen.strip():
        raise _Bad("field 'chosen' is empty")
    if not rejected.strip():
        raise _Bad("field 'rejected' is empty")
    if chosen.strip() == rejected.strip():
        raise _Tie("'chosen' and 'rejected' are identical")
    return prompt, chosen, rejected


def _response_row(rec: dict, render: ChatRender | None) -> tuple[str, str, bool]:
    finished = rec.get("finished", True)
    if not isinstance(finished, bool):
        raise _Bad(f"field 'finished' must be true or false (did the response end with EOS?), "
                   f"got {json_type_name(finished)}{_show(finished)}")
    if "messages" in rec:
        _only_one(rec, "messages", ["prompt", "response"])
        msgs = _messages(rec["messages"], "messages")
        if msgs[-1]["role"] != "assistant":
            raise _Bad(f"the last message must have role 'assistant' (it is the response), got {one_line(repr(msgs[-1]['role']), 30)}")
        if not any(m["content"].strip() for m in msgs[:-1]):
            raise _Bad("prompt is empty (no message with content before the assistant's reply)")
        return _render(render, msgs[:-1]), msgs[-1]["content"], finished
    prompt = _prompt_text(rec, render, RESPONSE_FIELDS)
    if not prompt.strip():
        raise _Bad("field 'prompt' is empty")
    return prompt, _string(rec, "response", RESPONSE_FIELDS, required_nonempty=False), finished


# ------------------------------------------------------------------------------------ loaders


def _load(path: str | os.PathLike, on_error: str, make: Callable[[dict, int, str], Any]) -> LoadResult:
    check_on_error(on_error)
    skipped: list[str] = []
    ties: list[str] = []
    name, rows = read_source(path, on_error=on_error, skipped=skipped)
    records = []
    for line, rec in rows:
        try:
            records.append(make(rec, line, name))
        except _Bad as bad:
            msg = f"{location(name, line)}: {bad}"
            if isinstance(bad, _Tie):
                ties.append(msg)
            elif on_error == "raise":
                raise DataError(msg) from None
            else:
                skipped.append(msg)
    # Bad JSON lines were collected while reading, bad fields after: list them in row order.
    skipped.sort(key=lambda msg: _row_number(msg, name))
    if not records:
        raise DataError(no_usable_rows(name, "records", skipped, ties))
    return LoadResult(records=records, skipped=skipped, source=name, ties=ties)



def _row_number(message: str, source: str) -> int:
    """N of a ``location(source, N): problem`` message."""
    rest = message[len(source) + 1 :]
    return int(rest.removeprefix("row ").split(":", 1)[0])


def load_prompts(
    path: str | os.PathLike, *, on_error: str = "raise", chat_template: ChatRender | None = None
) -> LoadResult[PromptRecord]:
    """Prompts for generation: ``{"prompt": str}`` or ``{"messages": [...]}`` per row."""
    return _load(
        path, on_error, lambda rec, line, src: PromptRecord(_prompt_row(rec, chat_template), line, src,
                                                            columns=_other_fields(rec, PROMPT_FIELDS))
    )


def _other_fields(rec: dict, fields: Sequence[str]) -> dict:
    return {k: v for k, v in rec.items() if k not in fields}


def column_names(rows) -> tuple[str, ...]:
    """The columns of records (dicts of a row's other fields), in the order they first appear: a
    column some rows lack is still one (those rows give None)."""
    names: dict[str, None] = {}
    for columns in rows:
        names.update(dict.fromkeys(columns))
    return tuple(names)


def other_columns(path: str | os.PathLike, fields: Sequence[str]) -> tuple[str, ...]:
    """The columns of a data file besides its format's ``fields`` (:func:`column_names` of its
    rows that hold a ``prompt`` or ``messages``), read without tokenising anything: what a run
    checks its reward functions against before any model loads. Unreadable lines and rows without
    a prompt are passed over here (the loader reports or skips them)."""
    _, rows = read_source(path, on_error="skip", skipped=[])
    texts = PROMPT_FIELDS
    return column_names(_other_fields(rec, fields) for _, rec in rows
                        if isinstance(rec, dict) and any(k in rec for k in texts))


def prompt_columns(path: str | os.PathLike) -> tuple[str, ...]:
    """The columns of a prompts file besides ``prompt`` / ``messages`` (:func:`other_columns`)."""
    return other_columns(path, PROMPT_FIELDS)


def load_sft(
    path: str | os.PathLike, *, on_error: str = "raise", chat_template: ChatRender | None = None,
    assistant_turns: str = "last",
) -> LoadResult[SFTRecord]:
    """Supervised pairs: ``prompt``+``completion``/``response``, ``text`` or ``messages`` per row.
    ``assistant_turns="all"``: a ``messages`` row with several assistant messages trains each of
    them (:attr:`SFTRecord.turns`); ``"last"`` (the default): the last one is the completion."""
    if assistant_turns not in ASSISTANT_TURNS:
        raise ValueError(f"assistant_turns must be one of {', '.join(ASSISTANT_TURNS)}, got {assistant_turns!r}")
    if assistant_turns == "last":
        return _load(path, on_error, lambda rec, line, src: SFTRecord(*_sft_row(rec, chat_template), line, src))

    def make(rec: dict, line: int, src: str) -> SFTRecord:
        prompt, completion, turns = _sft_turns(rec, chat_template)
        return SFTRecord(prompt, completion, line, src, turns)

    return _load(path, on_error, make)


def load_preferences(
    path: str | os.PathLike, *, on_error: str = "raise", chat_template: ChatRender | None = None
) -> LoadResult[PreferenceRecord]:
    """Preference pairs: ``prompt``, ``chosen``, ``rejected`` per row (strings or chat messages)."""
    return _load(
        path, on_error, lambda rec, line, src: PreferenceRecord(*_preference_row(rec, chat_template), line, src)
    )


def load_responses(
    path: str | os.PathLike, *, on_error: str = "raise", chat_template: ChatRender | None = None
) -> LoadResult[ResponseRecord]:
    """Rows to score: ``prompt`` + ``response`` or ``messages``, optional ``finished``, per row."""
    return _load(
        path, on_error,
        lambda rec, line, src: ResponseRecord(*_response_row(rec, chat_template), line, src, row=dict(rec)),
    )
