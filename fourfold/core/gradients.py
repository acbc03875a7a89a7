"""Gradient statistics of an update: the signal-to-noise ratio of its minibatch gradients
(``policy/grad_snr``) and the batch leave-one-out baseline of REINFORCE (``reinforce.baseline: loo``).

With g_1 .. g_M the (flattened, unclipped) gradients of the M minibatch steps of one update epoch and
gbar their mean:

    SNR = ||gbar|| / sqrt( (1/M) sum_i ||g_i - gbar||^2 )

the norm of the mean step over the root-mean-square deviation of the steps from it (M >= 2). A
large SNR: the minibatches agree on a direction; about 1/sqrt(M) or below: the mean is what their
noise leaves. :func:`grad_snr` is the definition on the stacked gradients; :class:`GradMoments`
accumulates the same number from a running sum (one float32 vector of the parameters' size) and the
sum of squared norms, using (1/M) sum ||g_i - gbar||^2 = (1/M) sum ||g_i||^2 - ||gbar||^2.
docs/experiments.md says what the variance claim compares with it.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from fourfold.core.masks import as_bool_mask, masked_sum


def snr_from_moments(total_sq_norm: float, sq_norm_sum: float, n: int) -> float:
    """The SNR of ``n`` >= 2 gradients from their moments: ``total_sq_norm`` = ||sum_i g_i||^2 and
    ``sq_norm_sum`` = sum_i ||g_i||^2. inf when every g_i is the same nonzero vector, nan when all
    are 0 (0 / 0); the noise term is clamped at 0 against rounding. Both moments are sums over the
    entries, so the sums of each rank's share of sharded gradients give the whole gradients' SNR
    (and W copies of the same gradients scale both by W: the same SNR)."""
    if n < 2:
        raise ValueError(f"the gradient SNR needs at least 2 gradients, got {n}")
    mean_sq = float(total_sq_norm) / n**2  # ||gbar||^2
    noise_sq = max(float(sq_norm_sum) / n - mean_sq, 0.0)
    if noise_sq == 0.0:
        return float("inf") if mean_sq > 0 else float("nan")
    return (mean_sq / noise_sq) ** 0.5


def grad_snr(grads: Tensor) -> Tensor:
    """The SNR of the rows of ``grads`` ``[M, P]`` (M >= 2 gradients, each flattened to P entries),
    computed in float64 straight from the definition (module docstring): a 0-d tensor."""
    g = grads.detach().double()
    if g.dim() != 2 or g.shape[0] < 2:
        raise ValueError(f"grads must be [M, P] with M >= 2, got shape {tuple(g.shape)}")
    gbar = g.mean(0)
    noise = (g - gbar).pow(2).sum(1).mean().sqrt()
    signal = gbar.norm()
    if float(noise) == 0.0:
        return torch.tensor(float("inf") if float(signal) > 0 else float("nan"), dtype=torch.float64)
    return signal / noise


class GradMoments:
    """The running moments of one epoch's minibatch gradients: :meth:`add` each step's flattened
    gradient (a float32 copy is summed), :meth:`snr` at the end. Memory: one float32 vector of the
    gradient's size."""

    def __init__(self) -> None:
        self.total: Optional[Tensor] = None
        self.sq_norm_sum = 0.0
        self.n = 0

    def add(self, flat_grad: Tensor) -> None:
        """Add one step's gradient (flattened; a float32 copy is summed)."""
        g = flat_grad.detach().float()
        self.total = g.clone() if self.total is None else self.total.add_(g)
        self.sq_norm_sum += float(g.double().pow(2).sum())
        self.n += 1

    def moments(self) -> tuple[float, float]:
        """(||sum_i g_i||^2, sum_i ||g_i||^2) of the gradients added (0, 0 before any)."""
        total_sq = 0.0 if self.total is None else float(self.total.double().pow(2).sum())
        return total_sq, self.sq_norm_sum

    def snr(self, reduce: Optional[Callable[[list], list]] = None) -> Optional[float]:
        """The SNR of the gradients added (:func:`snr_from_moments`), the two moments passed through
        ``reduce`` first when given (a sum over the ranks); None with fewer than 2 gradients."""
        if self.n < 2:
            return None
        moments = list(self.moments())
        total_sq, sq_sum = reduce(moments) if reduce is not None else moments
        return snr_from_moments(total_sq, sq_sum, self.n)


def flat_grad(params) -> Optional[Tensor]:
    """The gradients of ``params`` (those that have one) concatenated into one float32 vector (a
    sharded DTensor gradient: this rank's shard); None when none has a gradient."""
    grads = [_local(p.grad.detach()).reshape(-1).float() for p in params if p.grad is not None]
    return torch.cat(grads) if grads else None


def _local(t: Tensor) -> Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def leave_one_out_baseline(returns: Tensor, mask: Tensor) -> Tensor:
    """REINFORCE's batch leave-one-out baseline ``[B]``: row i's is the token-mean of the returns
    of the other rows' valid tokens,

        b_i = (sum_{j != i} sum_t m_jt G_jt) / (sum_{j != i} n_j)

    (the batch-mean baseline, masked_mean(G), without row i's own tokens, so b_i does not depend on
    row i's sample). A row whose others have no valid token gets 0. Detached. Shapes: ``returns``,
    ``mask`` ``[B, T]``."""
    m = as_bool_mask(mask)
    G = returns.detach()
    G = G if G.is_floating_point() else G.float()
    row_sum = masked_sum(G, m, dim=-1)  # (B,)
    row_n = m.sum(-1).to(G.dtype)
    others_n = row_n.sum() - row_n
    return torch.where(others_n > 0, (row_sum.sum() - row_sum) / others_n.clamp(min=1), torch.zeros_like(row_sum))
