"""The horizon family's report: ``summary.md`` (settings, results per world and arm with the cost
columns, claims last), ``report.html`` (the same, the gold gain and KL against the horizon, the
token-credit view) and ``horizon.png`` (the figure alone, for the docs). It reads the family's
``results.json`` record and ``credit.json`` (:mod:`fourfold.apps.experiments.credit`); it runs nothing.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Optional

from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.horizon_claims import world_label
from fourfold.apps.experiments.report import (
    COST_NOTE,
    arm_colors,
    claims_html,
    family_header,
    finish_panel,
    header_html,
    invocation_text,
    result_cell,
    rm_accuracy_text,
    text_table,
    write_summary_md,
)
from fourfold.apps.report_kit import esc, html_table, mean, signed, std
from fourfold.atomic import write_text_atomic

HORIZON_COLUMNS = (
    ("world", "world"), ("arm", "arm"), ("seeds", "seeds"), ("proxy_delta_sd", "proxy - SFT (sd)"),
    ("gold_delta_sd", "gold - SFT (sd)"), ("kl", "KL (nats)"), ("length", "length (words)"), ("sentences", "sentences"),
    ("well_formed", "well-formed"), ("gold_spread_seeds_sd", "gold sd over seeds (sd)"),
    ("models", "models (trained+frozen)"), ("peak_rss_mb", "peak RSS (MB)"), ("s_per_iteration", "s / iteration"),
    ("train_s", "train s"),
)
SHOWN_PER_VIEW = 2
"""Prompts of the credit view shown as heatmaps (each with its K responses); the table counts all."""


def result_rows(record: Mapping) -> list[dict]:
    """The results table's rows: per world its SFT model, then each arm (mean and sd over seeds)."""
    rows = []
    for world, sft in record["sft"].items():
        rows.append({"world": world, "arm": "SFT", "seeds": 1, "gold_delta_sd": 0.0, "proxy_delta_sd": 0.0,
                     **{k: sft.get(k) for k in ("kl", "length", "sentences", "well_formed")}})
        for arm, s in record["summaries"].get(world, {}).items():
            sentences = [r.get("sentences") for r in record["finals"][world].get(arm, [])]
            rows.append({"world": world, "arm": arm, **s, "sentences": mean(sentences), "sentences_sd": std(sentences)})
    return rows


def horizon_header(cfg: ExperimentsConfig, record: Mapping) -> str:
    """The text above the tables (its paragraphs also open report.html)."""
    h, ppo = cfg.horizon, cfg.demo.ppo
    return family_header(
        "horizon",
        f"Horizons {', '.join(map(str, sorted(h.horizons)))} (gold wants k sentences, each positive, 1/k of the "
        f"reward each; responses up to {h.tokens_per_sentence} x (k + 1) tokens); arms {', '.join(h.arms)}; "
        f"{len(cfg.seeds)} seeds ({', '.join(map(str, cfg.seeds))}); every run {cfg.iterations} iterations x "
        f"{ppo.rollout_batch_size} sampled responses; group arms K = {cfg.group_size}. Final evaluation: "
        f"{cfg.eval_prompts} held-out prompts, the same everywhere. Gold and proxy differences are in units of "
        "each world's SFT model's per-sample sd; values are mean ± sd over seeds.",
        "Worlds: " + "; ".join(f"{w}: {v['what']}" for w, v in record["worlds"].items()) + ".", rm_accuracy_text(record["rm"]),
        invocation_text(record, cfg.workers, "runs") + " Each world's own summary.md and "
        "report.html (curves, frontier, samples) are in its directory.")


def _points(record: Mapping, world: str, arm: str, key: str) -> tuple[float, float]:
    """Mean and sd over seeds of ``key`` (gold: in the world's SFT sd above SFT)."""
    rows, sft = record["finals"].get(world, {}).get(arm, []), record["sft"].get(world)
    if not rows or not sft:
        return math.nan, math.nan
    if key == "gold":
        vals = [(r["gold"] - sft["gold"]) / sft["gold_std"] if sft.get("gold_std") else math.nan for r in rows]
    else:
        vals = [r[key] for r in rows]
    return mean(vals), std(vals)


def _variants(cfg: ExperimentsConfig) -> list[tuple[str, str, str]]:
    """(world, arm, label) of the longest horizon's variants: the noisier reward, other group sizes."""
    h = cfg.horizon
    k = max(h.horizons)
    out = [(world_label(k, "noisy"), a, f"{a}, noisier labels") for a in h.noisy_arms] if h.noisy_task_options else []
    return out + [(world_label(k, f"k{size}"), h.group_arm, f"{h.group_arm}, K = {size}") for size in h.group_sizes]


def gain_figure(cfg: ExperimentsConfig, record: Mapping):
    """Gold gain over SFT (sd) and KL against the horizon, per arm (mean ± sd over seeds); the
    variants at the longest horizon as lone markers."""
    from matplotlib.figure import Figure

    h = cfg.horizon
    ks = sorted(h.horizons)
    variants = _variants(cfg)
    col = arm_colors(list(h.arms) + [label for _, _, label in variants])
    fig = Figure(figsize=(11, 4))
    for i, (key, title) in enumerate((("gold", "gold - SFT (SFT sd of that horizon)"),
                                      ("kl", "KL to the reference (nats per response)"))):
        ax = fig.add_subplot(1, 2, i + 1)
        for j, arm in enumerate(h.arms):
            pts = [_points(record, world_label(k), arm, key) for k in ks]
            ax.errorbar([k + 0.04 * (j - len(h.arms) / 2) for k in ks], [m for m, _ in pts],
                        yerr=[0.0 if math.isnan(s) else s for _, s in pts], color=col[arm], marker="o",
                        capsize=3, linewidth=1.4, label=arm)
        for j, (world, arm, label) in enumerate(variants):
            m, s = _points(record, world, arm, key)
            ax.errorbar([ks[-1] + 0.25 + 0.08 * j], [m], yerr=[0.0 if math.isnan(s) else s], color=col[label],
                        marker="s", linestyle="none", capsize=3, label=label)
        if key == "gold":
            ax.axhline(0.0, color="black", linestyle=":", linewidth=1)
        ax.set_xticks(ks)
        finish_panel(ax, title, "horizon k (sentences gold wants)", legend=i == 0)
    fig.suptitle("final evaluation, mean ± sd over seeds; squares: variants at the longest horizon", fontsize=9)
    fig.tight_layout()
    return fig


def _view_table(view: Mapping) -> str:
    """Mean advantage on the tokens of positive, neutral and negative sentences, GAE vs group."""
    sums: dict[int, list[list[float]]] = {p: [[], []] for p in (1, 0, -1)}
    for it in view["items"]:
        pol = it["sentence_polarity"]
        for s, a, g in zip(it["sentence"], it["gae"], it["group"]):
            if 0 <= s < len(pol):
                sums[pol[s]][0].append(a)
                sums[pol[s]][1].append(g)
    names = {1: "positive", 0: "neutral", -1: "negative"}
    rows = [[names[p], f"{mean(a):+.3f}" if a else "n/a", f"{mean(g):+.3f}" if g else "n/a", str(len(a))]
            for p, (a, g) in sums.items()]
    return html_table(["tokens of a sentence that is", "mean GAE advantage", "mean group advantage", "tokens"],
                      rows, num_cols=(1, 2, 3))


def _view_html(view: Mapping, k_group: int) -> str:
    from fourfold.reporting import token_heatmap_html

    items = view["items"][: SHOWN_PER_VIEW * k_group]
    vals = [abs(x) for it in items for key in ("gae", "group") for x in it[key] if math.isfinite(x)]
    scale = max(vals) if vals else 1.0
    rows = []
    for it in items:
        toks = [t if i or t.startswith(" ") else " " + t for i, t in enumerate(it["tokens"])]
        meta = (f"RM score {it['score']:+.2f} &middot; gold {signed(it['gold'])} &middot; KL {it['kl_sum']:.2f} "
                f"&middot; {len(toks)} tokens")
        rows.append(f'<tr><td class="prompt">{esc(it["prompt"])}</td>'
                    f"<td>{token_heatmap_html(toks, it['gae'], scale=scale)}</td>"
                    f"<td>{token_heatmap_html(toks, it['group'], scale=scale)}<div class=\"meta\">{meta}</div></td></tr>")
    return (f"<h3>responses of the {esc(view['label'])} run</h3>"
            "<table><thead><tr><th>prompt</th><th>GAE (ppo's critic)</th><th>group (flat)</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
            f"<p class=\"note\">Full colour at |A| = {scale:.3g} (one scale for both columns).</p>" + _view_table(view))


def credit_html(credit: Optional[Mapping]) -> str:
    """The token-credit section ('' when there is no view)."""
    if not credit or not credit.get("views"):
        return ""
    k = credit["K"]
    intro = (f"<h2>Which tokens got the credit (horizon {credit['horizon']}, first seed)</h2>"
             f"<p>The same responses, {k} per prompt, scored as in a PPO iteration (KL penalty "
             f"{credit['kl_coef']:g} per token, the reward model's score on the last token) and credited twice: by "
             f"GAE with the ppo run's trained critic (gamma {credit['gamma']:g}, lambda {credit['lam']:g}; not "
             f"whitened), and by the group baseline ({esc(credit['group_advantage'])}: (R - mean) / std over the "
             f"{k} responses of the prompt), which gives every token of a response the same advantage. Gold wants "
             "each sentence positive, so a critic that credits tokens gives the tokens of positive sentences more "
             "than those of negative ones; the group's flat advantage can only follow the whole response. On the "
             "group arm's responses the critic is ppo's, trained on another policy's samples.</p>")
    return intro + "\n".join(_view_html(v, k) for v in credit["views"])


def write_horizon_report(out: Path, cfg: ExperimentsConfig, record: Mapping, credit: Optional[Mapping]) -> None:
    """summary.md, report.html and horizon.png of the family in ``out``."""
    from fourfold.reporting import fig_to_data_uri, html_image, html_page

    header = horizon_header(cfg, record)
    rows = result_rows(record)
    write_summary_md(out / "summary.md", header=header, result_rows=rows, claims=record["claims"],
                     notes=record["notes"], columns=HORIZON_COLUMNS)
    body = [header_html(header)]
    body += claims_html(record["claims"], record["notes"])
    body += ["<h2>Results at the end of the budget</h2>",
             text_table([hd for _, hd in HORIZON_COLUMNS], [[result_cell(r, k) for k, _ in HORIZON_COLUMNS] for r in rows]),
             f"<p>{esc(COST_NOTE)}</p>"]
    if record["finals"]:
        fig = gain_figure(cfg, record)
        fig.savefig(out / "horizon.png", dpi=90, bbox_inches="tight")
        body += ["<h2>Gold gain and KL against the horizon</h2>", html_image(fig_to_data_uri(fig, dpi=80), "horizon")]
    body.append(credit_html(credit))
    links = "".join(f'<li><a href="{esc(w)}/report.html">{esc(w)}</a>: {esc(v["what"])}</li>'
                    for w, v in record["worlds"].items())
    body.append(f"<h2>Each world's report</h2><ul>{links}</ul>")
    write_text_atomic(out / "report.html", html_page("fourfold experiments: the horizon family", "\n".join(body)))
