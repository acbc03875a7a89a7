"""fourfold.core.kl: estimators, per-token rewards, KL controllers."""

import json
import math

import pytest
import torch

from fourfold.core import AdaptiveKLController, FixedKLController, kl_estimate, token_rewards

F64 = torch.float64


def close(a, b, **kw):
    torch.testing.assert_close(torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64), **kw)


LP = torch.tensor([-1.0, -2.0, -0.5], dtype=F64)
REF = torch.tensor([-1.5, -1.0, -0.5], dtype=F64)  # d = LP - REF = [0.5, -1.0, 0.0]


def test_kl_estimators_hand():
    close(kl_estimate(LP, REF, "k1"), [0.5, -1.0, 0.0])
    close(kl_estimate(LP, REF, "k2"), [0.5**2 / 2, 1.0 / 2, 0.0])  # [0.125, 0.5, 0]
    # k3 = exp(-d) - 1 + d: exp(-0.5) - 0.5 = 0.10653..., exp(1) - 2 = 0.71828..., 0
    close(kl_estimate(LP, REF, "k3"), [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0, 0.0])
    close(kl_estimate(LP, REF, "abs"), [0.5, 1.0, 0.0])
    assert kl_estimate(LP, REF).tolist() == kl_estimate(LP, REF, "k1").tolist()  # default k1


def test_k3_is_nonnegative_and_stable_for_tiny_d():
    d = torch.tensor([-5.0, -1e-9, 0.0, 1e-9, 5.0], dtype=F64)
    k3 = kl_estimate(d, torch.zeros_like(d), "k3")
    assert torch.all(k3 >= 0)
    close(k3[1], 0.5e-18, rtol=1e-6, atol=0)  # ~ d^2 / 2


def test_unknown_kind_names_allowed_kinds():
    with pytest.raises(ValueError) as e:
        kl_estimate(LP, REF, "k4")
    for kind in ("k1", "k2", "k3", "abs"):
        assert kind in str(e.value)
    with pytest.raises(ValueError):
        token_rewards(torch.zeros(3), LP[None].expand(3, 3), REF[None].expand(3, 3), torch.ones(3, 3), 0.1, kind="kl")


def test_token_rewards_score_on_last_valid_token():
    mask = torch.tensor(
        [
            [1, 1, 1, 0],  # length 3
            [0, 0, 1, 0],  # a single valid token (not at the start)
            [1, 1, 1, 1],  # full row
            [0, 0, 0, 0],  # empty row: gets nothing, not even its score
        ],
        dtype=F64,
    )
    logprobs = torch.full((4, 4), -1.0, dtype=F64)
    ref = torch.full((4, 4), -1.5, dtype=F64)  # d = 0.5 everywhere -> k1 = 0.5
    logprobs[0, 3] = 100.0  # outside the mask: ignored
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64)
    rewards, kl = token_rewards(scores, logprobs, ref, mask, kl_coef=0.1)
    p = -0.1 * 0.5  # = -0.05 per valid token
    close(rewards, [
        [p, p, p + 1.0, 0.0],  # score 1 on t = 2
        [0.0, 0.0, p + 2.0, 0.0],  # score 2 on t = 2, the only valid token
        [p, p, p, p + 3.0],  # score 3 on t = 3
        [0.0, 0.0, 0.0, 0.0],
    ])
    close(kl, 0.5 * mask)


def test_token_rewards_other_kind_and_tensor_coef():
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    lp = torch.tensor([[0.0, -1.0, 3.0]], dtype=F64)
    ref = torch.tensor([[-1.0, 0.0, 0.0]], dtype=F64)  # d = [1, -1, (3)]
    rewards, kl = token_rewards(torch.tensor([10.0], dtype=F64), lp, ref, mask, torch.tensor(0.5, dtype=F64), kind="k2")
    close(kl, [[0.5, 0.5, 0.0]])  # d^2 / 2
    close(rewards, [[-0.25, -0.25 + 10.0, 0.0]])  # -0.5 * 0.5, and the score on t = 1


def test_fixed_controller():
    c = FixedKLController(0.1)
    assert c.update(123.0, 1000) == 0.1 and c.value == 0.1
    c2 = FixedKLController(0.0)
    c2.load_state_dict(json.loads(json.dumps(c.state_dict())))
    assert c2.value == 0.1
    with pytest.raises(ValueError):
        FixedKLController(-1.0)


def test_adaptive_controller_updates_by_hand():
    c = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000)
    # error = clip(9/6 - 1, -0.2, 0.2) = clip(0.5) = 0.2; value = 0.2 * (1 + 0.2 * 256/10000) = 0.2 * 1.00512
    c.update(9.0, 256)
    assert c.value == pytest.approx(0.201024, rel=1e-12)
    # error = 5.4/6 - 1 = -0.1 (inside the clip); value *= 1 - 0.1 * 1000/10000 = 0.99
    c.update(torch.tensor(5.4), 1000)
    assert c.value == pytest.approx(0.201024 * 0.99, rel=1e-6)  # = 0.19901376 (5.4 as float32)
    # error = clip(0/6 - 1) = -0.2; value *= 1 - 0.2 * 10000/10000 = 0.8
    c.update(0.0, 10000)
    assert c.value == pytest.approx(0.19901376 * 0.8, rel=1e-6)  # = 0.159211008
    # exactly on target: error 0, unchanged
    before = c.value
    assert c.update(6.0, 5000) == before


def test_adaptive_controller_state_dict_roundtrip_and_errors():
    c = AdaptiveKLController(0.2, 6.0, 10000)
    c.update(9.0, 256)
    state = json.loads(json.dumps(c.state_dict()))  # plain floats
    assert all(type(v) is float for v in state.values())
    c2 = AdaptiveKLController(0.5, 6.0, 10000)
    c2.load_state_dict(state)
    assert c2.value == c.value
    c.update(7.0, 100)
    c2.update(7.0, 100)
    assert c2.value == c.value
    with pytest.raises(ValueError):
        c.update(float("nan"), 10)
    assert c.value == c2.value  # unchanged by the failed update
    for args in ((-0.1, 6.0, 10.0), (0.1, 0.0, 10.0), (0.1, 6.0, 0.0)):
        with pytest.raises(ValueError):
            AdaptiveKLController(*args)
