"""An environment's observations as token ids, each tokenised on its own (docs/environments.md,
"Token in, token out").

:class:`ObservationEncoder` turns the first observation (``reset()``'s) into prompt ids exactly as
the prompts stream encodes a prompt (BOS first; chat messages rendered by the tokenizer's chat
template, or the plain ``role: content`` fallback), and every later observation into the ids that
follow the policy's turn:

* a string (with ``env.observation_role`` null) is tokenised as it is, without special tokens, a
  special-token string in it kept as text (an environment cannot inject an EOS or a template
  marker);
* chat messages (or a string with a role) are rendered through the chat template as the
  continuation of a conversation whose assistant turn has just ended: the text the template puts
  after the assistant's EOS (e.g. the newline after ``<|im_end|>``), the messages, and the
  generation prompt of the next assistant turn. That continuation is found by rendering a fixed
  two-message conversation with and without the observation and taking the difference.

Nothing already in the trajectory is tokenised again: the ids returned are appended after the
policy's sampled ids as they are.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from fourfold.data.chat import TemplateText, chat_template_renderer, plain_chat_render
from fourfold.data.collate import encode_prompts
from fourfold.data.encoding import encode_texts
from fourfold.errors import DataError

Observation = Union[str, list[dict[str, Any]]]

_USER, _ASSISTANT = "\U000f0002u", "\U000f0002a"  # contents of the fixed conversation, never in real text


class ObservationEncoder:
    """Observations -> ids for ``tokenizer``; ``role``: the message role a string observation is
    wrapped in (``env.observation_role``; None = appended as text). Problems (a text the tokenizer
    reads as no tokens, a template that does not continue a conversation) are DataErrors naming
    ``where`` (the row)."""

    def __init__(self, tokenizer: Any, role: Optional[str] = None):
        self.tokenizer = tokenizer
        self.role = role
        self.render = chat_template_renderer(tokenizer)
        self.eos = getattr(tokenizer, "eos_token", None)

    def _messages(self, obs: Observation) -> Optional[list[dict[str, Any]]]:
        if isinstance(obs, list):
            return obs
        return [{"role": self.role, "content": obs}] if self.role is not None else None

    def first(self, obs: Observation, where: str, max_len: int) -> list[int]:
        """The first observation's ids: a prompt (BOS first), at most ``max_len`` tokens."""
        messages = self._messages(obs)
        if messages is None:
            text = obs
        else:
            text = self.render(messages) if self.render is not None else plain_chat_render(messages)
        source, _, line = where.rpartition(":")
        lines = [int(line)] if line.isdigit() else None
        (example,) = encode_prompts([text], self.tokenizer, max_len, lines=lines, source=source if lines else where)
        return example.input_ids

    def next(self, obs: Observation, where: str, after_eos: bool = True) -> list[int]:
        """A later observation's ids, to append right after the policy's turn. ``after_eos``: the
        turn ended with the tokenizer's EOS (else it was cut, or ended at a stop string): a chat
        continuation then keeps the template's EOS string, closing the assistant's turn."""
        messages = self._messages(obs)
        text = obs if messages is None else self._continuation(messages, where, after_eos)
        (ids,) = encode_texts(self.tokenizer, [text], [where], "observation")
        if isinstance(ids, str):
            raise DataError(f"{where}: {ids}")
        return ids

    def _continuation(self, messages: list[dict[str, Any]], where: str, after_eos: bool = True) -> str:
        """The text between the assistant's EOS and the next assistant reply, around ``messages``."""
        convo = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}]
        if self.render is None:  # plain: "assistant: A\n" then "role: content\n"... then "assistant: "
            return "\n" + "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        full = self.render(convo + list(messages))
        base = self.tokenizer.apply_chat_template(convo, tokenize=False, add_generation_prompt=False)
        end = base.rfind(_ASSISTANT)
        if end < 0 or not full.startswith(base[: end + len(_ASSISTANT)]):
            raise DataError(f"{where}: the chat template does not render an observation as the continuation of the "
                            "conversation (the conversation before it renders differently with it)")
        start = end + len(_ASSISTANT)
        if after_eos and self.eos and full.startswith(self.eos, start):  # the policy's EOS is in the trajectory
            start += len(self.eos)
        spans = [(s - start, e - start) for s, e in getattr(full, "literal_spans", ()) if s >= start]
        return TemplateText(full[start:], spans)
