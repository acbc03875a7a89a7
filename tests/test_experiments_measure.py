"""Issue 39's measurement arms of `fourfold experiments` (fourfold.apps.experiments.arms.MEASURE_ARMS):
REINFORCE with each baseline at PPO's optimizer steps per batch, PPO with the gradient SNR logged,
PPO where the ratios get large with and without dual-clip. Their configs, that they are not default
arms, and that the older arms' run keys stay what they were."""
import dataclasses
from pathlib import Path

from fourfold.apps.experiments import build_arms, models_in_memory, run_config, run_key
from fourfold.apps.experiments.arms import DUAL_CLIP, MEASURE_ARMS, STRESS_EPOCHS, STRESS_LR_MULTIPLIER
from fourfold.apps.experiments.config import EXPERIMENT_ARMS, ExperimentsConfig
from fourfold.apps.experiments.results import CURVE_KEYS
from fourfold.config import PPOConfig, ReinforceConfig, load_config, save_config, validate_tree

MAIN_KEYS = {  # as tests/test_experiments_practice.py: the older arms' keys at commit 01a2e02
    "ppo": "264aa5055c11ced0", "reinforce-lr1x": "1c753bf452bec6eb", "grpo": "3503c91558c55c8b",
    "ppo-1epoch": "b4f4dd618926a58c",
}


def test_measure_arms_configs(tmp_path):
    cfg = ExperimentsConfig(arms=["ppo", "reinforce", *MEASURE_ARMS])
    arms = {a.name: a for a in build_arms(cfg)}
    assert set(MEASURE_ARMS) <= set(arms) and set(MEASURE_ARMS) <= set(EXPERIMENT_ARMS)
    assert set(MEASURE_ARMS).isdisjoint(ExperimentsConfig().arms)  # not default arms
    rc = {n: run_config(cfg, a, 0, sft=tmp_path / "sft", rm=tmp_path / "rm", run_dir=tmp_path / n)
          for n, a in arms.items()}
    ppo = rc["ppo"].ppo
    assert (ppo.ppo_epochs, ppo.rollout_batch_size // ppo.minibatch_size) == (4, 4)  # 16 steps per batch
    for b in ("none", "mean", "loo"):
        r = rc[f"reinforce-steps-{b}"].reinforce
        changed = {k: v for k, v in dataclasses.asdict(r).items() if v != getattr(rc["reinforce-lr1x"].reinforce, k)}
        assert changed == {"batch_epochs": 4, "minibatches": 4, "log_grad_snr": True,
                           **({} if b == "none" else {"baseline": b})}
        assert r.steps_per_iteration == ppo.steps_per_iteration and r.lr == ppo.lr
        assert models_in_memory(cfg, arms[f"reinforce-steps-{b}"]) == (1, 2)

    def changed_ppo(n):
        return {k: v for k, v in dataclasses.asdict(rc[n].ppo).items() if v != getattr(ppo, k)}

    assert changed_ppo("ppo-snr") == {"log_grad_snr": True}
    stress = {"ppo_epochs": STRESS_EPOCHS, "lr": ppo.lr * STRESS_LR_MULTIPLIER}
    assert changed_ppo("ppo-stress") == stress == {"ppo_epochs": 12, "lr": 3 * ppo.lr}
    assert changed_ppo("ppo-stress-dual-clip") == {**stress, "dual_clip": DUAL_CLIP}
    for n in MEASURE_ARMS:
        cls = ReinforceConfig if n.startswith("reinforce") else PPOConfig
        save_config(rc[n], tmp_path / f"{n}.yaml")
        validate_tree(rc[n])
        assert load_config(cls, tmp_path / f"{n}.yaml") == rc[n]
    keys = {n: run_key(rc[n], arms[n].stage, {"sft": "s", "reward": "r"}) for n in rc}
    assert len({keys[n] for n in MEASURE_ARMS}) == len(MEASURE_ARMS)
    assert not {keys[n] for n in MEASURE_ARMS} & set(MAIN_KEYS.values())
    assert {"policy/grad_snr", "policy/dual_clipfrac", "policy/grad_norm", "policy/entropy"} <= set(CURVE_KEYS)


def test_older_arms_keep_their_keys_beside_the_measure_arms():
    cfg = ExperimentsConfig(arms=list(EXPERIMENT_ARMS))
    tmp = Path("/tmp/nokeys")
    keys = {a.name: run_key(run_config(cfg, a, 1, sft=tmp / "sft", rm=tmp / "rm", run_dir=tmp / a.name), a.stage,
                            {"sft": "s", "reward": "r"}) for a in build_arms(cfg)}
    assert {a: keys[a] for a in MAIN_KEYS} == MAIN_KEYS
