"""The prompts of the language-model RL stages: :class:`PromptStream` (a file or a list, tokenised once,
served in shuffled batches, resumable) and the K consecutive rows of a prompt's group
(:func:`repeat_prompts`, :func:`repeat_columns`)."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from fourfold.config import PromptDataConfig
from fourfold.data import (
    EpochSampler,
    chat_template_renderer,
    column_names,
    encode_prompts,
    left_pad,
    line_of,
    load_prompts,
)
from fourfold.errors import ConfigError


class PromptStream:
    """Prompts tokenised once, served in shuffled batches; resumable through ``state_dict()``.

    The prompts are ``prompts`` when given (a list of strings, used as they are), else the rows of
    the ``data.prompts`` file; with ``data.on_error: skip`` its bad rows (unreadable, longer than
    ``data.max_prompt_len``, or text the tokenizer reads as no tokens) are left out and their
    messages kept in ``skipped`` (file order); ``notes`` holds the warning lines on the prompts as
    a whole (most tokens unknown). Fewer prompts than one batch is a ConfigError naming
    ``batch_key``, the batch size's key."""

    def __init__(self, data: PromptDataConfig, tokenizer, batch_size: int, seed: int,
                 prompts: Optional[Sequence[str]] = None, batch_key: str = "rollout_batch_size"):
        on_error = "raise"
        if prompts is not None:
            texts, rows = list(prompts), [{}] * len(prompts)
            lines, source, self.skipped = None, "prompts", []
        elif data.prompts is not None:
            # chat `messages` are rendered exactly as the SFT and reward stages render them
            loaded = load_prompts(data.prompts, on_error=data.on_error, chat_template=chat_template_renderer(tokenizer))
            texts, lines, rows = [r.prompt for r in loaded], [r.line for r in loaded], [r.columns for r in loaded]
            source, on_error, self.skipped = data.prompts, data.on_error, list(loaded.skipped)
        else:
            raise ConfigError("data.prompts: missing: a prompts file (or prompts passed to the trainer)")
        self.notes: list[str] = []
        examples = encode_prompts(texts, tokenizer, data.max_prompt_len, lines=lines, source=source,
                                  on_error=on_error, skipped=self.skipped, notes=self.notes)
        self.skipped.sort(key=line_of)
        self.texts = [texts[e.index] for e in examples]
        self.ids = [e.input_ids for e in examples]
        self.columns = column_names(rows)
        """The prompts file's other columns (none for prompts passed as a list)."""
        self.rows = [rows[e.index] for e in examples]
        self.wheres = [f"{source}:{lines[e.index]}" if lines else f"{source}[{e.index}]" for e in examples]
        """Where each prompt comes from, for messages: ``file:line`` (``prompts[i]`` for a list)."""
        if len(self.ids) < batch_size:
            skipped = f" ({len(self.skipped)} bad rows skipped)" if self.skipped else ""
            raise ConfigError(f"{batch_key}: {batch_size} is more than the {len(self.ids)} prompts in {source}{skipped}; "
                              "one batch needs that many different prompts")
        self.pad_id = tokenizer.pad_token_id
        self.sampler = EpochSampler(len(self.texts), batch_size, seed=seed, drop_last=True)
        self._it = self.sampler.batches()

    def next(self, device) -> tuple[list[str], torch.Tensor, torch.Tensor]:
        """The next batch: its prompts' texts, ids and mask ``[n, P]`` (left-padded)."""
        return self.next_with_columns(device)[:3]

    def next_with_columns(self, device) -> tuple[list[str], torch.Tensor, torch.Tensor, dict[str, list]]:
        """:meth:`next` and the batch's columns: name -> one value per prompt (None where a row
        lacks the column); {} when the prompts have none."""
        idx = next(self._it)
        ids, mask = left_pad([self.ids[i] for i in idx], self.pad_id)
        columns = {c: [self.rows[i].get(c) for i in idx] for c in self.columns}
        return [self.texts[i] for i in idx], ids.to(device), mask.to(device), columns

    def next_rows(self) -> tuple[list[str], list[dict], list[str]]:
        """The next batch as an environment run reads it (the sampler advanced as by :meth:`next`):
        its prompts' texts, its rows (each a dict of the file's other columns with ``prompt``, the
        prompt's text; chat ``messages`` rendered) and where each comes from (``file:line``)."""
        idx = next(self._it)
        return ([self.texts[i] for i in idx], [{**self.rows[i], "prompt": self.texts[i]} for i in idx],
                [self.wheres[i] for i in idx])

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)
        self._it = self.sampler.batches()


def repeat_prompts(texts: list[str], ids: torch.Tensor, mask: torch.Tensor, k: int
                   ) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """Each prompt ``k`` times on consecutive rows (prompt i on rows i*k ... i*k + k - 1), the
    group of a group-baseline estimator: ``ids``, ``mask`` ``[n, P] -> [n * k, P]``. ``k = 1``
    returns the inputs themselves."""
    if k == 1:
        return texts, ids, mask
    return ([t for t in texts for _ in range(k)], ids.repeat_interleave(k, dim=0),
            mask.repeat_interleave(k, dim=0))


def repeat_columns(columns: dict[str, list], k: int) -> dict[str, list]:
    """The batch's columns for :func:`repeat_prompts`' rows: each prompt's value ``k`` times."""
    return {name: [v for v in values for _ in range(k)] for name, values in columns.items()}
