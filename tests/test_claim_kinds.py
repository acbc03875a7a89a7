"""Every published claim has a kind (finding or check), a reason and a null; the README's headline
counts findings only, recomputed here from results/*.json (issue 39)."""
import json
import re
from pathlib import Path

import pytest

from fourfold.apps import claim_kinds, claim_reeval
from fourfold.apps.claim_kit import claim_row, claims_held, counts, counts_text, headline_row

ROOT = Path(__file__).resolve().parents[1]
HEADLINE_ORDER = ("experiments.json", "horizon.json", "overoptimization.json", "turns.json", "practice.json",
                  "measure.json", "staleness.json", "warmup.json")
"""The README headline rows' families, top to bottom."""


def _claims(name):
    return json.loads((ROOT / "results" / name).read_text())["claims"]


@pytest.mark.parametrize("name", sorted(claim_kinds.RESULT_FAMILY))
def test_every_published_claim_has_a_kind_a_reason_and_a_null(name):
    for c in _claims(name):
        assert c["kind"] in ("finding", "check"), c["claim"]
        assert c["why"].strip() and c["null"].strip(), c["claim"]
        assert (c["null"] == claim_kinds.CHECK_NULL) == (c["kind"] == "check"), c["claim"]


def test_the_stored_results_are_what_reevaluation_gives():
    for name in claim_kinds.RESULT_FAMILY:
        rec = json.loads((ROOT / "results" / name).read_text())
        assert claim_reeval.reevaluate(name, rec) == rec, f"python -m fourfold.apps.claim_reeval changes {name}"


def test_the_readme_headline_counts_findings_as_results_say():
    rows = re.findall(r"(\d+) of (\d+) findings hold; (\d+) of (\d+) checks pass",
                      (ROOT / "README.md").read_text())
    assert len(rows) == len(HEADLINE_ORDER)
    for name, got in zip(HEADLINE_ORDER, rows):
        cs = _claims(name)
        findings = [c for c in cs if c["kind"] == "finding"]
        checks = [c for c in cs if c["kind"] == "check"]
        held = sum(c["holds"] == "yes" and not c["null"].startswith("yes") for c in findings)
        want = (held, len(findings), sum(c["holds"] == "yes" for c in checks), len(checks))
        assert tuple(map(int, got)) == want, name


def test_the_seed_sweeps_checks_are_the_ones_the_review_names():
    checks = [c["claim"] for c in _claims("experiments.json") if c["kind"] == "check"]
    assert len(checks) == 5 and sum("reinforce-pp" in c for c in checks) == 2
    assert [c["kind"] for c in _claims("practice.json")] == ["check", "finding", "finding", "check", "check", "check"]


def test_a_finding_whose_null_says_yes_is_flagged_not_held():
    rows = [claim_kinds.annotate("turns", [claim_row("learns", "every arm learns", "m", "t", True, null=null)])[0]
            for null in ("no (SFT against itself)", "yes (SFT against itself)")]
    rows += claim_kinds.annotate("turns", [claim_row("knob", "the knob works", "m", "t", True),
                                           claim_row("critic", "the gain grows", "m", "t", False)])
    assert claims_held(rows) == 1
    assert counts(rows) == {"findings": 3, "held": 1, "checks": 1, "passed": 1, "flagged": 1}
    assert counts_text(rows) == "1 of 3 findings hold; 1 of 1 checks pass; 1 flagged (null says yes)"
    assert headline_row("w", rows, "d", "cmd", "x") == (
        "| w | 1 of 3 findings hold; 1 of 1 checks pass; 1 flagged (null says yes) (d) | `cmd` | x |")


def test_a_claim_without_a_rule_is_an_error_naming_it():
    with pytest.raises(ValueError, match="'a new claim' .*'knob2'.*add a rule"):
        claim_kinds.annotate("turns", [claim_row("knob2", "a new claim", "m", "t", True)])


def test_synthetic_nulls_run_the_familys_own_verdict():
    from fourfold.apps.claim_nulls import synthetic_rate

    # a flat-then-falling PPO curve passes "rises, peaks and falls" on most draws (its max over noisy flat
    # points sits after the SFT point): the published PPO peak is flagged; a saturating BoN curve never passes
    assert synthetic_rate("ppo", "peak", draws=20) > 0.5
    assert synthetic_rate("bon", "peak", draws=20) == 0.0
    # three sizes with the same curve: a strict order passes by chance (about 1/6), more than 5%
    assert 0.05 < synthetic_rate("ppo", "size-peak", draws=60) < 0.4


def test_stored_nulls():
    from fourfold.apps.claim_nulls import stored_null

    rec = json.loads((ROOT / "results" / "experiments.json").read_text())
    row = {"group": "ppo", "claim": "ppo raises gold reward above the SFT model's"}
    assert stored_null("experiments", rec, row).startswith("no (stored mean: ppo-beta-high's gold gain (sd) 0.0588")
    rec["summaries"]["ppo-beta-high"]["gold_delta_sd"] = 0.5  # a control that gains: the mean no longer settles it
    assert stored_null("experiments", rec, row).startswith("yes")
    assert stored_null("experiments", rec, {"group": "critic", "claim": "x"}) is None  # set by annotate, every run
    assert claim_kinds.annotate("experiments", [claim_row("critic", "x", "m", "t", True)])[0]["null"].startswith(
        "no (by construction: ppo-no-critic against itself with seeds rotated")
    assert stored_null("experiments", rec, {"group": "beta0", "claim": "beta = 0 degenerates"}) is None
    flagged = [c["claim"] for c in _claims("overoptimization.json") if c["null"].startswith("yes")]
    assert "PPO: gold rises, peaks and falls while the proxy rises" in flagged


def test_old_margin_rows_are_reposed_from_their_stored_values():
    from fourfold.apps.claim_repose import repose

    rec = {"summaries": {"ppo": {"gold_delta_sd": 0.5}}}
    row = {"group": "critic-free", "claim": "removing the critic costs PPO less than 0.3 sd of gold (grpo)",
           "measured": "ppo's gold minus grpo's +0.10, +0.05, +0.06 sd, mean +0.07 sd (+- 0.04 sd: 2 evaluation "
                       "standard errors of the mean); ppo +0.50 +- 0.04 sd, grpo +0.43 +- 0.02 sd",
           "threshold": "mean over seeds < 0.3 sd", "holds": "yes"}
    new = repose("experiments", rec, row)
    # mean 0.07; SE max(0.02, sd(0.10, 0.05, 0.06) / sqrt 3 = 0.0153) = 0.02; bound 0.07 + 0.0329 = 0.1029 >= 0.1
    assert new["holds"] == "no" and "mean +0.07 sd (SE 0.020; 90% interval +0.04 to +0.10 sd)" in new["measured"]
    assert new["threshold"] == "upper 95% bound < 20% of ppo's mean gold gain (0.100 sd): non-inferiority"
    assert new["claim"] == "removing the critic costs PPO less than 20% of its gold gain (grpo)"
    rec["summaries"]["ppo"]["gold_delta_sd"] = 0.6  # margin 0.12 > 0.1029: holds
    assert repose("experiments", rec, row)["holds"] == "yes"
    assert repose("experiments", rec, new) == new  # a row in the new form is left alone


def test_reevaluation_keeps_a_null_the_run_computed_and_rederives_the_others():
    rec = json.loads((ROOT / "results" / "turns.json").read_text())
    computed = [c for c in rec["claims"] if "(computed" in c["null"]]
    assert computed, "the turns rerun's findings carry the nulls their run computed"
    stripped = {**rec, "claims": [{**c, "null": "stale text"} if c["kind"] == "check" else c for c in rec["claims"]]}
    again = claim_reeval.reevaluate("turns.json", stripped)
    assert again["claims"] == rec["claims"]  # the checks' nulls re-derived; the computed ones kept as they were
