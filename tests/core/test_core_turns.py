"""The three rules of multi-turn trajectories (fourfold.core.turns), each against hand-computed
values: rewards, KL and values at observation positions are never read, GAE bootstraps across an
observation, a turn's reward sits on its last policy token, truncation bootstraps or ends; plus
the property that inserting observation tokens changes no advantage on a policy token."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.core import (
    AdvantageInputs,
    aggregate_loss,
    discounted_returns,
    gae,
    get_advantage_estimator,
    kl_loss,
    ppo_policy_loss,
    token_rewards,
    value_loss,
)
from fourfold.core.turns import (
    bootstrap_values,
    from_policy_steps,
    place_turn_rewards,
    policy_advantages,
    policy_gae,
    to_policy_steps,
    trajectory_rewards,
    turn_end_mask,
    turn_ids_from_mask,
)

F64 = torch.float64
NAN = float("nan")

# One row: turn 0 = positions 0, 1; an observation at 2, 3; turn 1 = position 4; padding at 5.
MASK = torch.tensor([[1, 1, 0, 0, 1, 0]], dtype=F64)
TURN_IDS = torch.tensor([[0, 0, -1, -1, 1, -1]])
VALUES = torch.tensor([[0.5, 0.4, NAN, NAN, 0.2, NAN]], dtype=F64)  # observation values never read
REWARDS = torch.tensor([[0.0, 1.0, NAN, NAN, 2.0, NAN]], dtype=F64)
GAMMA, LAM = 0.9, 0.5


def test_turn_ids_and_ends_from_the_mask():
    assert turn_ids_from_mask(MASK).tolist() == TURN_IDS.tolist()
    assert turn_end_mask(TURN_IDS).tolist() == [[False, True, False, False, True, False]]
    two_rows = torch.tensor([[0, 1, 1, 0, 1, 1], [1, 1, 1, 1, 0, 0]])
    assert turn_ids_from_mask(two_rows).tolist() == [[-1, 0, 0, -1, 1, 1], [0, 0, 0, 0, -1, -1]]
    # adjacent turns (an empty observation between them) keep their own ids
    assert turn_end_mask(torch.tensor([[0, 0, 1, 1]])).tolist() == [[False, True, False, True]]


def test_turn_rewards_land_on_each_turns_last_policy_token():
    out = place_turn_rewards(torch.tensor([[1.0, 2.0]]), TURN_IDS)
    assert out.tolist() == [[0.0, 1.0, 0.0, 0.0, 2.0, 0.0]]
    adjacent = place_turn_rewards(torch.tensor([[3.0, 4.0, 0.0]]), torch.tensor([[0, 0, 1, 1, -1]]))
    assert adjacent.tolist() == [[0.0, 3.0, 0.0, 4.0, 0.0]]


def test_a_reward_with_no_token_to_carry_it_is_refused():
    with pytest.raises(ValueError, match="row 0: turn 2 has reward 5.0 but no policy token"):
        place_turn_rewards(torch.tensor([[1.0, 2.0, 5.0]]), TURN_IDS)
    with pytest.raises(ValueError, match="turn_rewards has 1 turns"):
        place_turn_rewards(torch.tensor([[1.0]]), TURN_IDS)


def test_kl_and_rewards_count_policy_tokens_only():
    lp = torch.tensor([[-1.0, -2.0, 50.0, NAN, -0.5, 7.0]], dtype=F64)
    ref = torch.tensor([[-1.5, -1.0, -50.0, 3.0, -0.5, NAN]], dtype=F64)
    rewards, kl = trajectory_rewards(torch.tensor([[1.0, 2.0]], dtype=F64), TURN_IDS, lp, ref, 0.1, "k1")
    assert kl.tolist() == [[0.5, -1.0, 0.0, 0.0, 0.0, 0.0]]
    assert torch.allclose(rewards, torch.tensor([[-0.05, 1.1, 0, 0, 2.0, 0]], dtype=F64), atol=1e-15)


def test_one_turn_is_token_rewards():
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=F64)
    lp, ref = torch.randn(3, 4, generator=g, dtype=F64), torch.randn(3, 4, generator=g, dtype=F64)
    scores = torch.tensor([0.3, -1.0, 2.0], dtype=F64)
    expected = token_rewards(scores, lp, ref, mask, 0.05, "k3")
    got = trajectory_rewards(scores[:, None], turn_ids_from_mask(mask), lp, ref, 0.05, "k3")
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_policy_gae_bootstraps_across_the_observation():
    # policy steps: V = 0.5, 0.4, 0.2; r = 0, 1, 2 (by hand)
    #   delta_3 = 2 - 0.2 = 1.8                 A_3 = 1.8
    #   delta_2 = 1 + 0.9*0.2 - 0.4 = 0.78      A_2 = 0.78 + 0.45*1.8 = 1.59
    #   delta_1 = 0 + 0.9*0.4 - 0.5 = -0.14     A_1 = -0.14 + 0.45*1.59 = 0.5755
    adv, ret = policy_gae(REWARDS, VALUES, MASK, GAMMA, LAM)
    assert torch.allclose(adv, torch.tensor([[0.5755, 1.59, 0, 0, 1.8, 0]], dtype=F64), atol=1e-12)
    assert torch.allclose(ret, torch.tensor([[1.0755, 1.99, 0, 0, 2.0, 0]], dtype=F64), atol=1e-12)
    # the plain GAE with the same mask stops at the observation: turn 0 never sees turn 1
    naive, _ = gae(REWARDS, VALUES, MASK, GAMMA, LAM)
    assert naive[0, 1].item() == pytest.approx(0.6)  # 1 - 0.4: no bootstrap from V = 0.2


def test_truncation_bootstrap_and_terminal():
    truncated = torch.tensor([True])
    final = torch.tensor([1.0], dtype=F64)
    boot = bootstrap_values(final, truncated, "bootstrap")
    assert boot.tolist() == [1.0]
    # delta_3 = 2 + 0.9*1.0 - 0.2 = 2.7; A_2 = 0.78 + 0.45*2.7 = 1.995; A_1 = -0.14 + 0.45*1.995 = 0.75775
    adv, ret = policy_gae(REWARDS, VALUES, MASK, GAMMA, LAM, bootstrap=boot)
    assert torch.allclose(adv, torch.tensor([[0.75775, 1.995, 0, 0, 2.7, 0]], dtype=F64), atol=1e-12)
    assert ret[0, 4].item() == pytest.approx(2.9)  # r + gamma * V_final
    terminal = bootstrap_values(final, truncated, "terminal")
    assert terminal.tolist() == [0.0]
    assert torch.equal(policy_gae(REWARDS, VALUES, MASK, GAMMA, LAM, bootstrap=terminal)[0],
                       policy_gae(REWARDS, VALUES, MASK, GAMMA, LAM)[0])
    # a finished row never bootstraps, and no critic means no value to bootstrap with
    assert bootstrap_values(torch.tensor([1.0, 2.0]), torch.tensor([False, True]), "bootstrap").tolist() == [0.0, 2.0]
    assert bootstrap_values(None, torch.tensor([True]), "bootstrap").tolist() == [0.0]
    with pytest.raises(ValueError, match="expected one of bootstrap, terminal"):
        bootstrap_values(final, truncated, "cut")


def test_policy_steps_round_trip():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    steps, step_mask = to_policy_steps(x, MASK)
    assert steps[0, :3].tolist() == [1.0, 2.0, 5.0] and step_mask.tolist() == [[True] * 3 + [False] * 3]
    assert from_policy_steps(steps, MASK).tolist() == [[1.0, 2.0, 0, 0, 5.0, 0]]


def test_every_estimator_runs_over_policy_tokens():
    gae_est = get_advantage_estimator("gae")
    inputs = AdvantageInputs(REWARDS, MASK, VALUES, 1, GAMMA, LAM)
    assert torch.equal(policy_advantages(gae_est, inputs)[0], policy_gae(REWARDS, VALUES, MASK, GAMMA, LAM)[0])
    # REINFORCE++'s returns discount across the observation: G = [0 + 0.5*1 + 0.25*2, 1 + 0.5*2, 2]
    rpp = get_advantage_estimator("reinforce_pp")
    _, ret = policy_advantages(rpp, AdvantageInputs(REWARDS, MASK, None, 1, 0.5, 1.0))
    assert ret.tolist() == [[1.0, 2.0, 0, 0, 2.0, 0]]
    assert discounted_returns(torch.nan_to_num(REWARDS), MASK, 0.5)[0, 1].item() == 1.0  # plain: cut there
    # RLOO of two rows: R = 3 and 1 over the policy tokens; A = +-2 on each row's policy tokens
    rewards = torch.cat([REWARDS, torch.tensor([[1.0, 0.0, NAN, NAN, 0.0, NAN]], dtype=F64)])
    mask = torch.cat([MASK, MASK])
    adv, _ = policy_advantages(get_advantage_estimator("rloo"), AdvantageInputs(rewards, mask, None, 2))
    assert adv.tolist() == [[2.0, 2.0, 0, 0, 2.0, 0], [-2.0, -2.0, 0, 0, -2.0, 0]]


def _strip(x, m):
    """Row 0 of ``x`` at the policy positions of ``m``, as a 1-row tensor."""
    return x[:, m[0].bool()]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 8),
    data=st.data(),
    gamma=st.sampled_from([1.0, 0.9, 0.5]),
    lam=st.sampled_from([1.0, 0.95, 0.3]),
    truncated=st.booleans(),
)
def test_inserting_observations_changes_no_policy_advantage(n, data, gamma, lam, truncated):
    num = st.floats(-5, 5, allow_nan=False, width=32)
    r = torch.tensor([data.draw(st.lists(num, min_size=n, max_size=n))], dtype=F64)
    v = torch.tensor([data.draw(st.lists(num, min_size=n, max_size=n))], dtype=F64)
    gaps = data.draw(st.lists(st.integers(0, 3), min_size=n + 1, max_size=n + 1))  # obs run before each token
    junk = data.draw(st.sampled_from([NAN, 1e30, -7.0]))
    cols_r, cols_v, cols_m = [], [], []
    for i in range(n + 1):
        cols_r += [junk] * gaps[i]
        cols_v += [junk] * gaps[i]
        cols_m += [0.0] * gaps[i]
        if i < n:
            cols_r.append(float(r[0, i]))
            cols_v.append(float(v[0, i]))
            cols_m.append(1.0)
    R, Vv, M = (torch.tensor([c], dtype=F64) for c in (cols_r, cols_v, cols_m))
    boot = bootstrap_values(torch.tensor([0.7], dtype=F64), torch.tensor([truncated]), "bootstrap")
    plain = policy_gae(r, v, torch.ones_like(r), gamma, lam, bootstrap=boot)
    spread = policy_gae(R, Vv, M, gamma, lam, bootstrap=boot)
    assert torch.equal(_strip(spread[0], M), plain[0]) and torch.equal(_strip(spread[1], M), plain[1])
    assert bool((spread[0][M == 0] == 0).all())
    # and without observations it is the plain GAE (with the bootstrap as V_T)
    ref_adv, _ = gae(r, v, torch.ones_like(r), gamma, lam, last_values=boot)
    assert torch.allclose(plain[0], ref_adv, atol=1e-12)


def _garbage_at_observations(x, m, value):
    return torch.where(m.bool(), x, torch.full_like(x, value))


@pytest.mark.parametrize("junk", [NAN, 1e4])
def test_the_masked_losses_count_policy_tokens_only(junk):
    """Loss, KL and entropy with the policy mask equal the same on the trajectory without its
    observations, whatever the observation positions hold, and give them exactly 0 gradient."""
    g = torch.Generator().manual_seed(1)
    M = torch.tensor([[1, 1, 0, 0, 1, 0], [0, 1, 1, 0, 0, 0]], dtype=F64)
    shape = M.shape
    base = {k: torch.randn(shape, generator=g, dtype=F64) * 0.3 for k in ("lp", "old", "adv", "ref", "v", "vold", "ret", "ent")}
    full = {k: _garbage_at_observations(x, M, junk) for k, x in base.items()}
    lp = full["lp"].clone().requires_grad_(True)
    vals = full["v"].clone().requires_grad_(True)
    ent = full["ent"].clone().requires_grad_(True)
    pieces = [ppo_policy_loss(lp, full["old"], full["adv"], M, 0.2)[0],
              kl_loss(lp, full["ref"], M, "k3")[0],
              value_loss(vals, full["vold"], full["ret"], M, 0.2)[0],
              aggregate_loss(ent, M, "token-mean")]
    total = sum(pieces)
    total.backward()
    for grad in (lp.grad, vals.grad, ent.grad):
        assert bool((grad[M == 0] == 0).all()) and bool(torch.isfinite(grad).all())
    # the same losses on the policy tokens alone (one flat row: token-mean needs no rows)
    sel = M.bool()
    flat = {k: x[sel][None] for k, x in base.items()}
    ones = torch.ones_like(flat["lp"])
    expected = [ppo_policy_loss(flat["lp"], flat["old"], flat["adv"], ones, 0.2)[0],
                kl_loss(flat["lp"], flat["ref"], ones, "k3")[0],
                value_loss(flat["v"], flat["vold"], flat["ret"], ones, 0.2)[0],
                aggregate_loss(flat["ent"], ones, "token-mean")]
    for got, want in zip(pieces, expected):
        assert math.isclose(float(got.detach()), float(want), rel_tol=1e-12, abs_tol=1e-15)
    # per-response aggregation counts each row's policy tokens: row 0 has 3, row 1 has 2
    per_seq = aggregate_loss(_garbage_at_observations(torch.ones(shape, dtype=F64), M, junk), M, "seq-mean-token-sum")
    assert float(per_seq) == 2.5


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_turn_rewards_sit_on_each_turns_last_token_whatever_the_layout(data):
    """Random turns (1-4 tokens each) with random observation runs (0-3 tokens) between them and
    padding after: every turn's reward is on its last token, nothing else carries one, and the row
    sums to the return; with a run between every two turns, the ids read off the mask agree."""
    n = data.draw(st.integers(1, 5))
    lengths = data.draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    gaps = data.draw(st.lists(st.integers(1, 3), min_size=n - 1, max_size=n - 1)) + [data.draw(st.integers(0, 3))]
    rewards = data.draw(st.lists(st.floats(-3, 3, allow_nan=False, width=32), min_size=n, max_size=n))
    ids, ends = [], []
    for k, (length, gap) in enumerate(zip(lengths, gaps)):
        ids += [k] * length
        ends.append(len(ids) - 1)
        ids += [-1] * gap
    turn_ids = torch.tensor([ids])
    placed = place_turn_rewards(torch.tensor([rewards], dtype=F64), turn_ids)
    expected = torch.zeros(1, len(ids), dtype=F64)
    expected[0, ends] = torch.tensor(rewards, dtype=F64)
    assert torch.equal(placed, expected)
    assert torch.equal(turn_ids_from_mask(turn_ids >= 0), turn_ids)
