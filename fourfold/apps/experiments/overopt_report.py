"""The overoptimization family's report: ``summary.md`` (settings, the fits per method and size,
where the demo's default KL puts PPO, claims last), ``overoptimization.png`` (gold gain and proxy
gain against d = sqrt(KL) per reward-model size, best-of-n and PPO side by side, the fitted forms
dashed) and ``report.html`` (the same with the figure). It reads the family's record; it runs nothing.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.overopt_claims import METHOD_NAMES, METHODS, mean_curve
from fourfold.apps.experiments.report import (
    claims_html,
    family_header,
    header_html,
    invocation_text,
    rm_accuracy_text,
    summary_tail,
    text_table,
)
from fourfold.apps.report_kit import fmt, md_table, mean, signed
from fourfold.atomic import write_text_atomic
from fourfold.core.overoptimization import Fit

FIT_COLUMNS = ("method", "RM pairs", "seeds", "alpha", "beta", "R^2", "gold peak (sd)", "peak d", "last d",
               "gold at last (sd)", "proxy first -> peak -> last")


def _pm(s: Mapping, k: str, digits: int = 3) -> str:
    sd = s.get(k + "_sd")
    return fmt(s[k], digits) + ("" if sd is None or not math.isfinite(sd) else f" ± {fmt(sd, digits)}")


def fit_rows(record: Mapping) -> list[list[str]]:
    rows = []
    for m in METHODS:
        for p, s in sorted(record["summaries"].get(m, {}).items(), key=lambda kv: int(kv[0])):
            rows.append([METHOD_NAMES[m], str(p), str(s["seeds"]), _pm(s, "alpha"), _pm(s, "beta"), _pm(s, "r2"),
                         signed(s["peak_gain_sd"]), fmt(s["peak_d"], 2), fmt(s["last_d"], 2), signed(s["last_gain_sd"]),
                         f"{fmt(s['proxy_first'], 3)} -> {fmt(s['proxy_at_peak'], 3)} -> {fmt(s['proxy_last'], 3)}"])
    return rows


def default_rows(record: Mapping) -> list[list[str]]:
    sd = record["curves"].get("sft_gold_std") or 1.0
    rows = []
    for p, runs in sorted(record["curves"].get("default", {}).items(), key=lambda kv: int(kv[0])):
        sft = [c["gold"][0] for c in record["curves"]["ppo"].get(p, record["curves"]["ppo"].get(str(p), []))]
        gain = (mean([r["gold"] for r in runs]) - mean(sft)) / sd if sft else math.nan
        rows.append([str(p), str(len(runs)), fmt(mean([math.sqrt(max(r["kl"], 0)) for r in runs]), 2), signed(gain),
                     fmt(mean([r["proxy"] for r in runs]), 3)])
    return rows


def overopt_header(cfg: ExperimentsConfig, record: Mapping) -> str:
    o = cfg.overoptimization
    return family_header(
        "overoptimization",
        f"Reward models trained on {', '.join(map(str, sorted(o.rm_pairs)))} preference pairs (the demo's labelers, "
        f"one SFT model); {len(cfg.seeds)} seeds ({', '.join(map(str, cfg.seeds))}). Best-of-n: {o.bon_n} SFT samples "
        f"of each of {o.bon_prompts} held-out prompts, every n <= {o.bon_n} by the unbiased estimator, d = "
        f"sqrt(log n - (n-1)/n). PPO: kl_coef={o.kl_coef:g}, {cfg.iterations} iterations x "
        f"{cfg.demo.ppo.rollout_batch_size} responses, evaluated every {o.eval_every} iterations on {o.curve_prompts} "
        f"held-out prompts (d = sqrt of the KL to the SFT model there). Gold gains are in units of the SFT model's "
        f"per-sample gold sd ({fmt(record['curves'].get('sft_gold_std'), 3)}); values are mean ± sd over seeds.",
        rm_accuracy_text(record["rm"], " pairs"), invocation_text(record, cfg.workers))


def overopt_figure(record: Mapping):
    """2 x 2 panels: gold gain (sd) and proxy gain against d, best-of-n and PPO; one colour per size."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    sd = record["curves"].get("sft_gold_std") or 1.0
    fig = Figure(figsize=(10, 7))
    axes = fig.subplots(2, 2, sharex="col")
    sizes = sorted({int(p) for m in METHODS for p in record["curves"].get(m, {})})
    cmap = colormaps["viridis"]
    for col, m in enumerate(METHODS):
        for k, p in enumerate(sizes):
            curves = record["curves"][m].get(p) or record["curves"][m].get(str(p))
            if not curves:
                continue
            color = cmap(0.15 + 0.7 * k / max(1, len(sizes) - 1))
            mc = mean_curve(curves)
            gain = [(g - mc["gold"][0]) / sd for g in mc["gold"]]
            axes[0][col].plot(mc["d"], gain, "o-" if m == "ppo" else "-", ms=3, color=color, label=f"{p} pairs")
            s = (record["summaries"][m].get(p) or record["summaries"][m].get(str(p)))
            fit = Fit(s["alpha"], s["beta"], s["r2"], "bon" if m == "bon" else "rl")
            xs = [mc["d"][-1] * i / 60 for i in range(61)]
            axes[0][col].plot(xs, [fit.predict(x) / sd for x in xs], "--", color=color, lw=1)
            axes[1][col].plot(mc["d"], [x - mc["proxy"][0] for x in mc["proxy"]], "-", color=color, label=f"{p} pairs")
        if m == "ppo":
            for k, p in enumerate(sizes):
                runs = record["curves"].get("default", {}).get(p) or record["curves"].get("default", {}).get(str(p))
                curves = record["curves"]["ppo"].get(p) or record["curves"]["ppo"].get(str(p))
                if runs and curves:
                    color = cmap(0.15 + 0.7 * k / max(1, len(sizes) - 1))
                    base = mean([c["gold"][0] for c in curves])
                    axes[0][col].plot([mean([math.sqrt(max(r["kl"], 0)) for r in runs])],
                                      [(mean([r["gold"] for r in runs]) - base) / sd], "*", ms=13, color=color,
                                      markeredgecolor="k")
        axes[0][col].set_title(f"{METHOD_NAMES[m]}: gold gain (solid; fit dashed"
                               + ("; star: the demo's default KL)" if m == "ppo" else ")"))
        axes[1][col].set_title(f"{METHOD_NAMES[m]}: proxy (RM) gain")
        axes[1][col].set_xlabel("d = sqrt(KL to the SFT model)")
        axes[0][col].axhline(0, color="#999", lw=0.5)
    axes[0][0].set_ylabel("gold - SFT (SFT sd)")
    axes[1][0].set_ylabel("RM score - SFT's")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def write_overopt_outputs(out: Path, cfg: ExperimentsConfig, record: Mapping) -> None:
    """summary.md, overoptimization.png and report.html in ``out``."""
    from fourfold.reporting import fig_to_data_uri, html_image, html_page

    header = overopt_header(cfg, record)
    fits, dflt = fit_rows(record), default_rows(record)
    d_head = ["RM pairs", "seeds", "d", "gold - SFT (sd)", "proxy"]
    parts = [header, "## Fits and peaks", "", md_table(list(FIT_COLUMNS), fits), ""]
    if dflt:
        parts += [f"## PPO at the demo's default KL (kl_coef={record['default_kl_coef']:g})", "", md_table(d_head, dflt), ""]
    write_text_atomic(out / "summary.md", "\n".join(parts + summary_tail(record["notes"], record["claims"])))
    body = [header_html(header)]
    body += claims_html(record["claims"], record["notes"])
    if any(record["curves"].get(m) for m in METHODS):
        fig = overopt_figure(record)
        fig.savefig(out / "overoptimization.png", dpi=90, bbox_inches="tight")
        body += ["<h2>Gold and proxy against d</h2>", html_image(fig_to_data_uri(fig, dpi=80), "overoptimization")]
    body += ["<h2>Fits and peaks</h2>", text_table(list(FIT_COLUMNS), fits)]
    if dflt:
        body += ["<h2>PPO at the demo's default KL</h2>", text_table(d_head, dflt)]
    write_text_atomic(out / "report.html", html_page("fourfold experiments: the overoptimization family", "\n".join(body)))
