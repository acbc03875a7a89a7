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


GSD = 0.7  # the SFT model's gold sd; n = 1024 and gold_std 0.7 give 2 SE of a difference = 0.0884 sd


def _row(seed, gold, kl):
    return {"seed": seed, "gold": gold, "gold_std": GSD, "n": 1024, "kl": kl}


def _clip_data(gold_gap=0.2, kl_mult=3.0, step_mult=3.0, ent_mult=0.5, spread=(0.0, 0.02, 0.01)):
    """Every clip pair and gold pair: the better (clipped) arm gold 0.6 + spread, KL 2 + spread,
    approx_kl 0.01, entropy 1.0; the other arm gold - gold_gap, KL x kl_mult, approx_kl x step_mult,
    entropy x ent_mult over the last quarter (its first 3 of 4 iterations at 1.0)."""
    from fourfold.apps.experiments.measure_claims import CLIP_PAIRS, GOLD_PAIRS

    finals, curves = {}, {}
    pairs = [(c, f) for f, c, _, _ in CLIP_PAIRS] + [(a, b) for _, _, a, b in GOLD_PAIRS]
    level = dict.fromkeys([a for p in pairs for a in p], 0.6)
    for _ in pairs:  # chains (ppo-snr > ppo-no-critic > ppo-no-baseline): each worse arm at least one gap lower
        for good, bad in pairs:
            level[bad] = min(level[bad], level[good] - gold_gap)
    for good, bad in pairs:
        g = level[good]
        finals[good] = [_row(s, g + d, 2.0 + 10 * d) for s, d in enumerate(spread)]
        finals[bad] = [_row(s, level[bad] + d, (2.0 + 10 * d) * kl_mult) for s, d in enumerate(spread)]
        curves[good] = {s: _c(**{"policy/approx_kl": [0.01, 0.01], "policy/entropy": [1.0] * 4,
                                 "policy/clipfrac": [0.1, 0.1]}) for s in range(3)}
        curves[bad] = {s: _c(**{"policy/approx_kl": [0.01 * step_mult, math.nan],
                                "policy/entropy": [1.0, 1.0, 1.0, ent_mult * (1 + d)]})
                       for s, d in enumerate(spread)}
    return finals, curves


def test_clip_and_baseline_claims_say_yes_on_clear_effects_with_null_no():
    """Gold gap 0.2 = 0.286 sd > 0.088 in every seed; the rotated null (ppo-stress against itself:
    -0.029, -0.014, +0.043 sd) fails in one seed. KL 6/2 = 3.0, 6.6/2.2 = 3.0: >= 1.5x; its null
    (the unclipped arm's best seed over its worst: 6.6/6.0 = 1.1) < 1.5. approx_kl 3x; entropy 0.5x
    (null 0.5/0.51 = 0.98 > 0.8)."""
    finals, curves = _clip_data()
    rows = {r["key"]: r for r in measure_claims(curves, finals=finals, gold_sd=GSD)}
    assert rows.pop("baseline-snr")["measured"].startswith("mean policy/grad_snr, mean / none: ratio n/a")  # not logged
    assert list(rows) == [f"clip-{w}-{t}" for t in ("4ep", "lr3x", "stress") for w in ("gold", "kl", "step", "entropy")] \
        + ["critic-gold", "baseline-gold-ppo", "baseline-gold-reinforce", "ppo-gold-reinforce"]
    assert {k: (r["holds"], r["null"], r["kind"], r["group"]) for k, r in rows.items()} == {
        k: ("yes", "no", "finding", "measure") for k in rows}
    assert rows["clip-gold-stress"]["measured"] == "gold difference 0.29, 0.29, 0.29 sd (seeds 0, 1, 2)"
    assert rows["clip-gold-stress"]["threshold"] == "> 2 evaluation standard errors (0.09, 0.09, 0.09 sd) in every seed"
    assert "ratio 3.00, 3.00, 3.00" in rows["clip-kl-stress"]["measured"]
    assert "ratio 0.50, 0.51, 0.51" in rows["clip-entropy-4ep"]["measured"]  # the last 25% of 4 iterations: 1
    assert "clipfrac 0.100, 0.100, 0.100" in rows["clip-step-lr3x"]["measured"]


def test_clip_and_baseline_claims_say_no_without_the_effect_and_nulls_flag_spread():
    # no effect at all: every claim says no, and so does every null
    finals, curves = _clip_data(gold_gap=0.0, kl_mult=1.0, step_mult=1.0, ent_mult=1.0)
    rows = [r for r in measure_claims(curves, finals=finals, gold_sd=GSD) if r["key"] != "baseline-snr"]
    assert len(rows) == 16 and {(r["holds"], r["null"]) for r in rows} == {("no", "no")}
    # a gold gap of 0.05 raw = 0.071 sd, inside 2 SE (0.088): no
    finals, curves = _clip_data(gold_gap=0.05)
    assert {r["key"]: r["holds"] for r in measure_claims(curves, finals=finals, gold_sd=GSD)}["critic-gold"] == "no"
    # seeds spread so wide that the better arm against itself passes: gold seed 0 vs 1 is 0.5 / 0.7 = 0.71 sd,
    # 1 vs 2 0.71, 2 vs 0 -1.43: the rotation fails; KL spread 2 + 10 d: (2+5)x3 / (2+0)x3 = 3.5 >= 1.5: null yes
    finals, curves = _clip_data(spread=(0.0, 0.5, 1.0))
    rows = {r["key"]: r for r in measure_claims(curves, finals=finals, gold_sd=GSD)}
    assert rows["clip-kl-stress"]["holds"] == "yes" and rows["clip-kl-stress"]["null"] == "yes"
    assert rows["clip-gold-stress"]["null"] == "no"
    # one seed only: the null is that seed against itself, a difference of 0: no
    one = {a: rs[:1] for a, rs in finals.items()}
    assert {r["key"]: r["null"] for r in measure_claims({}, finals=one, gold_sd=GSD)}["critic-gold"] == "no"
    # no gold sd: gold claims cannot hold
    assert {r["key"]: r["holds"] for r in measure_claims({}, finals=finals)}["critic-gold"] == "no"


def test_compute_claims_publishes_the_measure_group_with_kind_and_null():
    from fourfold.apps.experiments import compute_claims
    from fourfold.apps.experiments.config import ExperimentsClaimsConfig

    finals, curves = _clip_data()
    sft = {"gold": 0.4, "gold_std": GSD, "n": 1024, "proxy": 0.0, "length": 10.0, "well_formed": 0.9,
           "repetition": 0.0, "kl": 0.0}
    rows, notes = compute_claims(finals, sft, ExperimentsClaimsConfig(groups=["measure"]), kl_coef=0.05, curves=curves)
    assert rows.pop(0)["key"] == "baseline-snr" and len(rows) == 16 and notes == []
    assert {(r["group"], r["kind"], r["null"], r["holds"]) for r in rows} == {("measure", "finding", "no", "yes")}
    assert all(r["why"] for r in rows)
    rows, notes = compute_claims({}, sft, ExperimentsClaimsConfig(groups=["measure"]), kl_coef=0.05)
    assert rows == [] and notes == ["claims 'measure' not checked: none of the measurement arms' comparisons has results"]
    rows, notes = compute_claims(finals, sft, ExperimentsClaimsConfig(groups=["measure"], quick=True), kl_coef=0.05,
                                 curves=curves)
    assert rows == [] and any("claims 'measure'" in n for n in notes)
    # not a default group: the default sweep states none of these
    assert "measure" not in ExperimentsClaimsConfig().groups


def test_examples_measure_yaml_runs_exactly_the_arms_its_claims_compare():
    from fourfold.apps.experiments.measure_claims import CLIP_PAIRS, GOLD_PAIRS

    cfg = load_config(ExperimentsConfig, Path(__file__).resolve().parents[1] / "examples" / "measure.yaml")
    needed = {a for f, c, _, _ in CLIP_PAIRS for a in (f, c)} | {a for _, _, a, b in GOLD_PAIRS for a in (a, b)}
    needed |= {"reinforce-steps-loo", "ppo-stress-dual-clip"}  # the SNR and dual-clip claims' other arms
    assert set(cfg.arms) == needed and len(cfg.arms) == 12
    assert cfg.claims.groups == ["measure"] and cfg.seeds == [0, 1, 2] and cfg.workers == 1
