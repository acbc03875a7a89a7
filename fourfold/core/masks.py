"""Masked reductions over padded tensors.

Convention used everywhere in ``fourfold.core``: ``mask`` is float or bool with the same shape as
the data (or broadcastable to it); nonzero / True = valid (counts), 0 / False = padding or after
EOS. Masked-out entries never influence a result, not even through NaN or inf: they are replaced
with ``torch.where`` before any arithmetic, so their gradients are exactly zero as well.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import Tensor

Dim = Optional[Union[int, Sequence[int]]]


def as_bool_mask(mask: Tensor) -> Tensor:
    """``mask`` as a bool tensor: nonzero (or True) = valid. Same shape."""
    return mask if mask.dtype == torch.bool else mask != 0


def _float(x: Tensor) -> Tensor:
    return x if x.is_floating_point() else x.float()


def masked_sum(x: Tensor, mask: Tensor, dim: Dim = None, keepdim: bool = False) -> Tensor:
    """sum_i m_i * x_i.

    Shapes: ``x`` any shape, ``mask`` the same (or broadcastable). ``dim=None`` sums every valid
    entry into a 0-d tensor; otherwise sums over ``dim`` (e.g. ``dim=-1`` on ``[B, T]`` gives
    ``[B]``). Masked entries are replaced by 0 before summing.
    """
    m = as_bool_mask(mask)
    x = _float(x)
    zeroed = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return zeroed.sum()
    return zeroed.sum(dim=dim, keepdim=keepdim)


def masked_count(x: Tensor, mask: Tensor, dim: Dim = None, keepdim: bool = False) -> Tensor:
    """Number of valid entries of ``x`` (as x's float dtype): sum_i m_i, over ``dim`` or all."""
    x = _float(x)
    m = as_bool_mask(mask)
    if m.shape != x.shape:  # (the common case needs no broadcast: it is cheap to skip)
        m = torch.broadcast_to(m, torch.broadcast_shapes(x.shape, m.shape))
    m = m.to(x.dtype)
    if dim is None:
        return m.sum()
    return m.sum(dim=dim, keepdim=keepdim)


def masked_mean(x: Tensor, mask: Tensor, dim: Dim = None, keepdim: bool = False) -> Tensor:
    """sum_i m_i x_i / sum_i m_i.

    ``dim=None``: one mean over every valid entry (token-level mean), 0-d result.
    ``dim`` given: per-slice mean, e.g. ``[B, T] -> [B]`` with ``dim=-1``.
    A mean over no valid entry is 0 (not NaN), in both cases.
    """
    total = masked_sum(x, mask, dim, keepdim)
    count = masked_count(x, mask, dim, keepdim)
    return total / count.clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True, dim: Dim = None) -> Tensor:
    """Variance of the valid entries: sum_i m_i (x_i - mu)^2 / (n - 1) with n = sum_i m_i
    (``unbiased=False``: divide by n), mu = masked_mean(x, mask, dim).

    ``dim=None`` gives a 0-d tensor over all valid entries; a ``dim`` gives one variance per slice.
    A variance over fewer entries than it needs (n == 0, or n == 1 when unbiased) is 0, not NaN.
    """
    x = _float(x)
    m = as_bool_mask(mask)
    mean = masked_mean(x, m, dim, keepdim=dim is not None)
    centered = torch.where(m, x - mean, torch.zeros((), dtype=x.dtype, device=x.device))
    sq = masked_sum(centered * centered, m, dim)
    n = masked_count(x, m, dim)
    denom = n - 1 if unbiased else n
    var = sq / denom.clamp(min=1)
    return torch.where(denom > 0, var, torch.zeros_like(var))


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Whiten with the statistics of the valid entries (all of them, one mean and one variance):

        w = (x - mu) / sqrt(var + eps)          (shift_mean=True: mean 0, unbiased var ~1)
        w = (x - mu) / sqrt(var + eps) + mu     (shift_mean=False: rescaled, mean kept)

    mu = masked_mean(x, mask), var = masked_var(x, mask, unbiased=True). Same shape as ``x``;
    exactly 0 where ``mask`` is 0.
    """
    x = _float(x)
    m = as_bool_mask(mask)
    mean = masked_mean(x, m)
    var = masked_var(x, m, unbiased=True)
    w = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        w = w + mean
    return torch.where(m, w, torch.zeros((), dtype=w.dtype, device=w.device))


def last_valid_index(mask: Tensor) -> Tensor:
    """Index along the last dim of the last valid entry of each row: ``[B, T] -> [B]`` long
    (any leading shape ``[..., T] -> [...]``); -1 for a row with no valid entry."""
    m = as_bool_mask(mask)
    if m.shape[-1] == 0:
        return torch.full(m.shape[:-1], -1, dtype=torch.long, device=m.device)
    idx = torch.arange(m.shape[-1], device=m.device).expand(m.shape)
    return torch.where(m, idx, torch.full_like(idx, -1)).amax(dim=-1)


def first_valid_index(mask: Tensor) -> Tensor:
    """Index along the last dim of the first valid entry of each row: ``[B, T] -> [B]`` long
    (any leading shape); -1 for a row with no valid entry."""
    m = as_bool_mask(mask)
    T = m.shape[-1]
    if T == 0:
        return torch.full(m.shape[:-1], -1, dtype=torch.long, device=m.device)
    idx = torch.arange(T, device=m.device).expand(m.shape)
    first = torch.where(m, idx, torch.full_like(idx, T)).amin(dim=-1)
    return torch.where(first == T, torch.full_like(first, -1), first)


def mask_from_lengths(lengths: Tensor, max_len: int) -> Tensor:
    """``[B]`` lengths -> ``[B, max_len]`` float mask with m[b, t] = 1 iff t < lengths[b]."""
    t = torch.arange(max_len, device=lengths.device)
    return (t < lengths.unsqueeze(-1)).float()


def mask_until_eos(tokens: Tensor, eos_token_id: int) -> Tensor:
    """Response mask of generated ``tokens`` ``[B, T]`` (any ``[..., T]``): float, 1 up to and
    including the first ``eos_token_id`` of each row, 0 after it; all 1 for a row with no EOS."""
    is_eos = (tokens == eos_token_id).long()
    eos_before = torch.cumsum(is_eos, dim=-1) - is_eos  # number of EOS strictly before t
    return (eos_before == 0).float()
