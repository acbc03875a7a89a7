"""The staleness family's part of publishing (``fourfold experiments --config examples/staleness.yaml``,
docs/experiments.md "Running ahead: the corrections where they matter"; :mod:`fourfold.apps.publish`
calls it): its results/staleness.json record, its docs/experiments.md block and its README headline
row. The record keeps the family's claims whole (each with its kind, null and what the null
compared: the run computed them), per world the SFT model's gold, per arm and seed the final gold
and KL, and the per-run statistics the claims read (:func:`fourfold.apps.experiments.staleness_claims.run_stats`).
Plain data in, text out; nothing here runs a model.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional

from fourfold.apps.claim_kit import claims_md, counts_text, headline_row
from fourfold.apps.report_kit import md_table

NOT_YET = ("*Not run yet.* `fourfold experiments --config examples/staleness.yaml` runs it and `python -m "
           "fourfold.apps.publish collect` puts its per-arm table and its claims here.")
FINAL_KEYS = ("seed", "n", "gold", "gold_std", "kl", "length", "well_formed")
"""What the record keeps of each run's final evaluation."""


def staleness_record(res: Mapping, provenance: Mapping) -> dict:
    """results/staleness.json from the family's ``results.json`` record ``res``."""
    cfg = res.get("config", {})
    sc = cfg.get("staleness", {})
    finals = {w: {arm: [{k: row.get(k) for k in FINAL_KEYS} for row in rows] for arm, rows in by_arm.items()}
              for w, by_arm in (res.get("finals") or {}).items()}
    return {"claims": list(res.get("claims", [])), "notes": list(res.get("notes", [])),
            "worlds": dict(res.get("worlds", {})), "arms": dict(res.get("arms", {})),
            "sft": {w: {k: s.get(k) for k in ("gold", "gold_std")} for w, s in (res.get("sft") or {}).items()},
            "finals": finals, "stats": res.get("stats", {}),
            "seeds": cfg.get("seeds"), "iterations": cfg.get("iterations"), "eval_prompts": cfg.get("eval_prompts"),
            "ks": sc.get("ks"), "objectives": sc.get("objectives"), "top_p": sc.get("top_p"),
            "rollout_batch_size": cfg.get("demo", {}).get("ppo", {}).get("rollout_batch_size"),
            "wall_s": res.get("wall_s"), "provenance": dict(provenance)}


def staleness_text(r: Optional[Mapping], made: Callable[[Mapping], str]) -> str:
    """The docs/experiments.md block (``made``: the provenance sentence of :mod:`fourfold.apps.publish`)."""
    if not r:
        return NOT_YET
    from fourfold.apps.experiments.staleness_claims import arm_name, topp_name
    from fourfold.apps.experiments.staleness_report import COLUMNS, result_rows

    p = r["provenance"]
    order = [arm_name(o, k) for k in r["ks"] for o in r["objectives"]] + [topp_name(o) for o in r["objectives"]]
    rank = {a: i for i, a in enumerate(order)}
    stats = {w: dict(sorted(arms.items(), key=lambda kv: rank.get(kv[0], len(rank)))) for w, arms in r["stats"].items()}
    lines = [f"`{p.get('command')}`: {r['wall_s'] / 60:.1f} minutes for this invocation, {made(p)}; worlds "
             f"{', '.join(r['worlds'])}; seeds {', '.join(map(str, r['seeds']))}; {r['iterations']} iterations x "
             f"{r['rollout_batch_size']} responses per run, {r['eval_prompts']} held-out prompts. Per world and arm: "
             "the final gold minus the SFT model's in its per-sample sd, the final KL (nats), and the means over "
             "iterations, then over seeds, of the first minibatch's |r - 1|, the sampler-trainer token mismatch "
             "|d|, the importance weights' ESS (its smallest), the TIS weight, the clip share; seeds with a gold "
             "crash, a grad-norm spike, an entropy collapse; seeds whose lag was exactly min(i - 1, k):", "",
             md_table(COLUMNS, result_rows({**r, "stats": stats})), "",
             f"**Staleness claims: {counts_text(r['claims'])}** (thresholds fixed before the run, "
             "`staleness.claims` in examples/staleness.yaml; the null column: the same verdict on the comparison "
             "the row's `null_what` names in results/staleness.json):", "", claims_md(r["claims"])]
    lines += ([""] + [f"- {n}" for n in r["notes"]]) if r["notes"] else []
    return "\n".join(lines)


def staleness_headline(r: Optional[Mapping]) -> list[str]:
    """The README headline table's row ([] until the family is published)."""
    if not r:
        return []
    groups = ("stale-cost", "decoupled", "top-p", "stability")
    each = "; ".join(f"{g}: {sum(c['holds'] == 'yes' for c in r['claims'] if c.get('group') == g)}/"
                     f"{sum(c.get('group') == g for c in r['claims'])} hold"
                     for g in groups if any(c.get("group") == g for c in r["claims"]))
    return [headline_row(f"a sampler running ahead: lag k = {', '.join(map(str, r['ks']))} x the objectives for "
                         f"stale samples, and top-p {r['top_p']:g} (worlds {', '.join(r['worlds'])})", r["claims"],
                         f"{len(r['seeds'])} seeds; {each or 'no finding stated'}",
                         r["provenance"].get("command") or "fourfold experiments --config examples/staleness.yaml",
                         "[docs/experiments.md](docs/experiments.md#running-ahead-the-corrections-where-they-matter)")]
