"""The warm-up family's part of publishing (``fourfold experiments --config examples/warmup.yaml``,
docs/experiments.md "The critic's warm-up, where the critic pays"; :mod:`fourfold.apps.publish`
calls it): its results/warmup.json record, its docs/experiments.md block and its README headline
row. The record keeps the family's claims whole (each with its kind and the null the run computed),
the SFT model's gold, per arm and seed the final gold and KL, the per-run statistics the claims read
(:func:`fourfold.apps.experiments.warmup_claims.run_stats`, the per-iteration explained variances
included) and the ceiling. Plain data in, text out; nothing here runs a model.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional

from fourfold.apps.claim_kit import claims_md, counts_text, headline_row
from fourfold.apps.report_kit import md_table

NOT_YET = ("*Not run yet.* `fourfold experiments --config examples/warmup.yaml` runs it and `python -m "
           "fourfold.apps.publish collect` puts its per-arm table and its claims here.")
FINAL_KEYS = ("seed", "n", "gold", "gold_std", "kl", "length", "well_formed")
"""What the record keeps of each run's final evaluation."""


def warmup_record(res: Mapping, provenance: Mapping) -> dict:
    """results/warmup.json from the family's ``results.json`` record ``res``."""
    from fourfold.apps.experiments.warmup_report import ceiling_of

    cfg = res.get("config", {})
    wc = cfg.get("warmup", {})
    finals = {arm: [{k: row.get(k) for k in FINAL_KEYS} for row in rows] for arm, rows in (res.get("finals") or {}).items()}
    sft = res.get("sft") or {}
    return {"claims": list(res.get("claims", [])), "notes": list(res.get("notes", [])),
            "world": dict(res.get("world", {})), "arms": dict(res.get("arms", {})),
            "sft": {k: sft.get(k) for k in ("gold", "gold_std")}, "finals": finals, "stats": res.get("stats", {}),
            "ceiling": ceiling_of(res), "seeds": cfg.get("seeds"), "iterations": cfg.get("iterations"),
            "eval_prompts": cfg.get("eval_prompts"), "warmup": wc.get("warmup"), "ceiling_warmup": wc.get("ceiling_warmup"),
            "rollout_batch_size": res.get("rollout_batch_size"),
            "wall_s": res.get("wall_s"), "provenance": dict(provenance)}


def warmup_text(r: Optional[Mapping], made: Callable[[Mapping], str]) -> str:
    """The docs/experiments.md block (``made``: the provenance sentence of :mod:`fourfold.apps.publish`)."""
    if not r:
        return NOT_YET
    from fourfold.apps.experiments.warmup_report import COLUMNS, curve_rows, result_rows

    p = r["provenance"]
    lines = [f"`{p.get('command')}`: {r['wall_s'] / 60:.1f} minutes for this invocation, {made(p)}; world "
             f"{r['world'].get('label')}; seeds {', '.join(map(str, r['seeds']))}; {r['iterations']} policy iterations "
             f"x {r['rollout_batch_size']} responses per run (a warm-up arm's {r['warmup']} critic-only iterations first; "
             f"the ceiling arm {r['ceiling_warmup']} + 1), {r['eval_prompts']} held-out prompts. Per arm: the final "
             "gold minus the SFT model's in its per-sample sd, the final KL (nats), and the critic's "
             "value/explained_variance_mc (of the Monte Carlo return, before the critic's update; means over seeds) "
             "at iteration 1, at the first policy iteration (and as a share of the ceiling, "
             f"{r['ceiling']:.3f}), over the first policy iterations, over the last 10 iterations; and the logged "
             "value/explained_variance (of the GAE targets) at the first policy iteration:", "",
             md_table(COLUMNS, result_rows(r)), "",
             "value/explained_variance_mc per policy iteration (mean over seeds; the ceiling arm: its warm-up):", "",
             md_table(("arm", "EV"), curve_rows(r)), "",
             f"**Warm-up claims: {counts_text(r['claims'])}** (thresholds fixed before the run, `warmup.claims` in "
             "examples/warmup.yaml; the null column: the same verdict on a comparison where it must say no):", "",
             claims_md(r["claims"])]
    lines += ([""] + [f"- {n}" for n in r["notes"]]) if r["notes"] else []
    return "\n".join(lines)


def warmup_headline(r: Optional[Mapping]) -> list[str]:
    """The README headline table's row ([] until the family is published)."""
    if not r:
        return []
    groups = ("rm-start", "closes", "early-ev", "warmup-gold", "warmup-keeps", "critic-pays")
    each = "; ".join(f"{g}: {sum(c['holds'] == 'yes' for c in r['claims'] if c.get('group') == g)}/"
                     f"{sum(c.get('group') == g for c in r['claims'])} hold"
                     for g in groups if any(c.get("group") == g for c in r["claims"]))
    return [headline_row(f"the critic's start and warm-up where the critic pays ({r['world'].get('label')}: the reward-"
                         f"model start vs a zero head, {r['warmup']} warm-up iterations, against a converged critic)",
                         r["claims"], f"{len(r['seeds'])} seeds; {each or 'no finding stated'}",
                         r["provenance"].get("command") or "fourfold experiments --config examples/warmup.yaml",
                         "[docs/experiments.md](docs/experiments.md#the-critics-warm-up-where-the-critic-pays)")]
