"""The measurement sweep's part of publishing (``fourfold experiments --config examples/measure.yaml``,
docs/experiments.md "The update's measurements"; :mod:`fourfold.apps.publish` calls it): its
results/measure.json record, its docs/experiments.md block and its README headline row. The record
keeps the sweep's 'measure' claims whole (each with its kind, why, null and what the null compared:
the run computed them) and, per arm and seed, the per-iteration metrics those claims read, taken
from each run's ``metrics.jsonl``. Plain data in, text out; nothing here runs a model.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Mapping, Optional

from fourfold.apps.claim_kit import claims_md, counts_text, headline_row
from fourfold.apps.report_kit import finite, fmt, mean, signed, std

NOT_YET = ("*Not run yet.* `fourfold experiments --config examples/measure.yaml` runs it and `python -m "
           "fourfold.apps.publish collect` puts its per-arm table and the 'measure' claims here.")

METRICS = (("approx_kl", "policy/approx_kl", "mean"), ("clipfrac", "policy/clipfrac", "mean"),
           ("entropy_tail", "policy/entropy", "tail"), ("grad_snr", "policy/grad_snr", "mean"),
           ("dual_clipfrac", "policy/dual_clipfrac", "mean"), ("grad_norm_max", "policy/grad_norm", "max"))
"""(name in the record, metric, over the iterations: mean, the last quarter's mean, the largest)."""


def run_metrics(curve: Mapping) -> dict:
    """One run's metrics of :data:`METRICS` from its curves (:func:`fourfold.apps.experiments.read_curves`),
    as the 'measure' claims read them; None where not logged."""
    from fourfold.apps.experiments.measure_claims import MEASURE, run_max, run_mean, run_tail

    c = {"a": {0: curve}}
    fns = {"mean": lambda k: run_mean(c, "a", 0, k), "max": lambda k: run_max(c, "a", 0, k),
           "tail": lambda k: run_tail(c, "a", 0, k, MEASURE["entropy_tail_share"])}
    out = {name: fns[how](key) for name, key, how in METRICS}
    return {k: (v if math.isfinite(v) else None) for k, v in out.items()}


SUMMARY_KEYS = ("seeds", "gold", "gold_delta_sd", "gold_delta_sd_sd", "kl", "kl_sd", "length", "well_formed")


def measure_record(res: Mapping, provenance: Mapping, out: Path) -> dict:
    """results/measure.json from the sweep's ``results.json`` record ``res`` and its output
    directory ``out`` (runs/ARM/seedS/metrics.jsonl; absent ones skipped)."""
    from fourfold.apps.experiments import read_curves

    cfg = res.get("config", {})
    metrics: dict = {}
    for arm, rows in (res.get("finals") or {}).items():
        for row in rows:
            rd = Path(out) / "runs" / arm / f"seed{row['seed']}"
            if (rd / "metrics.jsonl").is_file():
                metrics.setdefault(arm, {})[str(row["seed"])] = run_metrics(read_curves(rd))
    ran, order = res.get("summaries", {}), cfg.get("arms", [])
    return {"claims": [c for c in res.get("claims", []) if c.get("group") == "measure"],
            "notes": [n for n in res.get("notes", []) if "'measure'" in n or "/seed" in n],
            "summaries": {a: {k: s.get(k) for k in SUMMARY_KEYS} for a, s in ran.items()},
            "arms": [a for a in order if a in ran] + sorted(a for a in ran if a not in order),
            "metrics": metrics, "sft": {k: res.get("sft", {}).get(k) for k in ("gold", "gold_std")},
            "seeds": cfg.get("seeds"), "iterations": cfg.get("iterations"), "eval_prompts": cfg.get("eval_prompts"),
            "rollout_batch_size": cfg.get("demo", {}).get("ppo", {}).get("rollout_batch_size"),
            "wall_s": res.get("wall_s"), "provenance": dict(provenance)}


def _pm(xs, text: Callable[[float], str]) -> str:
    """Mean ± sd over seeds of the logged values (the sd from two seeds on); '-' for none."""
    xs = finite([x for x in xs if x is not None])
    if not xs:
        return "-"
    sd = std(xs)
    return text(mean(xs)) + (f" ± {text(sd).lstrip('+')}" if math.isfinite(sd) else "")


def measure_text(r: Optional[Mapping], made: Callable[[Mapping], str]) -> str:
    """The docs/experiments.md block (``made``: the provenance sentence of :mod:`fourfold.apps.publish`)."""
    if not r:
        return NOT_YET
    p = r["provenance"]
    lines = [f"`{p.get('command')}`: {r['wall_s'] / 60:.1f} minutes, {made(p)}; seeds "
             f"{', '.join(map(str, r['seeds']))}; {r['iterations']} iterations x {r['rollout_batch_size']} responses per "
             f"run, {r['eval_prompts']} held-out prompts. Gold change in units of the SFT samples' gold sd "
             f"({fmt(r['sft'].get('gold_std'))}), final KL to the reference; per run the metrics the claims read "
             "(mean over iterations; entropy: the last quarter's mean; grad norm: the largest; '-': not logged); "
             "mean ± sd over seeds:", "",
             "| arm | seeds | gold - SFT (sd) | KL (nats) | approx_kl | clipfrac | entropy, last quarter | grad SNR | "
             "dual clipfrac | grad norm, largest |", "|---|---|---|---|---|---|---|---|---|---|"]
    f3, f4 = (lambda x: fmt(x, 3)), (lambda x: fmt(x, 4))
    cols = (("approx_kl", f4), ("clipfrac", f3), ("entropy_tail", f3), ("grad_snr", f3), ("dual_clipfrac", f4),
            ("grad_norm_max", lambda x: fmt(x, 2)))
    for arm in r["arms"]:
        s, runs = r["summaries"][arm], r["metrics"].get(arm, {}).values()
        lines.append(f"| {arm} | {s.get('seeds')} | {_pm_one(s, 'gold_delta_sd', signed)} | {_pm_one(s, 'kl', f3)} | "
                     + " | ".join(_pm([m.get(k) for m in runs], f) for k, f in cols) + " |")
    lines += ["", f"**Measurement claims: {counts_text(r['claims'])}** (thresholds fixed before the run, "
                  "`fourfold/apps/experiments/measure_claims.py`, `MEASURE`; the null column: the same verdict on "
                  "the comparison the row's `null_what` names in results/measure.json):", "", claims_md(r["claims"])]
    lines += ([""] + [f"- {n}" for n in r["notes"]]) if r["notes"] else []
    return "\n".join(lines)


def _pm_one(s: Mapping, key: str, text: Callable[[float], str]) -> str:
    x, sd = s.get(key), s.get(f"{key}_sd")
    if not isinstance(x, (int, float)) or not math.isfinite(x):
        return "-"
    return text(x) + (f" ± {text(sd).lstrip('+')}" if isinstance(sd, (int, float)) and math.isfinite(sd) else "")


def measure_headline(r: Optional[Mapping]) -> list[str]:
    """The README headline table's row ([] until the sweep is published)."""
    if not r:
        return []
    keys = ("clip-gold-stress", "clip-kl-stress", "critic-gold", "baseline-gold-reinforce", "baseline-snr")
    by_key = {c.get("key"): c for c in r["claims"]}
    each = "; ".join(f"{by_key[k]['claim'].split(' (')[0]}: {by_key[k]['holds']}" for k in keys if k in by_key)
    return [headline_row("the update's own claims on gold: the clip, a baseline, the critic, REINFORCE's variance",
                         r["claims"], f"{len(r['seeds'])} seeds; {each or 'none checked'}",
                         "fourfold experiments --config examples/measure.yaml",
                         "[docs/experiments.md](docs/experiments.md#the-updates-measurements-issue-39)")]
