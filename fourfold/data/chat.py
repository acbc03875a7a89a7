"""Chat rendering: message lists become prompt text, ending where the assistant's reply begins
(docs/data.md, "Chat rendering").

``render(messages) -> str`` is a :data:`ChatRender`. :func:`chat_template_renderer` builds one on the
tokenizer's own chat template and returns :class:`TemplateText` (its special tokens stay special at
tokenisation, special-token strings typed in a message stay text); :func:`plain_chat_render` is the
fallback without a template.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ChatRender", "RenderedChat", "TemplateText", "plain_chat_render", "chat_template_renderer"]

ChatRender = Callable[[list[dict[str, Any]]], str]
"""``render(messages) -> str``: the prompt text for a conversation, ending where the reply begins."""


class RenderedChat(str):
    """Prompt text rendered from chat messages; ``messages`` are those messages, so whoever reads
    the text later (a reward model with its own tokenizer and chat template) can render them anew."""

    messages: tuple[dict[str, Any], ...]

    def __new__(cls, text: str, messages: Sequence[dict[str, Any]] = ()):
        obj = super().__new__(cls, text)
        obj.messages = tuple(messages)
        return obj


def plain_chat_render(messages: list[dict[str, Any]]) -> str:
    """The fallback when the tokenizer has no chat template: one ``"role: content"`` line per
    message, then ``"assistant: "`` where the reply begins."""
    return RenderedChat("".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: ", messages)


class TemplateText(RenderedChat):
    """Text a chat template wrote. Its special tokens (``<|im_start|>``, a BOS, ...) are read as
    special tokens at tokenisation, while everything else fourfold tokenises is user text whose
    special-token strings stay text; ``literal_spans`` are the ``(start, end)`` character ranges
    of special-token strings a user typed inside a message, which stay text here too."""

    literal_spans: tuple[tuple[int, int], ...]

    def __new__(cls, text: str, literal_spans: Sequence[tuple[int, int]] = (), messages: Sequence[dict[str, Any]] = ()):
        obj = super().__new__(cls, text, messages)
        obj.literal_spans = tuple(literal_spans)
        return obj

    def tail(self, start: int) -> "TemplateText":
        """``self[start:]`` still as TemplateText: the literal spans in it, shifted."""
        return TemplateText(str.__getitem__(self, slice(start, None)),
                            [(a - start, b - start) for a, b in self.literal_spans if a >= start])


_MARK_START, _MARK_END = "\U000f0000", "\U000f0001"  # private-use characters around a marked string
_MARKED = re.compile(f"{_MARK_START}(\\d+){_MARK_END}")


def _mark_specials(messages: list[dict[str, Any]], pattern: re.Pattern) -> tuple[list[dict[str, Any]], list[str]]:
    """The messages with each special-token string in a content replaced by a numbered marker,
    and the strings replaced (marker i stands for strings[i])."""
    found: list[str] = []

    def mark(m: re.Match) -> str:
        found.append(m.group(0))
        return f"{_MARK_START}{len(found) - 1}{_MARK_END}"

    marked = [dict(msg, content=pattern.sub(mark, msg["content"])) if isinstance(msg.get("content"), str) else msg
              for msg in messages]
    return marked, found


def _unmark(text: str, found: list[str], messages: Sequence[dict[str, Any]] = ()) -> TemplateText:
    """The rendered text with the markers replaced by the strings they stand for, as TemplateText
    whose ``literal_spans`` are where those strings now are."""
    parts, spans, length, pos = [], [], 0, 0
    for m in _MARKED.finditer(text):
        before = text[pos : m.start()].replace(_MARK_START, "").replace(_MARK_END, "")
        literal = found[int(m.group(1))]
        parts += [before, literal]
        spans.append((length + len(before), length + len(before) + len(literal)))
        length += len(before) + len(literal)
        pos = m.end()
    parts.append(text[pos:].replace(_MARK_START, "").replace(_MARK_END, ""))
    return TemplateText("".join(parts), spans, messages)


def chat_template_renderer(tokenizer: Any) -> ChatRender | None:
    """``render`` built on the tokenizer's own chat template, or None when it has none (the loaders
    then use :func:`plain_chat_render`). It returns :class:`TemplateText`: the template's special
    tokens stay special, while a special-token string typed in a message is marked as literal text."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    specials = sorted({s for s in getattr(tokenizer, "all_special_tokens", []) if s}, key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(s) for s in specials)) if specials else None

    def render(messages: list[dict[str, Any]]) -> str:
        marked, found = _mark_specials(messages, pattern) if pattern is not None else (messages, [])
        text = tokenizer.apply_chat_template(marked, tokenize=False, add_generation_prompt=True)
        return _unmark(text, found, messages) if found else TemplateText(text, messages=messages)

    return render
