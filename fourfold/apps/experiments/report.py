"""The sweep's report: ``summary.md`` (results and claims tables) and the self-contained
``report.html`` (arms, claims, results, training curves, the gold-vs-KL frontier, samples).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from fourfold.apps.claim_kit import claims_md
from fourfold.apps.experiments.arms import Arm
from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.report_kit import duration, esc, finite, fmt, html_table, md_table, mean, num, signed
from fourfold.atomic import write_text_atomic

RESULT_COLUMNS = (
    ("arm", "arm"), ("seeds", "seeds"), ("proxy", "proxy (RM)"), ("proxy_delta_sd", "proxy - SFT (sd)"),
    ("gold", "gold"), ("gold_delta_sd", "gold - SFT (sd)"), ("kl", "KL (nats)"), ("length", "length (words)"),
    ("well_formed", "well-formed"), ("repetition", "repetition"), ("gold_spread_seeds_sd", "gold sd over seeds (sd)"),
    ("gold_spread_iters_sd", "gold sd over iterations (sd)"), ("models", "models (trained+frozen)"),
    ("peak_rss_mb", "peak RSS (MB)"), ("s_per_iteration", "s / iteration"), ("train_s", "train s"),
)
COST_NOTE = ("models: the models one run holds (trained + frozen: ppo's policy and critic + reference and RM; a "
             "critic-free arm or REINFORCE drops the critic; dpo holds its policy and the SFT reference, whose "
             "log-probs it computes up front). peak RSS: the peak resident memory of the run's training "
             "subprocess (torch and the Python runtime included; a resumed run counts its last process). "
             "s / iteration: mean wall seconds of a training iteration (sampling, scoring, updates); "
             "train s: a run's training seconds (start-up excluded; dpo: its steps over the pairs).")
_DIGITS = {"length": 1, "kl": 1, "well_formed": 2, "repetition": 2, "s_per_iteration": 2, "peak_rss_mb": 0,
           "train_s": 0, "sentences": 2}


def result_cell(row: Mapping, key: str) -> str:
    """A results-table cell: the value, and '± sd' over seeds where that is defined (two seeds or more)."""
    if key in ("arm", "seeds", "models", "world"):
        return str(row.get(key, "n/a"))
    digits = _DIGITS.get(key, 2 if key.endswith("_sd") else 3)
    text = signed(row.get(key), digits) if key.endswith("delta_sd") else fmt(row.get(key), digits)
    sd = num(row.get(key + "_sd")) if key not in ("gold_spread_seeds_sd", "gold_spread_iters_sd") else None
    if text != "n/a" and sd is not None:
        text += f" ± {sd:.{digits}f}"
    return text


def text_table(header: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    """An HTML table of plain-text cells (escaped here)."""
    return html_table([esc(h) for h in header], [[esc(c) for c in r] for r in rows], cls=cls)


def _smooth(xs: Sequence[float], w: int) -> list[float]:
    return [mean(xs[max(0, i - w + 1): i + 1]) for i in range(len(xs))]  # the window's finite values


def _seed_band(curves: Sequence[Mapping], key: str, w: int) -> tuple[list[float], list[float], list[float], list[float]]:
    """(iterations, mean, min, max) over seeds of a smoothed per-iteration series."""
    n = min((len(c.get(key, [])) for c in curves), default=0)
    if n == 0:
        return [], [], [], []
    its = list(curves[0]["iteration"][:n])
    series = [_smooth(c[key][:n], w) for c in curves]
    cols = list(zip(*series))
    avg = [mean(col) for col in cols]
    lo = [min(finite(col), default=math.nan) for col in cols]
    hi = [max(finite(col), default=math.nan) for col in cols]
    return its, avg, lo, hi


def arm_colors(arms: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {a: cmap(i % 10) for i, a in enumerate(arms)}


def finish_panel(ax, title: str, xlabel: str, legend: bool) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7, ncol=2)


def _curves_figure(curves: Mapping[str, Sequence[Mapping]], sft: Mapping, iterations: int) -> str:
    from matplotlib.figure import Figure

    from fourfold.reporting import fig_to_data_uri

    w = max(1, round(iterations / 12))
    arms = [a for a in curves if curves[a]]
    col = arm_colors(arms)
    fig = Figure(figsize=(12, 7.2))
    panels = (("reward/gold_mean", "gold reward (training batches)"), ("reward/score_mean", "proxy: RM score"),
              ("kl/k1", "KL to the reference (nats, k1)"), ("rollout/response_length", "response length (tokens)"))
    for i, (key, title) in enumerate(panels):
        ax = fig.add_subplot(2, 2, i + 1)
        for a in arms:
            its, m, lo, hi = _seed_band(curves[a], key, w)
            if not its:
                continue
            ax.plot(its, m, label=a, color=col[a], linewidth=1.4)
            if len(curves[a]) > 1:
                ax.fill_between(its, lo, hi, color=col[a], alpha=0.15, linewidth=0)
        if key == "reward/gold_mean":
            ax.axhline(sft["gold"], color="black", linestyle=":", linewidth=1, label="SFT (final evaluation)")
        if key == "kl/k1":
            ax.set_yscale("symlog", linthresh=0.1)
        finish_panel(ax, title, "iteration (same samples per iteration for every arm)", legend=i == 0)
    fig.suptitle(f"mean over seeds (line) and min-max band; moving average over {w} iterations", fontsize=9)
    fig.tight_layout()
    return fig_to_data_uri(fig, dpi=80)


def _frontier_figure(curves: Mapping[str, Sequence[Mapping]], finals: Mapping[str, Sequence[Mapping]],
                     sft: Mapping, iterations: int) -> str:
    from matplotlib.figure import Figure

    from fourfold.reporting import fig_to_data_uri

    w = max(3, iterations // 8)
    arms = [a for a in curves if curves[a]] + [a for a in finals if finals[a] and not curves.get(a)]  # dpo: final only
    col = arm_colors(arms)
    fig = Figure(figsize=(12, 4.2))
    for i, (key, fkey, title) in enumerate((("reward/score_mean", "proxy", "proxy (RM score) vs KL"),
                                            ("reward/gold_mean", "gold", "gold reward vs KL"))):
        ax = fig.add_subplot(1, 2, i + 1)
        for a in arms:
            for c in curves.get(a, []):  # every training batch of every seed
                ax.scatter(c["kl/k1"], c[key], color=col[a], s=6, alpha=0.3, linewidth=0)
            _, kl, _, _ = _seed_band(curves.get(a, []), "kl/k1", w)
            _, y, _, _ = _seed_band(curves.get(a, []), key, w)
            if kl:
                ax.plot(kl, y, color=col[a], linewidth=1.5, label=a, alpha=0.9)
            fin = finals.get(a) or []
            if fin:
                ax.scatter([f["kl"] for f in fin], [f[fkey] for f in fin], color=col[a], marker="o", s=18,
                           edgecolor="black", linewidth=0.5, zorder=3, label=None if kl else a)
        ax.scatter([0.0], [sft[fkey]], color="black", marker="*", s=80, zorder=4, label="SFT (eval)")
        ax.set_xscale("symlog", linthresh=1.0)
        finish_panel(ax, title, "KL to the reference (nats per response)", legend=i == 1)
    fig.suptitle(f"the over-optimisation frontier: small dots are training batches, lines their seed mean "
                 f"(moving average over {w} iterations), ringed dots each seed's final evaluation", fontsize=9)
    fig.tight_layout()
    return fig_to_data_uri(fig, dpi=80)


def write_summary_md(path: Path, *, header: str, result_rows: Sequence[Mapping], claims: Sequence[Mapping],
                     notes: Sequence[str], columns: Sequence[tuple[str, str]] = RESULT_COLUMNS) -> None:
    """Write summary.md: the header, the results table (``columns``: (key, heading) pairs), what was
    not checked, the claims table (last)."""
    table = md_table([h for _, h in columns], [[result_cell(r, k) for k, _ in columns] for r in result_rows])
    parts = [header, "## Results at the end of the budget", "", table, "", COST_NOTE, ""]
    write_text_atomic(path, "\n".join(parts + summary_tail(notes, claims)))


def summary_tail(notes: Sequence[str], claims: Sequence[Mapping]) -> list[str]:
    """The lines that end every summary.md: what was not checked (if anything), then the claims table."""
    parts = ["## Not checked", ""] + [f"- {n}" for n in notes] + [""] if notes else []
    return parts + ["## Claims", "", claims_md(claims), ""]


def invocation_text(record: Mapping, workers: int, skipped: str = "jobs") -> str:
    """The header's sentence on this invocation's time (``record``'s wall_s and jobs_s)."""
    return (f"This invocation took {duration(record['wall_s'])} (of which jobs {duration(record['jobs_s'])}, "
            f"{workers} workers; finished {skipped} are skipped on a rerun).")


def family_header(family: str, *paragraphs: str) -> str:
    """A family's summary header: the title '# fourfold experiments: the <family> family', then the paragraphs."""
    return "\n".join(line for p in (f"# fourfold experiments: the {family} family", *paragraphs) for line in (p, ""))


def rm_accuracy_text(rm: Mapping[str, Mapping], unit: str = "") -> str:
    """The header's sentence on the reward models' held-out accuracy, per world or size (``unit``
    after its name)."""
    acc = "; ".join(f"{w}{unit} {fmt(r.get('accuracy_vs_labelers'), 3)} / {fmt(r.get('accuracy_vs_gold'), 3)}"
                    for w, r in rm.items() if r)
    return f"Reward models, held-out accuracy vs labelers / vs gold: {acc}."


def header_html(header: str) -> str:
    """The paragraphs of a summary header (all but its title) as report.html's opening."""
    return "\n".join(f"<p>{esc(p)}</p>" for p in header.split("\n\n")[1:] if p.strip())


def _samples_html(finals_rows: Mapping[str, list[dict]], sft_rows: list[dict], n: int) -> str:
    if n <= 0 or not sft_rows:
        return ""
    parts = []
    for i, base in enumerate(sft_rows[:n]):
        rows = [["SFT", base["response"], fmt(base["proxy"], 2), fmt(base["gold"], 2)]]
        for arm, rs in finals_rows.items():
            if i < len(rs):
                r = rs[i]
                rows.append([arm, r["response"], fmt(r["proxy"], 2), fmt(r["gold"], 2)])
        parts.append(f"<h3>prompt: <code>{esc(base['prompt'])}</code></h3>"
                     + text_table(["model", "response", "proxy", "gold"], rows, cls="samples"))
    return "\n".join(parts)


def summary_header(cfg: ExperimentsConfig, arms: Sequence[Arm], *, n_prompts: int, sft: Mapping, demo_dir: Path,
                   rm_result: Mapping, unbiased_dir: Path | None, total_s: float, jobs_s: float) -> str:
    """The text above the tables of summary.md (its paragraphs also open report.html)."""
    ppo, rm = cfg.demo.ppo, cfg.demo.reward
    samples_per_run = cfg.iterations * ppo.rollout_batch_size
    dpo = (f" dpo samples nothing: {rm.steps} steps x {rm.batch_size} of the demo's labelled pairs (the reward "
           "model's budget)." if any(a.stage == "dpo" for a in arms) else "")
    return "\n".join([
        "# fourfold experiments", "",
        f"{len(arms)} arms x {len(cfg.seeds)} seeds (seeds {', '.join(map(str, cfg.seeds))}); every RL run "
        f"{cfg.iterations} iterations x {ppo.rollout_batch_size} = {samples_per_run} sampled responses.{dpo} "
        f"Final evaluation: {n_prompts} held-out prompts, the same for every run and for the SFT model. "
        f"Gold and proxy differences are in units of the SFT model's per-sample sd on those prompts "
        f"(gold sd {fmt(sft['gold_std'])}, proxy sd {fmt(sft['proxy_std'])}). Values are mean ± sd over seeds.",
        "",
        f"Demo stages: {demo_dir} (RM held-out accuracy vs labelers {fmt(rm_result.get('accuracy_vs_labelers'))}, "
        f"vs gold {fmt(rm_result.get('accuracy_vs_gold'))})"
        + (f"; unbiased-labeler RM: {unbiased_dir}" if unbiased_dir is not None else "")
        + f". ppo: kl_coef {ppo.kl_coef:g}, {ppo.ppo_epochs} epochs, lr {ppo.lr:g}.",
        "",
        f"This invocation took {duration(total_s)} (of which jobs {duration(jobs_s)}, {cfg.workers} workers; "
        "finished runs are skipped on a rerun).",
        "",
    ])


def claims_html(claims: Sequence[Mapping], notes: Sequence[str]) -> list[str]:
    claim_rows = "\n".join(
        f"<tr><td>{esc(c['claim'])}</td><td>{esc(c.get('kind', ''))}</td><td>{esc(c['measured'])}</td>"
        f"<td>{esc(c['threshold'])}</td>"
        f"<td style=\"font-weight:bold;color:{'#186a18' if c['holds'] == 'yes' else '#a01010'}\">{c['holds']}</td>"
        f"<td>{esc(c.get('null', ''))}</td></tr>"
        for c in claims)
    body = ["<h2>Claims</h2>",
            "<p>Computed from the final evaluations by <code>fourfold.apps.experiments.compute_claims</code>; "
            "thresholds are config keys (<code>claims.*</code>).</p>",
            "<table><thead><tr><th>claim</th><th>kind</th><th>measured</th><th>threshold</th><th>holds</th><th>null</th>"
            "</tr></thead>"
            f"<tbody>{claim_rows}</tbody></table>"]
    if notes:
        body.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    return body


def write_report(path: Path, *, cfg: ExperimentsConfig, arms: Sequence[Arm], header: str,
                 result_rows: Sequence[Mapping], claims: Sequence[Mapping], notes: Sequence[str],
                 curves: Mapping, finals: Mapping, sft: Mapping, rows_by_arm: Mapping, sft_rows: list) -> None:
    """Write the self-contained report.html of the sweep."""
    from fourfold.reporting import html_image, html_page

    body = [header_html(header), "<h2>Arms</h2>", text_table(["arm", "what"], [[a.name, a.what] for a in arms])]
    body += claims_html(claims, notes)
    body += ["<h2>Results at the end of the budget</h2>",
             text_table([h for _, h in RESULT_COLUMNS], [[result_cell(r, k) for k, _ in RESULT_COLUMNS] for r in result_rows]),
             "<p>gold sd over seeds: spread of the final gold across seeds; gold sd over iterations: spread of "
             "the training batches' gold over the last quarter of the run (mean over seeds); both in SFT sd.</p>",
             f"<p>{esc(COST_NOTE)}</p>"]
    if curves:
        body += ["<h2>Training curves</h2>", html_image(_curves_figure(curves, sft, cfg.iterations), "curves"),
                 "<h2>Gold vs KL</h2>",
                 "<p>As the policy moves away from the reference the proxy keeps rising while gold turns down: "
                 "that is over-optimisation of the reward model.</p>",
                 html_image(_frontier_figure(curves, finals, sft, cfg.iterations), "frontier")]
    if rows_by_arm and cfg.samples_in_report:
        body += [f"<h2>Samples at the end (seed {cfg.seeds[0]})</h2>",
                 _samples_html(rows_by_arm, sft_rows, cfg.samples_in_report)]
    write_text_atomic(path, html_page("fourfold experiments", "\n".join(body)))
