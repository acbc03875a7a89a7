"""The equivalence and non-inferiority claims of the published results, re-posed with a margin tied
to the effect (issue 39; docs/experiments.md, "Claim kinds and nulls"), from results/*.json alone.

Before: "removing the critic costs PPO less than 0.3 sd" and "a group baseline matches the critic"
(mean cost < 0.3 sd), "a very high beta keeps the policy at SFT" (|diff| within 2 evaluation SE).
After, as the claim functions now compute them: non-inferiority (the upper 95% bound of the mean cost
below 20% of PPO's gain) and equivalence by TOST (the 90% interval inside +-20% of PPO's gain or
length drift), the SE the larger of the evaluation's and the seeds'. :func:`repose` rewrites a row
still in the old form from the values its text and its record hold (2 decimals, so a verdict within
rounding of its margin is marked as such); a row in the new form is returned unchanged.
"""

from __future__ import annotations

import math
import re
from typing import Mapping

from fourfold.apps.claim_stats import MARGIN_SHARE, NULL_AT_MARGIN, interval_text, margin_threshold, margin_verdict, seed_se
from fourfold.apps.report_kit import fmt, signed

STORED = " (re-evaluated from the stored 2-decimal values)"
_NUM = r"[-+]?\d+(?:\.\d+)?"


def _floats(text: str) -> list[float]:
    return [float(x) for x in re.findall(_NUM, text)]


def _critic_free(record: Mapping, row: Mapping) -> dict:
    m = re.match(rf"ppo's gold minus (\S+)'s (.+?) sd, mean {_NUM} sd \(\+- ({_NUM}) sd: 2 evaluation standard errors "
                 r"of the mean\); (.*)$", row["measured"])
    arm, costs, band, spreads = m.group(1), _floats(m.group(2)), float(m.group(3)), m.group(4)
    cost = sum(costs) / len(costs)
    se = seed_se(costs, band / 2)
    b = margin_verdict(cost, se, record["summaries"]["ppo"]["gold_delta_sd"])
    return {**row, "claim": f"removing the critic costs PPO less than {MARGIN_SHARE:.0%} of its gold gain ({arm})",
            "measured": f"ppo's gold minus {arm}'s {', '.join(signed(c) for c in costs)} sd, mean {signed(cost)} sd "
                        f"({interval_text(b, se)}); {spreads}{STORED}",
            "threshold": margin_threshold(b, MARGIN_SHARE, "ppo's mean gold gain"), "holds": "yes" if b.holds else "no",
            "null": NULL_AT_MARGIN}


def _beta_high(record: Mapping, row: Mapping) -> dict:
    key = "gold" if "(gold)" in row["claim"] else "length"
    s, ppo, sft = record["summaries"]["ppo-beta-high"], record["summaries"]["ppo"], record["sft"]
    band = abs(_floats(row["threshold"])[0])  # "within +-X": 2 evaluation SE, 2 decimals
    if key == "gold":
        diff, sd, effect, unit, what = s["gold_delta_sd"], s["gold_delta_sd_sd"], ppo["gold_delta_sd"], "sd", "ppo's gold gain"
    else:
        diff, sd = s["length"] - sft["length"], s["length_sd"]
        effect, unit, what = ppo["length"] - sft["length"], "words", "ppo's length drift"
    se = max(band / 2, sd / math.sqrt(s["seeds"])) if s.get("seeds", 1) > 1 else band / 2
    b = margin_verdict(diff, se, effect, two_sided=True)
    return {**row, "measured": f"{key} {signed(diff)} {unit} from SFT's (mean over {s['seeds']} seeds; "
                               f"{interval_text(b, se, unit)}){STORED}",
            "threshold": margin_threshold(b, MARGIN_SHARE, what, unit, two_sided=True), "holds": "yes" if b.holds else "no",
            "null": NULL_AT_MARGIN}


def _match(record: Mapping, row: Mapping) -> dict:
    arm = re.search(r"\((\w+)\)", row["claim"]).group(1)
    parts, ok = [], []
    for w, m, band, seeds in re.findall(rf"(h\d[\w-]*) ({_NUM}) \(\+- ({_NUM}); seeds ([^)]*)\)", row["measured"]):
        d = _floats(seeds)
        se = seed_se(d, float(band) / 2)
        b = margin_verdict(float(m), se, record["summaries"][w]["ppo"]["gold_delta_sd"])
        ok.append(b.holds)
        parts.append(f"{w} {signed(float(m))} (bound {signed(b.upper)} / margin {fmt(b.margin, 3)}; seeds {seeds})")
    return {**row, "measured": f"ppo's gold minus {arm}'s, mean over seeds, upper 95% bound / margin: "
                               + "; ".join(parts) + f" sd{STORED}",
            "threshold": f"upper 95% bound < {MARGIN_SHARE:.0%} of ppo's gold gain at that horizon: non-inferiority, "
                         "at every one", "holds": "yes" if ok and all(ok) else "no", "null": NULL_AT_MARGIN}


def repose(family: str, record: Mapping, row: Mapping) -> dict:
    """``row`` re-posed with a margin when it is one of the old-form margin claims of ``family``; else ``row``."""
    if family == "experiments" and row["group"] == "critic-free" and row["threshold"].startswith("mean over seeds <"):
        return _critic_free(record, row)
    if family == "experiments" and row["group"] == "beta-high" and row["threshold"].startswith("within +-"):
        return _beta_high(record, row)
    if family == "horizon" and row["group"] in ("match", "noisy") and row["threshold"].endswith("sd at every one"):
        return _match(record, row)
    return dict(row)
