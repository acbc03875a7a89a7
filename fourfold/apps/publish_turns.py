"""The turns family's part of publishing (:mod:`fourfold.apps.publish` calls it): its results/turns.json
record from the family's results.json, its docs/experiments.md block and its README headline row.
Plain data in, text out; nothing here runs a model.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional

from fourfold.apps.claim_kit import claims_md, headline_row
from fourfold.apps.report_kit import fmt, mean, signed

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
            "arms": t.get("arms"), "wall_s": res.get("wall_s"), "provenance": dict(provenance),
            **({"shapes": res["shapes"], "ev_curves": res.get("ev_curves", {}), "critic_lr": t.get("critic_lr"),
                "critic_warmup": t.get("critic_warmup")} if res.get("shapes") else {})}


def _ev_lines(r: Mapping) -> list[str]:
    """The critics' explained variance per iteration (mean over seeds), one row per world and arm."""
    rows = []
    for w, by in r.get("ev_curves", {}).items():
        for a, cs in by.items():
            n = max((len(c) for c in cs), default=0)
            ys = [mean([c[i] for c in cs if len(c) > i]) for i in range(n)]
            if ys:
                rows.append(f"| {r['worlds'][w]['turns']} | {a} | {' '.join(fmt(y, 2) for y in ys)} |")
    if not rows:
        return []
    return ["", f"The critics' value/explained_variance per iteration, mean over seeds (critic_lr {r['critic_lr']:g}, "
                f"{r['critic_warmup']} warm-up iterations first):", "",
            "| turns | arm | explained variance per iteration |", "|---|---|---|", *rows]


def turns_text(r: Optional[Mapping], made: Callable[[Mapping], str]) -> str:
    """The docs/experiments.md block (``made``: the provenance sentence of :mod:`fourfold.apps.publish`)."""
    if not r:
        return NOT_YET
    lines = [f"`fourfold experiments --config examples/turns.yaml`: {r['wall_s'] / 60:.1f} minutes, "
             f"{made(r['provenance'])}; {len(r['seeds'])} seeds; {r['iterations']} iterations; gold on "
             f"{r['eval_prompts']} held-out rows per world, mean ± sd over seeds (gain: minus the SFT policy's):", "",
             "| turns | arm | gold sampled | gain | gold greedy | gain greedy |", "|---|---|---|---|---|---|"]
    shapes = r.get("shapes")
    if shapes:  # the rerun's record: rows x K and the critic's explained variance beside the gold
        lines[-2:] = ["| turns | arm | rows x K | gold sampled | gain | gold greedy | gain greedy | EV end |",
                      "|---|---|---|---|---|---|---|---|"]
    for w, info in r["worlds"].items():
        sft = r["sft"].get(w)
        if sft is None:
            continue
        lines.append(f"| {info['turns']} | SFT (before) | {'| ' if shapes else ''}{fmt(sft['gold'])} | | "
                     f"{fmt(sft['gold_greedy'])} | |{' |' if shapes else ''}")
        for a, s in r["summaries"].get(w, {}).items():
            sd = f" ± {fmt(s['gold_sd'])}" if s.get("gold_sd") is not None else ""
            shape = f"{shapes.get(a, '')} | " if shapes else ""
            ev = f" {fmt(s['ev_tail'], 3) if 'ev_tail' in s else ''} |" if shapes else ""
            lines.append(f"| {info['turns']} | {a} | {shape}{fmt(s['gold'])}{sd} | {signed(s['gain'])} | "
                         f"{fmt(s['gold_greedy'])} | {signed(s['gain_greedy'])} |{ev}")
    lines += _ev_lines(r) if shapes else []
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
