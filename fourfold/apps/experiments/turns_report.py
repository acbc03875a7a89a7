"""The turns family's report: ``summary.md`` (settings, gold per world and arm, claims last),
``turns.png`` (held-out gold against the turns per arm, ppo's gold minus each other arm's at its rows x K,
and the critics' explained variance per iteration) and
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

COLUMNS = ("world", "turns", "arm", "rows x K", "seeds", "gold sampled", "gain", "gold greedy", "gain greedy",
           "turns / traj.", "EV end", "train s")
EV_COLUMNS = ("world", "arm", "seeds", "value/explained_variance per iteration (mean over seeds)")


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
        rows.append([w, str(info["turns"]), "SFT (before)", "", "1", fmt(sft["gold"]), "", fmt(sft["gold_greedy"]), "",
                     fmt(sft["turns_mean"], 2), "", ""])
        shapes = record.get("shapes", {})
        for a, s in record["summaries"].get(w, {}).items():
            rows.append([w, str(info["turns"]), a, shapes.get(a, ""), str(s["seeds"]), _pm(s, "gold"), signed(s["gain"]),
                         _pm(s, "gold_greedy"), signed(s["gain_greedy"]), fmt(s["turns_mean"], 2),
                         _pm(s, "ev_tail") if "ev_tail" in s else "", fmt(s["train_s"], 0)])
    return rows


def mean_curve(curves) -> list[float]:
    """The mean over seeds of per-iteration curves, iteration by iteration (as long as the longest)."""
    n = max((len(c) for c in curves), default=0)
    return [mean([c[i] for c in curves if len(c) > i]) for i in range(n)]


def ev_rows(record: Mapping) -> list[list[str]]:
    """Per world and critic arm: its explained variance at every iteration, mean over seeds."""
    return [[w, a, str(len(cs)), " ".join(fmt(x, 2) for x in mean_curve(cs))]
            for w, by in record.get("ev_curves", {}).items() for a, cs in by.items() if cs]


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
        f"{cfg.iterations} policy iterations, the same trajectories per iteration for every arm, at the same rows x K "
        f"(K = {cfg.group_size}) but the -256x1 arms' one a row; the critic arms: critic_lr {t.critic_lr:g}, "
        f"{t.critic_warmup} warm-up iterations before the policy's. EV end: value/explained_variance, mean over the "
        f"last {t.claims.ev_tail_share:.0%} of a run's iterations. Gold: the share of {cfg.eval_prompts} rows of "
        "held-out chains answered right, "
        "sampled at T = 1 (the claims' gold) and greedy; gain = minus the SFT policy's. Values: mean ± sd over seeds.",
        f"Arms: {arms}.", invocation_text(record, cfg.workers))


def turns_figure(record: Mapping):
    """Gold (sampled) against the turns per arm with the SFT policy's, and ppo minus each arm."""
    from matplotlib.figure import Figure

    from fourfold.apps.experiments.report import arm_colors

    ev = {(w, a): mean_curve(cs) for w, by in record.get("ev_curves", {}).items() for a, cs in by.items() if cs}
    fig = Figure(figsize=(15 if ev else 10, 4))
    axes = fig.subplots(1, 3 if ev else 2)
    ax1, ax2 = axes[0], axes[1]
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
    shapes = record.get("shapes", {})
    for a in [a for a in arms if a != "ppo" and shapes.get(a) == shapes.get("ppo")]:
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
    if ev:
        ax3 = axes[2]
        for (w, a), ys in ev.items():
            ax3.plot(range(1, len(ys) + 1), ys, marker=".", color=colors.get(a), alpha=0.4 + 0.6 * (w == worlds[-1]),
                     label=f"{a} {w}")
        ax3.axhline(0, color="grey", lw=0.8)
        ax3.set_xlabel("iteration (warm-up included)")
        ax3.set_title("the critic's explained variance (value/explained_variance)", fontsize=10)
        ax3.legend(fontsize=7)
    fig.tight_layout()
    return fig


def write_turns_report(out: Path, cfg: ExperimentsConfig, record: Mapping) -> None:
    """summary.md, report.html and turns.png of the family in ``out``."""
    from fourfold.reporting import fig_to_data_uri, html_image, html_page

    header = turns_header(cfg, record)
    rows = result_rows(record)
    parts = [header, "## Held-out gold at the end of the budget", "", md_table(COLUMNS, rows), ""]
    evs = ev_rows(record)
    if evs:
        parts += ["## The critic's explained variance per iteration", "", md_table(EV_COLUMNS, evs), ""]
    write_text_atomic(out / "summary.md", "\n".join(parts + summary_tail(record["notes"], record["claims"])))
    body = [header_html(header)]
    body += claims_html(record["claims"], record["notes"])
    body += ["<h2>Held-out gold at the end of the budget</h2>", text_table(COLUMNS, rows)]
    if evs:
        body += ["<h2>The critic's explained variance per iteration</h2>", text_table(EV_COLUMNS, evs)]
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
