"""fourfold.names: each list of the zoo's names is written once and read by the config (its keys'
types and checks), by the core (its constants, tables and registry, checked on import) and by the
docs (every name documented where the key is)."""
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch

import fourfold.core as core
import fourfold.names as names
from fourfold.config import DPOAlgoConfig, EnvConfig, PPOAlgoConfig, PPOConfig, ReinforceAlgoConfig, load_config
from fourfold.core import losses as core_losses
from fourfold.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

CONFIG_KEYS = [  # (config class, field, the names its values are)
    (PPOAlgoConfig, "kl_estimator", names.KL_KINDS),
    (PPOAlgoConfig, "loss_agg", names.LOSS_AGG_MODES),
    (PPOAlgoConfig, "rollout_correction", names.CORRECTION_MODES),
    (PPOAlgoConfig, "policy_loss", names.POLICY_LOSSES),
    (PPOAlgoConfig, "ratio_level", names.RATIO_LEVELS),
    (ReinforceAlgoConfig, "kl_estimator", names.KL_KINDS),
    (ReinforceAlgoConfig, "rollout_correction", names.CORRECTION_MODES),
    (DPOAlgoConfig, "loss", names.DPO_LOSSES),
    (EnvConfig, "truncation", names.TRUNCATION_MODES),
]


@pytest.mark.parametrize("cls,field,expected", CONFIG_KEYS, ids=lambda x: getattr(x, "__name__", str(x)[:20]))
def test_every_config_key_takes_the_names_of_fourfold_names(cls, field, expected):
    assert typing.get_args(typing.get_type_hints(cls)[field]) == expected


def test_the_core_constants_are_the_same_tuples():
    for name in ("KL_KINDS", "LOSS_AGG_MODES", "POLICY_LOSSES", "RATIO_LEVELS", "CORRECTION_MODES", "DPO_LOSSES"):
        assert getattr(core, name) is getattr(names, name), name
    from fourfold.core.turns import TRUNCATION_MODES

    assert TRUNCATION_MODES is names.TRUNCATION_MODES
    assert names.CORRECTION_MODES == ("none", "token_tis", "token_mis", "seq_tis", "seq_mis", "geo_mis")


def test_the_core_tables_hold_exactly_the_names():
    assert tuple(core.SURROGATE_TERMS) == names.POLICY_LOSSES == ("clip", "cispo")
    assert core.SURROGATE_TERMS == {"clip": core.clip_term, "cispo": core.cispo_term}
    builtin = {n: e for n, e in core.ADVANTAGE_ESTIMATORS.items() if not n.startswith("test_")}
    assert tuple(builtin) == names.ADVANTAGE_NAMES
    assert tuple(n for n, e in builtin.items() if e.needs_critic) == names.CRITIC_ADVANTAGES == ("gae",)
    assert set(names.ZERO_AT_ONE_SAMPLE) <= set(names.ADVANTAGE_NAMES)
    from fourfold.core.correction import CORRECTION_WEIGHTS

    assert tuple(CORRECTION_WEIGHTS) == names.CORRECTION_MODES


def test_check_names_names_what_is_missing_and_what_is_extra():
    names.check_names("t", ("a", "b"), {"b": 1, "a": 2})  # any order
    with pytest.raises(RuntimeError) as e:
        names.check_names("fourfold.core.x.T", ("a", "b", "c"), {"a": 1, "d": 2, "e": 3})
    assert str(e.value) == ("fourfold.core.x.T and fourfold.names disagree: names without an entry: b, c; "
                            "entries without a name: d, e")
    with pytest.raises(RuntimeError, match=r"^t and fourfold.names disagree: entries without a name: z$"):
        names.check_names("t", (), ["z"])


@pytest.mark.parametrize("patch,expected", [
    ("n.POLICY_LOSSES += ('gspo',)",
     "fourfold.core.losses.SURROGATE_TERMS and fourfold.names disagree: names without an entry: gspo"),
    ("n.CORRECTION_MODES += ('seq_cap',)",
     "fourfold.core.correction.CORRECTION_WEIGHTS and fourfold.names disagree: names without an entry: seq_cap"),
    ("n.ADVANTAGE_NAMES = n.ADVANTAGE_NAMES[1:]",
     "fourfold.core.estimators.ADVANTAGE_ESTIMATORS and fourfold.names disagree: entries without a name: gae"),
])
def test_importing_core_stops_when_a_table_and_its_names_disagree(patch, expected):
    """A fresh interpreter changes one list before importing fourfold.core: the import fails with
    the one line naming the table and the name (the check runs, it is not a test-only promise)."""
    code = f"import fourfold.names as n\n{patch}\nimport fourfold.core"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == f"RuntimeError: {expected}"


def test_a_new_surrogate_term_gets_the_wrappers_ratio_weights_aggregation_and_stats(monkeypatch):
    """The wrapper owns the ratio level, the weights, the aggregation and the stats: a term that
    returns r * A as is (no clip) under the sequence ratio, token weights and seq-mean-token-sum.
    By hand: row 0 log-ratios 0.2, 0.4 (mean 0.3), row 1 one valid token 0.1, so s = e^0.3, e^0.1;
    terms w * s * A = [1 * e^0.3 * 1, 0.5 * e^0.3 * 2] and [2 * e^0.1 * (-1)]; seq sums e^0.3 * 2 and
    -2 e^0.1; loss = -(2 e^0.3 - 2 e^0.1) / 2."""
    monkeypatch.setitem(core_losses.SURROGATE_TERMS, "plain", lambda r, a, lp, b: (r * a, torch.zeros_like(r, dtype=torch.bool)))
    old = torch.zeros(2, 2, dtype=torch.float64)
    new = torch.tensor([[0.2, 0.4], [0.1, 9.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = torch.tensor([[1.0, 2.0], [-1.0, 5.0]], dtype=torch.float64)
    w = torch.tensor([[1.0, 0.5], [2.0, 7.0]], dtype=torch.float64)
    loss, stats = core.ppo_policy_loss(new, old, adv, mask, kind="plain", ratio_level="sequence", token_weights=w,
                                       agg="seq-mean-token-sum")
    e3, e1 = torch.tensor(0.3, dtype=torch.float64).exp(), torch.tensor(0.1, dtype=torch.float64).exp()
    assert torch.allclose(loss, -(2 * e3 - 2 * e1) / 2, rtol=0, atol=1e-12)
    assert stats["clipfrac"] == 0
    assert torch.allclose(stats["ratio_mean"], (2 * e3 + e1) / 3, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"^unknown policy loss 'gspo'; expected one of clip, cispo$"):
        core.ppo_policy_loss(new, old, adv, mask, kind="gspo")


@pytest.mark.parametrize("key,expected", [
    ("ppo.policy_loss", names.POLICY_LOSSES), ("ppo.ratio_level", names.RATIO_LEVELS),
    ("ppo.loss_agg", names.LOSS_AGG_MODES), ("ppo.kl_estimator", names.KL_KINDS),
    ("ppo.rollout_correction", names.CORRECTION_MODES),
])
def test_an_unknown_name_is_one_line_listing_the_names(key, expected):
    with pytest.raises(ConfigError) as e:
        load_config(PPOConfig, None, [f"{key}=bogus"])
    assert str(e.value) == f"command line: {key}: expected one of {', '.join(repr(n) for n in expected)}, got 'bogus'"


def _row(markdown: str, key: str) -> str:
    """The table row of ``markdown`` whose first cell starts with ``key``."""
    rows = [line for line in markdown.splitlines() if line.startswith(f"| `{key}")]
    assert len(rows) == 1, (key, rows)
    return rows[0]


def _ticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def _first_names(markdown: str, header: str) -> list[str]:
    """The first `name` of the first cell of each row of the table whose header row is ``header``."""
    lines = markdown.splitlines()
    start = lines.index(header) + 2
    rows = lines[start:]
    rows = rows[:next((i for i, line in enumerate(rows) if not line.startswith("|")), len(rows))]
    return [_ticked(line.split("|")[1])[0] for line in rows]


def test_every_name_is_documented_where_its_key_is():
    """The README's key table lists each key's names exactly, in the names' order; the tables of
    DPO's losses and of the correction's modes have one row per name; every policy loss and ratio
    level but the default has its row among docs/correction.md's losses."""
    readme = (ROOT / "README.md").read_text()
    for key, expected in (("ppo.advantage", names.ADVANTAGE_NAMES), ("ppo.kl_estimator", names.KL_KINDS),
                          ("ppo.loss_agg", names.LOSS_AGG_MODES), ("ppo.policy_loss", names.POLICY_LOSSES),
                          ("ppo.ratio_level", names.RATIO_LEVELS)):
        assert tuple(_ticked(_row(readme, key).split("|")[2])) == expected, key
    assert set(names.CORRECTION_MODES) <= set(_ticked(_row(readme, "ppo.rollout_correction")))
    assert tuple(_first_names(readme, "| `dpo.loss` | loss per pair | as in |")) == names.DPO_LOSSES
    correction = (ROOT / "docs" / "correction.md").read_text()
    assert tuple(_first_names(correction, "| mode | w_t | peers |")) == names.CORRECTION_MODES
    losses = set(_first_names(correction, "| key | what | paper |"))
    assert {f"ppo.policy_loss: {n}" for n in names.POLICY_LOSSES[1:]} <= losses
    assert {f"ppo.ratio_level: {n}" for n in names.RATIO_LEVELS[1:]} <= losses
    environments = (ROOT / "docs" / "environments.md").read_text()
    assert f"`env.truncation: {' | '.join(names.TRUNCATION_MODES)}`" in environments
