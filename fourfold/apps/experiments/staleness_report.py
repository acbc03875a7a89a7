"""The staleness family's report: ``summary.md`` and ``report.html`` (settings; per world and arm the
gold, KL, the ratio and importance-weight statistics, the stability counts and the lag check; the
claims last). It reads the family's record; it runs nothing. Each world's own summary.md and
report.html (the claims family's, with the curves) are in its subdirectory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.report import claims_html, family_header, header_html, invocation_text, summary_tail, text_table
from fourfold.apps.report_kit import fmt, md_table, mean, signed
from fourfold.atomic import write_text_atomic

COLUMNS = ("world", "arm", "seeds", "gold - SFT (sd)", "KL", "first |r - 1|", "mismatch |d|", "IS ESS (min)",
           "TIS weight", "clipfrac", "crashes", "spikes", "collapses", "lag ok")
"""The columns of the per-run statistics table (means over iterations, then over seeds; counts over seeds)."""


def _m(runs: Mapping, key: str, digits: int = 3) -> str:
    vals = [r[key] for r in runs.values()]
    return fmt(mean(vals), digits) if vals else ""


def _e(runs: Mapping, key: str) -> str:
    """The mean over seeds in scientific notation (the ratio's deviations run from 1e-7 to 1e-1)."""
    m = mean([r[key] for r in runs.values()]) if runs else float("nan")
    return f"{m:.1e}" if m == m else "n/a"


def _count(runs: Mapping, key: str) -> str:
    return f"{sum(bool(r[key]) for r in runs.values())}/{len(runs)}"


def result_rows(record: Mapping) -> list[list[str]]:
    """One row per world and arm: the final gold (mean over seeds, in the world's SFT sd) and the runs' statistics."""
    rows = []
    for w in record["worlds"]:
        sft = record["sft"].get(w)
        for arm, runs in record["stats"].get(w, {}).items():
            runs = {int(s): r for s, r in runs.items()}
            finals = record["finals"].get(w, {}).get(arm, [])
            gain = mean([(f["gold"] - sft["gold"]) / sft["gold_std"] for f in finals]) if sft and finals else None
            ess = f"{_m(runs, 'is_ess')} ({_m(runs, 'is_ess_min')})"
            rows.append([w, arm, str(len(runs)), signed(gain), _m(runs, "kl", 2), _e(runs, "first_ratio_dev"),
                         _e(runs, "token_diff"), ess, _m(runs, "is_weight", 4), _m(runs, "clipfrac"),
                         _count(runs, "crash"), f"{sum(r['spikes'] > 0 for r in runs.values())}/{len(runs)}",
                         _count(runs, "collapse"), _count(runs, "lag_ok")])
    return rows


def staleness_header(cfg: ExperimentsConfig, record: Mapping) -> str:
    s = cfg.staleness
    worlds = "; ".join(f"{w}: {v['what']}" for w, v in record["worlds"].items())
    topp = f", and the same at k = 0 sampling with top_p {s.top_p:g} (topp-<objective>)" if s.top_p < 1 else ""
    return family_header(
        "staleness",
        f"A sampler running ahead of the trainer: the objectives {', '.join(s.objectives)} at the lags k = "
        f"{', '.join(map(str, s.ks))} (rollout.max_staleness; arms k<k>-<objective>){topp}. Worlds: {worlds}. "
        f"Every arm x seed ({', '.join(map(str, cfg.seeds))}) for {cfg.iterations} iterations, the demo's PPO "
        f"otherwise; gold on {cfg.eval_prompts} held-out prompts. Thresholds fixed before the first run "
        "(staleness.claims, docs/experiments.md).",
        invocation_text(record, cfg.workers))


def write_staleness_report(out: Path, cfg: ExperimentsConfig, record: Mapping) -> None:
    """summary.md and report.html of the family in ``out``."""
    from fourfold.reporting import html_page

    header = staleness_header(cfg, record)
    rows = result_rows(record)
    title = "## Gold, the ratio and the importance weights, stability (means over iterations and seeds)"
    parts = [header, title, "", md_table(COLUMNS, rows), ""]
    write_text_atomic(out / "summary.md", "\n".join(parts + summary_tail(record["notes"], record["claims"])))
    body = [header_html(header)] + claims_html(record["claims"], record["notes"])
    body += [f"<h2>{title[3:]}</h2>", text_table(COLUMNS, rows)]
    write_text_atomic(out / "report.html", html_page("fourfold experiments: the staleness family", "\n".join(body)))
