"""Per-row sampling noise: what makes a response independent of the rank that samples it.

A training rollout does not draw its tokens from a shared generator (whose stream would depend on
how many rows came before, on this rank or another). Row ``r`` of iteration ``i`` of a run seeded
with ``s`` gets uniforms of its own, and token ``t`` of that row is picked from the policy's
temperature-scaled distribution by the inverse CDF at the ``t``-th uniform. So a 2-process run
(each rank sampling its slice of the global rows) and a 1-process run of the same config draw the
same tokens, up to the float rounding of the logits.

Derivation of the uniforms of global row ``r`` (:func:`row_seed`, :meth:`RowNoise.uniforms`):

1. ``key = f"fourfold/row-noise/{s}/{i}/{r}"`` (decimal integers), encoded as UTF-8;
2. its 64-bit seed: the first 8 bytes of ``BLAKE2b(key, digest_size=8)``, little-endian;
3. a CPU ``torch.Generator`` seeded with it draws ``torch.rand(max_new_tokens, dtype=float64)``;
   uniform ``t`` picks token ``t``.

Nothing here touches the global generators (python, numpy, torch): sampling no longer moves the
random state that the minibatch permutations draw from.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


def row_seed(seed: int, iteration: int, row: int) -> int:
    """The 64-bit seed of global ``row``'s generator at ``iteration`` of a run seeded with
    ``seed``: the first 8 bytes (little-endian) of BLAKE2b of ``"fourfold/row-noise/{seed}/{iteration}/{row}"``."""
    key = f"fourfold/row-noise/{int(seed)}/{int(iteration)}/{int(row)}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


@dataclass(frozen=True)
class RowNoise:
    """The sampling noise of one iteration of a run: ``seed`` (``run.seed``) and ``iteration``."""

    seed: int
    iteration: int

    def uniforms(self, rows: range, n: int) -> torch.Tensor:
        """Uniforms in [0, 1) of the global ``rows`` (e.g. ``range(8, 16)``), ``n`` per row:
        ``[len(rows), n]`` float64 on the CPU, row ``j`` from a generator seeded with
        ``row_seed(seed, iteration, rows[j])`` (one small generator per row)."""
        out = torch.empty(len(rows), n, dtype=torch.float64)
        for j, row in enumerate(rows):
            g = torch.Generator()
            g.manual_seed(row_seed(self.seed, self.iteration, row))
            out[j] = torch.rand(n, generator=g, dtype=torch.float64)
        return out


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token picks ``[B]`` (long) from the distributions ``probs [B, V]`` at the uniforms ``u [B]``
    in [0, 1): the smallest index ``k`` with ``cdf_k > u * cdf_V`` (cumulative sums in float64;
    ``u`` scaled by the row's total, so probabilities that do not sum to exactly 1 are no bias).

    A token of probability 0 is never picked (its cdf equals its predecessor's, which the strict
    ``>`` reaches first; ``u = 0`` picks the first token of positive probability). At the top end,
    where rounding can put ``u * cdf_V`` on or past the last cdf, the pick is clamped to the row's
    last token of positive probability."""
    cdf = probs.double().cumsum(-1)  # (B, V)
    target = (u.to(cdf) * cdf[:, -1]).unsqueeze(-1)  # (B, 1)
    tok = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    vocab = torch.arange(probs.shape[-1], device=probs.device)
    last = torch.where(probs > 0, vocab, torch.zeros_like(vocab)).amax(-1)
    return torch.minimum(tok, last)
