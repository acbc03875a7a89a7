"""The turns family's part of publishing (:mod:`fourfold.apps.publish` calls it): its results/turns.json
record from the family's results.json, its docs/experiments.md block and its README headline row.
Plain data in, text out; nothing here runs a model.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional

from fourfold.apps.claim_kit import claims_md, headline_row
from fourfold.apps.report_kit import fmt, signed

NOT_YET = ("*No results published yet.* `fourfold experiments --config examples/turns.yaml` runs it and "
           "`python -m fourfold.apps.publish collect` puts its table, figure and claims here (`make results` too).")


def turns_record(res: Mapping, provenance: Mapping) -> dict:
    """The committed summary of the family's ``results.json`` record ``res``: the SFT policy's and
    every arm's held-out gold per world, the claims, with the run's provenance."""
    cfg = res.get("config", {})
    t = cfg.get("turns", {})
    return {"claims": res.get("claims", []), "summaries": res.get("summaries", {}), "sft": res.get("sft", {}),
            "worlds": res.get("worlds", {}), "seeds": cfg.get("seeds"), "iterations": cfg.get("iterations"),
            "eval_prompts": cfg.get("eval_prompts"), "group_size": cfg.get("group_size"), "hops": t.get("hops"),
            "arms": t.get("arms"), "wall_s": res.get("wall_s"), "provenance": dict(provenance)}


def turns_text(r: Optional[Mapping], made: Callable[[Mapping], str]) -> str:
    """The docs/experiments.md block (``made``: the provenance sentence of :mod:`fourfold.apps.publish`)."""
    if not r:
        return NOT_YET
    lines = [f"`fourfold experiments --config examples/turns.yaml`: {r['wall_s'] / 60:.1f} minutes, "
             f"{made(r['provenance'])}; {len(r['seeds'])} seeds; {r['iterations']} iterations; gold on "
             f"{r['eval_prompts']} held-out rows per world, mean ± sd over seeds (gain: minus the SFT policy's):", "",
             "| turns | arm | gold sampled | gain | gold greedy | gain greedy |", "|---|---|---|---|---|---|"]
    for w, info in r["worlds"].items():
        sft = r["sft"].get(w)
        if sft is None:
            continue
        lines.append(f"| {info['turns']} | SFT (before) | {fmt(sft['gold'])} | | {fmt(sft['gold_greedy'])} | |")
        for a, s in r["summaries"].get(w, {}).items():
            sd = f" ± {fmt(s['gold_sd'])}" if s.get("gold_sd") is not None else ""
            lines.append(f"| {info['turns']} | {a} | {fmt(s['gold'])}{sd} | {signed(s['gain'])} | "
                         f"{fmt(s['gold_greedy'])} | {signed(s['gain_greedy'])} |")
    lines += ["", "![held-out gold against the turns, and ppo's gold minus each arm's](img/turns.png)", "",
              claims_md(r["claims"])]
    return "\n".join(lines)


def turns_headline(r: Optional[Mapping]) -> list[str]:
    """The README headline table's row ([] until the family is published)."""
    if not r:
        return []
    critic = "; ".join(f"{c['claim'].split(' (')[0]}: {c['holds']}" for c in r["claims"] if c["group"] == "critic")
    turns = ", ".join(str(v["turns"]) for v in r["worlds"].values())
    return [headline_row(f"does the critic pay more as the turns grow? the lookup world at {turns} turns", r["claims"],
                         critic or "the critic claims not checked", "fourfold experiments --config examples/turns.yaml",
                         "[docs/experiments.md](docs/experiments.md#the-turns-family)")]
