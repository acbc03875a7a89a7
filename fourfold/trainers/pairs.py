"""Preference pairs for the stages that train on them (the reward model and DPO): the held-out
split and the tokenisation, each done once, up front.

A pair is ``prompt`` + ``chosen`` / ``rejected`` (:func:`fourfold.data.load_preferences`: strings,
chat messages, or rows that leave the prompt implicit), tokenised by
:func:`fourfold.data.encode_preferences`: the prompt as PPO encodes prompts (BOS first), then the
response's ids and EOS; a pair over ``train.max_len`` tokens is an error naming file and line.
"""

from __future__ import annotations

from typing import Optional

import torch

from fourfold.config import PreferenceDataConfig
from fourfold.data import PreferenceExample, chat_template_renderer, encode_preferences, line_of, load_preferences
from fourfold.errors import DataError


def split_records(data: PreferenceDataConfig, tokenizer, seed: int):
    """(train records, held-out records or None, LoadResult of train for the skipped rows and notes).

    Held out: ``data.eval`` when given, else ``round(eval_fraction * n)`` pairs (at least one when
    the fraction is > 0 and there are two or more) drawn by a permutation seeded with ``seed``;
    both parts keep file order."""
    render = chat_template_renderer(tokenizer)
    loaded = load_preferences(data.train, on_error=data.on_error, chat_template=render)
    records = list(loaded)
    if data.eval is not None:
        held = load_preferences(data.eval, on_error=data.on_error, chat_template=render)
        loaded.skipped.extend(held.skipped)
        loaded.notes.extend(held.notes)
        return records, list(held), loaded
    n = len(records)
    n_eval = min(n - 1, max(1, round(data.eval_fraction * n))) if data.eval_fraction > 0 and n >= 2 else 0
    if n_eval == 0:
        return records, None, loaded
    g = torch.Generator()
    g.manual_seed(seed)
    held_idx = set(torch.randperm(n, generator=g)[:n_eval].tolist())
    train = [r for i, r in enumerate(records) if i not in held_idx]
    held = [r for i, r in enumerate(records) if i in held_idx]
    return train, held, loaded


def encode(records, tokenizer, max_len: int, on_error: str, skipped: list[str], notes: list[str],
           what: str) -> list[PreferenceExample]:
    """Tokenise pairs once: prompt ids (BOS first) + response ids + EOS; over ``max_len`` is an error.
    Skipped rows go to ``skipped``, warnings on the data as a whole to ``notes``."""
    examples = encode_preferences(records, tokenizer, max_len, truncate=False, on_error=on_error, skipped=skipped,
                                  notes=notes)
    if not examples:
        raise DataError(f"{what}: no usable preference pairs ({len(skipped)} skipped)")
    return examples


def load_examples(cfg, tokenizer) -> tuple[list[PreferenceExample], Optional[list[PreferenceExample]], list[str],
                                           list[str]]:
    """(training pairs, held-out pairs or None, messages of the skipped rows in file order, warning
    lines on the data as a whole: most tokens unknown), each pair tokenised once. ``cfg``: a stage
    config with ``data`` (:class:`PreferenceDataConfig`), ``train.max_len`` and ``run.seed`` (the
    reward model's or DPO's)."""
    data, max_len = cfg.data, cfg.train.max_len
    train_recs, held_recs, loaded = split_records(data, tokenizer, cfg.run.seed)
    skipped, notes = loaded.skipped, loaded.notes
    train_ex = encode(train_recs, tokenizer, max_len, data.on_error, skipped, notes, data.train)
    eval_ex = None
    if held_recs:
        eval_ex = encode(held_recs, tokenizer, max_len, data.on_error, skipped, notes, data.eval or data.train)
    skipped.sort(key=lambda msg: (not msg.startswith(f"{data.train}:"), line_of(msg)))  # file order
    return train_ex, eval_ex, skipped, notes

