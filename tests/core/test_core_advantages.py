"""fourfold.core.advantages: GAE by hand and against a per-row Python loop, returns, baselines."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.core import discounted_returns, explained_variance, gae, mean_baseline

F64 = torch.float64


def close(a, b, **kw):
    torch.testing.assert_close(torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64), **kw)


def gae_reference(rewards, values, mask, gamma, lam, dones=None, last_values=None):
    """The docstring's recursion, one row at a time, in plain Python floats."""
    rewards, values, mask = rewards.tolist(), values.tolist(), mask.tolist()
    dones = dones.tolist() if dones is not None else None
    B, T = len(rewards), len(rewards[0])
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for b in range(B):
        V = [values[b][t] if mask[b][t] else 0.0 for t in range(T)]
        V.append(float(last_values[b]) if last_values is not None else 0.0)  # V_T
        a_next = 0.0  # A_T
        for t in reversed(range(T)):
            m_next = mask[b][t + 1] if t + 1 < T else 1  # m_T = 1
            c = float(m_next) * (1.0 - float(dones[b][t]) if dones is not None else 1.0)
            if not mask[b][t]:
                a_next = 0.0
                continue
            delta = rewards[b][t] + gamma * c * V[t + 1] - V[t]
            adv[b][t] = delta + gamma * lam * c * a_next
            ret[b][t] = adv[b][t] + V[t]
            a_next = adv[b][t]
    return torch.tensor(adv, dtype=F64), torch.tensor(ret, dtype=F64)


def test_gae_language_model_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0], [5.0, 3.0, 5.0]], dtype=F64)
    values = torch.tensor([[0.5, 0.25, 0.5], [1.0, 0.5, 7.0], [9.0, 1.0, 9.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 1, 0]], dtype=F64)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    # row 0 (full): delta_2 = 1 - 0.5 = 0.5, A_2 = 0.5
    #   delta_1 = 0 + 1*0.5 - 0.25 = 0.25, A_1 = 0.25 + 1*0.95*0.5 = 0.725
    #   delta_0 = 0 + 1*0.25 - 0.5 = -0.25, A_0 = -0.25 + 0.95*0.725 = 0.43875
    # row 1 (length 2): t = 2 masked -> V_2, A_2 taken as 0
    #   delta_1 = 2 + 1*0 - 0.5 = 1.5, A_1 = 1.5
    #   delta_0 = 0 + 1*0.5 - 1 = -0.5, A_0 = -0.5 + 0.95*1.5 = 0.925
    # row 2 (only t = 1 valid): A_1 = 3 - 1 = 2
    close(adv, [[0.43875, 0.725, 0.5], [0.925, 1.5, 0.0], [0.0, 2.0, 0.0]])
    # returns = A + V inside the mask
    close(ret, [[0.43875 + 0.5, 0.725 + 0.25, 0.5 + 0.5], [0.925 + 1.0, 1.5 + 0.5, 0.0], [0.0, 3.0, 0.0]])


def test_gae_discounted_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=F64)
    values = torch.tensor([[0.5, 0.25, 0.5]], dtype=F64)
    adv, _ = gae(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.5)
    # A_2 = 1 - 0.5 = 0.5
    # delta_1 = 0 + 0.9*0.5 - 0.25 = 0.2,   A_1 = 0.2 + 0.9*0.5*0.5 = 0.425
    # delta_0 = 0 + 0.9*0.25 - 0.5 = -0.275, A_0 = -0.275 + 0.45*0.425 = -0.08375
    close(adv, [[-0.08375, 0.425, 0.5]])


def test_gae_dones_and_last_values_hand():
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 2.0]], dtype=F64)
    values = torch.tensor([[2.0, 3.0, 4.0, 5.0], [1.0, 1.0, 1.0, 1.0]], dtype=F64)
    dones = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 1]])
    last_values = torch.tensor([10.0, 100.0], dtype=F64)
    adv, ret = gae(rewards, values, torch.ones(2, 4), gamma=0.9, lam=0.8, dones=dones, last_values=last_values)
    # row 0: episode ends at t = 1; the episode starting at t = 2 is cut by the row end -> V_4 = 10
    #   t=3: c=1: delta = 1 + 0.9*10 - 5 = 5,            A_3 = 5
    #   t=2: c=1: delta = 1 + 0.9*5 - 4 = 1.5,           A_2 = 1.5 + 0.9*0.8*5 = 5.1
    #   t=1: done, c=0: delta = 1 - 3 = -2,              A_1 = -2
    #   t=0: c=1: delta = 1 + 0.9*3 - 2 = 1.7,           A_0 = 1.7 + 0.72*(-2) = 0.26
    # row 1: done at t = 3, so last_values (100) is not used
    #   t=3: delta = 2 - 1 = 1,                          A_3 = 1
    #   t=2: delta = 0 + 0.9*1 - 1 = -0.1,               A_2 = -0.1 + 0.72*1 = 0.62
    #   t=1: delta = -0.1,                               A_1 = -0.1 + 0.72*0.62 = 0.3464
    #   t=0: delta = -0.1,                               A_0 = -0.1 + 0.72*0.3464 = 0.149408
    close(adv, [[0.26, -2.0, 5.1, 5.0], [0.149408, 0.3464, 0.62, 1.0]])
    close(ret, [[2.26, 1.0, 9.1, 10.0], [1.149408, 1.3464, 1.62, 2.0]])
    # without last_values V_4 = 0: row 0 t=3: delta = 1 - 5 = -4
    adv0, _ = gae(rewards, values, torch.ones(2, 4), gamma=0.9, lam=0.8, dones=dones)
    close(adv0[0, 3], -4.0)


def test_gae_last_values_in_lm_case_only_for_full_rows():
    # rows [1, 1] and [1, 0], r = V = 0, last_values = 1, gamma = lam = 1:
    # row 0: A_1 = 0 + 1*1 - 0 = 1, A_0 = 0 + 0 - 0 + 1*1 = 1; row 1: c_0 = m_1 = 0 -> A_0 = 0
    z = torch.zeros(2, 2, dtype=F64)
    adv, _ = gae(z, z, torch.tensor([[1, 1], [1, 0]]), gamma=1.0, lam=1.0, last_values=torch.ones(2, dtype=F64))
    close(adv, [[1.0, 1.0], [0.0, 0.0]])


def test_gae_truncation_recipe():
    # truncated at t = 1 with V(final_obs) = 4: the caller adds gamma * 4 to r_1 and marks done
    rewards = torch.tensor([[1.0, 1.0 + 0.5 * 4.0]], dtype=F64)
    values = torch.tensor([[1.0, 2.0]], dtype=F64)
    adv, _ = gae(rewards, values, torch.ones(1, 2), gamma=0.5, lam=1.0, dones=torch.tensor([[0, 1]]))
    # A_1 = 3 - 2 = 1; A_0 = 1 + 0.5*2 - 1 + 0.5*1*1 = 1.5
    close(adv, [[1.5, 1.0]])


def test_gae_any_leading_shape():
    r = torch.tensor([1.0, 2.0], dtype=F64)
    adv, ret = gae(r, torch.zeros(2, dtype=F64), torch.ones(2), gamma=1.0, lam=1.0)  # [T]
    close(ret, [3.0, 2.0])
    r3 = torch.ones(2, 3, 4, dtype=F64)
    assert gae(r3, r3, torch.ones(2, 3, 4))[0].shape == (2, 3, 4)


@settings(max_examples=80, deadline=None)
@given(
    b=st.integers(1, 4), t=st.integers(1, 6), seed=st.integers(0, 2**31 - 1),
    gamma=st.sampled_from([1.0, 0.99, 0.5]), lam=st.sampled_from([1.0, 0.95, 0.0]),
    use_dones=st.booleans(), use_last=st.booleans(),
)
def test_gae_matches_python_loop_reference(b, t, seed, gamma, lam, use_dones, use_last):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(b, t, generator=g, dtype=F64)
    values = torch.randn(b, t, generator=g, dtype=F64)
    mask = (torch.rand(b, t, generator=g) < 0.8).double()  # arbitrary holes
    dones = (torch.rand(b, t, generator=g) < 0.3).long() if use_dones else None
    last = torch.randn(b, generator=g, dtype=F64) if use_last else None
    adv, ret = gae(rewards, values, mask, gamma, lam, dones=dones, last_values=last)
    ref_adv, ref_ret = gae_reference(rewards, values, mask, gamma, lam, dones, last)
    close(adv, ref_adv, rtol=1e-12, atol=1e-12)
    close(ret, ref_ret, rtol=1e-12, atol=1e-12)


@settings(max_examples=80, deadline=None)
@given(b=st.integers(1, 4), t=st.integers(1, 7), seed=st.integers(0, 2**31 - 1))
def test_gae_lambda_one_gamma_one_returns_are_reverse_cumsum(b, t, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(b, t, generator=g, dtype=F64)
    values = torch.randn(b, t, generator=g, dtype=F64) * 10
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    mask = (torch.arange(t) < lengths[:, None]).double()
    _, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    masked_r = rewards * mask
    expected = masked_r.flip(-1).cumsum(-1).flip(-1) * mask  # sum_{k >= t} r_k within the mask
    close(ret, expected, rtol=1e-10, atol=1e-10)
    close(discounted_returns(rewards, mask), expected, rtol=1e-10, atol=1e-10)


def test_discounted_returns_hand():
    r = torch.tensor([[1.0, 2.0, 3.0]], dtype=F64)
    # G_2 = 3, G_1 = 2 + 0.5*3 = 3.5, G_0 = 1 + 0.5*3.5 = 2.75
    close(discounted_returns(r, torch.ones(1, 3), gamma=0.5), [[2.75, 3.5, 3.0]])
    # t = 2 masked: G_1 = 2, G_0 = 1 + 0.5*2 = 2
    close(discounted_returns(r, torch.tensor([[1, 1, 0]]), gamma=0.5), [[2.0, 2.0, 0.0]])
    # done at t = 1: G_2 = 3, G_1 = 2, G_0 = 1 + 0.5*2 = 2
    close(discounted_returns(r, torch.ones(1, 3), gamma=0.5, dones=torch.tensor([[0, 1, 0]])), [[2.0, 2.0, 3.0]])


def test_mean_baseline():
    s = torch.tensor([1.0, 2.0, 3.0, 6.0], requires_grad=True)
    b = mean_baseline(s)
    close(b, 3.0)  # (1 + 2 + 3 + 6) / 4
    assert b.dim() == 0 and not b.requires_grad
    close(mean_baseline(torch.tensor([1, 2])), 1.5)


def test_explained_variance_hand():
    R = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64)
    ones = torch.ones(4)
    assert explained_variance(R, R, ones) == pytest.approx(1.0)  # perfect critic
    assert explained_variance(torch.zeros(4), R, ones) == pytest.approx(0.0)  # Var[R - 0] = Var[R]
    # R - V = [1, 0, 0, 0]: mean 0.25, Var = (0.75^2 + 3*0.25^2)/4 = 0.1875; Var[R] = 1.25 -> 1 - 0.15 = 0.85
    assert explained_variance(torch.tensor([0.0, 2.0, 3.0, 4.0]), R, ones) == pytest.approx(0.85)
    # a masked entry does not count
    R5, V5 = torch.tensor([1.0, 2.0, 3.0, 4.0, 999.0]), torch.tensor([0.0, 2.0, 3.0, 4.0, -5.0])
    assert explained_variance(V5, R5, torch.tensor([1, 1, 1, 1, 0])) == pytest.approx(0.85)
    assert isinstance(explained_variance(R, R, ones), float)


def test_explained_variance_degenerate_is_zero():
    assert explained_variance(torch.randn(4), torch.full((4,), 3.7), torch.ones(4)) == 0.0  # Var[R] = 0
    assert explained_variance(torch.randn(4), torch.zeros(4), torch.ones(4)) == 0.0
    assert explained_variance(torch.randn(4), torch.randn(4), torch.zeros(4)) == 0.0  # nothing valid
    assert explained_variance(torch.randn(4), torch.randn(4), torch.tensor([0, 1, 0, 0])) == 0.0  # one entry
