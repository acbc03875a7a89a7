"""The sampler that runs ahead (rollout.max_staleness, fourfold.trainers.ahead): k = 0 is the
synchronous run; k >= 1 samples iteration i with the weights of update max(0, i - 1 - k) exactly,
deterministically, under PPO with a critic, GRPO and REINFORCE; the stale ratio; resume after SIGKILL."""
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fourfold.checkpoint.encoding import read_component
from fourfold.config import PPOConfig, ReinforceConfig, load_config
from fourfold.errors import ConfigError
from fourfold.reporting import is_timing_key, read_metrics


def _overrides(tiny_lm, out, stage="ppo", **extra):
    base = {"model.policy": tiny_lm / "sft", "model.reward_fn": f"{tiny_lm / 'reward_fn.py'}:reward",
            "data.prompts": tiny_lm / "prompts.jsonl", "generation.max_new_tokens": 8,
            "run.output_dir": out, "run.progress": False, "run.seed": 0, "run.threads": 1}
    if stage == "ppo":
        base.update({"model.critic_init": "policy", "ppo.iterations": 4, "ppo.rollout_batch_size": 8,
                     "ppo.minibatch_size": 4, "ppo.ppo_epochs": 2, "ppo.lr": 3e-3, "ppo.critic_lr": 1e-3})
    else:
        base.update({"reinforce.iterations": 4, "reinforce.rollout_batch_size": 8, "reinforce.lr": 3e-3,
                     "reinforce.baseline": "mean"})
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _run(tiny_lm, out, stage="ppo", **extra):
    """One in-process run; (metrics rows, samples.jsonl text, final policy weights)."""
    if stage == "ppo":
        from fourfold.trainers.ppo import train

        cfg = load_config(PPOConfig, None, _overrides(tiny_lm, out, stage, **extra))
    else:
        from fourfold.trainers.reinforce import train

        cfg = load_config(ReinforceConfig, None, _overrides(tiny_lm, out, stage, **extra))
    train(cfg)
    return (read_metrics(Path(out) / "metrics.jsonl"), (Path(out) / "samples.jsonl").read_text(),
            load_file(str(Path(out) / "policy" / "model.safetensors")))


def _comparable(rows):
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


def _same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_k0_is_the_default_synchronous_run(tiny_lm, tmp_path):
    """rollout.max_staleness=0 said explicitly is the default run bit for bit (metrics minus timing,
    samples, weights), and it logs none of the run-ahead metrics; k = 1 is another run."""
    rows, samples, weights = _run(tiny_lm, tmp_path / "default")
    rows0, samples0, weights0 = _run(tiny_lm, tmp_path / "k0", **{"rollout.max_staleness": 0})
    assert _comparable(rows0) == _comparable(rows) and samples0 == samples and _same_weights(weights0, weights)
    assert not any(k in r for r in rows for k in ("rollout/version_lag", "rollout/is_ess", "time/sampler_wait_s"))
    rows1, _, weights1 = _run(tiny_lm, tmp_path / "k1", **{"rollout.max_staleness": 1})
    # iteration 1 samples with version 0 in both: the same tokens (the snapshot's log-probs round apart
    # from the live module's by ~1e-7, generation.weights copy's float rounding)
    for key in ("rollout/tokens", "rollout/response_length", "reward/score_mean"):
        assert rows1[0][key] == rows[0][key], key
    assert rows1[0]["kl/k1"] == pytest.approx(rows[0]["kl/k1"], abs=1e-6) and rows1[0]["rollout/version_lag"] == 0.0
    assert _comparable(rows1)[1] != _comparable(rows)[1] and not _same_weights(weights1, weights)


@pytest.mark.parametrize("stage,extra", [
    ("ppo", {}),  # PPO with a critic (gae)
    ("ppo", {"ppo.advantage": "grpo", "ppo.samples_per_prompt": 2, "model.critic_init": "null"}),
    ("reinforce", {}),
])
def test_k1_runs_end_to_end_deterministically_with_the_lag_k(tiny_lm, tmp_path, stage, extra):
    """Two k = 1 runs are equal (metrics minus timing, samples, weights); the lag is min(i - 1, 1)
    (exactly 1 after the first iteration), and the IS weights' ESS is 1 at iteration 1 (the
    sampler's weights are the trainer's) and below 1 once stale."""
    extra = {**extra, "rollout.max_staleness": 1}
    a = _run(tiny_lm, tmp_path / "a", stage, **extra)
    b = _run(tiny_lm, tmp_path / "b", stage, **extra)
    assert _comparable(a[0]) == _comparable(b[0]) and a[1] == b[1] and _same_weights(a[2], b[2])
    rows = a[0]
    assert [r["rollout/version_lag"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    ess = [r["rollout/is_ess"] for r in rows]
    assert ess[0] == pytest.approx(1.0, abs=1e-9) and all(0 < e < 0.9999 for e in ess[1:]), ess


def test_k2_lags_by_two_after_warm_up(tiny_lm, tmp_path):
    rows, _, _ = _run(tiny_lm, tmp_path / "k2", **{"rollout.max_staleness": 2, "ppo.iterations": 5})
    assert [r["rollout/version_lag"] for r in rows] == [0.0, 1.0, 2.0, 2.0, 2.0]


def test_the_first_ratio_is_stale_under_engine_and_1_under_recompute(tiny_lm, tmp_path):
    """k = 1: with the sampler's log-probs as pi_old (old_logprobs engine) the first minibatch's
    ratio is pi_train / pi_behaviour, off 1 once the batch is a version old; with the proximal
    pi_old recomputed by the trainer it is exactly 1 (and decoupled PPO with token TIS runs)."""
    stale, _, _ = _run(tiny_lm, tmp_path / "engine", **{"rollout.max_staleness": 1, "ppo.old_logprobs": "engine"})
    dev = [r["policy/first_ratio_abs_dev"] for r in stale]
    assert dev[0] < 1e-5 and all(d > 1e-3 for d in dev[1:]), dev
    prox, _, _ = _run(tiny_lm, tmp_path / "recompute", **{"rollout.max_staleness": 1, "ppo.old_logprobs": "recompute",
                                                        "ppo.rollout_correction": "token_tis"})
    assert all(r["policy/first_ratio_abs_dev"] == 0.0 for r in prox)
    assert all(r["mismatch/is_weight_mean"] != 1.0 for r in prox[1:])


def test_static_engine_and_lora_run_ahead(tiny_lm, tmp_path):
    """The static engine's samples equal the eager one's at k = 1; a LoRA policy (its adapter merged
    into each snapshot) runs with the lag."""
    eager, eager_samples, _ = _run(tiny_lm, tmp_path / "eager", **{"rollout.max_staleness": 1, "ppo.iterations": 2})
    static, static_samples, _ = _run(tiny_lm, tmp_path / "static", **{"rollout.max_staleness": 1, "ppo.iterations": 2,
                                                                      "generation.engine": "static"})
    assert static_samples == eager_samples
    assert [r["rollout/tokens"] for r in static] == [r["rollout/tokens"] for r in eager]
    lora, _, _ = _run(tiny_lm, tmp_path / "lora", **{"rollout.max_staleness": 1, "ppo.iterations": 2,
                                                    "model.lora.r": 4, "model.lora.alpha": 8})
    assert [r["rollout/version_lag"] for r in lora] == [0.0, 1.0]


@pytest.mark.parametrize("extra,message", [
    ({"rollout.max_staleness": -1}, "rollout.max_staleness: must be >= 0 (0 = synchronous), got -1"),
])
def test_a_bad_staleness_is_one_line(tiny_lm, tmp_path, extra, message):
    with pytest.raises(ConfigError) as e:
        load_config(PPOConfig, None, _overrides(tiny_lm, tmp_path / "x", **extra))
    assert message in str(e.value) and "\n" not in str(e.value)


def _cli(args):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "fourfold.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_resume_after_sigkill_is_exact_with_batches_in_flight(tiny_lm, tmp_path):
    """k = 2, killed after the checkpoint of iteration 2 (two batches in flight, sampled with the
    weights of updates 0 and 1), resumed: the metrics rows and the final weights are the
    uninterrupted run's; resuming with another lag is one ConfigError line."""
    over = _overrides(tiny_lm, tmp_path / "full", **{"ppo.iterations": 5, "run.save_every": 1,
                                                     "run.keep_checkpoints": 10, "rollout.max_staleness": 2})
    p = _cli(["ppo", *over])
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out.decode()[-2000:]
    killed = [o.replace(str(tmp_path / "full"), str(tmp_path / "killed")) for o in over]
    p = _cli(["ppo", *killed, "ppo.iterations=5"])
    target = tmp_path / "killed" / "checkpoints" / "step-00000002"
    deadline = time.time() + 300
    while not target.exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert target.exists()
    # the tiny run may have gone on past step 2 before the kill landed: resume from step 2 whatever the race
    for later in sorted((tmp_path / "killed" / "checkpoints").glob("step-*")):
        if later.name > target.name:
            shutil.rmtree(later)
    state = read_component(target, "state")
    assert [(b["iteration"], b["version"]) for b in state["ahead"]["batches"]] == [(3, 0), (4, 1)]
    assert state["ahead"]["batches"][0]["result"]["samples"]["sequences"].dtype == torch.long
    p = _cli(["ppo", *[o for o in killed if "max_staleness" not in o], "rollout.max_staleness=1", "run.resume=true"])
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 2 and "rollout.max_staleness: 1, but the checkpoint resumed was written with 2" in out.decode()
    p = _cli(["ppo", *killed, "run.resume=true"])
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out.decode()[-2000:]
    full, rows = read_metrics(tmp_path / "full" / "metrics.jsonl"), read_metrics(tmp_path / "killed" / "metrics.jsonl")
    assert _comparable(rows) == _comparable(full) and len(rows) == 5
    a, b = load_file(str(tmp_path / "full" / "policy" / "model.safetensors")), \
        load_file(str(tmp_path / "killed" / "policy" / "model.safetensors"))
    assert _same_weights(a, b)


def test_bf16_auto_keeps_the_samplers_pi_old_when_stale(tiny_lm, tmp_path, capsys):
    """Under bf16-mixed a synchronous run's old_logprobs auto is recompute; with a sampler running
    ahead and no rollout_correction it is engine: a recomputed pi_old without a correction would make
    the first ratio exactly 1 and drop the staleness (miles PR #1829). With token_tis it is the
    decoupled objective: recompute, the first ratio 1, the weights off 1."""
    rows, _, _ = _run(tiny_lm, tmp_path / "auto", **{"rollout.max_staleness": 1, "ppo.iterations": 3,
                                                     "model.precision": "bf16-mixed"})
    assert "ppo.old_logprobs: auto = engine (rollout.max_staleness 1" in capsys.readouterr().out
    dev = [r["policy/first_ratio_abs_dev"] for r in rows]
    assert all(d > 1e-3 for d in dev[1:]), dev
    rows, _, _ = _run(tiny_lm, tmp_path / "tis", **{"rollout.max_staleness": 1, "ppo.iterations": 3,
                                                    "model.precision": "bf16-mixed", "ppo.rollout_correction": "token_tis"})
    assert [r["policy/first_ratio_abs_dev"] for r in rows] == [0.0] * 3
    assert all(r["mismatch/is_weight_mean"] != 1.0 for r in rows[1:])


def test_uncorrected_staleness_is_said(tiny_lm, tmp_path):
    """The warning of a stale run that nothing corrects: PPO's recompute without a correction and
    REINFORCE without one; none for engine, a correction, or k = 0."""
    from fourfold.trainers.practice import staleness_notes

    def notes(stage, **extra):
        cls = PPOConfig if stage == "ppo" else ReinforceConfig
        return staleness_notes(load_config(cls, None, _overrides(tiny_lm, tmp_path, stage, **extra)), stage)

    [line] = notes("ppo", **{"rollout.max_staleness": 2, "ppo.old_logprobs": "recompute"})
    assert line.startswith("rollout.max_staleness 2 without ppo.rollout_correction: ppo.old_logprobs: recompute")
    assert "set ppo.rollout_correction" in line
    [line] = notes("reinforce", **{"rollout.max_staleness": 1})
    assert "the REINFORCE gradient" in line and "set reinforce.rollout_correction" in line
    assert notes("ppo", **{"rollout.max_staleness": 1}) == []  # auto: engine
    assert notes("ppo", **{"rollout.max_staleness": 1, "ppo.rollout_correction": "token_tis"}) == []
    assert notes("reinforce", **{"rollout.max_staleness": 1, "reinforce.rollout_correction": "token_tis"}) == []
    assert notes("ppo", **{"ppo.old_logprobs": "recompute"}) == []


def test_a_run_ahead_extends_on_resume(tiny_lm, tmp_path):
    """--resume with more iterations: the run that wrote the checkpoint sampled nothing past its
    end, so the first k batches of the extension are sampled with the checkpoint's weights (a lag
    below k, logged as such); two extensions are equal."""
    for name in ("a", "b"):
        _run(tiny_lm, tmp_path / name, **{"rollout.max_staleness": 2, "ppo.iterations": 3})
        rows, samples, weights = _run(tiny_lm, tmp_path / name, **{"rollout.max_staleness": 2, "ppo.iterations": 6,
                                                                   "run.resume": "true"})
        if name == "a":
            first = rows, samples, weights
    assert [r["rollout/version_lag"] for r in rows] == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]
    assert _comparable(first[0]) == _comparable(rows) and first[1] == samples and _same_weights(first[2], weights)


ECHO = '''
class Echo:
    """Three turns: each reply is the row's `secret` word; saying it scores 1, else 0."""

    def __init__(self, row):
        self.secret = row["secret"]

    def reset(self):
        return "w3 w4"

    def step(self, action):
        return " " + self.secret, float(self.secret in action.split()), False


def echo(row):
    return Echo(row)
'''


def _env_run(tiny_lm, tmp_path, out, **extra):
    """A three-turn environment run (PPO with a critic), its metrics, samples and weights."""
    import json
    import random

    if not (tmp_path / "echo_envs.py").exists():
        (tmp_path / "echo_envs.py").write_text(ECHO)
        rng = random.Random(0)
        (tmp_path / "secret.jsonl").write_text("".join(
            json.dumps({"prompt": f"w{rng.randrange(60)} w{rng.randrange(60)}", "secret": f"w{rng.randrange(60)}"}) + "\n"
            for _ in range(32)))
    env = {"env.factory": f"{tmp_path / 'echo_envs.py'}:echo", "env.max_turns": 3, "env.max_tokens": 40,
           "data.prompts": tmp_path / "secret.jsonl", "model.reward_fn": "null", "generation.max_new_tokens": 5,
           "ppo.iterations": 3, "run.samples_every": 1}
    return _run(tiny_lm, out, **{**env, **extra})


def test_an_environment_run_ahead_is_deterministic_with_the_lag(tiny_lm, tmp_path):
    """k = 1 with a three-turn environment: the sampler runs whole episodes with its snapshot (the
    environments made and stepped in its thread), the trainer scores them. Two runs are equal
    (metrics minus timing, samples, weights); the lag is exactly min(i - 1, 1); iteration 1
    samples with version 0, so its turns are the synchronous run's."""
    sync, _, _ = _env_run(tiny_lm, tmp_path, tmp_path / "sync")
    a = _env_run(tiny_lm, tmp_path, tmp_path / "a", **{"rollout.max_staleness": 1})
    b = _env_run(tiny_lm, tmp_path, tmp_path / "b", **{"rollout.max_staleness": 1})
    assert _comparable(a[0]) == _comparable(b[0]) and a[1] == b[1] and _same_weights(a[2], b[2])
    rows = a[0]
    assert [r["rollout/version_lag"] for r in rows] == [0.0, 1.0, 1.0]
    assert all(r["env/turns_mean"] == 3.0 for r in rows)
    for key in ("rollout/tokens", "env/return_mean", "env/observation_tokens_mean"):
        assert rows[0][key] == sync[0][key], key
    assert rows[1]["rollout/is_ess"] < 0.9999 and _comparable(rows)[1] != _comparable(sync)[1]


def test_an_environment_run_ahead_resumes_exactly(tiny_lm, tmp_path):
    """k = 2, resumed from iteration 1's checkpoint (two episode batches in flight, their
    trajectories in the checkpoint): the uninterrupted run's metrics and weights."""
    over = {"rollout.max_staleness": 2, "ppo.iterations": 4, "run.save_every": 1, "run.keep_checkpoints": 10}
    full = _env_run(tiny_lm, tmp_path, tmp_path / "full", **over)
    _env_run(tiny_lm, tmp_path, tmp_path / "cut", **over)
    for later in ("step-00000002", "step-00000003", "step-00000004"):
        shutil.rmtree(tmp_path / "cut" / "checkpoints" / later)
    state = read_component(tmp_path / "cut" / "checkpoints" / "step-00000001", "state")
    assert [(b["iteration"], b["version"]) for b in state["ahead"]["batches"]] == [(2, 0), (3, 0)]
    assert len(state["ahead"]["batches"][0]["result"]["trajectories"]) == 8
    resumed = _env_run(tiny_lm, tmp_path, tmp_path / "cut", **over, **{"run.resume": "true"})
    assert _comparable(resumed[0]) == _comparable(full[0]) and _same_weights(resumed[2], full[2])


@pytest.mark.parametrize("engine", ["eager", "static"])
def test_rows_sampled_apart_and_padded_are_the_batch_sampled_whole(engine):
    """What a rank's sampler thread does under torchrun (no stop check across ranks): each part of
    the rows sampled alone stops when its own rows end; padded to the longest part's responses
    (pad_responses) and concatenated, the parts are the whole batch sampled at once (tokens, masks,
    finished flags exactly, the pads included; log-probs and entropies to float rounding, as a batch
    of 2 rows rounds apart from one of 8), with rows that stop early at different steps (the eager
    and static engines)."""
    from types import SimpleNamespace

    from fourfold.rollout.engine import make_engine
    from fourfold.rollout.noise import RowNoise
    from fourfold.rollout.sampling import Samples
    from fourfold.trainers.rollouts import pad_responses
    from tests.rollout.test_engine import PAD, _frequent_token, _model, _prompts

    model, (ids, mask), T = _model("llama"), _prompts(rows=8), 10
    eos = _frequent_token(model, ids, mask, T)
    eng = make_engine(SimpleNamespace(engine=engine, weights="live", compile=False, stop_check_every=3))

    def run(rows):
        return eng(model, ids[rows], mask[rows], max_new_tokens=T, temperature=0.5, eos_token_id=eos,
                   pad_token_id=PAD, noise=RowNoise(1, 2).uniforms(range(rows.start, rows.stop), T), sync_stop=False)

    whole, parts = run(slice(0, 8)), [run(slice(0, 2)), run(slice(2, 4)), run(slice(4, 8))]
    assert parts[1].n_response < parts[0].n_response == whole.n_response  # rows 2, 3 stop early (lengths 5, 4)
    width = max(h.n_response for h in parts)
    padded = [pad_responses(h, width, PAD) for h in parts]
    for f in dataclasses.fields(Samples):
        got = getattr(whole, f.name)
        if got is not None:
            cat = torch.cat([getattr(p, f.name) for p in padded])
            assert torch.equal(cat, got) if not got.is_floating_point() or f.name.endswith("mask") else \
                torch.allclose(cat, got, rtol=0, atol=1e-5), f.name


def test_filter_groups_refills_with_the_trainers_weights(tiny_lm, tmp_path):
    """k = 1 with DAPO's filter_groups (GRPO, groups of 2, the reward mostly 0: many zero-spread
    groups): the iteration's first batch is the sampler's (lag min(i - 1, 1)), the further ones are
    sampled then by the trainer; two runs are equal, and some iteration did draw further batches."""
    extra = {"rollout.max_staleness": 1, "ppo.advantage": "grpo", "ppo.samples_per_prompt": 2,
             "model.critic_init": "null", "ppo.filter_groups": "true", "ppo.filter_groups_max_batches": 3}
    a = _run(tiny_lm, tmp_path / "a", **extra)
    b = _run(tiny_lm, tmp_path / "b", **extra)
    assert _comparable(a[0]) == _comparable(b[0]) and a[1] == b[1] and _same_weights(a[2], b[2])
    assert [r["rollout/version_lag"] for r in a[0]] == [0.0, 1.0, 1.0, 1.0]
    assert max(r["reward/filter_batches"] for r in a[0]) > 1, [r["reward/filter_batches"] for r in a[0]]
