"""Tokenisation and collation: records -> token ids -> padded ``torch.long`` tensors.

``encode_*`` tokenise once (the slow part) into small per-example objects that keep the record's
``index`` and ``line``; ``collate_*`` pad a batch of them (the fast part); ``tokenize_*`` do both.
The choices (prompt and reply tokenised apart, BOS, EOS trained on, padding sides, special tokens
kept out of user text, truncation, bad rows, ties) are documented once, in docs/data.md
("Tokenisation and collation").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from fourfold.data.chat import TemplateText
from fourfold.data.encoding import (
    RowSink,
    data_source,
    encode_texts,
    require_special_id,
    row_location,
    special_id,
    start_rows,
    tokenized_rows,
    unknown_token_note,
    with_bos,
)
from fourfold.data.formats import PreferenceRecord, PromptRecord, SFTRecord
from fourfold.errors import DataError

__all__ = [
    "PromptExample",
    "SFTExample",
    "PreferenceExample",
    "encode_prompts",
    "tokenize_prompts",
    "left_pad",
    "right_pad",
    "encode_sft",
    "collate_sft",
    "tokenize_sft",
    "encode_preferences",
    "collate_preferences",
    "tokenize_preferences",
    "EpochSampler",
    "to_device",
]


@dataclasses.dataclass(frozen=True)
class PromptExample:
    input_ids: list[int]
    """Prompt ids (BOS first when added), at most ``max_prompt_len`` long."""
    index: int
    """Position of the prompt in the list given to :func:`encode_prompts`."""
    line: int
    truncated: bool = False


@dataclasses.dataclass(frozen=True)
class SFTExample:
    input_ids: list[int]
    """Prompt ids followed by completion ids (+ EOS)."""
    num_prompt_tokens: int
    index: int
    line: int
    truncated: bool = False
    loss_mask: tuple[int, ...] | None = None
    """Per id of ``input_ids``: 1 = trained (several assistant turns, :attr:`SFTRecord.turns`);
    None = every id after the prompt."""


@dataclasses.dataclass(frozen=True)
class PreferenceExample:
    chosen_ids: list[int]
    """Prompt ids followed by the chosen response's ids (+ EOS)."""
    rejected_ids: list[int]
    num_prompt_tokens: int
    index: int
    line: int
    truncated: bool = False


# ----------------------------------------------------------------------------------- helpers


def _prompt_problem(n: int, max_prompt_len: int) -> str:
    return f"prompt has {n} tokens, more than data.max_prompt_len={max_prompt_len}"


def _pad(seqs: Sequence[Sequence[int]], pad_id: int, left: bool, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if len(seqs) == 0:
        raise ValueError("cannot pad an empty batch")
    L = max(len(s) for s in seqs) if length is None else length
    ids = torch.full((len(seqs), L), int(pad_id), dtype=torch.long)  # (B, L)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)  # (B, L)
    for b, s in enumerate(seqs):
        n = len(s)
        if n == 0:
            continue
        row = torch.as_tensor(list(s), dtype=torch.long)
        if left:
            ids[b, L - n :] = row
            mask[b, L - n :] = 1
        else:
            ids[b, :n] = row
            mask[b, :n] = 1
    return ids, mask


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts for generation: ``(input_ids [B, L], attention_mask [B, L])``, both long,
    ``L`` the longest prompt; the mask is 1 on real tokens."""
    return _pad(seqs, pad_id, left=True)


def right_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad sequences: ``(input_ids [B, L], attention_mask [B, L])``, both long."""
    return _pad(seqs, pad_id, left=False)


# ------------------------------------------------------------------------------------ prompts


def encode_prompts(
    prompts: Sequence[str | PromptRecord],
    tokenizer: Any,
    max_prompt_len: int,
    *,
    lines: Sequence[int] | None = None,
    source: str | None = None,
    truncate: bool = False,
    add_bos: bool = True,
    on_error: str = "raise",
    skipped: list[str] | None = None,
    notes: list[str] | None = None,
) -> list[PromptExample]:
    """Tokenise prompts (strings or :class:`PromptRecord`), checking ``max_prompt_len``.

    Messages name ``source:line`` (from the record, else from ``source`` and ``lines``, else the
    1-based position). Too long: DataError, or with ``truncate=True`` the leftmost tokens are
    dropped (BOS kept). A prompt with no tokens at all (or text the tokenizer reads as none) is an
    error; most tokens UNK, a note.
    """
    if max_prompt_len < 1:
        raise ValueError(f"max_prompt_len must be >= 1, got {max_prompt_len}")
    sink = RowSink(on_error, skipped, prompts, notes=notes)
    bos = special_id(tokenizer, "bos_token_id") if add_bos else None
    texts = [p.prompt if isinstance(p, PromptRecord) else p for p in prompts]
    line_of = [
        getattr(p, "line", None) if isinstance(p, PromptRecord) else (lines[i] if lines is not None else i + 1)
        for i, p in enumerate(prompts)
    ]
    wheres = [row_location(p, i, source, line_of[i]) for i, p in enumerate(prompts)]
    encoded = encode_texts(tokenizer, texts, wheres, "prompt")
    sink.note(unknown_token_note(tokenizer, [encoded], data_source(prompts, source)))
    out = []
    for i, ids in enumerate(encoded):
        if isinstance(ids, str):
            sink.bad(wheres[i], ids)
            continue
        ids = with_bos(ids, bos)
        truncated = False
        if len(ids) > max_prompt_len:
            if not truncate:
                sink.bad(wheres[i], _prompt_problem(len(ids), max_prompt_len))
                continue
            keep_bos = bos is not None and ids[0] == bos
            ids = ([bos] + ids[len(ids) - max_prompt_len + 1 :]) if keep_bos else ids[len(ids) - max_prompt_len :]
            truncated = True
        if not ids:
            sink.bad(wheres[i], "prompt is empty after tokenisation (0 tokens)")
            continue
        out.append(PromptExample(input_ids=ids, index=i, line=line_of[i], truncated=truncated))
    return out


def tokenize_prompts(
    prompts: Sequence[str | PromptRecord], tokenizer: Any, max_prompt_len: int, **options: Any
) -> list[list[int]]:
    """Prompt ids, one list per prompt, in order: :func:`encode_prompts` (``options``: its keywords);
    raises ``DataError("{source}:{line}: prompt has {n} tokens, more than data.max_prompt_len=...")``
    unless ``truncate=True``. Pad a batch with :func:`left_pad`."""
    return [e.input_ids for e in encode_prompts(prompts, tokenizer, max_prompt_len, **options)]


# ---------------------------------------------------------------------------- prompt + reply(s)


def _fit(
    prompt: list[int], reply: list[int], max_len: int, truncate: bool, what: str
) -> tuple[list[int] | None, bool, str | None]:
    """``(reply ids cut to fit, truncated, problem)`` for prompt + reply within ``max_len``."""
    total = len(prompt) + len(reply)
    if total <= max_len:
        return reply, False, None
    if len(prompt) >= max_len:
        return None, False, f"prompt has {len(prompt)} tokens, leaving no room for the {what} within max_len={max_len}"
    if not truncate:
        return None, False, f"prompt + {what} have {total} tokens, more than max_len={max_len}"
    return reply[: max_len - len(prompt)], True, None


def encode_sft(
    records: Sequence[SFTRecord],
    tokenizer: Any,
    max_len: int,
    *,
    eos: bool = True,
    add_bos: bool = True,
    truncate: bool = True,
    max_prompt_len: int | None = None,
    on_error: str = "raise",
    skipped: list[str] | None = None,
    notes: list[str] | None = None,
) -> list[SFTExample]:
    """Tokenise SFT records: prompt ids (BOS first) + completion ids (+ EOS), at most ``max_len``."""
    sink, bos = start_rows(records, tokenizer, max_len, add_bos=add_bos, on_error=on_error, skipped=skipped,
                           notes=notes)
    eos_id = require_special_id(tokenizer, "eos_token_id", "eos=True appends it to completions") if eos else None
    out = []
    for i, rec, where, p, (c,) in tokenized_rows(records, tokenizer, sink, bos, [("completion", "completion")]):
        if rec.turns:
            example, problem = _encode_turns(rec, i, where, p, tokenizer, eos_id, max_len, truncate, max_prompt_len)
            if problem is not None:
                sink.bad(where, problem)
            else:
                out.append(example)
            continue
        c = c + [eos_id] if eos_id is not None else c
        if max_prompt_len is not None and len(p) > max_prompt_len:
            problem = _prompt_problem(len(p), max_prompt_len)
        elif not c:
            problem = "completion is empty after tokenisation (0 tokens)"
        else:
            c, truncated, problem = _fit(p, c, max_len, truncate, "completion")
        if problem is not None:
            sink.bad(where, problem)
            continue
        out.append(SFTExample(input_ids=p + c, num_prompt_tokens=len(p), index=i, line=rec.line, truncated=truncated))
    return out


def _encode_turns(rec: SFTRecord, i: int, where: str, p: list[int], tokenizer: Any, eos_id: int | None, max_len: int,
                  truncate: bool, max_prompt_len: int | None) -> tuple[SFTExample | None, str | None]:
    """A record with several assistant turns: the prompt ids, then each segment of ``rec.turns``
    tokenised on its own (as a multi-turn rollout appends them), EOS after each trained one (and
    the EOS string the template wrote after it taken out of the next segment), the loss mask 1 on
    the trained segments' ids. ``(example, None)`` or ``(None, problem)``."""
    if max_prompt_len is not None and len(p) > max_prompt_len:
        return None, _prompt_problem(len(p), max_prompt_len)
    eos = getattr(tokenizer, "eos_token", None) if eos_id is not None else None
    texts = []
    for text, trained in rec.turns:
        if not trained and eos and text.startswith(eos):
            text = text.tail(len(eos)) if isinstance(text, TemplateText) else text[len(eos):]
        texts.append(text)
    encoded = encode_texts(tokenizer, texts, [where] * len(texts), "assistant turn")
    ids, mask = list(p), [0] * len(p)
    for seg, (_, trained) in zip(encoded, rec.turns):
        if isinstance(seg, str):
            return None, seg
        seg = seg + [eos_id] if trained and eos_id is not None else seg
        ids += seg
        mask += [int(trained)] * len(seg)
    truncated = len(ids) > max_len
    if truncated and not truncate:
        return None, f"prompt + assistant turns have {len(ids)} tokens, more than max_len={max_len}"
    if len(p) >= max_len:
        return None, f"prompt has {len(p)} tokens, leaving no room for the completion within max_len={max_len}"
    ids, mask = ids[:max_len], mask[:max_len]
    return SFTExample(input_ids=ids, num_prompt_tokens=len(p), index=i, line=rec.line, truncated=truncated,
                      loss_mask=tuple(mask)), None


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A collated batch (any of the ``collate_*`` dicts) with every tensor moved to ``device``
    (non-blocking)."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def collate_sft(examples: Sequence[SFTExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch: ``input_ids``, ``attention_mask``, ``loss_mask`` ``[N, L]`` (long; loss_mask
    is 1 on completion tokens incl. EOS, 0 on prompt and padding) and ``truncated`` ``[N]`` (bool)."""
    input_ids, attention_mask = right_pad([e.input_ids for e in examples], pad_id)  # (N, L)
    n_prompt = torch.tensor([e.num_prompt_tokens for e in examples], dtype=torch.long)  # (N,)
    positions = torch.arange(input_ids.shape[1])  # (L,)
    loss_mask = attention_mask * (positions[None, :] >= n_prompt[:, None]).long()  # (N, L)
    for row, e in enumerate(examples):  # several assistant turns: their own mask
        if e.loss_mask is not None:
            loss_mask[row, : len(e.loss_mask)] = torch.tensor(e.loss_mask, dtype=torch.long)
    truncated = torch.tensor([e.truncated for e in examples], dtype=torch.bool)  # (N,)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask, "truncated": truncated}


def tokenize_sft(records: Sequence[SFTRecord], tokenizer: Any, max_len: int, **options: Any) -> dict[str, torch.Tensor]:
    """:func:`encode_sft` (``options``: its keywords; bad rows raise by default) then
    :func:`collate_sft` with the tokenizer's pad id."""
    pad_id = require_special_id(tokenizer, "pad_token_id", "needed to pad")
    return collate_sft(encode_sft(records, tokenizer, max_len, **options), pad_id)


def encode_preferences(
    records: Sequence[PreferenceRecord],
    tokenizer: Any,
    max_len: int,
    *,
    eos: bool = True,
    add_bos: bool = True,
    truncate: bool = True,
    max_prompt_len: int | None = None,
    on_error: str = "raise",
    skipped: list[str] | None = None,
    ties: list[str] | None = None,
    notes: list[str] | None = None,
) -> list[PreferenceExample]:
    """Tokenise preference pairs: prompt ids + chosen/rejected ids (+ EOS), each at most ``max_len``.
    A pair whose two sequences come out as the same ids (the tokenizer maps both to the same
    tokens, or truncation cuts where they differ) is a tie: it carries no preference, so it is
    left out and its message goes to ``ties``, whatever ``on_error`` says."""
    sink, bos = start_rows(records, tokenizer, max_len, add_bos=add_bos, on_error=on_error, skipped=skipped,
                           ties=ties, notes=notes)
    eos_id = require_special_id(tokenizer, "eos_token_id", "eos=True appends it to responses") if eos else None
    tail = [eos_id] if eos_id is not None else []
    replies = [("chosen", "chosen response"), ("rejected", "rejected response")]
    out = []
    for i, rec, where, p, (c, r) in tokenized_rows(records, tokenizer, sink, bos, replies):
        problem = None
        c_trunc = r_trunc = False
        if max_prompt_len is not None and len(p) > max_prompt_len:
            problem = _prompt_problem(len(p), max_prompt_len)
        if problem is None:
            c, c_trunc, problem = _fit(p, c + tail, max_len, truncate, "chosen response")
        if problem is None:
            r, r_trunc, problem = _fit(p, r + tail, max_len, truncate, "rejected response")
        if problem is not None:
            sink.bad(where, problem)
            continue
        if c == r:
            after = f" after truncation to max_len={max_len}" if (c_trunc or r_trunc) else ""
            sink.tie(where, f"'chosen' and 'rejected' are the same tokens{after}")
            continue
        out.append(
            PreferenceExample(
                chosen_ids=p + c,
                rejected_ids=p + r,
                num_prompt_tokens=len(p),
                index=i,
                line=rec.line,
                truncated=c_trunc or r_trunc,
            )
        )
    return out


def collate_preferences(examples: Sequence[PreferenceExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch, chosen and rejected padded to one common length ``L`` (so they can be
    stacked into one ``[2N, L]`` forward): ``chosen_input_ids``, ``chosen_attention_mask``,
    ``rejected_input_ids``, ``rejected_attention_mask`` ``[N, L]`` (long), ``truncated`` ``[N]``."""
    if len(examples) == 0:
        raise ValueError("cannot pad an empty batch")
    L = max(max(len(e.chosen_ids), len(e.rejected_ids)) for e in examples)
    c_ids, c_mask = _pad([e.chosen_ids for e in examples], pad_id, left=False, length=L)  # (N, L)
    r_ids, r_mask = _pad([e.rejected_ids for e in examples], pad_id, left=False, length=L)  # (N, L)
    return {
        "chosen_input_ids": c_ids,
        "chosen_attention_mask": c_mask,
        "rejected_input_ids": r_ids,
        "rejected_attention_mask": r_mask,
        "truncated": torch.tensor([e.truncated for e in examples], dtype=torch.bool),
    }


def tokenize_preferences(
    records: Sequence[PreferenceRecord], tokenizer: Any, max_len: int, **options: Any
) -> dict[str, torch.Tensor]:
    """:func:`encode_preferences` (``options``: its keywords; bad rows raise by default, ties are
    left out) then :func:`collate_preferences` with the tokenizer's pad id."""
    pad_id = require_special_id(tokenizer, "pad_token_id", "needed to pad")
    return collate_preferences(encode_preferences(records, tokenizer, max_len, **options), pad_id)


# ------------------------------------------------------------------------------------ sampler


class EpochSampler:
    """Seeded batches of indices, a fresh ``torch.randperm`` per epoch, resumable mid-epoch.

    ``for batch in sampler`` yields the rest of the current epoch (lists of ints), then moves to
    the next epoch; :meth:`batches` runs across epochs without end. A batch counts as consumed once
    it is yielded, so a checkpoint saved after training on it holds a ``state_dict()`` that resumes
    with the *next* batch. The order of epoch ``e`` depends only on ``(seed, e)``, so a sampler
    restored with :meth:`load_state_dict` yields exactly the batches the original would have.
    """

    def __init__(self, num_samples: int, batch_size: int, *, seed: int = 0, shuffle: bool = True, drop_last: bool = False):
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and batch_size > num_samples:
            raise ValueError(f"drop_last with batch_size={batch_size} > num_samples={num_samples} gives no batches")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = int(seed)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0
        """Samples of the current epoch's order already handed out."""

    def _end(self) -> int:
        return self.num_samples - self.num_samples % self.batch_size if self.drop_last else self.num_samples

    def __len__(self) -> int:
        """Batches per epoch."""
        return self._end() // self.batch_size if self.drop_last else -(-self.num_samples // self.batch_size)

    def order(self, epoch: int) -> list[int]:
        """The sample order of ``epoch`` (a pure function of seed and epoch)."""
        if not self.shuffle:
            return list(range(self.num_samples))
        g = torch.Generator()
        g.manual_seed((self.seed * 1_000_003 + epoch) & 0x7FFF_FFFF_FFFF_FFFF)
        return torch.randperm(self.num_samples, generator=g).tolist()

    def _roll(self) -> None:
        if self.position >= self._end():
            self.epoch += 1
            self.position = 0

    def __iter__(self) -> Iterator[list[int]]:
        self._roll()
        epoch, order, end = self.epoch, self.order(self.epoch), self._end()
        while self.epoch == epoch and self.position < end:
            start = self.position
            self.position = min(start + self.batch_size, end)
            yield order[start : self.position]
        self._roll()

    def batches(self) -> Iterator[list[int]]:
        """Batches forever, epoch after epoch (for step-based training loops)."""
        while True:
            yield from self

    def state_dict(self) -> dict[str, int]:
        self._roll()
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "num_samples": self.num_samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        n = int(state.get("num_samples", self.num_samples))
        if n != self.num_samples:
            raise DataError(
                f"cannot resume the data order: the data now has {self.num_samples} records, "
                f"the checkpoint was taken with {n}"
            )
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
