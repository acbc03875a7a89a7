"""Truncated sampling (generation.top_k, top_p, min_p) in the RL loops: the rollout's log-probs are
the renormalised distribution's (the behaviour policy), the trainer's the full softmax, the KL in
the rewards the full policy's; the gap is logged (rollout/log_kept_mass) and measured by the
mismatch path (mismatch/*), pi_old is recomputed under ppo.old_logprobs auto, and the rollout
correction weights it; the keys' refusals are one line."""
import pytest
import torch

from fourfold.config import GenerationConfig, PPOConfig, ReinforceConfig, load_config
from fourfold.config.sampling import filters_said
from fourfold.errors import ConfigError
from fourfold.reporting import read_metrics


def _over(tiny_lm, out, **extra):
    base = {"model.policy": tiny_lm / "sft", "model.reward_fn": f"{tiny_lm / 'reward_fn.py'}:reward",
            "model.critic_init": "policy", "data.prompts": tiny_lm / "prompts.jsonl", "ppo.iterations": 2,
            "ppo.rollout_batch_size": 8, "ppo.minibatch_size": 4, "ppo.ppo_epochs": 1, "ppo.lr": 1e-3,
            "generation.max_new_tokens": 6, "generation.temperature": 0.7, "run.output_dir": out,
            "run.progress": False, "run.seed": 0, "run.device": "cpu", "run.threads": 1}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def test_the_truncated_rollouts_log_probs_are_the_renormalised_distributions(tiny_lm):
    """trl#6789's trap: under top_k the engine's log-probs are log_softmax of the filtered logits / T
    (renormalised over the kept tokens), not the full softmax's (the buggy form: they differ by more
    than 1e-2 here); the policy's full-softmax log-probs are theirs plus the kept mass and equal the
    training forward at T; the KL in the rewards is the full policy's against the reference."""
    from fourfold.models.build import load_roles
    from fourfold.models.roles import response_logits, response_logprobs
    from fourfold.rollout.engine import make_engine
    from fourfold.rollout.noise import RowNoise
    from fourfold.rollout.sampling import Truncation, truncate_logits
    from fourfold.trainers.rollouts import collect

    cfg = load_config(PPOConfig, None, _over(tiny_lm, "unused"))
    roles = load_roles("ppo", cfg, torch.device("cpu"))
    ids = torch.randint(3, 60, (8, 3), generator=torch.Generator().manual_seed(0))
    gen = GenerationConfig(max_new_tokens=6, temperature=0.7, top_k=5)
    col = collect(roles, ["p"] * 8, ids, torch.ones_like(ids), gen, engine=make_engine(gen), kl_coef=0.1,
                  noise=RowNoise(0, 1))
    r, s, T = col.rollout, col.samples, col.rollout.mask.shape[1]
    ids_all, attn, m = r.context["input_ids"], r.context["attention_mask"], r.mask.bool()
    with torch.no_grad():
        logits = response_logits(roles.policy, ids_all, attn, T).float()  # (B, T, V)
        filtered = truncate_logits(logits.flatten(0, 1), 0.7, Truncation(top_k=5)).view_as(logits)
        at_t, _ = response_logprobs(roles.policy, ids_all, attn, T, 0.7)
    tokens = ids_all[:, -T:, None]
    renormalised = torch.log_softmax(filtered, -1).gather(-1, tokens).squeeze(-1)
    assert (renormalised - r.logprobs)[m].abs().max() < 2e-6
    assert (at_t - r.logprobs)[m].abs().max() > 1e-2  # the full softmax is not what was sampled
    assert (at_t - s.policy_logprobs)[m].abs().max() < 2e-6
    kept = s.kept_logmass
    assert (kept[m] < 0).all() and (kept[~m] == 0).all()
    assert col.metrics["rollout/log_kept_mass"] == pytest.approx(float(kept[m].mean()), abs=1e-6)
    assert col.metrics["rollout/log_kept_mass"] < -1e-2
    assert (col.kl - (at_t - r.ref_logprobs) * r.mask)[m].abs().max() < 2e-6  # k1 of the full policy


def test_ppo_with_top_p_through_the_cli_logs_the_gap_and_recomputes_pi_old(tiny_lm, tmp_path, capsys):
    """`fourfold ppo generation.top_p=0.9`: auto recomputes pi_old (said in the first lines, with
    the note that no correction is set); every iteration logs rollout/log_kept_mass < 0, and the
    mismatch path measures the same gap from the trainer's side (mean |d_t| = -mean log Z_t); the
    first ratio is 1. With ppo.rollout_correction token_tis the weights are the kept masses (< 1)."""
    from fourfold.cli import main

    out = tmp_path / "p"
    assert main(["ppo", *_over(tiny_lm, out, **{"generation.top_p": 0.9})]) == 0
    said = capsys.readouterr().out
    assert "ppo.old_logprobs: auto = recompute (generation.top_p 0.9: the engine's log-probs" in said
    assert "set ppo.rollout_correction (e.g. token_tis)" in said
    rows = read_metrics(out / "metrics.jsonl")
    assert len(rows) == 2
    for row in rows:
        assert row["rollout/log_kept_mass"] < -1e-3
        assert row["mismatch/token_abs_diff_mean"] == pytest.approx(-row["rollout/log_kept_mass"], abs=2e-6)
        assert row["mismatch/seq_ratio_max"] <= 1 + 1e-6  # pi_train <= pi_sampled on every kept token
        assert row["policy/first_ratio_abs_dev"] < 2e-6
    from fourfold.trainers.ppo import train

    out = tmp_path / "tis"
    train(load_config(PPOConfig, None, _over(tiny_lm, out, **{"generation.top_k": 5, "ppo.iterations": 1,
                                                               "ppo.rollout_correction": "token_tis"})))
    assert "rollout_correction" not in capsys.readouterr().out.replace("(rollout_correction token_tis)", "")
    row = read_metrics(out / "metrics.jsonl")[0]
    assert 0 < row["mismatch/is_weight_mean"] < 1 and row["rollout/log_kept_mass"] < -1e-3


def test_reinforce_logs_the_gap_and_untruncated_runs_log_none(tiny_lm, tmp_path):
    from fourfold.trainers.reinforce import train

    over = [o for o in _over(tiny_lm, tmp_path / "rf") if not o.startswith(("ppo.", "model.critic_init"))]
    train(load_config(ReinforceConfig, None, over + ["reinforce.iterations=1", "reinforce.rollout_batch_size=8",
                                                     "generation.min_p=0.3"]))
    row = read_metrics(tmp_path / "rf" / "metrics.jsonl")[0]
    assert row["rollout/log_kept_mass"] < -1e-3
    assert row["mismatch/token_abs_diff_mean"] == pytest.approx(-row["rollout/log_kept_mass"], abs=2e-6)


@pytest.mark.parametrize("key, value, message", [
    ("top_k", -1, "generation.top_k: must be >= 0 (0 = off), got -1"),
    ("top_p", 0, "generation.top_p: must be in (0, 1] (1 = off), got 0"),
    ("top_p", 1.5, "generation.top_p: must be in (0, 1] (1 = off), got 1.5"),
    ("min_p", 1, "generation.min_p: must be in [0, 1) (0 = off), got 1"),
    ("min_p", -0.1, "generation.min_p: must be in [0, 1) (0 = off), got -0.1"),
])
def test_the_keys_refuse_values_out_of_range_in_one_line(tiny_lm, key, value, message):
    with pytest.raises(ConfigError) as e:
        load_config(PPOConfig, None, _over(tiny_lm, "unused", **{f"generation.{key}": value}))
    assert str(e.value) == f"command line: {message}"


def test_generate_refuses_greedy_with_a_filter():
    from fourfold.config import GenerateSamplingConfig

    with pytest.raises(ConfigError) as e:
        GenerateSamplingConfig(greedy=True, top_p=0.9).validate()
    assert str(e.value) == ("generation.greedy: takes the most likely token, which every filter keeps: generation.top_p "
                            "0.9 would change nothing; set greedy false or the filters off")
    GenerateSamplingConfig(top_k=3, top_p=0.9, min_p=0.1).validate()
    assert filters_said(GenerationConfig(top_k=3, min_p=0.1)) == "generation.top_k 3, generation.min_p 0.1"
