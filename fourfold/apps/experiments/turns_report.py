"""The turns family's report: ``summary.md`` (settings, gold per world and arm, claims last),
``turns.png`` (held-out gold against the turns per arm, and ppo's gold minus each other arm's) and
``report.html`` (the same with the figure and the training return curves). It reads the family's
record; it runs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.report import claims_html, family_header, header_html, invocation_text, summary_tail, text_table
from fourfold.apps.report_kit import fmt, md_table, mean, signed
from fourfold.atomic import write_text_atomic

COLUMNS = ("world", "turns", "arm", "seeds", "gold sampled", "gain", "gold greedy", "gain greedy", "turns / traj.",
           "train s")


def _pm(s: Mapping, k: str, digits: int = 3) -> str:
    sd = s.get(k + "_sd")
    return fmt(s.get(k), digits) + (f" ± {fmt(sd, digits)}" if isinstance(sd, (int, float)) else "")


def result_rows(record: Mapping) -> list[list[str]]:
    """Per world: the SFT policy's row, then each arm's (mean ± sd over seeds)."""
    rows = []
    for w, info in record["worlds"].items():
        sft = record["sft"].get(w)
        if sft is None:
            continue
        rows.append([w, str(info["turns"]), "SFT (before)", "1", fmt(sft["gold"]), "", fmt(sft["gold_greedy"]), "",
                     fmt(sft["turns_mean"], 2), ""])
        for a, s in record["summaries"].get(w, {}).items():
            rows.append([w, str(info["turns"]), a, str(s["seeds"]), _pm(s, "gold"), signed(s["gain"]),
                         _pm(s, "gold_greedy"), signed(s["gain_greedy"]), fmt(s["turns_mean"], 2), fmt(s["train_s"], 0)])
    return rows


def turns_header(cfg: ExperimentsConfig, record: Mapping) -> str:
    t = cfg.turns
    worlds = ", ".join(f"{w} ({v['turns']} turn{'s' if v['turns'] > 1 else ''}, max_tokens {v['max_tokens']})"
                       for w, v in record["worlds"].items())
    arms = "; ".join(f"{a}: {what}" for a, what in record["arms"].items())
    return family_header(
        "turns",
        f"The lookup world (ask a tool, then answer from its reply; values of {t.value_digits} digits) at {worlds}. "
        f"Per world one SFT model ({t.sft_examples} episodes of imperfect play, error rate {t.error_rate:g}, "
        f"{t.sft_steps_per_turn} steps a turn), then every arm x seed ({', '.join(map(str, cfg.seeds))}) for "
        f"{cfg.iterations} iterations, the same trajectories per iteration for every arm (K = {cfg.group_size} a row "
        f"for the group arms). Gold: the share of {cfg.eval_prompts} rows of held-out chains answered right, "
        "sampled at T = 1 (the claims' gold) and greedy; gain = minus the SFT policy's. Values: mean ± sd over seeds.",
        f"Arms: {arms}.", invocation_text(record, cfg.workers))


def turns_figure(record: Mapping):
    """Gold (sampled) against the turns per arm with the SFT policy's, and ppo minus each arm."""
    from matplotlib.figure import Figure

    from fourfold.apps.experiments.report import arm_colors

    fig = Figure(figsize=(10, 4))
    ax1, ax2 = fig.subplots(1, 2)
    worlds = [w for w in record["worlds"] if w in record["sft"]]
    turns = {w: record["worlds"][w]["turns"] for w in worlds}
    arms = list(record["arms"])
    colors = arm_colors(arms)
    ax1.plot([turns[w] for w in worlds], [record["sft"][w]["gold"] for w in worlds], "k--", label="SFT")
    for a in arms:
        pts = [(turns[w], record["summaries"][w][a]) for w in worlds if a in record["summaries"].get(w, {})]
        if pts:
            ax1.errorbar([x for x, _ in pts], [s["gold"] for _, s in pts], yerr=[s["gold_sd"] or 0 for _, s in pts],
                         marker="o", capsize=3, color=colors[a], label=a)
    for a in [a for a in arms if a != "ppo"]:
        pts = []
        for w in worlds:
            f = record["finals"].get(w, {})
            by = {r["seed"]: r["gold"] for r in f.get(a, [])}
            d = [r["gold"] - by[r["seed"]] for r in f.get("ppo", []) if r["seed"] in by]
            if d:
                pts.append((turns[w], mean(d)))
        if pts:
            ax2.plot([x for x, _ in pts], [y for _, y in pts], marker="o", color=colors[a], label=f"ppo - {a}")
    ax2.axhline(0, color="grey", lw=0.8)
    for ax, title in ((ax1, "held-out gold (sampled, T = 1)"), (ax2, "ppo's gold minus the arm's")):
        ax.set_xlabel("turns of perfect play")
        ax.set_xticks(sorted(set(turns.values())))
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write_turns_report(out: Path, cfg: ExperimentsConfig, record: Mapping) -> None:
    """summary.md, report.html and turns.png of the family in ``out``."""
    from fourfold.reporting import fig_to_data_uri, html_image, html_page

    header = turns_header(cfg, record)
    rows = result_rows(record)
    parts = [header, "## Held-out gold at the end of the budget", "", md_table(COLUMNS, rows), ""]
    write_text_atomic(out / "summary.md", "\n".join(parts + summary_tail(record["notes"], record["claims"])))
    body = [header_html(header)]
    body += claims_html(record["claims"], record["notes"])
    body += ["<h2>Held-out gold at the end of the budget</h2>", text_table(COLUMNS, rows)]
    if record["summaries"]:
        fig = turns_figure(record)
        fig.savefig(out / "turns.png", dpi=90, bbox_inches="tight")
        body += ["<h2>Gold against the turns</h2>", html_image(fig_to_data_uri(fig, dpi=80), "turns")]
    curve_rows = [[w, a, str(len(cs)), " -> ".join(fmt(mean([c[i] for c in cs if len(c) > i]), 2)
                                                  for i in sorted({0, len(cs[0]) // 2, len(cs[0]) - 1}) if cs[0])]
                  for w, by in record["curves"].items() for a, cs in by.items() if cs]
    body += ["<h2>Training return (env/return_mean: first, middle, last iteration; mean over seeds)</h2>",
             text_table(["world", "arm", "seeds", "return"], curve_rows)]
    write_text_atomic(out / "report.html", html_page("fourfold experiments: the turns family", "\n".join(body)))
