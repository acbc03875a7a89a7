"""Scoring a rollout: one batched no-grad forward pass each of the reference (log-probs), the
critic (values) and the reward model (one scalar per sequence) over prompt + response.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from typing import Optional, Sequence

import torch

from fourfold.rollout.sampling import Samples


@dataclass
class Scores:
    ref_logprobs: torch.Tensor  # [B, T]
    values: torch.Tensor  # [B, T] V(s_t) from the critic (zeros without one)
    scores: torch.Tensor  # [B] reward per sequence
    parts: Optional[torch.Tensor] = None  # [B, n_parts] a weighted reward's parts, in its order (None: one source)


def select_rows(batch, rows: slice):
    """Rows ``rows`` of every tensor of a :class:`Samples` or :class:`Scores` (a new one)."""
    return replace(batch, **{f.name: getattr(batch, f.name)[rows] for f in fields(batch)
                             if getattr(batch, f.name) is not None})


def reward_scores(reward, seq: torch.Tensor, attn: torch.Tensor, prompts: Optional[Sequence[str]],
                  responses: Optional[Sequence[str]], columns: Optional[dict] = None
                  ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The reward role's float scores ``[B]`` of the sequences ``seq`` (``attn`` their mask), the
    texts and ``columns`` given when it reads text, and a weighted reward's parts ``[B, n_parts]``
    (its ``last_parts`` in its ``names`` order; None for one source)."""
    kw = {"columns": columns} if columns and getattr(reward, "needs_text", False) else {}
    scores = reward(seq, attn, prompts, responses, **kw).float()
    names = getattr(reward, "names", None)
    parts = torch.stack([reward.last_parts[n] for n in names], 1) if names else None  # (B, n_parts)
    return scores, parts


@torch.no_grad()
def score_rollout(
    samples: Samples,
    *,
    reference,
    reward,
    critic=None,
    temperature: float = 1.0,
    prompts: Optional[Sequence[str]] = None,
    responses: Optional[Sequence[str]] = None,
    concurrent: bool = False,
    columns: Optional[dict] = None,
) -> Scores:
    """Reference log-probs, critic values and reward scores in one batched no-grad pass each.

    With ``concurrent`` the reference pass runs in a second thread beside the critic and reward
    passes (independent models; same results). ``columns``: the rows' other fields (name -> one
    value per row), given to a reward that reads text; a weighted reward's parts (its
    ``last_parts``, in its ``names`` order) come back as ``Scores.parts``.
    """
    seq, attn, T = samples.sequences, samples.attention_mask, samples.n_response

    def reference_pass() -> torch.Tensor:
        with torch.no_grad():
            return reference.logprobs(seq, attn, T, temperature) * samples.response_mask

    pool = ThreadPoolExecutor(max_workers=1) if concurrent else None
    ref_future = pool.submit(reference_pass) if pool else None
    try:
        if critic is not None:
            values = critic.response_values(seq, attn, T) * samples.response_mask
        else:
            values = torch.zeros_like(samples.logprobs)
        scores, parts = reward_scores(reward, seq, attn, prompts, responses, columns)
        ref_logprobs = ref_future.result() if ref_future else reference_pass()
    finally:
        if pool:
            pool.shutdown()
    return Scores(ref_logprobs, values, scores, parts)
