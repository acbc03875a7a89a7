"""Preference pairs for the stages that train on them (the reward model and DPO): the held-out
split and the tokenisation, each done once, up front.

A pair is ``prompt`` + ``chosen`` / ``rejected`` (:func:`fourfold.data.load_preferences`: strings,
chat messages, or rows that leave the prompt implicit), tokenised by
:func:`fourfold.data.encode_preferences`: the prompt as PPO encodes prompts (BOS first), then the
response's ids and EOS; a pair over ``train.max_len`` tokens is an error naming file and line. A
pair whose chosen and rejected are the same (as text, or as tokens) is a tie: it carries no
preference, so it is left out, counted in one warning line, and an error only when every pair of a
file is one.
"""

from __future__ import annotations

from typing import Optional

import torch

from fourfold.config import PreferenceDataConfig
from fourfold.data import (
    LoadResult,
    PreferenceExample,
    chat_template_renderer,
    encode_preferences,
    line_of,
    load_preferences,
    no_usable_rows,
)
from fourfold.errors import DataError


def split_records(data: PreferenceDataConfig, tokenizer, seed: int):
    """(train records, held-out records or None, LoadResult of data.train, LoadResult of data.eval or
    None): the LoadResults hold each file's skipped rows, ties and notes.

    Held out: ``data.eval`` when given, else ``round(eval_fraction * n)`` pairs (at least one when
    the fraction is > 0 and there are two or more) drawn by a permutation seeded with ``seed``;
    both parts keep file order."""
    render = chat_template_renderer(tokenizer)
    loaded = load_preferences(data.train, on_error=data.on_error, chat_template=render)
    records = list(loaded)
    if data.eval is not None:
        held = load_preferences(data.eval, on_error=data.on_error, chat_template=render)
        return records, list(held), loaded, held
    n = len(records)
    n_eval = min(n - 1, max(1, round(data.eval_fraction * n))) if data.eval_fraction > 0 and n >= 2 else 0
    if n_eval == 0:
        return records, None, loaded, None
    g = torch.Generator()
    g.manual_seed(seed)
    held_idx = set(torch.randperm(n, generator=g)[:n_eval].tolist())
    train = [r for i, r in enumerate(records) if i not in held_idx]
    held = [r for i, r in enumerate(records) if i in held_idx]
    return train, held, loaded, None


def encode(records, tokenizer, max_len: int, on_error: str, loaded: LoadResult, what: str) -> list[PreferenceExample]:
    """Tokenise pairs once: prompt ids (BOS first) + response ids + EOS; over ``max_len`` is an
    error. Skipped rows, ties and notes go to the lists of ``loaded``, the file's LoadResult; no
    pair left is an error naming ``what``."""
    examples = encode_preferences(records, tokenizer, max_len, truncate=False, on_error=on_error,
                                  skipped=loaded.skipped, ties=loaded.ties, notes=loaded.notes)
    if not examples:
        raise DataError(no_usable_rows(what, "preference pairs", loaded.skipped, loaded.ties))
    return examples


def ties_note(ties: list[str]) -> list[str]:
    """The one warning line on the tied pairs left out (none: no line)."""
    if not ties:
        return []
    pairs = "pair" if len(ties) == 1 else "pairs"
    return [f"{len(ties)} tied preference {pairs} left out ('chosen' and 'rejected' the same: no preference to "
            f"learn); first: {ties[0]}"]


def load_examples(cfg, tokenizer) -> tuple[list[PreferenceExample], Optional[list[PreferenceExample]], list[str],
                                           list[str]]:
    """(training pairs, held-out pairs or None, messages of the skipped rows in file order, warning
    lines: the tied pairs left out, most tokens unknown), each pair tokenised once. ``cfg``: a stage
    config with ``data`` (:class:`PreferenceDataConfig`), ``train.max_len`` and ``run.seed`` (the
    reward model's or DPO's)."""
    data, max_len = cfg.data, cfg.train.max_len
    train_recs, held_recs, loaded, held_loaded = split_records(data, tokenizer, cfg.run.seed)
    train_ex = encode(train_recs, tokenizer, max_len, data.on_error, loaded, data.train)
    eval_ex = None
    if held_recs:
        eval_ex = encode(held_recs, tokenizer, max_len, data.on_error, held_loaded or loaded,
                         data.eval or f"{data.train} (the pairs held out by data.eval_fraction)")
    files = [loaded] + ([held_loaded] if held_loaded is not None else [])

    def file_order(msg: str) -> tuple:
        return not msg.startswith(f"{data.train}:"), line_of(msg)

    skipped = sorted((m for f in files for m in f.skipped), key=file_order)
    ties = sorted((m for f in files for m in f.ties), key=file_order)
    return train_ex, eval_ex, skipped, ties_note(ties) + [n for f in files for n in f.notes]
