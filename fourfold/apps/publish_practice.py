"""The practice sweep's part of publishing (``fourfold experiments --config examples/practice.yaml``,
docs/correction.md "Sweep arms"; :mod:`fourfold.apps.publish` calls it): its results/practice.json
record and its docs/correction.md block. The record is the claims sweep's
(:func:`fourfold.apps.publish.collect_experiments`) plus the practice claims' notes and, per arm and
seed, the per-iteration metrics those claims read, taken from each run's ``metrics.jsonl``. Plain
data in, text out; nothing here runs a model.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Mapping, Optional

from fourfold.apps.claim_kit import claims_md, counts_text, headline_row
from fourfold.apps.report_kit import finite, fmt, mean, signed, std

NOT_YET = ("*Not run yet.* `fourfold experiments --config examples/practice.yaml` runs it and `python -m "
           "fourfold.apps.publish collect` puts its per-arm table and the practice claims here.")

WARMUP_ARM = "ppo-critic-warmup"
"""The arm whose first policy iteration is ``critic_warmup + 1`` (every other arm's is 1)."""

def _at(curve: Mapping, key: str, it: int) -> Optional[float]:
    for i, v in zip(curve.get("iteration", []), curve.get(key, [])):
        if int(i) == it:
            return v if math.isfinite(v) else None
    return None


def run_metrics(curve: Mapping, first: int) -> dict:
    """One run's practice metrics from its curves (:func:`fourfold.apps.experiments.read_curves`), as
    the practice claims read them: the critic's explained variance at iteration 1 and at ``first``
    (its first policy iteration), ``mismatch/token_abs_diff_mean``'s smallest, ``policy/first_ratio_abs_dev``'s
    largest and ``mismatch/is_truncated_share``'s mean over the logged iterations; None where not logged."""
    def over(key: str, fn: Callable) -> Optional[float]:
        xs = finite(curve.get(key, []))
        return fn(xs) if xs else None

    return {"ev_1": _at(curve, "value/explained_variance", 1),
            "ev_first": _at(curve, "value/explained_variance", first),
            "token_diff_min": over("mismatch/token_abs_diff_mean", min),
            "first_ratio_max": over("policy/first_ratio_abs_dev", max),
            "truncated_mean": over("mismatch/is_truncated_share", mean)}


def practice_record(record: Mapping, res: Mapping, out: Path) -> dict:
    """results/practice.json: ``record`` (the sweep's, :func:`fourfold.apps.publish.collect_experiments`)
    with its 'practice' claims only, the notes on those it could not check, the arms in the order
    the sweep ran them, ppo-critic-warmup's warm-up iterations, and {arm: {seed: metrics}} read
    from ``out``/runs/ARM/seedS/metrics.jsonl (the sweep's run directories; absent ones skipped)."""
    from fourfold.apps.experiments import read_curves
    from fourfold.apps.experiments.arms import critic_warmup_iterations
    from fourfold.apps.experiments.config import ExperimentsConfig

    warmup = critic_warmup_iterations(ExperimentsConfig(iterations=int(record["iterations"])))
    metrics: dict = {}
    for arm, rows in (res.get("finals") or {}).items():
        for row in rows:
            rd = Path(out) / "runs" / arm / f"seed{row['seed']}"
            if (rd / "metrics.jsonl").is_file():
                first = warmup + 1 if arm == WARMUP_ARM else 1
                metrics.setdefault(arm, {})[str(row["seed"])] = run_metrics(read_curves(rd), first)
    notes = [n for n in res.get("notes", []) if n.startswith("claims 'practice'")]
    ran, order = record["summaries"], res.get("config", {}).get("arms", [])
    return {**record, "claims": [c for c in record["claims"] if c["group"] == "practice"],
            "notes": list(dict.fromkeys(notes)), "critic_warmup": warmup, "metrics": metrics,
            "arms": [a for a in order if a in ran] + sorted(a for a in ran if a not in order)}


def _pm(xs, text: Callable[[float], str]) -> str:
    """Mean ± sd over seeds of the logged values (the sd from two seeds on); '-' for none."""
    xs = finite([x for x in xs if x is not None])
    if not xs:
        return "-"
    sd = std(xs)
    return text(mean(xs)) + (f" ± {text(sd).lstrip('+')}" if math.isfinite(sd) else "")


def practice_text(r: Optional[Mapping], made: Callable[[Mapping], str]) -> str:
    """The docs/correction.md block (``made``: the provenance sentence of :mod:`fourfold.apps.publish`)."""
    if not r:
        return NOT_YET
    p, first = r["provenance"], r["critic_warmup"] + 1
    lines = [f"`{p.get('command')}`: {r['wall_s'] / 60:.1f} minutes, {made(p)}; seeds "
             f"{', '.join(map(str, r['seeds']))}; {r['iterations']} iterations x {r['rollout_batch_size']} responses per "
             f"run, {r['eval_prompts']} held-out prompts. Gold change in units of the SFT samples' gold sd "
             f"({fmt(r['sft'].get('gold_std'))}), final KL to the reference; the per-iteration metrics per run as the "
             f"claims read them (the first policy iteration: {first} for {WARMUP_ARM}, 1 for the others; "
             "'-': not logged); mean ± sd over seeds:", "",
             "| arm | seeds | gold - SFT (sd) | KL (nats) | explained variance, iteration 1 | explained variance, first "
             "policy iteration | mismatch token abs diff mean, smallest | first ratio abs dev, largest | truncated "
             "share, mean |", "|---|---|---|---|---|---|---|---|---|"]
    sci = lambda x: f"{x:.2e}"  # noqa: E731
    cols = (("ev_1", signed), ("ev_first", signed), ("token_diff_min", sci), ("first_ratio_max", sci),
            ("truncated_mean", lambda x: fmt(x, 4)))
    for arm in r["arms"]:
        s, runs = r["summaries"][arm], r["metrics"].get(arm, {}).values()
        gold = signed(s.get("gold_delta_sd")) + (f" ± {s['gold_delta_sd_sd']:.2f}" if _finite(s, "gold_delta_sd_sd") else "")
        kl = fmt(s.get("kl"), 1) + (f" ± {s['kl_sd']:.1f}" if _finite(s, "kl_sd") else "")
        lines.append(f"| {arm} | {s.get('seeds')} | {gold} | {kl} | "
                     + " | ".join(_pm([m.get(k) for m in runs], f) for k, f in cols) + " |")
    lines += ["", f"**Practice claims: {counts_text(r['claims'])}** (thresholds in the table above):", "",
              claims_md(r["claims"])]
    lines += ([""] + [f"- {n}" for n in r["notes"]]) if r["notes"] else []
    return "\n".join(lines)


def practice_headline(r: Optional[Mapping]) -> list[str]:
    """The README headline table's row ([] until the sweep is published)."""
    if not r:
        return []
    each = "; ".join(f"{c['claim'].split(' (')[0]}: {c['holds']}{' (check)' if c.get('kind') == 'check' else ''}"
                     for c in r["claims"])
    return [headline_row("PPO as practised now: critic warm-up, dual-clip, the bf16 copy with and without correction",
                         r["claims"], f"{len(r['seeds'])} seeds; {each or 'none checked'}",
                         "fourfold experiments --config examples/practice.yaml",
                         "[docs/correction.md](docs/correction.md#results)")]


def _finite(s: Mapping, key: str) -> bool:
    return isinstance(s.get(key), (int, float)) and math.isfinite(s[key])
