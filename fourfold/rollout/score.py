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


def select_rows(batch, rows: slice):
    """Rows ``rows`` of every tensor of a :class:`Samples` or :class:`Scores` (a new one)."""
    return replace(batch, **{f.name: getattr(batch, f.name)[rows] for f in fields(batch)
                             if getattr(batch, f.name) is not None})


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
) -> Scores:
    """Reference log-probs, critic values and reward scores in one batched no-grad pass each.

    With ``concurrent`` the reference pass runs in a second thread beside the critic and reward
    passes (independent models; same results).
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
        scores = reward(seq, attn, prompts, responses).float()
        ref_logprobs = ref_future.result() if ref_future else reference_pass()
    finally:
        if pool:
            pool.shutdown()
    return Scores(ref_logprobs, values, scores)
