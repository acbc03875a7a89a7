"""The overoptimization family's part of publishing (:mod:`fourfold.apps.publish` calls it): its
results/overoptimization.json record from the family's results.json, its docs/experiments.md block
and its README headline row. Plain data in, text out; nothing here runs a model.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Optional

from fourfold.apps.claim_kit import claims_md, headline_row, null_says_yes
from fourfold.apps.report_kit import fmt, mean, signed

NOT_YET = ("*No results published yet.* `fourfold experiments --config examples/overoptimization.yaml` runs it and "
           "`python -m fourfold.apps.publish collect` puts its fits, figure and claims here (`make results` too).")


def overopt_record(res: Mapping, provenance: Mapping) -> dict:
    """The committed summary of the family's ``results.json`` record ``res``: fits and peaks per
    method and size, the default-KL runs' d per size, the claims, with the run's provenance."""
    cfg = res.get("config", {})
    o, curves = cfg.get("overoptimization", {}), res.get("curves", {})
    return {"claims": res.get("claims", []), "summaries": res.get("summaries", {}), "seeds": cfg.get("seeds"),
            "iterations": cfg.get("iterations"), **{k: o.get(k) for k in ("rm_pairs", "bon_n", "kl_coef", "lr_multiplier")},
            "default": {p: mean([math.sqrt(max(r["kl"], 0.0)) for r in runs]) for p, runs in curves.get("default", {}).items()},
            "default_kl_coef": res.get("default_kl_coef"), "rm": res.get("rm", {}), "wall_s": res.get("wall_s"),
            "provenance": dict(provenance)}


def _pm(s: Mapping, key: str, digits: int = 3) -> str:
    sd = s.get(key + "_sd")
    return fmt(s.get(key), digits) + (f" ± {sd:.{digits}f}" if isinstance(sd, (int, float)) and sd == sd else "")


def overopt_text(o: Optional[Mapping], made: Callable[[Mapping], str]) -> str:
    """The docs/experiments.md block (``made``: the provenance sentence of :mod:`fourfold.apps.publish`)."""
    if not o:
        return NOT_YET
    lines = [f"`fourfold experiments --config examples/overoptimization.yaml`: {o['wall_s'] / 60:.1f} minutes, "
             f"{made(o['provenance'])}; {len(o['seeds'])} seeds; best-of-n up to n = {o['bon_n']}; PPO kl_coef="
             f"{o['kl_coef']:g} at {o['lr_multiplier']:g}x the demo's learning rates, {o['iterations']} iterations. "
             "Gold gains in units of the SFT model's per-sample sd; fits per seed, mean ± sd:", "",
             "| method | RM pairs | alpha | beta | R^2 | gold peak (sd) | at d | last d | gold at last (sd) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m, name in (("bon", "best-of-n"), ("ppo", "PPO")):
        for p, s in sorted(o["summaries"].get(m, {}).items(), key=lambda kv: int(kv[0])):
            lines.append(f"| {name} | {p} | {_pm(s, 'alpha')} | {_pm(s, 'beta')} | {_pm(s, 'r2')} | "
                         f"{signed(s['peak_gain_sd'])} | {fmt(s['peak_d'], 2)} | {fmt(s['last_d'], 2)} | "
                         f"{signed(s['last_gain_sd'])} |")
    d = "; ".join(f"{p} pairs d = {fmt(v, 2)}" for p, v in sorted(o["default"].items(), key=lambda kv: int(kv[0])))
    lines += ["", f"PPO at the demo's default kl_coef={o['default_kl_coef']:g}: {d or 'not run'}.", "",
              "![gold and proxy against d = sqrt(KL), per reward-model size](img/overoptimization.png)", "",
              claims_md(o["claims"])]
    return "\n".join(lines)


def overopt_headline(o: Optional[Mapping]) -> list[str]:
    """The README headline table's row ([] until the family is published)."""
    return [headline_row(
        f"reward hacking as a law (Gao et al.): best-of-n and PPO at RMs of {', '.join(map(str, o['rm_pairs']))} pairs",
        o["claims"], f"{len(o['seeds'])} seed{'s' if len(o['seeds']) > 1 else ''}; "
        + "; ".join(f"{c['claim']}: {c['holds']}{' (flagged: its null says yes)' if null_says_yes(c) else ''}"
                    for c in o["claims"] if c["group"] == "peak"),
        "fourfold experiments --config examples/overoptimization.yaml",
        "[docs/experiments.md](docs/experiments.md#the-overoptimization-family)")] if o else []
