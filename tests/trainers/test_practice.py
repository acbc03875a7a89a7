"""PPO as practised now, in the loop: the mismatch measured (bf16-mixed copy: non-zero, recompute:
the first ratio exactly 1; fp32, the eager and the static engine: zero to float rounding), the temperature on both sides, pure
temperature sampling, the critic's warm-up (the policy bit-identical) and warm start (weights
only), critic_lam's value targets, the keys' one-line errors."""
import dataclasses

import pytest
import torch

from fourfold.config import PPOAlgoConfig, PPOConfig, load_config
from fourfold.errors import ConfigError
from fourfold.reporting import read_metrics


def _over(tiny_lm, out, **extra):
    base = {"model.policy": tiny_lm / "sft", "model.reward_fn": f"{tiny_lm / 'reward_fn.py'}:reward",
            "data.prompts": tiny_lm / "prompts.jsonl", "ppo.iterations": 2,
            "ppo.rollout_batch_size": 8, "ppo.minibatch_size": 4, "ppo.ppo_epochs": 1, "ppo.lr": 1e-3,
            "generation.max_new_tokens": 6, "generation.temperature": 0.7, "run.output_dir": out,
            "run.progress": False, "run.seed": 0, "run.device": "cpu"}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _run(tiny_lm, out, **extra):
    from fourfold.trainers.ppo import train

    train(load_config(PPOConfig, None, _over(tiny_lm, out, **extra)))
    return read_metrics(out / "metrics.jsonl")


def _assert_float_rounding(rows) -> None:
    """Every iteration's mismatch is float32 rounding (a KV-cache step against a full forward)."""
    for r in rows:
        assert r["mismatch/token_abs_diff_max"] < 2e-6
        assert abs(r["mismatch/geo_ratio_min"] - 1) < 2e-6 and abs(r["mismatch/geo_ratio_max"] - 1) < 2e-6
        assert r["policy/first_ratio_abs_dev"] < 2e-6


def test_the_sequence_ratio_check_holds_either_direction_and_fails_on_none_or_too_far(seq_ratios_within_token_bound):
    """The bf16 tests' check of mismatch/seq_ratio_*: every ratio below 1 passes (an AVX2-only CPU's
    rounding), as does one on each side; no move at all, or a move past max_tokens x the token
    maximum, fails."""
    import math

    row = lambda lo, hi, tok: {"mismatch/seq_ratio_min": lo, "mismatch/seq_ratio_max": hi,
                               "mismatch/token_abs_diff_max": tok}
    seq_ratios_within_token_bound(row(0.99924, 0.99990, 4e-3), max_tokens=6)
    seq_ratios_within_token_bound(row(0.995, 1.004, 4e-3), max_tokens=6)
    seq_ratios_within_token_bound(row(math.exp(-0.024), 1.0, 4e-3), max_tokens=6)  # exactly at the bound
    for bad in (row(1.0, 1.0, 4e-3), row(0.97, 1.0, 4e-3), row(1.0, 1.03, 4e-3), row(1.01, 0.99, 4e-3)):
        with pytest.raises(AssertionError):
            seq_ratios_within_token_bound(bad, max_tokens=6)


def test_bf16_copy_mismatch_is_measured_and_recompute_makes_the_first_ratio_one(tiny_lm, tmp_path, capsys,
                                                                                   seq_ratios_within_token_bound):
    bf16 = {"model.precision": "bf16-mixed", "generation.weights": "copy"}
    rows = _run(tiny_lm, tmp_path / "auto", **bf16)  # auto = recompute under bf16-mixed
    assert "ppo.old_logprobs: auto = recompute (model.precision bf16-mixed" in capsys.readouterr().out
    for r in rows:
        assert r["mismatch/token_abs_diff_max"] > 1e-4 and r["mismatch/token_abs_diff_mean"] > 0
        seq_ratios_within_token_bound(r, max_tokens=6)  # not the direction: one CPU's rounding
        assert r["policy/first_ratio_abs_dev"] == 0.0  # exactly: pi_old is the first minibatch's own forward
    engine = _run(tiny_lm, tmp_path / "engine", **bf16, **{"ppo.old_logprobs": "engine"})
    assert engine[0]["policy/first_ratio_abs_dev"] > 1e-5  # the clip would act on bf16 rounding
    assert engine[0]["mismatch/token_abs_diff_max"] == rows[0]["mismatch/token_abs_diff_max"]  # same rollout


def test_fp32_eager_mismatch_is_zero_to_float_rounding(tiny_lm, tmp_path, capsys):
    """Not bit-zero: a KV-cache step and a full forward round differently (~5e-7 per token)."""
    rows = _run(tiny_lm, tmp_path / "fp32")
    assert "old_logprobs" not in capsys.readouterr().out  # engine: nothing said
    _assert_float_rounding(rows)
    off = _run(tiny_lm, tmp_path / "off", **{"ppo.measure_mismatch": "false"})
    assert not any(k.startswith("mismatch/") for k in off[0])


@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.slow)])  # inductor: ~30 s cold
def test_fp32_static_engine_mismatch_is_float_rounding_and_recompute_makes_the_first_ratio_one(
        tiny_lm, tmp_path, capsys, monkeypatch, compile):
    """The static engine (its preallocated cache and fixed-shape step, compiled by inductor or not)
    rounds like the eager one: at most 4.8e-7 per token against the training forward (measured,
    compiled or not), so auto stays engine in fp32 (resolve_old_logprobs); recompute makes the
    first minibatch's ratio exactly 1 on the same rollout."""
    from fourfold.trainers import rl

    engines, real = [], rl.make_engine
    monkeypatch.setattr(rl, "make_engine", lambda *a, **k: engines.append(real(*a, **k)) or engines[-1])
    torch._dynamo.reset()
    static = {"generation.engine": "static", "generation.compile": str(compile).lower()}
    rows = _run(tiny_lm, tmp_path / "auto", **static)
    assert "old_logprobs" not in capsys.readouterr().out  # auto = engine: nothing said
    assert bool(engines[0].compiled_shapes) is compile  # the compiled step did sample
    _assert_float_rounding(rows)
    assert all(r["mismatch/token_abs_diff_mean"] < 5e-7 for r in rows)
    again = _run(tiny_lm, tmp_path / "recompute", **static, **{"ppo.old_logprobs": "recompute"})
    assert "fourfold ppo: ppo.old_logprobs: recompute" in capsys.readouterr().out
    assert [r["policy/first_ratio_abs_dev"] for r in again] == [0.0, 0.0]
    for key in ("mismatch/token_abs_diff_max", "mismatch/token_abs_diff_mean"):
        assert again[0][key] == rows[0][key]  # the same rollout, measured the same way


def test_a_correction_runs_in_ppo_grpo_and_reinforce(tiny_lm, tmp_path):
    from fourfold.config import ReinforceConfig
    from fourfold.trainers.reinforce import train as reinforce

    rows = _run(tiny_lm, tmp_path / "ppo", **{"ppo.rollout_correction": "token_tis"})
    assert rows[0]["policy/first_ratio_abs_dev"] == 0.0  # auto = recompute with a correction
    assert abs(rows[0]["mismatch/is_weight_mean"] - 1) < 2e-6
    rows = _run(tiny_lm, tmp_path / "grpo", **{"ppo.advantage": "grpo", "ppo.samples_per_prompt": 4,
                                               "ppo.rollout_correction": "seq_mis", "ppo.kl_in": "loss"})
    assert rows[0]["mismatch/is_masked_share"] == 0.0 and 0 <= rows[0]["reward/frac_zero_std"] <= 1
    over = [o for o in _over(tiny_lm, tmp_path / "rf") if not o.startswith(("ppo.", "model.critic_init"))]
    reinforce(load_config(ReinforceConfig, None, over + ["reinforce.iterations=2", "reinforce.rollout_batch_size=8",
                                                         "reinforce.rollout_correction=geo_mis"]))
    rf = read_metrics(tmp_path / "rf" / "metrics.jsonl")
    assert rf[0]["mismatch/is_weight_mean"] == 1.0 and rf[0]["mismatch/token_abs_diff_max"] < 2e-6


def test_temperature_on_both_sides_and_pure_temperature_sampling(tiny_lm):
    """trl#4159 and trl#6789: without a filter (generation.top_k/top_p/min_p off, the default) the
    engine's log-probs are log_softmax(logits / T) of the full vocabulary at the sampled tokens; the
    training forward at T agrees, at T = 1 it does not. With a filter they are the renormalised
    distribution's: tests/trainers/test_truncated_sampling.py."""
    from fourfold.config import GenerationConfig
    from fourfold.config.sampling import truncates
    from fourfold.models.build import load_roles
    from fourfold.models.roles import response_logits, response_logprobs
    from fourfold.rollout.eager import EagerEngine
    from fourfold.rollout.noise import RowNoise
    from fourfold.trainers.rollouts import collect

    assert not truncates(GenerationConfig())
    cfg = load_config(PPOConfig, None, _over(tiny_lm, "unused"))
    roles = load_roles("ppo", cfg, torch.device("cpu"))
    ids = torch.randint(3, 60, (4, 3), generator=torch.Generator().manual_seed(0))
    col = collect(roles, ["p"] * 4, ids, torch.ones_like(ids), GenerationConfig(max_new_tokens=6, temperature=0.7),
                  engine=EagerEngine(), kl_coef=0.0, noise=RowNoise(0, 1))
    r, T = col.rollout, col.rollout.mask.shape[1]
    ids_all, attn = r.context["input_ids"], r.context["attention_mask"]
    with torch.no_grad():
        full = torch.log_softmax(response_logits(roles.policy, ids_all, attn, T).float() / 0.7, -1)
        at_t, _ = response_logprobs(roles.policy, ids_all, attn, T, 0.7)
        at_1, _ = response_logprobs(roles.policy, ids_all, attn, T, 1.0)
    picked = full.gather(-1, ids_all[:, -T:, None]).squeeze(-1)
    m = r.mask.bool()
    assert (picked - r.logprobs)[m].abs().max() < 2e-6
    assert (at_t - r.logprobs)[m].abs().max() < 2e-6
    assert (at_1 - r.logprobs)[m].abs().max() > 1e-2  # the temperature left out of one side


def test_critic_warmup_leaves_the_policy_bit_identical(tiny_lm, tmp_path, monkeypatch):
    from fourfold.models.build import load_roles
    from fourfold.trainers import ppo

    cfg = load_config(PPOConfig, None, _over(tiny_lm, tmp_path / "w", **{"ppo.iterations": 3, "ppo.critic_warmup": 2}))
    roles = load_roles("ppo", cfg, torch.device("cpu"))
    start = {k: v.clone() for k, v in roles.policy.state_dict().items()}
    critic_start = {k: v.clone() for k, v in roles.critic.state_dict().items()}
    made, seen = [], []
    real_optim, real_update = ppo.make_optim, ppo.ppo_update
    monkeypatch.setattr(ppo, "make_optim", lambda *a, **k: made.append(real_optim(*a, **k)) or made[-1])

    def update(roles_, rollout, algo, opt, *a, **k):
        out = real_update(roles_, rollout, algo, opt, *a, **k)
        same = all(torch.equal(v, start[n]) for n, v in roles_.policy.state_dict().items())
        seen.append((same, len(opt.policy_opt.state), opt.policy_sched.last_epoch, k["train_policy"]))
        return out

    monkeypatch.setattr(ppo, "ppo_update", update)
    ppo.train(cfg, roles=roles)
    assert seen[:2] == [(True, 0, 0, False)] * 2  # weights, AdamW state (none yet), schedule untouched
    assert seen[2][0] is False and seen[2][1] > 0 and seen[2][3] is True
    assert not all(torch.equal(v, critic_start[n]) for n, v in roles.critic.state_dict().items())
    rows = read_metrics(tmp_path / "w" / "metrics.jsonl")
    assert "policy/loss" not in rows[0] and "value/loss" in rows[0] and "policy/loss" in rows[2]
    assert "mismatch/token_abs_diff_max" in rows[0]  # measured in the warm-up too


def test_critic_warm_start_loads_weights_only(tiny_lm, tmp_path, monkeypatch):
    from fourfold.checkpoint.plain import save_checkpoint
    from fourfold.models.build import load_roles
    from fourfold.run.optim import make_optimizer
    from fourfold.trainers import ppo, practice

    cfg = load_config(PPOConfig, None, _over(tiny_lm, tmp_path / "a"))
    donor = load_roles("ppo", cfg, torch.device("cpu"))
    with torch.no_grad():
        for p in donor.critic.parameters():
            p.add_(0.1)
    opt = make_optimizer(donor.critic.parameters(), 1e-3)
    donor.critic(torch.tensor([[5, 6]]), torch.ones(1, 2)).sum().backward()
    opt.step()  # an optimiser with state, which must not come along
    saved = {k: v.clone() for k, v in donor.critic.state_dict().items()}
    save_checkpoint(tmp_path / "old", 7, modules={"critic": donor.critic, "policy": donor.policy},
                    optimizers={"critic": opt})
    seen = []
    real = ppo.ppo_update

    def update(roles_, rollout, algo, opt_, *a, **k):
        if not seen:
            seen.append((all(torch.equal(v, saved[n]) for n, v in roles_.critic.state_dict().items()),
                         len(opt_.critic_opt.state)))
        return real(roles_, rollout, algo, opt_, *a, **k)

    monkeypatch.setattr(ppo, "ppo_update", update)
    ppo.train(load_config(PPOConfig, None, _over(tiny_lm, tmp_path / "b", **{"ppo.critic_from": tmp_path / "old"})))
    assert seen == [(True, 0)]
    with pytest.raises(ConfigError, match="ppo.critic_from"):
        practice.warm_start_critic(donor.critic, str(tmp_path / "missing"))


def test_critic_lam_sets_the_value_targets_only():
    """gamma 1, rewards 0, 0, 1, values 0.5, 0.2, 0.1. lam 0.5: deltas -0.3, -0.1, 0.9, advantages
    -0.125, 0.35, 0.9; critic_lam 1: the returns are the Monte-Carlo 1, 1, 1 (not A + V)."""
    from fourfold.config import PPOAlgoConfig
    from fourfold.core import Rollout
    from fourfold.trainers.ppo import compute_advantages

    def rollout():
        return Rollout(actions=torch.zeros(1, 3, dtype=torch.long), mask=torch.ones(1, 3), logprobs=torch.zeros(1, 3),
                       values=torch.tensor([[0.5, 0.2, 0.1]]), rewards=torch.tensor([[0.0, 0.0, 1.0]]))

    algo = PPOAlgoConfig(lam=0.5, whiten_advantages=False)
    plain = compute_advantages(rollout(), algo)
    assert plain.advantages[0].tolist() == pytest.approx([-0.125, 0.35, 0.9])
    assert plain.returns[0].tolist() == pytest.approx([0.375, 0.55, 1.0])
    decoupled = compute_advantages(rollout(), dataclasses.replace(algo, critic_lam=1.0))
    assert decoupled.advantages[0].tolist() == pytest.approx([-0.125, 0.35, 0.9])
    assert decoupled.returns[0].tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_monte_carlo_returns_do_not_depend_on_the_values():
    from fourfold.core import Rollout
    from fourfold.trainers.ppo import monte_carlo_returns, value_metrics

    def rollout(values):
        return Rollout(actions=torch.zeros(2, 3, dtype=torch.long), mask=torch.ones(2, 3), logprobs=torch.zeros(2, 3),
                       values=torch.tensor(values), rewards=torch.tensor([[0.0, 0.0, 1.0], [0.0, -0.5, 0.0]]))

    algo = PPOAlgoConfig(lam=0.5)
    for values in ([[0.5, 0.2, 0.1], [0.0, 0.0, 0.0]], [[9.0, -3.0, 2.0], [1.0, 1.0, 1.0]]):
        assert monte_carlo_returns(rollout(values), algo).flatten().tolist() == pytest.approx([1.0, 1.0, 1.0, -0.5, -0.5, 0.0])
    r = rollout([[1.0, 1.0, 1.0], [-0.5, -0.5, 0.0]])  # the values are the MC returns: explained variance 1
    r.returns = torch.zeros(2, 3)
    m = value_metrics(r, monte_carlo_returns(r, algo))
    assert m["value/explained_variance_mc"] == pytest.approx(1.0) and "value/explained_variance_mc" not in value_metrics(r)


def test_value_statistics_and_overlong_and_mask_truncated_are_logged(tiny_lm, tmp_path):
    rows = _run(tiny_lm, tmp_path / "v", **{"ppo.overlong_buffer": 2, "ppo.mask_truncated": "true"})
    r = rows[0]
    assert r["value/error"] >= 0 and r["value/returns_std"] >= 0 and "value/returns_mean" in r
    assert -1 <= r["value/explained_variance_mc"] <= 1 + 1e-9
    assert -1 <= r["reward/overlong_penalty_mean"] <= 0 and 0 <= r["rollout/masked_truncated_share"] <= 1


@pytest.mark.parametrize("key, value, match", [
    ("ppo.rollout_correction", "token_tis", "old_logprobs"),  # with old_logprobs=engine
    ("ppo.dual_clip", "1.0", "must be > 1"),
    ("ppo.critic_warmup", "2", "leaves no policy iteration"),
    ("ppo.critic_lam", "1.5", r"\[0, 1\]"),
    ("ppo.overlong_buffer", "99", "max_new_tokens"),
    ("ppo.rollout_correction_cap", "1.0", "> 1"),
    ("ppo.rollout_correction_cap", "2.0", "rollout_correction is none: there are no weights to cap"),  # not ignored
])
def test_the_new_keys_one_line_errors(tiny_lm, tmp_path, key, value, match):
    extra = {"ppo.old_logprobs": "engine"} if key == "ppo.rollout_correction" else {}
    with pytest.raises(ConfigError, match=match) as e:
        load_config(PPOConfig, None, _over(tiny_lm, tmp_path, **extra) + [f"{key}={value}"])
    assert key in str(e.value) and "\n" not in str(e.value)


def test_reinforce_refuses_a_cap_without_a_correction_mode(tiny_lm, tmp_path):
    from fourfold.config import ReinforceConfig

    over = [f"model.policy={tiny_lm / 'sft'}", f"model.reward_fn={tiny_lm / 'reward_fn.py'}:reward",
            f"data.prompts={tiny_lm / 'prompts.jsonl'}", "reinforce.rollout_correction_cap=2"]
    with pytest.raises(ConfigError, match="reinforce.rollout_correction_cap: set, and reinforce.rollout_correction is none"):
        load_config(ReinforceConfig, None, over)
    load_config(ReinforceConfig, None, over + ["reinforce.rollout_correction=token_tis"])  # with a mode: taken


def test_a_sequence_ratio_with_a_token_level_clip_is_warned_once(tiny_lm, tmp_path, capsys):
    """GSPO's ratio with PPO's clip 0.2 clips nothing: one warning line at the start (issue 40, 12);
    a sequence-level clip (4e-4) says nothing."""
    rows = _run(tiny_lm, tmp_path / "tok", **{"ppo.ratio_level": "sequence"})
    out = capsys.readouterr().out
    assert out.count("warning: ppo.ratio_level: sequence (GSPO) with a clip of 0.2") == 1, out
    assert all(r["policy/clipfrac"] < 0.05 for r in rows)  # the warning's reason, on this run
    _run(tiny_lm, tmp_path / "seq", **{"ppo.ratio_level": "sequence", "ppo.clip_eps": 4e-4})
    assert "ppo.ratio_level" not in capsys.readouterr().out


def _collected(scores, T, P, pad=0):
    from fourfold.core import Rollout
    from fourfold.rollout.sampling import Samples
    from fourfold.trainers.rollouts import Collected

    B = len(scores)
    ids = torch.arange(1, B * (P + T) + 1).reshape(B, P + T)
    mask = torch.ones(B, T)
    r = Rollout(actions=ids[:, P:], mask=mask, logprobs=-mask, values=0 * mask, rewards=mask, ref_logprobs=-mask,
                scores=torch.tensor(scores), context={"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    s = Samples(ids, torch.ones_like(ids), mask, -mask, torch.ones(B, dtype=torch.bool))
    return Collected(r, s, [f"p{v}" for v in scores], [], mask.clone(), {"m": 1.0})


def test_fill_groups_drops_equal_groups_and_refills_by_hand():
    """K = 2, 3 groups a batch. First rollout: groups (1, 1), (0, 1), (2, 2): one kept. Draw 1
    (wider prompts, longer responses): (0, 0), (3, 4), (5, 6): two kept, the batch full."""
    from fourfold.trainers.groups import fill_groups

    first = _collected([1.0, 1.0, 0.0, 1.0, 2.0, 2.0], T=2, P=3)
    more = _collected([0.0, 0.0, 3.0, 4.0, 5.0, 6.0], T=4, P=5)
    draws = []
    col, m = fill_groups(first, lambda d: draws.append(d) or more, 2, 3, pad_id=0)
    assert draws == [1] and m == {"reward/filtered_groups": 3.0, "reward/filter_batches": 2.0}
    assert col.rollout.scores.tolist() == [0.0, 1.0, 3.0, 4.0, 5.0, 6.0]
    assert col.prompts == ["p0.0", "p1.0", "p3.0", "p4.0", "p5.0", "p6.0"]
    ids, attn = col.rollout.context["input_ids"], col.rollout.context["attention_mask"]
    assert ids.shape == (6, 9) and col.rollout.mask.shape == (6, 4)
    # the first rollout's row 2 (prompt 3 tokens, response 2): 2 pads on the prompt's left, 2 on the response's right
    assert attn[0].tolist() == [0, 0, 1, 1, 1, 1, 1, 0, 0] and col.rollout.mask[0].tolist() == [1, 1, 0, 0]
    assert ids[0, 2:7].tolist() == first.rollout.context["input_ids"][2].tolist()
    # the bound reached (one rollout): completed with the first dropped groups
    col, m = fill_groups(first, lambda d: more, 2, 1, pad_id=0)
    assert col.rollout.scores.tolist() == [1.0, 1.0, 0.0, 1.0, 2.0, 2.0] and m["reward/filter_batches"] == 1.0



def test_fill_groups_keeps_a_weighted_rewards_parts_with_their_rows():
    """The parts of a weighted reward (logged as reward/<name>_mean, named by the guard) follow
    the rows filter_groups keeps, in the kept order."""
    import dataclasses

    from fourfold.trainers.groups import fill_groups

    def with_parts(col, rm):
        return dataclasses.replace(col, parts={"rm": torch.tensor(rm), "rule": col.rollout.scores - torch.tensor(rm)})

    first = with_parts(_collected([1.0, 1.0, 0.0, 1.0, 2.0, 2.0], T=2, P=3), [0.5, 0.5, 0.0, 0.25, 1.0, 1.0])
    more = with_parts(_collected([0.0, 0.0, 3.0, 4.0, 5.0, 6.0], T=4, P=5), [0.0, 0.0, 1.5, 2.0, 2.5, 3.0])
    col, _ = fill_groups(first, lambda d: more, 2, 3, pad_id=0)
    assert col.parts["rm"].tolist() == [0.0, 0.25, 1.5, 2.0, 2.5, 3.0]
    assert (col.parts["rm"] + col.parts["rule"]).tolist() == col.rollout.scores.tolist()

def test_filter_groups_in_the_loop(tiny_lm, tmp_path, monkeypatch):
    """DAPO's refills happen, and reward/score_* are the kept batch's (the scores the update trains
    on), the first rollout's mean beside as reward/first_score_mean."""
    from fourfold.trainers import ppo

    kept, real = [], ppo.shape_scores
    monkeypatch.setattr(ppo, "shape_scores", lambda r, algo, limit: kept.append(r.scores.clone()) or real(r, algo, limit))
    rows = _run(tiny_lm, tmp_path / "dapo", **{"ppo.advantage": "grpo", "ppo.samples_per_prompt": 2,
                                               "ppo.kl_in": "loss", "ppo.filter_groups": "true",
                                               "generation.max_new_tokens": 4})
    for r, scores in zip(rows, kept, strict=True):
        assert 1 <= r["reward/filter_batches"] <= 3 and r["reward/filtered_groups"] >= 0
        assert r["reward/score_mean"] == pytest.approx(float(scores.mean()), abs=1e-7)
        assert r["reward/score_max"] == pytest.approx(float(scores.max()), abs=1e-7)
    assert any(r["reward/first_score_mean"] != r["reward/score_mean"] for r in rows)  # refills changed the batch
    # the tiny reward counts one word in 4 tokens: most groups tie at 0, so refills happen
    assert max(r["reward/filter_batches"] for r in rows) > 1
