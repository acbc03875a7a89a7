"""Critic-free advantage estimators (GRPO, Dr. GRPO, RLOO, REINFORCE++) by hand and against
per-definition Python references; the estimator registry and its common signature."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.core import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    Estimator,
    gae,
    get_advantage_estimator,
    grpo_advantages,
    register_advantage_estimator,
    reinforce_pp_advantages,
    rloo_advantages,
    token_rewards,
)

F64 = torch.float64


def close(a, b, **kw):
    torch.testing.assert_close(torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64), **kw)


# Two prompts, K = 4: group 0 scores [1, 3, 5, 7], group 1 all equal [2, 2, 2, 2].
SCORES = torch.tensor([1.0, 3.0, 5.0, 7.0, 2.0, 2.0, 2.0, 2.0], dtype=F64)
# T = 3 with padding: row 1 has 1 valid token, row 2 has none (its score still counts in its group)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])


def per_token(per_seq, mask=MASK):
    return torch.tensor(per_seq, dtype=F64)[:, None] * mask.to(F64)


def test_grpo_hand_equal_group_is_zero_not_nan():
    adv, ret = grpo_advantages(SCORES, MASK, group_size=4)
    # group 0: mean = 16/4 = 4, R - mean = [-3, -1, 1, 3], sum of squares = 9 + 1 + 1 + 9 = 20,
    #   unbiased std = sqrt(20/3) = 2.58199; A = (R - mean) / (std + 1e-6)
    # group 1: all 2 -> R - mean = 0, std = 0 -> A = 0 / (0 + eps) = 0 (not NaN)
    s = math.sqrt(20 / 3) + 1e-6
    close(adv, per_token([-3 / s, -1 / s, 1 / s, 3 / s, 0, 0, 0, 0]))
    assert torch.all(adv[4:] == 0)
    close(ret, per_token(SCORES.tolist()))  # returns = R on the valid tokens
    assert torch.all(adv[2] == 0) and torch.all(adv[MASK == 0] == 0)  # padding and the empty row


def test_dr_grpo_hand_no_std_division():
    adv, _ = grpo_advantages(SCORES, MASK, group_size=4, scale_by_std=False)
    # R - mean: group 0 [-3, -1, 1, 3], group 1 zeros
    close(adv, per_token([-3, -1, 1, 3, 0, 0, 0, 0]))


def test_grpo_group_size_two_and_eps():
    # [1, 2]: mean 1.5, R - mean = [-0.5, 0.5], unbiased std = sqrt((0.25 + 0.25)/1) = sqrt(0.5)
    adv, _ = grpo_advantages(torch.tensor([1.0, 2.0], dtype=F64), torch.ones(2, 1), 2, eps=0.0)
    close(adv, [[-0.5 / math.sqrt(0.5)], [0.5 / math.sqrt(0.5)]])  # [-0.7071, 0.7071]
    # eps = 0.5: -0.5 / (0.70711 + 0.5)
    adv, _ = grpo_advantages(torch.tensor([1.0, 2.0], dtype=F64), torch.ones(2, 1), 2, eps=0.5)
    close(adv, [[-0.5 / (math.sqrt(0.5) + 0.5)], [0.5 / (math.sqrt(0.5) + 0.5)]])


def test_equal_groups_are_exactly_zero_despite_round_off():
    # mean(0.1, 0.1, 0.1) = 0.30000000000000004 / 3 != 0.1 in floats; the advantage is still 0 exactly
    s = torch.full((3,), 0.1, dtype=F64)
    assert s.mean().item() != 0.1
    for adv in (grpo_advantages(s, torch.ones(3, 2), 3)[0], grpo_advantages(s, torch.ones(3, 2), 3, scale_by_std=False)[0],
                rloo_advantages(s, torch.ones(3, 2), 3)[0]):
        assert torch.all(adv == 0)


def test_rloo_hand():
    adv, ret = rloo_advantages(SCORES, MASK, group_size=4)
    # group 0: A_1 = 1 - (3 + 5 + 7)/3 = -4,   A_2 = 3 - (1 + 5 + 7)/3 = -4/3,
    #          A_3 = 5 - (1 + 3 + 7)/3 = 4/3,  A_4 = 7 - (1 + 3 + 5)/3 = 4;  sum = 0
    # group 1: 2 - (2 + 2 + 2)/3 = 0
    close(adv, per_token([-4, -4 / 3, 4 / 3, 4, 0, 0, 0, 0]))
    close(ret, per_token(SCORES.tolist()))


def test_group_size_one():
    m = torch.tensor([[1, 1], [1, 0], [0, 0]])
    s = torch.tensor([3.0, -1.0, 5.0], dtype=F64)
    # GRPO: each sample is its own group mean -> A = 0 (no signal), with and without std
    assert torch.all(grpo_advantages(s, m, 1)[0] == 0)
    assert torch.all(grpo_advantages(s, m, 1, scale_by_std=False)[0] == 0)
    # RLOO: no other sample -> baseline 0 -> A = R (plain REINFORCE)
    close(rloo_advantages(s, m, 1)[0], [[3.0, 3.0], [-1.0, 0.0], [0.0, 0.0]])


@pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages])
def test_group_errors(fn):
    with pytest.raises(ValueError, match="multiple of the group size"):
        fn(torch.zeros(6), torch.ones(6, 2), 4)  # 6 rows, K = 4
    with pytest.raises(ValueError, match="group_size"):
        fn(torch.zeros(4), torch.ones(4, 2), 0)
    with pytest.raises(ValueError, match="scores"):
        fn(torch.zeros(4), torch.ones(3, 2), 1)  # rows disagree


def test_integer_scores_become_float():
    adv, ret = rloo_advantages(torch.tensor([1, 3]), torch.ones(2, 1), 2)
    assert adv.dtype == torch.float32
    close(adv, [[-2.0], [2.0]])  # 1 - 3, 3 - 1


def test_reinforce_pp_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 2.0, 99.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = reinforce_pp_advantages(rewards, mask, gamma=1.0)
    # G: row 0 = [1, 1, 1], row 1 = [2.5, 2, -]; over the 5 valid tokens mean = 7.5/5 = 1.5,
    # G - mean = [-0.5, -0.5, -0.5, 1, 0.5], sum of squares = 3*0.25 + 1 + 0.25 = 2, unbiased var = 2/4 = 0.5
    close(ret, [[1.0, 1.0, 1.0], [2.5, 2.0, 0.0]])
    s = math.sqrt(0.5 + 1e-8)
    close(adv, [[-0.5 / s, -0.5 / s, -0.5 / s], [1 / s, 0.5 / s, 0.0]])
    # gamma = 0.5: row 0 G = [0.25, 0.5, 1], row 1 G = [0.5 + 0.5*2, 2] = [1.5, 2]
    _, ret = reinforce_pp_advantages(rewards, mask, gamma=0.5)
    close(ret, [[0.25, 0.5, 1.0], [1.5, 2.0, 0.0]])
    # one valid token: variance 0 -> A = 0 exactly
    adv, _ = reinforce_pp_advantages(rewards, torch.tensor([[0, 0, 1], [0, 0, 0]]))
    assert torch.all(adv == 0)


def test_reinforce_pp_folds_the_kl_into_the_token_rewards():
    # token rewards of token_rewards(k1, beta = 0.1): d = [0.5, 1.0] -> -0.05, -0.1 + score 2 on the last token
    scores = torch.tensor([2.0], dtype=F64)
    rewards, _ = token_rewards(scores, torch.tensor([[0.5, 1.0]], dtype=F64), torch.zeros(1, 2, dtype=F64),
                               torch.ones(1, 2), 0.1)
    inputs = AdvantageInputs(rewards=rewards, mask=torch.ones(1, 2))
    _, ret = get_advantage_estimator("reinforce_pp")(inputs)
    # G_1 = 2 - 0.1 = 1.9, G_0 = -0.05 + 1.9 = 1.85
    close(ret, [[1.85, 1.9]])


# ---- registry and the common signature ----


def test_registry_names_and_critics():
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "grpo", "dr_grpo", "rloo", "reinforce_pp"}
    assert {n for n, fn in ADVANTAGE_ESTIMATORS.items() if fn.needs_critic} == {"gae"}
    assert get_advantage_estimator("rloo") is ADVANTAGE_ESTIMATORS["rloo"]


def test_unknown_estimator_lists_known_names():
    with pytest.raises(ValueError) as e:
        get_advantage_estimator("ppo")
    msg = str(e.value)
    assert "'ppo'" in msg
    assert all(name in msg for name in ("dr_grpo", "gae", "grpo", "reinforce_pp", "rloo"))


def test_register_a_new_estimator_and_duplicates():
    @register_advantage_estimator("test_zero")
    def zero(inputs):
        return torch.zeros_like(inputs.rewards), torch.zeros_like(inputs.rewards)

    try:
        record = get_advantage_estimator("test_zero")
        assert isinstance(record, Estimator) and (record.name, record.fn, record.needs_critic) == ("test_zero", zero, False)
        assert not hasattr(zero, "needs_critic")  # the fact lives in the record, not on the function
        out = record(AdvantageInputs(rewards=torch.ones(2, 3), mask=torch.ones(2, 3)))
        assert all(torch.equal(x, torch.zeros(2, 3)) for x in out)  # calling the record calls fn
        with pytest.raises(ValueError, match="already registered"):
            register_advantage_estimator("test_zero", needs_critic=True)(lambda inputs: None)
        assert ADVANTAGE_ESTIMATORS["test_zero"] is record and not record.needs_critic  # unchanged
    finally:
        ADVANTAGE_ESTIMATORS.pop("test_zero")
    with pytest.raises(ValueError, match="already registered"):
        register_advantage_estimator("gae")(lambda inputs: None)


def test_advantage_inputs_validation():
    with pytest.raises(ValueError, match="rewards"):
        AdvantageInputs(rewards=torch.zeros(2, 3), mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="values"):
        AdvantageInputs(rewards=torch.zeros(2, 3), mask=torch.ones(2, 3), values=torch.zeros(2))
    with pytest.raises(ValueError, match="mask"):
        AdvantageInputs(rewards=torch.zeros(3), mask=torch.ones(3))
    with pytest.raises(ValueError, match="group_size"):
        AdvantageInputs(rewards=torch.zeros(2, 3), mask=torch.ones(2, 3), group_size=0)


def kl_rewards():
    """Token rewards of two prompts x K = 2 with the KL in them (token_rewards, k1, beta = 0.1):
    d = logprobs - ref = row 0 [0.5, 0.5], row 1 [2.0, -], row 2 [0, 0], row 3 [1.0, 1.0]."""
    scores = torch.tensor([1.0, 3.0, 0.0, 4.0], dtype=F64)
    lp = torch.tensor([[0.5, 0.5], [2.0, 50.0], [0.0, 0.0], [1.0, 1.0]], dtype=F64)
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    return scores, lp, torch.zeros(4, 2, dtype=F64), mask


def test_rloo_baselines_the_reward_with_the_summed_kl():
    scores, lp, ref, mask = kl_rewards()
    rewards, _ = token_rewards(scores, lp, ref, mask, 0.1)
    adv, ret = get_advantage_estimator("rloo")(AdvantageInputs(rewards=rewards, mask=mask, group_size=2))
    # R = score - 0.1 * sum d: [1 - 0.1, 3 - 0.2, 0 - 0, 4 - 0.2] = [0.9, 2.8, 0, 3.8]
    # K = 2: A = R_i - R_other: [0.9 - 2.8, 2.8 - 0.9, 0 - 3.8, 3.8 - 0] = [-1.9, 1.9, -3.8, 3.8]
    close(adv, [[-1.9, -1.9], [1.9, 0.0], [-3.8, -3.8], [3.8, 3.8]])
    close(ret, [[0.9, 0.9], [2.8, 0.0], [0.0, 0.0], [3.8, 3.8]])


def test_grpo_uses_the_score_alone_when_the_kl_is_out_of_the_reward():
    scores, lp, ref, mask = kl_rewards()
    rewards, _ = token_rewards(scores, lp, ref, mask, 0.0)  # kl_in: loss -> no KL in the reward
    for name, scale in (("grpo", True), ("dr_grpo", False)):
        adv, ret = get_advantage_estimator(name)(AdvantageInputs(rewards=rewards, mask=mask, group_size=2))
        expected = grpo_advantages(scores, mask, 2, scale_by_std=scale)
        assert torch.equal(adv, expected[0]) and torch.equal(ret, expected[1])
    # by hand (dr_grpo): groups [1, 3] and [0, 4] -> R - mean = [-1, 1, -2, 2]
    close(adv, [[-1.0, -1.0], [1.0, 0.0], [-2.0, -2.0], [2.0, 2.0]])


def test_gae_estimator_wraps_gae():
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(3, 4, generator=g, dtype=F64), torch.randn(3, 4, generator=g, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    out = get_advantage_estimator("gae")(AdvantageInputs(rewards=r, mask=mask, values=v, gamma=0.9, lam=0.8))
    ref = gae(r, v, mask, 0.9, 0.8)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    with pytest.raises(ValueError, match="critic values"):
        get_advantage_estimator("gae")(AdvantageInputs(rewards=r, mask=mask))


# ---- properties ----


def grouped_reference(scores, K, kind):
    """The docstrings' formulas, one group at a time, in Python floats."""
    out = []
    for g in range(0, len(scores), K):
        grp = scores[g:g + K]
        mean = sum(grp) / K
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (K - 1)) if K > 1 else 0.0
        for i, x in enumerate(grp):
            if kind == "rloo":
                others = grp[:i] + grp[i + 1:]
                out.append(x - sum(others) / len(others) if others else x)
            elif kind == "dr_grpo":
                out.append(x - mean)
            else:
                out.append((x - mean) / (std + 1e-6))
    return out


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 4), K=st.integers(1, 5), seed=st.integers(0, 2**31 - 1), ties=st.booleans())
def test_group_estimators_match_reference_and_sum_to_zero(n, K, seed, ties):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n * K, generator=g, dtype=F64) * 3
    if ties:  # small integers: equal scores within a group are common
        scores = scores.round().clamp(-1, 1)
    mask = torch.ones(n * K, 1)
    results = {
        "grpo": grpo_advantages(scores, mask, K)[0][:, 0],
        "dr_grpo": grpo_advantages(scores, mask, K, scale_by_std=False)[0][:, 0],
        "rloo": rloo_advantages(scores, mask, K)[0][:, 0],
    }
    for kind, adv in results.items():
        assert torch.isfinite(adv).all()
        close(adv, grouped_reference(scores.tolist(), K, kind), rtol=1e-9, atol=1e-9)
        if K >= 2:
            close(adv.reshape(n, K).sum(1), torch.zeros(n), rtol=0, atol=1e-9)  # a group's advantages sum to 0
    groups = scores.reshape(n, K)
    if K >= 2:
        # GRPO: unbiased std of a non-constant group's advantages = std / (std + eps) ~ 1
        std = groups.std(1)
        close(results["grpo"].reshape(n, K).std(1), std / (std + 1e-6), rtol=1e-9, atol=1e-12)
        # RLOO = K/(K-1) * Dr. GRPO
        close(results["rloo"], results["dr_grpo"] * K / (K - 1), rtol=1e-9, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 5), t=st.integers(1, 6), seed=st.integers(0, 2**31 - 1), gamma=st.sampled_from([1.0, 0.9]))
def test_reinforce_pp_matches_python_reference(b, t, seed, gamma):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(b, t, generator=g, dtype=F64)
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    mask = (torch.arange(t) < lengths[:, None]).long()
    adv, ret = reinforce_pp_advantages(rewards, mask, gamma)
    G = [[0.0] * t for _ in range(b)]
    for i in range(b):
        acc = 0.0
        for k in reversed(range(int(lengths[i]))):
            acc = rewards[i, k].item() + gamma * acc
            G[i][k] = acc
    valid = [G[i][k] for i in range(b) for k in range(int(lengths[i]))]
    mean = sum(valid) / max(len(valid), 1)
    var = sum((x - mean) ** 2 for x in valid) / (len(valid) - 1) if len(valid) > 1 else 0.0
    expected = [[(G[i][k] - mean) / math.sqrt(var + 1e-8) if k < lengths[i] else 0.0 for k in range(t)]
                for i in range(b)]
    close(ret, G, rtol=1e-10, atol=1e-10)
    close(adv, expected, rtol=1e-8, atol=1e-8)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3), K=st.sampled_from([1, 2, 4]), t=st.integers(1, 5), extra=st.integers(1, 3),
       seed=st.integers(0, 2**31 - 1))
def test_padding_columns_never_change_any_estimator(n, K, t, extra, seed):
    """Appending ``extra`` padded columns (random values under mask 0) leaves every registered
    estimator's output on the original columns unchanged and 0 on the new ones."""
    g = torch.Generator().manual_seed(seed)
    B = n * K
    rewards = torch.randn(B, t, generator=g, dtype=F64)
    values = torch.randn(B, t, generator=g, dtype=F64)
    mask = (torch.rand(B, t, generator=g) < 0.7).long()
    pad = lambda x: torch.cat([x, torch.randn(B, extra, generator=g, dtype=F64) * 1e3], 1)  # noqa: E731
    wide_mask = torch.cat([mask, torch.zeros(B, extra, dtype=torch.long)], 1)
    for name, estimator in ADVANTAGE_ESTIMATORS.items():
        narrow = estimator(AdvantageInputs(rewards, mask, values, K, 0.9, 0.95))
        wide = estimator(AdvantageInputs(pad(rewards), wide_mask, pad(values), K, 0.9, 0.95))
        for u, w in zip(narrow, wide):
            close(w[:, :t], u, rtol=1e-12, atol=1e-12, msg=name)
            assert torch.all(w[:, t:] == 0), name
            assert torch.all(u[mask == 0] == 0), name
