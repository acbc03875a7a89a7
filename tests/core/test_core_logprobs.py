"""fourfold.core.logprobs: exact values, references in float64, bf16, blocks, gradients."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fourfold.core.logprobs as lp_mod
from fourfold.core import entropy_from_logits, logprobs_from_logits

F64 = torch.float64
LN3 = math.log(3.0)


def ref_logprobs(logits, tokens, temperature=1.0):
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def ref_entropy(logits, temperature=1.0):
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def test_hand_values():
    # logits [0, ln 3] -> p = [1/4, 3/4]; [0, 0] -> p = [1/2, 1/2]
    logits = torch.tensor([[[0.0, LN3], [0.0, 0.0]]], dtype=F64)
    tokens = torch.tensor([[1, 0]])
    torch.testing.assert_close(logprobs_from_logits(logits, tokens), torch.tensor([[math.log(0.75), math.log(0.5)]], dtype=F64))
    # H = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.5623...; H(uniform over 2) = ln 2
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([[h, math.log(2)]], dtype=F64))


def test_temperature_divides_logits():
    # logits [0, 2 ln 3] at temperature 2 -> z = [0, ln 3] -> p = [1/4, 3/4]
    logits = torch.tensor([[0.0, 2 * LN3]], dtype=F64)
    torch.testing.assert_close(logprobs_from_logits(logits, torch.tensor([1]), temperature=2.0),
                               torch.tensor([math.log(0.75)], dtype=F64))
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(entropy_from_logits(logits, temperature=2.0), torch.tensor([h], dtype=F64))


def test_shapes_dtypes_and_errors():
    logits = torch.randn(5, 7)  # flattened [N, V] with tokens [N]
    assert logprobs_from_logits(logits, torch.zeros(5, dtype=torch.long)).shape == (5,)
    assert logprobs_from_logits(logits.bfloat16(), torch.zeros(5, dtype=torch.long)).dtype == torch.float32
    assert entropy_from_logits(logits.half()).dtype == torch.float32
    assert logprobs_from_logits(torch.randn(2, 3, 4, 7), torch.zeros(2, 3, 4, dtype=torch.long)).shape == (2, 3, 4)
    with pytest.raises(ValueError, match="tokens"):
        logprobs_from_logits(logits, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_logits(logits, torch.zeros(5, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(logits, temperature=-1.0)


def test_minus_inf_logits():
    # a vocabulary entry masked to -inf has p = 0: entropy stays finite, its gradient is 0
    logits = torch.tensor([[0.0, 0.0, float("-inf")]], dtype=F64, requires_grad=True)
    h = entropy_from_logits(logits)
    torch.testing.assert_close(h, torch.tensor([math.log(2)], dtype=F64))
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert logprobs_from_logits(logits.detach(), torch.tensor([2])).item() == float("-inf")


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 3), t=st.integers(1, 4), v=st.integers(1, 9),
    temperature=st.sampled_from([1.0, 0.7, 1.5]), scale=st.floats(0.1, 30.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_log_softmax_reference_float64(b, t, v, temperature, scale, seed):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, t, v, generator=g, dtype=F64) * scale).requires_grad_()
    tokens = torch.randint(0, v, (b, t), generator=g)
    w = torch.randn(b, t, generator=g, dtype=F64)  # random upstream gradient
    out = logprobs_from_logits(logits, tokens, temperature)
    ref = ref_logprobs(logits, tokens, temperature)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    (g1,) = torch.autograd.grad((out * w).sum(), logits)
    (g2,) = torch.autograd.grad((ref * w).sum(), logits)
    torch.testing.assert_close(g1, g2, rtol=1e-10, atol=1e-12)
    ent, ent_ref = entropy_from_logits(logits, temperature), ref_entropy(logits, temperature)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-10, atol=1e-10)
    (g1,) = torch.autograd.grad((ent * w).sum(), logits)
    (g2,) = torch.autograd.grad((ent_ref * w).sum(), logits)
    torch.testing.assert_close(g1, g2, rtol=1e-8, atol=1e-10)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 3), t=st.integers(1, 4), v=st.integers(2, 40), seed=st.integers(0, 2**31 - 1))
def test_bf16_close_to_float32_reference(b, t, v, seed):
    g = torch.Generator().manual_seed(seed)
    logits32 = torch.randn(b, t, v, generator=g) * 4
    tokens = torch.randint(0, v, (b, t), generator=g)
    logits16 = logits32.bfloat16()
    out = logprobs_from_logits(logits16, tokens)
    assert out.dtype == torch.float32
    # exact up to float32 rounding on the bf16 values themselves
    torch.testing.assert_close(out, ref_logprobs(logits16.float(), tokens), rtol=1e-6, atol=1e-5)
    # bf16 keeps 8 significant bits: each logit moves by <= |x| * 2^-8, so a log-prob by <= 2 max|x| 2^-8
    bound = 2 * logits32.abs().max().item() * 2**-8 + 1e-5
    assert (out - ref_logprobs(logits32, tokens)).abs().max().item() <= bound
    assert (entropy_from_logits(logits16) - ref_entropy(logits32)).abs().max().item() <= 2 * bound


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_blocks_and_non_viewable_slices_match_reference(monkeypatch, temperature):
    """Force tiny blocks (several rows per block, rows split across blocks) and a slice of logits that
    cannot be viewed as [-1, V] (the causal-LM shift): same values and gradients as the reference."""
    monkeypatch.setattr(lp_mod, "BLOCK_ELEMENTS", 11)
    g = torch.Generator().manual_seed(0)
    full = torch.randn(3, 6, 5, generator=g, dtype=F64, requires_grad=True)
    logits = full[:, 1:-1]  # [3, 4, 5], not viewable as [-1, 5]
    tokens = torch.randint(0, 5, (3, 4), generator=g)
    w = torch.randn(3, 4, generator=g, dtype=F64)
    for fn, ref in ((lambda x: logprobs_from_logits(x, tokens, temperature), lambda x: ref_logprobs(x, tokens, temperature)),
                    (lambda x: entropy_from_logits(x, temperature), lambda x: ref_entropy(x, temperature))):
        out, expected = fn(logits), ref(logits)
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
        (g1,) = torch.autograd.grad((out * w).sum(), full)
        (g2,) = torch.autograd.grad((expected * w).sum(), full)
        torch.testing.assert_close(g1, g2, rtol=1e-10, atol=1e-12)
        assert torch.all(g1[:, 0] == 0) and torch.all(g1[:, -1] == 0)


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 4, generator=g, dtype=F64, requires_grad=True)
    tokens = torch.randint(0, 4, (2, 3), generator=g)
    assert torch.autograd.gradcheck(lambda z: logprobs_from_logits(z, tokens, 0.8), (x,))
    assert torch.autograd.gradcheck(lambda z: entropy_from_logits(z, 1.3), (x,))


def test_bf16_gradient_has_input_dtype_and_matches():
    g = torch.Generator().manual_seed(2)
    x32 = torch.randn(2, 3, 8, generator=g)
    tokens = torch.randint(0, 8, (2, 3), generator=g)
    x16 = x32.bfloat16().requires_grad_()
    logprobs_from_logits(x16, tokens).sum().backward()
    assert x16.grad.dtype == torch.bfloat16
    xr = x16.detach().float().requires_grad_()
    ref_logprobs(xr, tokens).sum().backward()
    torch.testing.assert_close(x16.grad.float(), xr.grad, rtol=1e-2, atol=1e-2)


def test_float32_input_not_modified_by_backward():
    x = torch.randn(2, 3, 5, requires_grad=True)
    before = x.detach().clone()
    (entropy_from_logits(x).sum() + logprobs_from_logits(x, torch.zeros(2, 3, dtype=torch.long)).sum()).backward()
    assert torch.equal(x.detach(), before)
