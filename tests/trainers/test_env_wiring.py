"""Environments wired into `fourfold ppo` and `fourfold reinforce` (issue 31): a single-turn
environment whose reward is the reward function gives exactly the plain reward-function run
(metrics, samples' scores, weights), multi-turn runs with a critic and with K trajectories a row
train and log env/* and turn samples, and the env section is refused with one line where it is
not supported."""
import json
import random

import pytest
import torch

from fourfold.config import PPOConfig, ReinforceConfig, load_config
from fourfold.errors import ConfigError
from fourfold.reporting import documented, read_metrics

RULES = '''
def reward(prompts, responses):
    return [float(len(r.split()) % 3) - 0.5 * float("w1" in r) for r in responses]
'''

ENVS = '''
import rules


class OneTurn:
    """The reward function as a one-turn environment: the prompt, then one response scored."""

    def __init__(self, row):
        self.prompt = row["prompt"]

    def reset(self):
        return self.prompt

    def step(self, action):
        return "", rules.reward([self.prompt], [action])[0], True


def one_turn(row):
    return OneTurn(row)


class Echo:
    """Three turns: each reply is the row's `secret` word; saying it scores 1, else 0."""

    def __init__(self, row):
        self.secret, self.turn = row["secret"], 0

    def reset(self):
        return "w3 w4"

    def step(self, action):
        self.turn += 1
        return " " + self.secret, float(self.secret in action.split()), False


def echo(row):
    return Echo(row)
'''


def _prompts(path, n=32, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            words = " ".join(f"w{rng.randrange(60)}" for _ in range(rng.randrange(2, 5)))
            f.write(json.dumps({"prompt": words, "secret": f"w{rng.randrange(60)}", "idx": i}) + "\n")
    return path


@pytest.fixture
def files(tmp_path, monkeypatch):
    (tmp_path / "rules.py").write_text(RULES)
    (tmp_path / "envs.py").write_text(ENVS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path, _prompts(tmp_path / "p.jsonl")


def _cfg(tiny_lm, out, prompts, cls=PPOConfig, **extra):
    over = {"model.policy": tiny_lm / "sft", "data.prompts": prompts, "generation.max_new_tokens": 6,
            "run.output_dir": out, "run.progress": False, "run.device": "cpu", "run.samples_every": 1}
    if cls is PPOConfig:
        over.update({"ppo.iterations": 2, "ppo.rollout_batch_size": 8, "ppo.minibatch_size": 4, "ppo.ppo_epochs": 2,
                     "ppo.lr": 1e-3})  # a critic (gae) starts from the policy: no reward model
    else:
        over.update({"reinforce.iterations": 2, "reinforce.rollout_batch_size": 8, "reinforce.lr": 1e-3})
    over.update(extra)
    return load_config(cls, None, [f"{k}={v}" for k, v in over.items()])


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _same_run(plain_dir, env_dir, iterations: int = 2):
    """Every metric of the plain run (timings aside) equal in the environment run, the samples'
    scores equal, the final weights equal."""
    plain, env = read_metrics(plain_dir / "metrics.jsonl"), read_metrics(env_dir / "metrics.jsonl")
    assert len(plain) == len(env) == iterations
    for p, e in zip(plain, env):
        keys = [k for k in p if not k.startswith("time/")]
        assert {k: p[k] for k in keys} == {k: e[k] for k in keys}
        assert e["env/turns_mean"] == 1.0 and e["env/done_frac"] == 1.0 and e["env/return_mean"] == p["reward/score_mean"]
    ps, es = _lines(plain_dir / "samples.jsonl"), _lines(env_dir / "samples.jsonl")
    assert [s["score"] for s in ps] == [s["return"] for s in es]
    assert [s["response"] for s in ps] == [s["turns"][0]["action"] for s in es]
    from safetensors.torch import load_file

    a, b = load_file(plain_dir / "policy" / "model.safetensors"), load_file(env_dir / "policy" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("stage", ["ppo", "grpo", "reinforce"])
def test_a_one_turn_environment_is_the_reward_function_run_exactly(tiny_lm, files, stage):
    tmp, prompts = files
    cls = ReinforceConfig if stage == "reinforce" else PPOConfig
    extra = {"ppo.advantage": "grpo", "ppo.samples_per_prompt": 4} if stage == "grpo" else {}
    if cls is ReinforceConfig:
        from fourfold.trainers.reinforce import train
    else:
        from fourfold.trainers.ppo import train
    train(_cfg(tiny_lm, tmp / "plain", prompts, cls, **{"model.reward_fn": f"{tmp / 'rules.py'}:reward", **extra}))
    train(_cfg(tiny_lm, tmp / "env", prompts, cls, **{"env.factory": f"{tmp / 'envs.py'}:one_turn",
                                                       "env.max_tokens": 64, "env.max_turns": 1, **extra}))
    _same_run(tmp / "plain", tmp / "env")


def test_a_one_turn_environment_is_the_function_run_when_responses_end_early(tiny_lm, files):
    """12 tokens a response, so that some responses end at EOS before the limit (checked), GRPO over
    4 iterations of 4 minibatches: the one rollout builds the same tensors from an environment as
    from the reward function, so metrics, samples and weights are equal (before the one rollout, the
    environment path's update differed here: grad norm 0.830709 against 0.830764 at iteration 1,
    weights 2.9e-2 apart after 4)."""
    from fourfold.trainers.ppo import train

    tmp, prompts = files
    extra = {"ppo.advantage": "grpo", "ppo.samples_per_prompt": 4, "ppo.iterations": 4, "ppo.minibatch_size": 2,
             "generation.max_new_tokens": 12}
    train(_cfg(tiny_lm, tmp / "plain", prompts, **{"model.reward_fn": f"{tmp / 'rules.py'}:reward", **extra}))
    train(_cfg(tiny_lm, tmp / "env", prompts, **{"env.factory": f"{tmp / 'envs.py'}:one_turn",
                                                 "env.max_tokens": 64, "env.max_turns": 1, **extra}))
    rows = read_metrics(tmp / "plain" / "metrics.jsonl")
    assert any(0 < r["rollout/no_eos_share"] < 1 for r in rows)  # some rows end early, some at the limit
    _same_run(tmp / "plain", tmp / "env", iterations=4)


@pytest.mark.parametrize("advantage", ["gae", "rloo"])
def test_a_multi_turn_run_trains_and_logs_turns(tiny_lm, files, advantage):
    """Three turns with observations between them, with the critic (GAE over the policy's tokens)
    and with K = 4 trajectories a row (RLOO: each trajectory its own environment)."""
    from fourfold.trainers.ppo import train

    tmp, prompts = files
    extra = {"ppo.samples_per_prompt": 4} if advantage == "rloo" else {}
    out = tmp / advantage
    train(_cfg(tiny_lm, out, prompts, **{"env.factory": f"{tmp / 'envs.py'}:echo", "env.max_turns": 3,
                                         "env.max_tokens": 48, "ppo.advantage": advantage, **extra}))
    rows = read_metrics(out / "metrics.jsonl")
    assert len(rows) == 2 and all(documented(k) for k in rows[0] if k != "step")
    for r in rows:
        assert r["env/turns_mean"] == 3.0 and r["env/truncated_frac"] == 1.0
        assert r["env/observation_tokens_mean"] == 2.0  # the secret after turns 1 and 2 (not after the last)
    assert ("value/explained_variance" in rows[0]) == (advantage == "gae")
    (sample, *_) = _lines(out / "samples.jsonl")
    turns = sample["turns"]
    assert len(turns) == 3 and all("reward" in t for t in turns)
    assert [t.get("observation") for t in turns][:2] == [turns[0]["observation"]] * 2 and "observation" not in turns[2]
    assert sample["truncated"] and not sample["done"]
    assert (out / "critic").exists() == (advantage == "gae")


def test_a_multi_turn_reinforce_run(tiny_lm, files):
    from fourfold.trainers.reinforce import train

    tmp, prompts = files
    out = tmp / "reinforce"
    train(_cfg(tiny_lm, out, prompts, ReinforceConfig, **{"env.factory": f"{tmp / 'envs.py'}:echo",
                                                          "env.max_turns": 2, "env.max_tokens": 40}))
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["env/turns_mean"] for r in rows] == [2.0, 2.0]
    assert all(r["policy/loss"] == r["policy/loss"] for r in rows)  # finite


@pytest.mark.parametrize("stage", ["ppo", "reinforce"])
def test_a_multi_turn_run_on_the_static_engine_is_the_eager_run(tiny_lm, files, stage):
    """generation.engine: static with env.factory: the turns on the static engine's cache (kept
    across turns) train and log env/*, and give the eager engine's run: the env/* metrics (tokens
    and rewards) exactly, the same turn samples, every other metric of the first iteration within
    float rounding (the engines' log-probs agree to ~1e-6); after one Adam step the runs' weights
    differ by more than that (Adam's step on a gradient entry near 0 is about +-lr whatever its
    rounding), so the second iteration's are compared at 2%."""
    tmp, prompts = files
    cls = ReinforceConfig if stage == "reinforce" else PPOConfig
    if cls is ReinforceConfig:
        from fourfold.trainers.reinforce import train
    else:
        from fourfold.trainers.ppo import train
    over = {"env.factory": f"{tmp / 'envs.py'}:echo", "env.max_turns": 3, "env.max_tokens": 40}
    for engine in ("eager", "static"):
        train(_cfg(tiny_lm, tmp / engine, prompts, cls, **{**over, "generation.engine": engine}))
    eager, static = read_metrics(tmp / "eager" / "metrics.jsonl"), read_metrics(tmp / "static" / "metrics.jsonl")
    assert len(static) == 2 and all(documented(k) for k in static[0] if k != "step")
    for e, s, rel in zip(eager, static, (1e-5, 2e-2)):
        assert e.keys() == s.keys()
        assert {k: v for k, v in s.items() if k.startswith("env/")} == {k: v for k, v in e.items() if k.startswith("env/")}
        assert s["env/turns_mean"] == 3.0
        for k in e:
            if not k.startswith(("time/", "env/")):
                assert s[k] == pytest.approx(e[k], rel=rel, abs=1e-5), k
    assert [r["turns"] for r in _lines(tmp / "static" / "samples.jsonl")] == \
        [r["turns"] for r in _lines(tmp / "eager" / "samples.jsonl")]


def test_policy_returns_sum_the_later_policy_rewards_across_observations():
    """REINFORCE's one returns-to-go (core.turns.policy_returns), over an environment's policy tokens."""
    from fourfold.core import Rollout
    from fourfold.core.turns import policy_returns

    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]])
    rewards = torch.tensor([[0.5, 1.0, 9.0, 9.0, 0.0, 2.0, 9.0]])  # 9 off the policy tokens: never read
    r = Rollout(actions=torch.zeros(1, 7, dtype=torch.long), mask=mask, logprobs=torch.zeros(1, 7),
                values=torch.zeros(1, 7), rewards=rewards, ref_logprobs=torch.zeros(1, 7), scores=torch.zeros(1),
                context={})
    assert policy_returns(r.rewards, r.mask).tolist() == [[3.5, 3.0, 0.0, 0.0, 2.0, 2.0, 0.0]]


def test_dapo_shaping_applies_to_a_multi_turn_run(tiny_lm, files, monkeypatch):
    """filter_groups, overlong_buffer and mask_truncated on the three-turn Echo world (GRPO, K = 4):
    the run trains and logs each; the overlong penalty is DAPO's on each trajectory's policy tokens
    against the trajectory budget (4 tokens x 3 turns = 12), the masked share is the share of rows
    whose last turn ran out of tokens (no EOS), and the kept batch keeps rollout_batch_size rows."""
    from fourfold.core import overlong_penalty
    from fourfold.trainers import ppo, practice

    tmp, prompts = files
    seen = []
    real_shape, real_mask = practice.shape_scores, practice.mask_truncated

    def shape(rollout, algo, limit):
        seen.append(("shape", rollout.mask.sum(1).clone(), limit, real_shape(rollout, algo, limit)[1]))
        return real_shape(rollout, algo, limit)

    def mask(rollout, finished):
        out = real_mask(rollout, finished)
        seen.append(("mask", finished.clone(), out[0].mask.sum(1).clone(), out[1]))
        return out

    monkeypatch.setattr(ppo, "shape_scores", shape)
    monkeypatch.setattr(ppo, "mask_truncated", mask)
    extra = {"env.factory": f"{tmp / 'envs.py'}:echo", "env.max_turns": 3, "env.max_tokens": 64,
             "generation.max_new_tokens": 4, "ppo.advantage": "grpo", "ppo.samples_per_prompt": 4, "ppo.kl_in": "loss",
             "ppo.filter_groups": "true", "ppo.filter_groups_max_batches": 3, "ppo.overlong_buffer": 4,
             "ppo.overlong_penalty": 1.0, "ppo.mask_truncated": "true", "ppo.iterations": 3}
    ppo.train(_cfg(tiny_lm, tmp / "dapo", prompts, **extra))
    rows = read_metrics(tmp / "dapo" / "metrics.jsonl")
    assert len(rows) == 3
    for r in rows:
        assert r["env/turns_mean"] > 1 and 1 <= r["reward/filter_batches"] <= 3 and r["reward/filtered_groups"] >= 0
        assert r["reward/overlong_penalty_mean"] <= 0 and 0 <= r["rollout/masked_truncated_share"] <= 1
    shapes, masks = [x for x in seen if x[0] == "shape"], [x for x in seen if x[0] == "mask"]
    assert len(shapes) == len(masks) == 3
    for (_, lengths, limit, metrics), (_, finished, kept, masked) in zip(shapes, masks):
        assert limit == 12 and lengths.numel() == 8  # the kept batch: rollout_batch_size rows
        want = overlong_penalty(lengths, 12, 4, 1.0)
        assert metrics["reward/overlong_penalty_mean"] == pytest.approx(float(want.mean()))
        assert masked["rollout/masked_truncated_share"] == pytest.approx(1.0 - float(finished.float().mean()))
        assert bool((kept[~finished] == 0).all()) and bool((kept[finished] > 0).all())
    assert any(float(overlong_penalty(x[1], 12, 4, 1.0).min()) < 0 for x in shapes)  # the penalty bit somewhere
    assert any(m[3]["rollout/masked_truncated_share"] > 0 for m in masks)  # some trajectory was cut mid-turn
    assert any(r["reward/filtered_groups"] > 0 for r in rows)  # and some group of equal returns dropped
    print({k: [r[k] for r in rows] for k in ("reward/filtered_groups", "reward/filter_batches",
                                               "reward/overlong_penalty_mean", "rollout/masked_truncated_share")})


def test_an_environment_with_a_weighted_reward_function_beside_it(tiny_lm, files):
    """The Echo world's turn rewards at env.reward_weight 0.5 plus a reward function (weight 2) on
    each whole trajectory, with filter_groups: both parts are logged (reward/env_mean,
    reward/reward_mean), every sample's score is the weighted sum of its logged parts, and the
    metrics' score is the parts' weighted mean."""
    from fourfold.trainers.ppo import train

    tmp, prompts = files
    extra = {"env.factory": f"{tmp / 'envs.py'}:echo", "env.max_turns": 3, "env.max_tokens": 64, "env.reward_weight": 0.5,
             "model.reward_fns": f"[{{fn: '{tmp / 'rules.py'}:reward', weight: 2.0}}]", "ppo.advantage": "grpo",
             "ppo.samples_per_prompt": 4, "ppo.kl_in": "loss", "ppo.filter_groups": "true", "ppo.iterations": 2}
    train(_cfg(tiny_lm, tmp / "both", prompts, **extra))
    rows = read_metrics(tmp / "both" / "metrics.jsonl")
    for r in rows:
        assert {"reward/env_mean", "reward/reward_mean", "env/return_mean"} <= r.keys()
        assert r["reward/env_mean"] == pytest.approx(r["env/return_mean"])  # the part is logged unweighted
    first = rows[0]  # filter_groups' kept batch is the first rollout's groups, refilled; the parts are the first's
    samples = _lines(tmp / "both" / "samples.jsonl")
    assert samples and all(set(s["parts"]) == {"env", "reward"} for s in samples)
    for s in samples:
        assert s["score"] == pytest.approx(0.5 * s["parts"]["env"] + 2.0 * s["parts"]["reward"], abs=1e-5)
        assert s["parts"]["env"] == pytest.approx(s["return"], abs=1e-6)
    assert any(s["parts"]["reward"] != 0 for s in samples) and first["reward/filter_batches"] >= 1


@pytest.mark.parametrize("over, key", [
    ({"model.reward_fn": "rules.py:env"}, "model.reward_fn: named 'env', the environment's own part"),
    ({"env.reward_weight": "nan"}, "env.reward_weight: must be a finite number"),
    ({"generation.missing_eos_score": -1.0}, "generation.missing_eos_score: not applied with env.factory"),
    ({"model.critic_init": "reward"}, "model.critic_init: 'reward' needs model.reward"),
    ({"env.max_turns": 0}, "env.max_turns: must be >= 1"),
    ({"env.factory": "nocolon"}, "env.factory: 'nocolon': expected"),
    ({"ppo.overlong_buffer": 13, "generation.max_new_tokens": 4, "env.max_turns": 3},
     "ppo.overlong_buffer: 13 is more than the trajectory budget 12 (generation.max_new_tokens x env.max_turns"),
])
def test_the_env_section_is_refused_with_one_line_where_unsupported(over, key):
    base = {"model.policy": "p", "data.prompts": "f.jsonl", "env.factory": "envs.py:make_env",
            "model.critic_init": "policy"}
    base.update(over)
    with pytest.raises(ConfigError, match="^command line: " + key.replace("(", r"\(").replace(")", r"\)")) as e:
        load_config(PPOConfig, None, [f"{k}={v}" for k, v in base.items()])
    assert "\n" not in str(e.value)


def test_env_defaults_keep_the_single_turn_config():
    cfg = load_config(PPOConfig, None, ["model.policy=p", "model.reward_fn=r.py:f", "data.prompts=f.jsonl",
                                         "model.critic_init=policy"])
    assert cfg.env.factory is None
    with pytest.raises(ConfigError, match="model.reward: no reward"):
        load_config(ReinforceConfig, None, ["model.policy=p", "data.prompts=f.jsonl"])
    assert load_config(ReinforceConfig, None, ["model.policy=p", "data.prompts=f.jsonl", "env.factory=e.py:f"]).env.factory


def test_an_env_key_without_a_factory_is_refused_not_ignored():
    with pytest.raises(ConfigError, match="^command line: env.max_turns: set, and env.factory is null"):
        load_config(ReinforceConfig, None, ["model.policy=p", "model.reward_fn=r.py:f", "data.prompts=f.jsonl",
                                            "env.max_turns=2"])


@pytest.mark.parametrize("critic_mode", ["separate", "adapter"])
def test_a_lora_policy_trains_against_an_environment(tiny_lm, files, critic_mode):
    """LoRA (the reference = the base with adapters off; the critic a full copy or an adapter on the
    same base): a multi-turn PPO run moves the adapters and logs env/*."""
    from fourfold.trainers.ppo import train

    tmp, prompts = files
    out = tmp / f"lora-{critic_mode}"
    train(_cfg(tiny_lm, out, prompts, **{"env.factory": f"{tmp / 'envs.py'}:echo", "env.max_turns": 2,
                                         "env.max_tokens": 40, "model.lora.r": 4, "model.lora.alpha": 8,
                                         "model.critic_mode": critic_mode}))
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["env/turns_mean"] for r in rows] == [2.0, 2.0]
    assert all(r["policy/grad_norm"] > 0 for r in rows)
    assert (out / "policy").exists()


def test_the_lookup_examples_load():
    from pathlib import Path

    from fourfold.config import SFTConfig

    root = Path(__file__).resolve().parents[2] / "examples"
    grpo = load_config(PPOConfig, root / "lookup_grpo.yaml", [])
    assert grpo.env.factory == "fourfold.tasks.lookup:make_env" and grpo.ppo.advantage == "grpo"
    assert load_config(SFTConfig, root / "lookup_sft.yaml", []).data.assistant_turns == "all"


def test_a_task_probe_is_refused_with_one_line(tiny_lm, files):
    from fourfold.trainers.ppo import train

    tmp, prompts = files
    over = {"env.factory": f"{tmp / 'envs.py'}:echo", "env.max_tokens": 40}
    with pytest.raises(ConfigError, match="^data.task: a task's probe measures single responses"):
        train(_cfg(tiny_lm, tmp / "probe", prompts, **over), probe=lambda p, r: {})


def test_an_environment_run_resumed_is_the_uninterrupted_run(tiny_lm, files):
    """The prompt stream's position and the per-row noise carry the environments' rows: 2
    iterations, then resumed to 4, give the 4-iteration run's metrics and weights."""
    from safetensors.torch import load_file

    from fourfold.trainers.ppo import train

    tmp, prompts = files
    over = {"env.factory": f"{tmp / 'envs.py'}:echo", "env.max_turns": 2, "env.max_tokens": 40,
            "ppo.lr_schedule": "constant", "run.save_every": 1, "run.samples_every": 0}
    train(_cfg(tiny_lm, tmp / "full", prompts, **{**over, "ppo.iterations": 4}))
    train(_cfg(tiny_lm, tmp / "cut", prompts, **{**over, "ppo.iterations": 2}))
    train(_cfg(tiny_lm, tmp / "cut", prompts, **{**over, "ppo.iterations": 4, "run.resume": True}))
    full, cut = read_metrics(tmp / "full" / "metrics.jsonl"), read_metrics(tmp / "cut" / "metrics.jsonl")
    drop = ("time/",)
    assert [{k: v for k, v in r.items() if not k.startswith(drop)} for r in full] == \
        [{k: v for k, v in r.items() if not k.startswith(drop)} for r in cut]
    a, b = load_file(tmp / "full" / "policy" / "model.safetensors"), load_file(tmp / "cut" / "policy" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
