"""The warm-up family's report: ``summary.md`` and ``report.html`` (settings; per arm the gold, KL and
the critic's explained variance at its start, its first policy iteration, the first policy
iterations and the end, relative to the ceiling; the explained variance per policy iteration; the
ceiling's warm-up curve; the claims last). It reads the family's record; it runs nothing. The
world's own summary.md and report.html (the claims family's, with the curves) are in its subdirectory.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.report import claims_html, family_header, header_html, invocation_text, summary_tail, text_table
from fourfold.apps.experiments.warmup_claims import ARMS, CEILING, EV_KEY
from fourfold.apps.report_kit import fmt, md_table, mean, signed
from fourfold.atomic import write_text_atomic

COLUMNS = ("arm", "seeds", "gold - SFT (sd)", "KL", "EV it. 1", "EV 1st policy it.", "/ ceiling", "EV first policy its.",
           "EV last 10", "EV (GAE targets) 1st policy it.")
"""The per-arm table's columns (EV: value/explained_variance_mc; means over seeds)."""
CURVE_POINTS = 10
"""Policy iterations shown in the explained-variance table."""


def _mean(vals: Sequence[float]) -> float:
    f = [float(v) for v in vals if v is not None and math.isfinite(float(v))]
    return mean(f) if f else math.nan


def ceiling_of(record: Mapping) -> float:
    """The ceiling: the ceiling arm's plateau EV, mean over seeds (nan without it)."""
    return _mean([r["ev_plateau"] for r in record["stats"].get(CEILING, {}).values()])


def ordered(stats: Mapping) -> list[str]:
    return sorted(stats, key=lambda a: ARMS.index(a) if a in ARMS else len(ARMS))


def result_rows(record: Mapping) -> list[list[str]]:
    """One row per arm: the final gold (in the SFT sd) and KL, the critic's EV at its points (means over seeds)."""
    sft, ceil, rows = record.get("sft") or {}, ceiling_of(record), []
    for arm in ordered(record["stats"]):
        runs = record["stats"][arm]
        finals = record["finals"].get(arm, [])
        gain = _mean([(f["gold"] - sft["gold"]) / sft["gold_std"] for f in finals]) if sft and finals else math.nan
        m = {k: _mean([r[k] for r in runs.values()]) for k in ("ev_iter1", "ev_first", "ev_early", "ev_tail", "ev_lam_first")}
        critic = arm != "ppo-no-critic"
        rel = m["ev_first"] / ceil if critic and math.isfinite(ceil) and ceil > 0 else math.nan
        ev = [fmt(m[k], 3) if critic else "-" for k in ("ev_iter1", "ev_first")]
        rows.append([arm, str(len(runs)), signed(gain), fmt(_mean([f.get("kl") for f in finals]), 2), *ev,
                     fmt(rel, 2) if critic else "-", *[fmt(m[k], 3) if critic else "-" for k in ("ev_early", "ev_tail", "ev_lam_first")]])
    return rows


def curve_rows(record: Mapping) -> list[list[str]]:
    """Per critic arm the EV at policy iterations 1..CURVE_POINTS (mean over seeds); the ceiling arm's warm-up curve."""
    rows = []
    for arm in ordered(record["stats"]):
        runs = list(record["stats"][arm].values())
        if arm == "ppo-no-critic" or not runs:
            continue
        if arm == CEILING:
            w = runs[0]["warmup"]
            pts = [i for i in range(0, w, max(1, w // CURVE_POINTS))][:CURVE_POINTS]
            label = "ceiling (warm-up iterations " + ", ".join(str(i + 1) for i in pts) + ")"
        else:
            w, pts, label = runs[0]["warmup"], [], arm
            pts = [w + i for i in range(CURVE_POINTS)]
        vals = [_mean([r["ev"][i] if i < len(r["ev"]) else math.nan for r in runs]) for i in pts]
        rows.append([label, ", ".join(fmt(v, 2) for v in vals)])
    return rows


def warmup_header(cfg: ExperimentsConfig, record: Mapping) -> str:
    wc = cfg.warmup
    return family_header(
        "warmup",
        f"The critic's start and its warm-up where the critic pays: {record['world']['label']}, {record['world']['what']}. "
        f"Arms: {'; '.join(f'{a}: {w}' for a, w in record['arms'].items())}. Every arm x seed "
        f"({', '.join(map(str, cfg.seeds))}) for {cfg.iterations} policy iterations (a warm-up's {wc.warmup} "
        f"first), the demo's PPO otherwise; gold on {cfg.eval_prompts} held-out prompts. EV is {EV_KEY} (of the "
        f"Monte Carlo return) on each batch before the critic's update; the ceiling: the ceiling arm's mean over its "
        f"last {wc.claims.plateau_iterations} warm-up iterations, {fmt(ceiling_of(record), 3)}. Thresholds fixed "
        "before the first run (warmup.claims, docs/experiments.md).",
        invocation_text(record, cfg.workers))


def write_warmup_report(out: Path, cfg: ExperimentsConfig, record: Mapping) -> None:
    """summary.md and report.html of the family in ``out``."""
    from fourfold.reporting import html_page

    header = warmup_header(cfg, record)
    rows, curves = result_rows(record), curve_rows(record)
    title = "## Gold and the critic's explained variance (means over seeds)"
    ctitle = f"## {EV_KEY} per policy iteration (mean over seeds; the ceiling arm: its warm-up)"
    parts = [header, title, "", md_table(COLUMNS, rows), "", ctitle, "", md_table(("arm", "EV"), curves), ""]
    write_text_atomic(out / "summary.md", "\n".join(parts + summary_tail(record["notes"], record["claims"])))
    body = [header_html(header)] + claims_html(record["claims"], record["notes"])
    body += [f"<h2>{title[3:]}</h2>", text_table(COLUMNS, rows), f"<h2>{ctitle[3:]}</h2>", text_table(("arm", "EV"), curves)]
    write_text_atomic(out / "report.html", html_page("fourfold experiments: the warm-up family", "\n".join(body)))
