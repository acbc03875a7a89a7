"""The PPO section's estimator keys (advantage, samples_per_prompt, kl_in, loss_agg, clip_eps_low/high):
the names the config repeats match fourfold.core's registry, one-line errors, which runs load a critic."""
import typing
from pathlib import Path

import pytest
import torch

from fourfold.config import ConfigError, PPOAlgoConfig, PPOConfig, load_config
from fourfold.config.ppo import ADVANTAGE_NAMES, CRITIC_ADVANTAGES, ZERO_AT_ONE_SAMPLE
from fourfold.core import ADVANTAGE_ESTIMATORS, LOSS_AGG_MODES, AdvantageInputs

ROOT = Path(__file__).resolve().parents[1]
OK = ["model.policy=sft", "model.reward=rm", "data.prompts=p.jsonl"]
FN = ["model.policy=sft", "model.reward_fn=rewards.py:score", "data.prompts=p.jsonl"]


def err(overrides):
    with pytest.raises(ConfigError) as e:
        load_config(PPOConfig, None, overrides)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_the_config_names_the_registered_estimators():
    assert sorted(ADVANTAGE_NAMES) == sorted(ADVANTAGE_ESTIMATORS)
    assert sorted(CRITIC_ADVANTAGES) == sorted(n for n, fn in ADVANTAGE_ESTIMATORS.items() if fn.needs_critic)
    assert typing.get_args(typing.get_type_hints(PPOAlgoConfig)["loss_agg"]) == LOSS_AGG_MODES


def test_zero_at_one_sample_names_the_estimators_that_cannot_learn_from_one_sample():
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(6, 5)
    inputs = AdvantageInputs(torch.randn(6, 5, generator=g), mask, torch.randn(6, 5, generator=g), group_size=1)
    all_zero = {name for name, fn in ADVANTAGE_ESTIMATORS.items() if torch.all(fn(inputs)[0] == 0)}
    assert all_zero == set(ZERO_AT_ONE_SAMPLE)


@pytest.mark.parametrize("overrides,fragment", [
    (["ppo.advantage=gpro"], "ppo.advantage: unknown estimator 'gpro' (did you mean 'grpo'?); known: gae, grpo, dr_grpo"),
    (["ppo.advantage=ppo"], "ppo.advantage: unknown estimator 'ppo'; known:"),
    (["ppo.samples_per_prompt=3"], "ppo.samples_per_prompt: 3 does not divide rollout_batch_size=64"),
    (["ppo.samples_per_prompt=0"], "ppo.samples_per_prompt: must be >= 1"),
    (["ppo.advantage=grpo"], "ppo.samples_per_prompt: advantage=grpo needs >= 2 samples per prompt"),
    (["ppo.advantage=dr_grpo"], "ppo.samples_per_prompt: advantage=dr_grpo needs >= 2 samples per prompt"),
    (["ppo.advantage=rloo", "ppo.whiten_rewards=true"], "ppo.whiten_rewards: applies to advantage=gae only"),
    (["ppo.kl_in=loss", "ppo.adaptive_kl=true"], "ppo.adaptive_kl: steers the KL in the reward"),
    (["ppo.kl_in=both"], "ppo.kl_in: expected one of 'reward', 'loss'"),
    (["ppo.loss_agg=seq-mean"], "ppo.loss_agg: expected one of 'token-mean', 'seq-mean-token-mean'"),
    (["ppo.clip_eps_high=0"], "ppo.clip_eps_high: must be > 0 or null"),
    (["ppo.clip_eps_low=-0.1"], "ppo.clip_eps_low: must be > 0 or null"),
    (["ppo.use_critic=false", "ppo.whiten_advantages=false"],
     "ppo.use_critic: false runs advantage=reinforce_pp, whose returns are whitened"),
])
def test_impossible_estimator_settings_are_one_line_errors(overrides, fragment):
    assert fragment in err(OK + overrides)


def test_critic_free_estimators_load_no_critic_and_need_no_critic_init():
    # critic_init unset: a critic starts from the reward model when there is one, else from the policy
    assert load_config(PPOConfig, None, OK).model.critic_init == "reward"
    assert load_config(PPOConfig, None, FN).model.critic_init == "policy"
    assert "model.critic_init: 'reward' needs model.reward" in err(FN + ["model.critic_init=reward"])
    for extra in (["ppo.advantage=grpo", "ppo.samples_per_prompt=4"], ["ppo.advantage=rloo"],
                  ["ppo.advantage=reinforce_pp"], ["ppo.use_critic=false"]):
        cfg = load_config(PPOConfig, None, FN + extra)
        assert not cfg.ppo.loads_critic and cfg.model.critic_init is None, extra
    assert load_config(PPOConfig, None, OK).ppo.loads_critic
    # use_critic does not bring a critic to an estimator that reads none
    assert not PPOAlgoConfig(advantage="reinforce_pp", use_critic=True).loads_critic


def test_the_unset_critic_init_is_the_start_the_plan_builds():
    """Validation writes the default's choice into the config, so the role plan (and the saved
    config.yaml) read 'reward' beside a reward model and 'policy' without one, as before the
    default was null; a critic directory is used as it is."""
    from fourfold.models.plan import plan_roles

    critic = {name: plan_roles("ppo", load_config(PPOConfig, None, over)).role("critic")
              for name, over in (("rm", OK), ("fn", FN), ("dir", OK + ["model.critic=c"]))}
    assert [(c.start, c.key) for c in critic.values()] == [("copy-reward", "model.reward"),
                                                          ("zero-head", "model.policy"), ("load", "model.critic")]


NO_CRITIC = [
    ("ppo", ["ppo.advantage=grpo", "ppo.samples_per_prompt=4"], "ppo.advantage=grpo has no critic"),
    ("ppo", ["ppo.advantage=dr_grpo", "ppo.samples_per_prompt=4"], "ppo.advantage=dr_grpo has no critic"),
    ("ppo", ["ppo.advantage=rloo"], "ppo.advantage=rloo has no critic"),
    ("ppo", ["ppo.advantage=reinforce_pp"], "ppo.advantage=reinforce_pp has no critic"),
    ("ppo", ["ppo.use_critic=false"], "ppo.advantage=gae with use_critic=false (reinforce_pp) has no critic"),
    ("reinforce", [], "fourfold reinforce has no critic"),
]


@pytest.mark.parametrize("value", ["reward", "policy"])
@pytest.mark.parametrize("stage,extra,why", NO_CRITIC, ids=lambda x: x if isinstance(x, str) and "=" not in x else None)
def test_critic_init_without_a_critic_is_one_line_through_the_cli(capsys, stage, extra, why, value):
    """model.critic_init set where nothing reads it (a critic-free estimator, REINFORCE) is refused,
    as the other keys that would do nothing are: exit 2, one line naming the key and the estimator."""
    from fourfold.cli import main

    assert main([stage, *OK, *extra, f"model.critic_init={value}"]) == 2
    out, errors = capsys.readouterr()
    assert out == "" and errors == (f"fourfold {stage}: error: command line: model.critic_init: set to {value!r}, "
                                    f"and {why}: leave it unset\n")


@pytest.mark.parametrize("extra,printed", [([], "reward"), (["ppo.advantage=grpo", "ppo.samples_per_prompt=4"], "null")])
def test_the_default_critic_init_runs_gae_and_grpo_and_round_trips(capsys, tmp_path, extra, printed):
    """Unset, critic_init is accepted with gae and with grpo; --print-config shows the resolved
    start (null where there is no critic) and --config reads that file back to the same config."""
    from fourfold.cli import main

    assert main(["ppo", "--print-config", *OK, *extra]) == 0
    text = capsys.readouterr().out
    assert f"\n  critic_init: {printed}\n" in text
    (tmp_path / "c.yaml").write_text(text)
    assert main(["ppo", "--print-config", "--config", str(tmp_path / "c.yaml")]) == 0
    assert capsys.readouterr().out == text


def test_use_critic_false_is_the_reinforce_pp_estimator_in_the_config():
    """The config says which registered estimator a run computes; the trainer does not branch on
    use_critic. whiten_rewards (before the estimator) stays allowed there, as before."""
    table = {(adv, uc): PPOAlgoConfig(advantage=adv, use_critic=uc).estimator
             for adv in ADVANTAGE_NAMES for uc in (True, False)}
    assert table == {**{(a, uc): a for a in ADVANTAGE_NAMES for uc in (True, False)}, ("gae", False): "reinforce_pp"}
    cfg = load_config(PPOConfig, None, FN + ["ppo.use_critic=false", "ppo.whiten_rewards=true"]).ppo
    assert (cfg.advantage, cfg.estimator, cfg.loads_critic) == ("gae", "reinforce_pp", False)
    assert not ADVANTAGE_ESTIMATORS[cfg.estimator].needs_critic


def test_rollout_batch_size_stays_the_responses():
    cfg = load_config(PPOConfig, None, OK + ["ppo.advantage=grpo", "ppo.samples_per_prompt=8", "ppo.rollout_batch_size=32",
                                             "ppo.minibatch_size=8"])
    assert cfg.ppo.rollout_batch_size // cfg.ppo.samples_per_prompt == 4
    assert cfg.ppo.steps_per_iteration == 4 * 4  # minibatches count responses, as with one sample per prompt


@pytest.mark.parametrize("name,advantage,k,kl_in,loss_agg", [
    ("grpo", "grpo", 8, "loss", "seq-mean-token-mean"),
    ("rloo", "rloo", 4, "reward", "token-mean"),
    ("reinforce_pp", "reinforce_pp", 1, "reward", "token-mean"),
])
def test_estimator_examples_load(name, advantage, k, kl_in, loss_agg):
    ppo = load_config(PPOConfig, ROOT / "examples" / f"{name}.yaml").ppo
    assert (ppo.advantage, ppo.samples_per_prompt, ppo.kl_in, ppo.loss_agg) == (advantage, k, kl_in, loss_agg)
    assert not ppo.loads_critic


@pytest.mark.parametrize("stage", ["ppo", "reinforce"])
def test_a_correction_cap_without_a_correction_mode_is_one_line_through_the_cli(capsys, stage):
    """<stage>.rollout_correction_cap with rollout_correction none would do nothing: refused, exit 2,
    one line naming the key (issue 40, item 9; it was silently ignored); with a mode it is taken."""
    from fourfold.cli import main

    assert main([stage, *OK, f"{stage}.rollout_correction_cap=2"]) == 2
    out, errors = capsys.readouterr()
    assert out == "" and errors.count("\n") == 1
    assert errors.startswith(f"fourfold {stage}: error: command line: {stage}.rollout_correction_cap: set, "
                             f"and {stage}.rollout_correction is none"), errors
    assert main([stage, *OK, f"{stage}.rollout_correction_cap=2", f"{stage}.rollout_correction=token_tis",
                 "--print-config"]) == 0
    assert "rollout_correction_cap: 2" in capsys.readouterr().out


def test_gspo_with_a_token_level_clip_warns_once_through_the_cli(tiny_lm, tmp_path, capsys):
    """ppo.ratio_level=sequence with the default clip_eps 0.2 (which clips nothing at the sequence
    level) runs, with one warning line on stdout naming GSPO's sizes and nothing on stderr (issue 40,
    item 12: a warning, not a refusal, since a large clip is a choice a user may make on purpose)."""
    from fourfold.cli import main

    run = [f"model.policy={tiny_lm / 'sft'}", f"model.reward={tiny_lm / 'rm'}", f"data.prompts={tiny_lm / 'prompts.jsonl'}",
           "ppo.ratio_level=sequence", "ppo.iterations=1", "ppo.rollout_batch_size=4", "ppo.minibatch_size=4",
           "ppo.ppo_epochs=1", "generation.max_new_tokens=4", "run.device=cpu", "run.progress=false"]
    assert main(["ppo", *run, "--output-dir", str(tmp_path / "a")]) == 0
    out, errors = capsys.readouterr()
    warned = [line for line in out.splitlines() if "warning: ppo.ratio_level: sequence (GSPO) with a clip of 0.2" in line]
    assert len(warned) == 1 and "3e-4" in warned[0] and errors == "", (out, errors)
    assert main(["ppo", *run, "ppo.clip_eps=4e-4", "--output-dir", str(tmp_path / "b")]) == 0
    assert "ppo.ratio_level" not in capsys.readouterr().out
