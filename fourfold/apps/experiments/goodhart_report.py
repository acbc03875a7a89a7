"""The re-posed overoptimization family's report (issue 41): ``summary.md`` (the design, the reward
models' gold accuracy three ways, best-of-n per world and level beside the gold ceiling, every PPO
run's curve in brief, the claims last with the paper's finding beside each), ``overoptimization.png``
(gold gain against d per world: best-of-n on the empirical d, PPO's curves, the gold arm and the
penalised runs) and ``report.html`` (the same with the figure). It reads the family's record
(:func:`fourfold.apps.experiments.goodhart.run_goodhart`); it runs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.report import claims_html, family_header, header_html, invocation_text, summary_tail, text_table
from fourfold.apps.report_kit import fmt, md_table, signed
from fourfold.atomic import write_text_atomic

RM_COLUMNS = ("world", "RM pairs", "held-out pairs vs gold", "SFT samples (best-of-n) vs gold", "policies' samples vs gold",
              "pairs (policies')")
BON_COLUMNS = ("world", "RM", "gold gain peak", "at n", "gold gain at N", "d analytic at N", "d empirical at N",
               "proxy gain at N")
PPO_COLUMNS = ("world", "reward", "kl_coef", "seeds", "points", "gold gain peak", "at d", "last d", "gold gain at last",
               "proxy gain at last")


def _gain(xs) -> list[float]:
    return [x - xs[0] for x in xs]


def rm_rows(record: Mapping) -> list[list[str]]:
    """One row per world and level: the RM's gold accuracy on held-out SFT pairs, on the best-of-n
    SFT samples and on the PPO policies' own samples (pooled over checkpoints)."""
    rows = []
    for w, levels in record["rm"].items():
        bon = (record["record"].get(w, {}).get("bon") or {}).get("levels", {})
        acc = record["accuracy"].get(w, {})
        for p, r in sorted(levels.items(), key=lambda kv: int(kv[0])):
            rows.append([w, p, fmt(r.get("accuracy_vs_gold"), 3), fmt(bon.get(p, {}).get("accuracy"), 3),
                         fmt(acc.get(p, {}).get("accuracy"), 3), str(acc.get(p, {}).get("pairs", ""))])
    return rows


def bon_rows(record: Mapping) -> list[list[str]]:
    """One row per world and level (and the gold ceiling): best-of-n's gold gain over n = 1."""
    rows = []
    for w, rec in record["record"].items():
        b = rec.get("bon")
        if not b:
            continue
        curves = [(p, b["levels"][p]) for p in sorted(b["levels"], key=int)] + [("gold (ceiling)", b["gold_ceiling"])]
        for p, c in curves:
            gain = _gain(c["gold"])
            j = max(range(len(gain)), key=gain.__getitem__)
            rows.append([w, str(p), signed(gain[j]), str(b["n"][j]), signed(gain[-1]), fmt(b["d_analytic"][-1], 2),
                         fmt(c["d"][-1], 2), signed(_gain(c["proxy"])[-1])])
    return rows


def ppo_rows(record: Mapping) -> list[list[str]]:
    """One row per PPO run (mean over seeds): gold's peak gain and where, the last point."""
    rows = []
    for w, by_reward in record["runs"].items():
        for reward, by_coef in by_reward.items():
            for coef, c in sorted(by_coef.items(), key=lambda kv: float(kv[0])):
                gain = _gain(c["gold"])
                j = max(range(len(gain)), key=gain.__getitem__)
                rows.append([w, reward, coef, str(c.get("seeds", 1)), str(len(gain)), signed(gain[j]), fmt(c["d"][j], 2),
                             fmt(c["d"][-1], 2), signed(gain[-1]), signed(_gain(c["proxy"])[-1])])
    return rows


def goodhart_header(cfg: ExperimentsConfig, record: Mapping) -> str:
    g = cfg.overoptimization.goodhart
    worlds = "; ".join(f"{w}: {', '.join(f'{k}={v}' for k, v in o.items())}" for w, o in g.worlds.items())
    return family_header(
        "overoptimization (design goodhart)",
        f"Worlds ({worlds}); reward models on {', '.join(map(str, sorted(g.rm_pairs)))} preference pairs from each "
        f"world's labelers, one SFT model per corpus; {len(cfg.seeds)} seed(s). Best-of-n: {g.bon_n} SFT samples of each "
        f"of {g.bon_prompts} held-out prompts, n = {', '.join(map(str, g.grid()))} by the unbiased estimator, d the "
        f"empirical one (sqrt of the plug-in KL; the analytic bound beside it). PPO at {g.lr_multiplier:g}x the demo's "
        f"rates, {cfg.iterations} iterations x {cfg.demo.ppo.rollout_batch_size} responses, kl_coef 0 against every "
        f"level, {', '.join(f'{c:g}' for c in g.kl_coefs if c > 0)} against {g.sweep_pairs} pairs"
        f"{', and on gold itself (critic from the policy)' if g.gold_arm else ''}; checkpoints {record['schedule']} "
        f"each evaluated by {g.accuracy_samples} samples of {g.curve_prompts} held-out prompts (gold per prompt the "
        f"mean of its samples, d = sqrt of the mean KL to the SFT model). Gains are raw gold over the first point.",
        invocation_text(record, cfg.workers))


def goodhart_figure(record: Mapping):
    """A row per world: best-of-n gold gain against d (each level, the gold ceiling dashed), PPO's
    gold gain against d (kl_coef 0 per level, the gold arm dashed, the penalised runs dotted)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    worlds = list(record["record"])
    fig = Figure(figsize=(10, 3.6 * max(1, len(worlds))))
    axes = fig.subplots(max(1, len(worlds)), 2, squeeze=False)
    cmap = colormaps["viridis"]
    for row, w in enumerate(worlds):
        rec, runs = record["record"][w], record["runs"].get(w, {})
        levels = sorted({int(p) for p in (rec.get("bon") or {}).get("levels", {})} |
                        {int(r[1:]) for r in runs if r.startswith("p")})
        color = {p: cmap(0.1 + 0.75 * k / max(1, len(levels) - 1)) for k, p in enumerate(levels)}
        ax = axes[row][0]
        if rec.get("bon"):
            b = rec["bon"]
            for p in sorted(b["levels"], key=int):
                ax.plot(b["levels"][p]["d"], _gain(b["levels"][p]["gold"]), "o-", ms=3, color=color[int(p)], label=f"{p} pairs")
            ax.plot(b["gold_ceiling"]["d"], _gain(b["gold_ceiling"]["gold"]), "k--", lw=1, label="by gold")
        ax.set_title(f"{w}: best-of-n, gold gain")
        ax = axes[row][1]
        for reward, by_coef in runs.items():
            for coef, c in by_coef.items():
                style = "k--" if reward == "gold" else ("o-" if float(coef) == 0 else "s:")
                kw = {} if reward == "gold" else {"color": color.get(int(reward[1:]), "C0")}
                ax.plot(c["d"], _gain(c["gold"]), style, ms=3, lw=1, label=f"{reward} kl {coef}", **kw)
        ax.set_title(f"{w}: PPO, gold gain")
        for ax in axes[row]:
            ax.axhline(0, color="#999", lw=0.5)
            ax.set_xlabel("d = sqrt(KL to the SFT model)")
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def write_goodhart_outputs(out: Path, cfg: ExperimentsConfig, record: Mapping) -> None:
    """summary.md, overoptimization.png and report.html in ``out``."""
    from fourfold.reporting import fig_to_data_uri, html_image, html_page

    header = goodhart_header(cfg, record)
    tables = [("Reward models: gold pair accuracy", RM_COLUMNS, rm_rows(record)),
              ("Best-of-n (gains over n = 1)", BON_COLUMNS, bon_rows(record)),
              ("PPO runs (gains over the SFT model)", PPO_COLUMNS, ppo_rows(record))]
    parts = [header]
    for title, cols, rows in tables:
        if rows:
            parts += [f"## {title}", "", md_table(list(cols), rows), ""]
    claims = [{**c, "measured": f"{c['measured']} [paper: {c['paper']}]"} if c.get("paper") else c for c in record["claims"]]
    write_text_atomic(out / "summary.md", "\n".join(parts + summary_tail(record["notes"], claims)))
    body = [header_html(header)] + claims_html(claims, record["notes"])
    if any(r.get("bon") or r.get("ppo") for r in record["record"].values()):
        fig = goodhart_figure(record)
        fig.savefig(out / "overoptimization.png", dpi=90, bbox_inches="tight")
        body += ["<h2>Gold against d</h2>", html_image(fig_to_data_uri(fig, dpi=80), "overoptimization")]
    for title, cols, rows in tables:
        if rows:
            body += [f"<h2>{title}</h2>", text_table(list(cols), rows)]
    write_text_atomic(out / "report.html", html_page("fourfold experiments: the overoptimization family (goodhart)",
                                                     "\n".join(body)))
