"""Issue 39's measurement arms of `fourfold experiments` (fourfold.apps.experiments.arms.MEASURE_ARMS):
REINFORCE with each baseline at PPO's optimizer steps per batch, PPO with the gradient SNR logged,
PPO where the ratios get large with and without dual-clip. Their configs, that they are not default
arms, and that the older arms' run keys stay what they were."""
import dataclasses
import math
from pathlib import Path

from fourfold.apps.experiments import build_arms, models_in_memory, run_config, run_key
from fourfold.apps.experiments.arms import DUAL_CLIP, MEASURE_ARMS, STRESS_EPOCHS, STRESS_LR_MULTIPLIER
from fourfold.apps.experiments.config import EXPERIMENT_ARMS, ExperimentsConfig
from fourfold.apps.experiments.measure_claims import MEASURE, measure_claims, run_mean, spread_pair
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


def _c(**series):
    return {k: list(v) for k, v in series.items()}


def _curves(none=(1.0, 1.1, 0.9), mean=(1.5, 1.6, 1.4), loo=(1.75, 1.8, 1.72), gae=(3.0, 3.2, 2.9),
            dual_share=(0.01, 0.02, 0.015), dual_spike=(2.0, 2.2, 2.1), stress_spike=(5.0, 6.0, 4.0)):
    snr = lambda xs: {s: _c(**{"policy/grad_snr": [x, x, math.nan]}) for s, x in enumerate(xs)}  # nan: not logged
    return {"reinforce-steps-none": snr(none), "reinforce-steps-mean": snr(mean), "reinforce-steps-loo": snr(loo),
            "ppo-snr": snr(gae),
            "ppo-stress-dual-clip": {s: _c(**{"policy/dual_clipfrac": [x, x], "policy/grad_norm": [1.0, g]})
                                     for s, (x, g) in enumerate(zip(dual_share, dual_spike))},
            "ppo-stress": {s: _c(**{"policy/dual_clipfrac": [0.0, 0.0], "policy/grad_norm": [1.0, g]})
                           for s, g in enumerate(stress_spike)}}


def test_measure_claims_hold_on_clear_effects_with_null_no():
    """mean / none 1.5, 1.45, 1.56; loo / mean 1.17, 1.13, 1.23; ppo / loo 1.71, 1.78, 1.69; the
    dual share >= 0.001 (ppo-stress's 0); spikes 2.0/5.0, 2.2/6.0, 2.1/4.0 <= 0.8. The nulls: each
    numerator arm's best seed over its worst (mean 1.6/1.4 = 1.14 < 1.2, loo 1.8/1.72 = 1.047 < 1.05,
    ppo 3.2/2.9 = 1.10, spikes 2.0/2.2 = 0.91 > 0.8) say no."""
    rows = {r["key"]: r for r in measure_claims(_curves())}
    assert list(rows) == ["baseline-snr", "loo-snr", "critic-snr", "dual-clip-acts", "dual-clip-spikes"]
    assert {k: (r["holds"], r["null"], r["kind"]) for k, r in rows.items()} == {
        k: ("yes", "no", "finding") for k in rows}
    assert "ratio 1.50, 1.45, 1.56" in rows["baseline-snr"]["measured"]
    assert rows["baseline-snr"]["threshold"] == f">= {MEASURE['baseline_min_snr_ratio']:g}x in every seed"
    assert math.isclose(run_mean(_curves(), "ppo-snr", 1, "policy/grad_snr"), 3.2)


def test_measure_claims_fail_and_nulls_flag_seed_spread():
    # one seed where the baseline does not help (1.1 / 1.1): no, and the mean arm's own spread over
    # seeds (1.5 / 1.1 = 1.36) passes 1.2x: null yes. PPO's spread (9.0 / 2.5) alone passes 1.2x, so
    # its null says yes although the claim holds: not a finding that holds
    rows = {r["key"]: r for r in measure_claims(_curves(mean=(1.5, 1.1, 1.4), gae=(4.0, 2.5, 9.0)))}
    assert rows["baseline-snr"]["holds"] == "no" and rows["baseline-snr"]["null"] == "yes"
    assert rows["critic-snr"]["holds"] == "yes" and rows["critic-snr"]["null"] == "yes"
    # the bound never acting, and spikes as large as without it
    rows = {r["key"]: r for r in measure_claims(_curves(dual_share=(0.0, 0.01, 0.01), dual_spike=(5.0, 6.0, 4.0)))}
    assert rows["dual-clip-acts"]["holds"] == "no" and rows["dual-clip-acts"]["null"] == "no"
    assert rows["dual-clip-spikes"]["holds"] == "no"
    # arms that did not run: their claims are left out; a nan series fails
    assert measure_claims({}) == []
    c = _curves()
    c["reinforce-steps-none"][0]["policy/grad_snr"] = [math.nan]
    assert {r["key"]: r["holds"] for r in measure_claims(c)}["baseline-snr"] == "no"
    assert spread_pair([math.nan], True) == ([], []) and spread_pair([1.0, 3.0, 2.0], False) == ([1.0], [3.0])
