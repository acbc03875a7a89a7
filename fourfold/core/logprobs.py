"""Token log-probabilities and entropies from logits, memory-lean.

A language model's logits ``[B, T, V]`` are often bf16 and large (V ~ 50k-150k). Taking
``log_softmax(logits.float())`` would allocate a float32 copy of the whole tensor (and keep it for
backward). Instead both functions work on row blocks of at most ``BLOCK_ELEMENTS`` elements,
upcast each block to float32, and save only the (shared) input logits plus one float32 number per
row for backward; the backward pass recomputes the softmax block by block and writes the gradient
straight into a tensor of the logits' dtype. Results are float32 (float64 for float64 input) and
exact up to float32 rounding of the upcast block.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from fourfold.core.masks import masked_sum

BLOCK_ELEMENTS = 1 << 24
"""Elements of one row block (16M: 64 MiB in float32); the memory estimate counts its buffers."""


def _compute_dtype(logits: Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _for_row_blocks(fn: Callable[..., None], logits: Tensor, *aligned: Tensor) -> None:
    """Call ``fn(block [n, V], *aligned_blocks [n, ...])`` over row blocks of ``logits [..., V]``.

    ``aligned`` tensors share the leading dims of ``logits``, are contiguous (outputs are written
    in place through them). ``logits`` is viewed, never copied: when it cannot be viewed as
    ``[-1, V]`` (e.g. a slice ``logits[:, P-1:-1]``) the first dim is iterated instead.
    """
    lead = logits.dim() - 1
    V = logits.shape[-1]
    try:
        flat = logits.view(-1, V)
    except RuntimeError:
        for i in range(logits.shape[0]):
            _for_row_blocks(fn, logits[i], *(a[i] for a in aligned))
        return
    flats = [a.view(-1, *a.shape[lead:]) for a in aligned]
    rows = max(1, BLOCK_ELEMENTS // max(V, 1))
    for s in range(0, flat.shape[0], rows):
        fn(flat[s : s + rows], *(f[s : s + rows] for f in flats))


def _scaled(x: Tensor, cdt: torch.dtype, temperature: float) -> Tensor:
    """``z = x / temperature`` in the compute dtype (``x`` itself upcast at temperature 1; it may
    alias ``x``, so callers never modify it in place)."""
    z = x.to(cdt)
    if temperature != 1.0:
        z = z / temperature
    return z


def _forward_blocks(ctx, temperature: float, block: Callable[..., None], logits: Tensor, *aligned: Tensor) -> None:
    """A forward of both functions: ``block`` over the row blocks of ``logits`` and ``aligned``
    (:func:`_for_row_blocks`, no graph), then saved for backward what it reads: the input logits,
    ``aligned[0]`` (the function's own tensor: the tokens, the entropies) and ``aligned[-1]`` (the
    row logsumexps the block wrote)."""
    with torch.no_grad():
        _for_row_blocks(block, logits, *aligned)
    ctx.save_for_backward(logits, aligned[0], aligned[-1])
    ctx.temperature = temperature


def _logits_grad(ctx, grad_out: Tensor, grad_z: Callable[..., Tensor]) -> Tensor:
    """d loss / d logits, block by block: ``grad_z(z, saved, lse, grad_out)`` gives d loss / d z
    for a row block (``z = logits / T`` recomputed in the compute dtype; see :func:`_forward_blocks`), and the
    chain rule through ``z = x / T`` divides it by T. Written straight into the logits' dtype."""
    logits, saved, lse = ctx.saved_tensors
    temperature = ctx.temperature
    cdt = lse.dtype
    grad_out = grad_out.contiguous()
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)

    def block(x: Tensor, g: Tensor, s: Tensor, l: Tensor, go: Tensor) -> None:
        gz = grad_z(_scaled(x, cdt, temperature), s, l, go)
        if temperature != 1.0:
            gz = gz / temperature
        g.copy_(gz)

    _for_row_blocks(block, logits, grad, saved, lse, grad_out)
    return grad


def _backward(grad_z: Callable[..., Tensor], inputs: int):
    """The backward of both functions (a ``staticmethod``, first order only): d loss / d logits by
    :func:`_logits_grad` with ``grad_z``, None for the ``inputs - 1`` other inputs of forward."""

    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        return (_logits_grad(ctx, grad_out, grad_z), *[None] * (inputs - 1))

    return staticmethod(backward)


class _TokenLogprob(torch.autograd.Function):
    """out = z[token] - logsumexp(z), z = logits / temperature; grad = (onehot - softmax(z)) / T."""

    @staticmethod
    def forward(ctx, logits: Tensor, tokens: Tensor, temperature: float) -> Tensor:
        cdt = _compute_dtype(logits)
        tokens = tokens.contiguous()
        out = torch.empty(tokens.shape, dtype=cdt, device=logits.device)
        lse = torch.empty(tokens.shape, dtype=cdt, device=logits.device)

        def block(x: Tensor, tok: Tensor, o: Tensor, l: Tensor) -> None:
            z = _scaled(x, cdt, temperature)
            l.copy_(torch.logsumexp(z, dim=-1))
            o.copy_(z.gather(-1, tok.unsqueeze(-1)).squeeze(-1) - l)

        _forward_blocks(ctx, temperature, block, logits, tokens, out, lse)
        return out

    @staticmethod
    def grad_z(z: Tensor, tok: Tensor, l: Tensor, go: Tensor) -> Tensor:
        # d out / d z = onehot(token) - softmax(z)
        gz = torch.exp(z - l.unsqueeze(-1)).mul_(-go.unsqueeze(-1))
        return gz.scatter_add_(-1, tok.unsqueeze(-1), go.unsqueeze(-1))

    backward = _backward(grad_z, inputs=3)


class _Entropy(torch.autograd.Function):
    """H = logsumexp(z) - sum_v p_v z_v, p = softmax(z), z = logits / temperature;
    dH/dz_v = -p_v (z_v - sum_u p_u z_u)."""

    @staticmethod
    def forward(ctx, logits: Tensor, temperature: float) -> Tensor:
        cdt = _compute_dtype(logits)
        shape = logits.shape[:-1]
        ent = torch.empty(shape, dtype=cdt, device=logits.device)
        lse = torch.empty(shape, dtype=cdt, device=logits.device)

        def block(x: Tensor, h: Tensor, l: Tensor) -> None:
            z = _scaled(x, cdt, temperature)
            l.copy_(torch.logsumexp(z, dim=-1))
            p = torch.exp(z - l.unsqueeze(-1))
            pz = torch.where(p > 0, p * z, 0.0)  # p = 0 where z = -inf: contributes 0, not NaN
            h.copy_(l - pz.sum(-1))

        _forward_blocks(ctx, temperature, block, logits, ent, lse)
        return ent

    @staticmethod
    def grad_z(z: Tensor, h: Tensor, l: Tensor, go: Tensor) -> Tensor:
        p = torch.exp(z - l.unsqueeze(-1))
        mean_z = (l - h).unsqueeze(-1)  # sum_u p_u z_u = lse - H
        # z may alias x (float32 input, temperature 1): never modify it in place
        return torch.where(p > 0, p * (z - mean_z), 0.0).mul_(-go.unsqueeze(-1))

    backward = _backward(grad_z, inputs=2)


def logprobs_from_logits(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """log pi(token | prefix) under softmax(logits / temperature).

        lp[b, t] = z[b, t, tokens[b, t]] - logsumexp_v z[b, t, v],   z = logits / temperature

    Shapes: ``logits [B, T, V]`` (any ``[..., V]``), ``tokens [B, T]`` long (``[...]``), every
    entry a valid index in ``[0, V)`` (callers replace padding ids first). ``logits[:, t]`` scores
    ``tokens[:, t]``: the caller does the usual one-step shift. Result ``[B, T]`` float32 (float64
    for float64 logits); differentiable w.r.t. ``logits`` (first order). No float32 copy of the
    whole ``logits`` is ever held (see module docstring).
    """
    _check_temperature(temperature)
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} disagree: "
                         "expected logits [..., V] with tokens [...]")
    return _TokenLogprob.apply(logits, tokens.long(), float(temperature))


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of softmax(logits / temperature) at every position.

        H[b, t] = logsumexp_v z - sum_v p_v z_v,   p = softmax(z),   z = logits[b, t] / temperature

    Shapes: ``logits [B, T, V]`` (any ``[..., V]``) -> ``[B, T]`` float32 (float64 for float64
    logits); differentiable w.r.t. ``logits`` (first order), computed block-wise like
    :func:`logprobs_from_logits`.
    """
    _check_temperature(temperature)
    return _Entropy.apply(logits, float(temperature))


def dense_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0,
                   with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """(:func:`logprobs_from_logits`, :func:`entropy_from_logits` or None) in plain tensor ops, for
    ``torch.compile`` to trace and fuse (the block-wise functions above are autograd Functions with
    Python loops, which it cannot trace). The same values up to float32 rounding; it holds the
    float32 log-softmax of the whole ``logits`` for backward, so it is meant for compiled training
    steps only (inductor fuses most of that away)."""
    _check_temperature(temperature)
    z = logits.to(_compute_dtype(logits))
    if temperature != 1.0:
        z = z / temperature
    logp = torch.log_softmax(z, dim=-1)  # (..., V)
    out = logp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return out, None
    p = logp.exp()
    return out, -torch.where(p > 0, p * logp, 0.0).sum(-1)


def sequence_logprobs(token_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log pi(response | prompt) of each sequence: the sum of its valid tokens' log-probs.

        seq[b] = sum_t mask[b, t] * token_logprobs[b, t]

    Shapes: ``token_logprobs``, ``mask`` ``[B, T]`` (any ``[..., T]``) -> ``[B]``. Masked entries
    (padding, even -inf) never count, and their gradient is exactly 0; a row without a valid token
    sums to 0. Differentiable w.r.t. ``token_logprobs``.
    """
    return masked_sum(token_logprobs, mask, dim=-1)
