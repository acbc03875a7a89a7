"""Tokenising prompt + response rows for scoring, in the layout PPO scores its rollouts in.

During PPO a response is scored as :func:`fourfold.rollout.eager.sample` leaves it: the prompt's ids
(tokenised as :func:`~fourfold.data.collate.encode_prompts` does: no special tokens, BOS first)
left-padded to the batch's longest prompt, then the generated ids right-padded to the longest
response, EOS included when the response ended. :func:`encode_responses` rebuilds those ids from
text (the response's ids, then EOS when ``finished``) and :func:`collate_responses` lays a batch out
the same way, so a reward model reads its score at the same token (the last valid one) and,
for the same rows in the same batches, gets the same inputs as PPO's ``score()``.
:func:`collate_pair_responses` lays out preference pairs that way, so DPO asks its policy and its
reference role for response log-probs exactly as PPO asks them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from fourfold.data.collate import PreferenceExample, left_pad, right_pad
from fourfold.data.encoding import require_special_id, start_rows, tokenized_rows
from fourfold.data.formats import ResponseRecord

__all__ = ["ResponseExample", "encode_responses", "collate_responses", "collate_pair_responses"]


@dataclasses.dataclass(frozen=True)
class ResponseExample:
    prompt_ids: list[int]
    """Prompt ids, BOS first when the tokenizer has one."""
    response_ids: list[int]
    """Response ids, then EOS when the record is ``finished``."""
    index: int
    """Position of the record in the list given to :func:`encode_responses`."""
    line: int


def encode_responses(
    records: Sequence[ResponseRecord],
    tokenizer: Any,
    max_len: int,
    *,
    add_bos: bool = True,
    on_error: str = "raise",
    skipped: list[str] | None = None,
    notes: list[str] | None = None,
) -> list[ResponseExample]:
    """Tokenise rows to score; prompt + response (with BOS and EOS) over ``max_len`` tokens, a
    prompt with no tokens, or a prompt or response with text the tokenizer reads as no tokens, is a
    problem naming ``file:line`` (raised, or skipped and collected); most tokens UNK, a note."""
    sink, bos = start_rows(records, tokenizer, max_len, add_bos=add_bos, on_error=on_error, skipped=skipped,
                           notes=notes)
    eos = require_special_id(tokenizer, "eos_token_id", "a finished response ends with it")
    out = []
    for i, rec, where, p, (r,) in tokenized_rows(records, tokenizer, sink, bos, [("response", "response")]):
        r = r + [eos] if rec.finished else r
        problem = None
        if not p:
            problem = "prompt is empty after tokenisation (0 tokens)"
        elif len(p) + len(r) > max_len:
            problem = f"prompt + response have {len(p) + len(r)} tokens, more than max_len={max_len}"
        if problem is not None:
            sink.bad(where, problem)
            continue
        out.append(ResponseExample(prompt_ids=p, response_ids=r, index=i, line=rec.line))
    return out


def collate_responses(examples: Sequence[ResponseExample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [B, P+T], attention_mask [B, P+T])``, long: prompts left-padded to ``P``, responses
    right-padded to ``T`` (PPO's ``Samples.sequences`` / ``attention_mask`` layout)."""
    prompt_ids, prompt_mask = left_pad([e.prompt_ids for e in examples], pad_id)  # (B, P)
    response_ids, response_mask = right_pad([e.response_ids for e in examples], pad_id)  # (B, T); T may be 0
    return torch.cat([prompt_ids, response_ids], 1), torch.cat([prompt_mask, response_mask], 1)



def collate_pair_responses(examples: Sequence[PreferenceExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Preference pairs in PPO's scoring layout, chosen rows first, then rejected: ``N`` pairs give
    ``2N`` rows, row ``i`` the prompt + chosen response of pair ``i`` and row ``N + i`` its prompt +
    rejected response. Prompts left-padded to the longest prompt ``P``, responses (EOS included)
    right-padded to the longest response ``T``:

    ``input_ids``, ``attention_mask`` ``[2N, P+T]`` and ``response_mask`` ``[2N, T]`` (1 on each
    response's own tokens), all long."""
    if len(examples) == 0:
        raise ValueError("cannot pad an empty batch")
    rows = [(e.chosen_ids, e.num_prompt_tokens) for e in examples] + [(e.rejected_ids, e.num_prompt_tokens)
                                                                       for e in examples]
    prompt_ids, prompt_mask = left_pad([ids[:n] for ids, n in rows], pad_id)  # (2N, P)
    response_ids, response_mask = right_pad([ids[n:] for ids, n in rows], pad_id)  # (2N, T)
    return {
        "input_ids": torch.cat([prompt_ids, response_ids], 1),
        "attention_mask": torch.cat([prompt_mask, response_mask], 1),
        "response_mask": response_mask,
    }
