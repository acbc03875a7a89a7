"""fourfold.core.masks: hand-computed cases and whitening properties."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.core import (
    first_valid_index,
    last_valid_index,
    mask_from_lengths,
    mask_until_eos,
    masked_count,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

F64 = torch.float64
X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=F64)
M = torch.tensor([[1, 1, 0], [0, 1, 0]], dtype=F64)  # valid: 1, 2 | 5


def close(a, b, **kw):
    torch.testing.assert_close(torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64), **kw)


def test_masked_sum_all_and_per_row():
    close(masked_sum(X, M), 1 + 2 + 5)  # = 8
    close(masked_sum(X, M, dim=-1), [1 + 2, 5])
    close(masked_count(X, M), 3)
    close(masked_count(X, M, dim=-1), [2, 1])


def test_masked_mean_all_and_per_row():
    close(masked_mean(X, M), 8 / 3)  # (1 + 2 + 5) / 3
    close(masked_mean(X, M, dim=-1), [(1 + 2) / 2, 5 / 1])


def test_masked_mean_empty_row_is_zero_not_nan():
    m = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=F64)
    close(masked_mean(X, m, dim=-1), [1.5, 0.0])  # row 1 has no valid entry
    close(masked_mean(X, torch.zeros_like(m)), 0.0)
    close(masked_mean(X, m, dim=-1, keepdim=True), [[1.5], [0.0]])


def test_bool_and_float_masks_agree():
    assert torch.equal(masked_mean(X, M.bool(), dim=-1), masked_mean(X, M, dim=-1))
    assert torch.equal(masked_whiten(X, M.bool()), masked_whiten(X, M))


def test_masked_var():
    # valid values 1, 2, 5: mean 8/3, deviations -5/3, -2/3, 7/3, squares 25/9 + 4/9 + 49/9 = 78/9 = 26/3
    close(masked_var(X, M), (26 / 3) / 2)  # unbiased: / (3 - 1) = 13/3
    close(masked_var(X, M, unbiased=False), (26 / 3) / 3)  # = 26/9
    # per row: row 0 values 1, 2 -> mean 1.5, squares 0.25 + 0.25 = 0.5 -> /1; row 1 one value -> 0
    close(masked_var(X, M, dim=-1), [0.5, 0.0])
    close(masked_var(X, M, unbiased=False, dim=-1), [0.25, 0.0])


def test_masked_var_degenerate_is_zero_not_nan():
    one = torch.tensor([[0, 0, 1], [0, 0, 0]], dtype=F64)
    close(masked_var(X, one), 0.0)  # one entry: unbiased variance undefined -> 0
    close(masked_var(X, one, unbiased=False), 0.0)
    close(masked_var(X, torch.zeros_like(one)), 0.0)


def test_masked_whiten_hand():
    mean, std = 8 / 3, math.sqrt(13 / 3)
    expected = [[(1 - mean) / std, (2 - mean) / std, 0.0], [0.0, (5 - mean) / std, 0.0]]
    close(masked_whiten(X, M, eps=0.0), expected)
    kept = [[(1 - mean) / std + mean, (2 - mean) / std + mean, 0.0], [0.0, (5 - mean) / std + mean, 0.0]]
    close(masked_whiten(X, M, shift_mean=False, eps=0.0), kept)


def test_masked_whiten_exact_zero_outside_mask_even_for_inf():
    x = X.clone()
    x[0, 2] = float("inf")
    x[1, 0] = float("nan")
    w = masked_whiten(x, M)
    assert torch.all(w[~M.bool()] == 0)
    assert torch.equal(w, masked_whiten(X, M))


def test_masked_whiten_single_valid_entry_is_zero():
    m = torch.tensor([[0, 0, 0], [0, 1, 0]], dtype=F64)
    close(masked_whiten(X, m), torch.zeros(2, 3))  # x - mean = 0 at the only valid entry


def test_last_and_first_valid_index():
    m = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 1]])
    assert last_valid_index(m).tolist() == [1, 3, -1, 2, 3]
    assert first_valid_index(m).tolist() == [0, 0, -1, 2, 1]
    assert last_valid_index(m.bool()).dtype == torch.long
    assert last_valid_index(torch.zeros(2, 0)).tolist() == [-1, -1]


def test_mask_from_lengths_and_until_eos():
    assert mask_from_lengths(torch.tensor([2, 0, 3]), 3).tolist() == [[1, 1, 0], [0, 0, 0], [1, 1, 1]]
    tokens = torch.tensor([[5, 2, 7, 2], [1, 1, 1, 1], [2, 3, 3, 3]])
    # 1 up to and including the first EOS (= 2)
    assert mask_until_eos(tokens, 2).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


@settings(max_examples=60, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 4), st.integers(1, 6)),
    seed=st.integers(0, 2**31 - 1),
    scale=st.floats(1e-2, 1e3),
    offset=st.floats(-1e3, 1e3),
)
def test_whiten_gives_mean_zero_var_one(shape, seed, scale, offset):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=F64) * scale + offset
    m = torch.rand(shape, generator=g) < 0.7
    m.view(-1)[:2] = True  # at least two valid entries
    if masked_var(x, m) < 1e-6 * scale**2:  # all valid values (nearly) equal: nothing to whiten
        return
    w = masked_whiten(x, m, eps=0.0)
    close(masked_mean(w, m), 0.0, atol=1e-9, rtol=0)
    close(masked_var(w, m), 1.0, atol=1e-9, rtol=1e-9)
    assert torch.all(w[~m] == 0)
    k = masked_whiten(x, m, shift_mean=False, eps=0.0)
    close(masked_mean(k, m), masked_mean(x, m), atol=1e-9 * (1 + abs(offset)), rtol=1e-9)
    close(masked_var(k, m), 1.0, atol=1e-6, rtol=1e-6)
