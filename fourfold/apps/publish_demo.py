"""The demo's published figures: :func:`collect_demo` (results/demo.json from the demo runs),
:func:`file_by_machine` (results/machines.json) and the blocks they render (the seed table, the
quick demo's line, the machines' table and spread). Nothing here runs a model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping, Sequence

from fourfold.apps.publish_io import made_all, read, run_provenance
from fourfold.apps.report_kit import fmt, pct, signed


def collect_demo_run(run: Path) -> dict:
    """One demo run's published numbers: SFT -> PPO on its held-out prompts, its reward model."""
    ev = read(run / "eval.json")
    if not ev:
        raise FileNotFoundError(f"{run / 'eval.json'}: no demo evaluation (run the demo first)")
    rm = (read(run / "stages" / "reward" / "DONE") or {}).get("result", {})
    cfg_text = (run / "config.yaml").read_text(encoding="utf-8") if (run / "config.yaml").is_file() else ""
    prompts = re.search(r"^eval:\n  prompts: (\d+)", cfg_text, re.M)
    walls = [(read(run / "stages" / s / "DONE") or {}).get("result", {}).get("wall_s") for s in ("sft", "pairs", "reward", "ppo", "eval")]
    b, a = ev["sft"], ev["ppo"]
    return {"provenance": run_provenance(run), "eval_prompts": int(prompts.group(1)) if prompts else None,
            **{k: [b[k], a[k]] for k in ("proxy", "gold", "length", "well_formed", "repetition")},
            "kl": a["kl"], "gold_gain_sd": ev["gold_gain_sd"],
            "rm_accuracy_vs_labelers": rm.get("accuracy_vs_labelers"), "rm_accuracy_vs_gold": rm.get("accuracy_vs_gold"),
            "rm_slips_accuracy_vs_gold": rm.get("slips_accuracy_vs_gold"),
            "stages_s": round(sum(w for w in walls if w), 1)}


def collect_demo(full: Sequence[Path], quick: Sequence[Path]) -> dict:
    """results/demo.json: {full: {seed: run}, quick: {seed: run}} (the seed read from each run's config)."""
    def by_seed(runs: Sequence[Path]) -> dict:
        out = {}
        for run in runs:
            m = re.search(r"^  seed: (\d+)", (run / "config.yaml").read_text(encoding="utf-8"), re.M)
            out[m.group(1) if m else str(len(out))] = collect_demo_run(run)
        return out

    return {"full": by_seed(full), "quick": by_seed(quick)}


def file_by_machine(machines: Mapping, demo: Mapping) -> dict:
    """results/machines.json's ``machines``, {machine: {full|quick: {seed: run}}}, with the runs of a
    demo record (:func:`collect_demo`'s shape) filed under the machine their provenance names,
    replacing that machine's run of the same part and seed: the same commands' figures on every
    machine they were run on (docs/demo.md, "On another machine")."""
    out = {m: {part: dict(runs) for part, runs in parts.items()} for m, parts in machines.items()}
    for part, runs in demo.items():
        for seed, run in runs.items():
            out.setdefault(run["provenance"]["machine"], {}).setdefault(part, {})[seed] = run
    return out


def seed_order(runs: Mapping[str, Mapping]) -> list[str]:
    """The seeds of ``{seed: run}`` in numeric order."""
    return sorted(runs, key=int)


def quick_demo_text(res: Mapping) -> str:
    q = res["demo"]["quick"]
    seeds = seed_order(q)
    prompts = {q[s].get("eval_prompts") for s in seeds}
    return (f"gold {' / '.join(signed(q[s]['gold_gain_sd']) for s in seeds)} SFT sd over SFT on seeds "
            f"{' / '.join(seeds)} ({'/'.join(str(p) for p in prompts)} held-out prompts; "
            f"{made_all([(f'seed {s}', q[s]['provenance']) for s in seeds])})")


def demo_seed_table(res: Mapping) -> str:
    runs = res["demo"]["full"]
    seeds = seed_order(runs)
    head = ("| seed | proxy (RM) | gold | gold gain | KL (nats/response) | length (words) | well-formed | repetition "
            "| RM acc. vs labelers / vs gold / on one-slip pairs |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    def arrow(r: Mapping, key: str, d: int) -> str:
        return f"{fmt(r[key][0], d)} -> {fmt(r[key][1], d)}"

    for s in seeds:
        r = runs[s]
        lines.append(f"| {s} | {arrow(r, 'proxy', 2)} | {arrow(r, 'gold', 2)} | {signed(r['gold_gain_sd'])} sd | "
                     f"{fmt(r['kl'], 1)} | {arrow(r, 'length', 1)} | {arrow(r, 'well_formed', 3)} | "
                     f"{arrow(r, 'repetition', 3)} | "
                     f"{pct(r['rm_accuracy_vs_labelers'], 1)} / {pct(r['rm_accuracy_vs_gold'], 1)} / "
                     f"{pct(r['rm_slips_accuracy_vs_gold'])} |")
    prompts = {runs[s].get("eval_prompts") for s in seeds}
    return ("\n".join(lines) + f"\n\nSFT -> PPO on {'/'.join(map(str, prompts))} held-out prompts; "
            + made_all([(f"seed {s}", runs[s]["provenance"]) for s in seeds]) + ".")


def _gains(runs: Mapping) -> str:
    return " / ".join(f"{signed(runs[s]['gold_gain_sd'])}" for s in seed_order(runs)) if runs else "-"


def _spread(res: Mapping, part: str) -> tuple[int, int, float, float]:
    """(runs, machines, lowest, highest gold gain) of one part of the demo over every machine."""
    machines = (res.get("machines") or {}).get("machines", {})
    gains = [r["gold_gain_sd"] for parts in machines.values() for r in parts.get(part, {}).values()]
    n = sum(1 for parts in machines.values() if parts.get(part))
    return len(gains), n, min(gains, default=float("nan")), max(gains, default=float("nan"))


def machines_table(res: Mapping) -> str:
    """docs/demo.md's table of the demo's figures on each machine it was run on."""
    machines = (res.get("machines") or {}).get("machines", {})
    lines = ["| machine (as recorded) | demo: gold gain, seeds | RM vs gold | quick demo: gold gain, seeds | RM vs gold |",
             "|---|---|---|---|---|"]
    for m in sorted(machines):
        full, quick = machines[m].get("full", {}), machines[m].get("quick", {})
        rm = lambda runs: " / ".join(pct(runs[s]["rm_accuracy_vs_gold"], 1) for s in seed_order(runs)) if runs else "-"
        lines.append(f"| {m} | {_gains(full)} ({', '.join(seed_order(full)) or '-'}) | {rm(full)} | "
                     f"{_gains(quick)} ({', '.join(seed_order(quick)) or '-'}) | {rm(quick)} |")
    commits = sorted({r["provenance"]["commit"] for parts in machines.values() for runs in parts.values() for r in runs.values()})
    text = "\n".join(lines)
    for part, name in (("full", "the demo"), ("quick", "the quick demo")):
        n, k, lo, hi = _spread(res, part)
        if n:
            text += f"\n\nOver {n} runs of {name} on {k} machines: gold gain {signed(lo)} to {signed(hi)} sd."
    return text + f" Commits: {', '.join(commits)}."


def machine_spread_text(res: Mapping) -> str:
    """README's line on how far the figures move from machine to machine."""
    n, k, lo, hi = _spread(res, "full")
    if not n:
        return "measured on one machine only"
    machines = res["machines"]["machines"].values()
    counts = {len(parts.get("full", {})) for parts in machines if parts.get("full")}
    each = f" ({counts.pop()} seeds each)" if len(counts) == 1 else ""
    return f"over {n} runs on {k} machines{each} the demo's gold gain was {signed(lo)} to {signed(hi)} sd"
