"""``report.html`` for `fourfold demo`: one self-contained page that explains a finished run.

Sections: what ran (stages and wall times) and the SFT -> PPO headline table; the reward model
(accuracy vs labelers and vs gold, the labelers' length bias); curves over PPO iterations (plus
SFT loss and RM accuracy); before/after samples; "which tokens got the credit" (per-token GAE
advantages of freshly sampled PPO responses, :mod:`fourfold.apps.demo.credit`); how to read it / what
to try next.

Everything is read from the run directory (``config.yaml``, ``eval.json``, ``stages/*/DONE``,
``stages/*/metrics.jsonl``, ``stages/eval/samples.jsonl``, the ``sft/ reward/ policy/ critic/``
model directories), so the page is a deterministic function of that directory: plots are PNGs
embedded as data URIs (matplotlib's Figure API, no pyplot), CSS is inline, and the per-token view
samples with a fixed seed (:mod:`fourfold.apps.demo.credit`). The demo's config and the PPO stage's
config are read as typed configs (``DemoConfig``, ``PPOConfig``).
"""

from __future__ import annotations

import math
import random
import shlex
from pathlib import Path
from typing import Any, Mapping, Sequence

from fourfold.apps.cache import read_done, read_json
from fourfold.apps.demo.credit import credit_section
from fourfold.apps.report_kit import esc, html_table, mean, num, pct, signed, std
from fourfold.atomic import write_text_atomic
from fourfold.config import DemoConfig, load_config
from fourfold.reporting import fig_to_data_uri, html_image, html_page, read_metrics
from fourfold.sinks import fmt_fixed

STAGE_WHAT = {
    "sft": "generate the review corpus, build the word-level tokenizer, train a tiny Llama from scratch (supervised)",
    "pairs": "sample two responses per prompt from the SFT model; simulated labelers pick the better one",
    "reward": "train the reward model (initialised from SFT) on those preferences (Bradley-Terry loss)",
    "ppo": "PPO: the policy maximises the frozen reward model's score minus a KL penalty to the frozen SFT model",
    "eval": "SFT vs PPO policy on held-out prompts, scored by the reward model and by the hidden gold reward",
    "report": "this page",
}
STAGES = tuple(STAGE_WHAT)
"""The demo's stages in the order :func:`fourfold.apps.demo.pipeline.run` runs them (the report is the last)."""
DPI = 80

_EXTRA_CSS = """
<style>
.lead{font-size:1.05em}
.note{color:#555;font-size:.92em}
.box{background:#f7f7f2;border-left:4px solid #b9b48a;padding:.5em 1em;margin:1em 0}
.warn{background:#fbf3ec;border-left:4px solid #d08a4a;padding:.5em 1em;margin:1em 0}
table.samples td{max-width:24em}
table.samples .resp{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.92em}
.prompt{color:#666;font-family:ui-monospace,Menlo,Consolas,monospace}
.credit{margin:.8em 0 1.2em 0}
.credit .meta{font-size:.85em;color:#555}
.legend span{padding:1px 6px;border-radius:3px;margin-right:.4em}
code{background:#f3f3f3;padding:0 .25em;border-radius:3px}
</style>
""".strip()


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------


def _corr(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    n = len(xs)
    if n < 3:
        return None
    mx, my = mean(xs), mean(ys)
    sxy = sum((a - mx) * (b - my) for a, b in zip(xs, ys))
    sxx = sum((a - mx) ** 2 for a in xs)
    syy = sum((b - my) ** 2 for b in ys)
    if sxx <= 0 or syy <= 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def _series(rows: Sequence[Mapping], key: str, x: str = "step") -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        if key in r and num(r.get(x)) is not None:
            xs.append(float(r[x]))
            v = num(r[key])
            ys.append(float("nan") if v is None else v)
    return xs, ys


# ---------------------------------------------------------------------------------------------
# figures (matplotlib Figure API only: no pyplot global state)
# ---------------------------------------------------------------------------------------------


def _style(ax, title: str, xlabel: str = "", ylabel: str = "") -> None:
    ax.set_title(title, fontsize=10)
    if xlabel:
        ax.set_xlabel(xlabel, fontsize=8)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def _no_data(ax, title: str) -> None:
    _style(ax, title)
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="#888")


def _ppo_figure(rows: list[dict], ev: Mapping) -> str:
    from matplotlib.figure import Figure

    sft = ev.get("sft") or {}
    panels = [
        ("reward/score_mean", "Proxy reward (RM score)", "proxy", "reward/score_std"),
        ("reward/gold_mean", "Gold reward (hidden truth)", "gold", None),
        ("kl/k1", "KL to reference (nats / response)", "kl", None),
        ("rollout/response_length", "Response length (tokens)", None, None),
        ("policy/entropy", "Policy entropy (nats / token)", None, None),
        ("value/explained_variance", "Critic explained variance", None, None),
        ("value/error", "Critic error (V - R)^2 before its update", None, None),
        ("mismatch/token_abs_diff_max", "Engine vs trainer log-probs: max |diff|", None, None),
    ]
    fig = Figure(figsize=(14, 5.6))
    axes = fig.subplots(2, 4)
    xkey = "iteration" if any("iteration" in r for r in rows) else "step"
    for ax, (key, title, base_key, band_key) in zip(axes.flat, panels):
        xs, ys = _series(rows, key, xkey)
        if not xs:
            _no_data(ax, title)
            continue
        ax.plot(xs, ys, color="#1f77b4", linewidth=1.4, marker="o", markersize=2.5, label="PPO batch")
        if key == "reward/gold_mean" and len(ys) >= 8:  # noisy (few, discrete values): add a running mean
            w = 5
            windows = [[v for v in ys[max(0, i - w + 1): i + 1] if math.isfinite(v)] for i in range(len(ys))]
            run = [mean(v) if v else float("nan") for v in windows]
            ax.plot(xs, run, color="#08306b", linewidth=2, label=f"running mean ({w})")
        if band_key:
            _, sd = _series(rows, band_key, xkey)
            if len(sd) == len(ys):
                ax.fill_between(xs, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)],
                                color="#1f77b4", alpha=0.15, linewidth=0, label="± 1 sd in batch")
        line = sft_line(key, base_key, sft)
        if line is not None:
            ax.axhline(line[0], color="#d62728", linestyle="--", linewidth=1, label=line[1])
        _style(ax, title, "PPO iteration")
        if base_key or band_key or key in ("rollout/response_length", "reward/gold_mean"):
            ax.legend(fontsize=6.5, loc="best")
    fig.tight_layout()
    return fig_to_data_uri(fig, dpi=DPI)


def sft_line(key: str, base_key: str | None, sft: Mapping) -> tuple[float, str] | None:
    """(value, legend) of the SFT model's held-out line on the PPO panel of ``key`` (its eval's
    ``base_key``), in the panel's unit, or None. Response length: the eval counts words and
    ``rollout/response_length`` tokens up to and including EOS; the review task's tokenizer makes each
    word one token, so a finished response has words + 1 tokens."""
    if key == "rollout/response_length":
        words = num(sft.get("length"))
        return None if words is None else (words + 1, "SFT (held-out eval: words + EOS, in tokens)")
    value = num(sft.get(base_key)) if base_key else None
    return None if value is None else (value, "SFT (held-out eval)")


def _batches_and_held_out(ax, rows: list[dict], key: str, eval_key: str, eval_label: str) -> list[float] | None:
    """Plot a trainer's ``key`` per logged batch and its held-out ``eval_key``; the held-out steps
    (None, and nothing plotted, when ``key`` was never logged)."""
    xs, ys = _series(rows, key)
    if not xs:
        return None
    ax.plot(xs, ys, linewidth=1.4, marker="o", markersize=2.5, label="train batch")
    ex, ey = _series(rows, eval_key)
    if ex:
        ax.plot(ex, ey, "s", color="#d62728", markersize=5, label=eval_label)
    return ex


def _training_figure(sft_rows: list[dict], rm_rows: list[dict], pairs: Mapping, rm: Mapping) -> str:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.5, 2.7))
    a1, a2 = fig.subplots(1, 2)
    if _batches_and_held_out(a1, sft_rows, "sft/loss", "sft/eval_loss", "held-out") is None:
        _no_data(a1, "SFT loss")
    else:
        _style(a1, "SFT loss (cross-entropy / token)", "step")
        a1.legend(fontsize=6.5)
    ex = _batches_and_held_out(a2, rm_rows, "rm/accuracy", "rm/eval_accuracy", "held-out (vs labelers)")
    if ex is None:
        _no_data(a2, "Reward-model accuracy")
    else:
        vs_gold = num(rm.get("accuracy_vs_gold"))
        if ex and vs_gold is not None:
            a2.plot([ex[-1]], [vs_gold], "D", color="#ff7f0e", markersize=5, label="held-out (vs gold)")
        agree = num(pairs.get("labels_agree_with_gold"))
        if agree is not None:
            a2.axhline(agree, color="#2ca02c", linestyle=":", linewidth=1, label="labelers agree with gold")
        a2.axhline(0.5, color="#888", linestyle="--", linewidth=0.8, label="chance")
        _style(a2, "Reward-model accuracy on pairs", "step")
        a2.legend(fontsize=6.5)
    fig.tight_layout()
    return fig_to_data_uri(fig, dpi=DPI)


def _eval_figure(by_model: Mapping[str, list[dict]]) -> str:
    from matplotlib.figure import Figure

    colors = {"sft": "#7f7f7f", "ppo": "#1f77b4"}
    fig = Figure(figsize=(8.5, 3.0))
    a1, a2 = fig.subplots(1, 2)
    rng = random.Random(0)  # deterministic jitter: gold takes few distinct values
    lengths = {}
    for name in ("sft", "ppo"):
        rows = by_model.get(name) or []
        px = [float(r["proxy"]) for r in rows if num(r.get("proxy")) is not None and num(r.get("gold")) is not None]
        gy = [float(r["gold"]) + rng.uniform(-0.06, 0.06)
              for r in rows if num(r.get("proxy")) is not None and num(r.get("gold")) is not None]
        if px:
            a1.scatter(px, gy, s=9, alpha=0.6, color=colors[name], label=name.upper(), linewidths=0)
        lengths[name] = [len(str(r.get("response", "")).split()) for r in rows]
    _style(a1, "Each held-out response: proxy vs gold", "reward-model score (proxy)", "gold reward (jittered)")
    if any(lengths.values()):
        a1.legend(fontsize=7)
        top = max(max(v) for v in lengths.values() if v)
        bins = list(range(0, top + 3, 2))
        for name in ("sft", "ppo"):
            if lengths.get(name):
                a2.hist(lengths[name], bins=bins, alpha=0.5, color=colors[name], label=name.upper())
        a2.legend(fontsize=7)
    _style(a2, "Response length on held-out prompts", "words", "responses")
    fig.tight_layout()
    return fig_to_data_uri(fig, dpi=DPI)


# ---------------------------------------------------------------------------------------------
# the page
# ---------------------------------------------------------------------------------------------


def _stage_results(out: Path) -> dict[str, dict]:
    res = {}
    for name in STAGES:
        rec = read_done(out, name)
        if rec is not None:
            res[name] = rec.get("result") or {}
    return res


def _paired(by_model: Mapping[str, list[dict]], key: str) -> tuple[float, float, int] | None:
    """(mean difference PPO - SFT, its standard error, n) over prompts present in both (paired by order)."""
    a, b = by_model.get("sft") or [], by_model.get("ppo") or []
    diffs = [float(y[key]) - float(x[key]) for x, y in zip(a, b)
             if x.get("prompt") == y.get("prompt") and num(x.get(key)) is not None and num(y.get(key)) is not None]
    if len(diffs) < 2:
        return None
    return mean(diffs), std(diffs) / math.sqrt(len(diffs)), len(diffs)


def _labelers(task) -> str:
    bias = getattr(getattr(task, "config", None), "labeler_length_bias", None)
    if bias is None:
        return "imperfect: noisy, and not always right"
    return "noisy and biased towards longer reviews" if float(bias) > 0 else "noisy (their length bias is off in this run)"


def _intro(cfg: DemoConfig, stages: dict[str, dict], task) -> str:
    rows = []
    total = 0.0
    for i, name in enumerate(STAGES, 1):
        w = num((stages.get(name) or {}).get("wall_s"))
        if name == "report":
            wall = "(now)"
        elif name not in stages:
            wall = "not run"
        else:
            wall = "n/a" if w is None else f"{w:.1f} s"
            total += w or 0.0
        rows.append([str(i), f"<code>{name}</code>", esc(STAGE_WHAT[name]), wall])
    sizes = f"a {cfg.model.num_layers}-layer Llama with hidden size {cfg.model.hidden_size} and a word-level tokenizer"
    quick = " (the <code>--quick</code> budget)" if cfg.quick else ""
    return (
        "<h2>1. What ran</h2>"
        '<p class="lead">This run trained the classic RLHF stack from nothing, on a synthetic world of product '
        "reviews whose <em>true</em> quality is known (the <b>gold reward</b>: a positive, well-formed review of "
        "normal length). The models never see gold. They learn from simulated human labelers, who are "
        f"{_labelers(task)}. The reward model learns from those labelers, and PPO optimises the "
        "reward model (the <b>proxy</b>). So the question this page answers is: <em>did optimising the proxy improve "
        f"the truth, and what did it cost?</em></p><p>Every model is {sizes}{quick}. "
        "Stages are cached: a stage whose settings did not change is reused, and its time is that of the run that "
        "produced it.</p>"
        + html_table(["#", "stage", "what it does", "wall time"], rows, num_cols=(3,))
        + f'<p class="note">Total {total:.0f} s of stage time.</p>'
    )


def fmt(x: Any, digits: int = 3) -> str:
    """``x`` with ``digits`` decimals (``n/a`` when it is not a number), never ``-0.00``."""
    v = num(x)
    return "n/a" if v is None else fmt_fixed(v, digits)


def _headline(ev: Mapping, by_model: Mapping[str, list[dict]], pairs: Mapping, n_prompts: int | None) -> str:
    sft, ppo = ev.get("sft") or {}, ev.get("ppo") or {}
    spec = [
        ("proxy", "Proxy score (reward model)", "what PPO was trained to raise", 3, False),
        ("gold", "Gold reward", "the hidden true quality (never seen in training)", 3, False),
        ("kl", "KL to SFT reference (nats / response)",
         "how far the policy drifted from SFT (the k1 estimate: unbiased, so a sample's mean can fall a little below 0)",
         2, False),
        ("length", "Length (words)", "mean response length", 1, False),
        ("well_formed", "Well-formed", "share of responses that parse as a review", 0, True),
        ("repetition", "Repetition", "share of responses that repeat themselves", 0, True),
    ]
    rows = []
    for key, label, what, d, as_pct in spec:
        a, b = num(sft.get(key)), num(ppo.get(key))
        if as_pct:
            cells = [pct(a), pct(b), "n/a" if a is None or b is None else f"{100 * (b - a):+.{d}f} pts"]
        else:
            cells = [fmt(a, d), fmt(b, d), "n/a" if a is None or b is None else f"{round(b - a, d) + 0.0:+.{d}f}"]
        rows.append([esc(label), *cells, esc(what)])
    table = html_table(["metric", "SFT", "PPO", "change", "meaning"], rows, num_cols=(1, 2, 3))
    gg, pg = num(ev.get("gold_gain_sd")), num(ev.get("proxy_gain_sd"))
    n_txt = f" on {n_prompts} held-out prompts" if n_prompts else " on held-out prompts"
    out = [f"<h3>SFT vs PPO{n_txt}</h3>", table,
           f'<p class="box"><b>Gold gain: {signed(gg)} SFT standard deviations</b> '
           f"(proxy gain: {signed(pg)} SFT standard deviations). One SFT standard deviation of gold is "
           f"{fmt(sft.get('gold_std'), 2)}; of the proxy, {fmt(sft.get('proxy_std'), 2)}.</p>"]
    # an honest reading of the numbers
    notes = []
    gp = _paired(by_model, "gold")
    if gp is not None:
        d, se, n = gp
        if abs(d) < 2 * se:
            notes.append(f"The gold difference ({d:+.3f}) is within two standard errors (SE {se:.3f}, paired over {n} "
                         "prompts) of zero: with this few prompts it is not distinguishable from noise.")
        else:
            notes.append(f"The gold difference ({d:+.3f}) is {abs(d) / se:.1f} standard errors (SE {se:.3f}, paired over "
                         f"{n} prompts) from zero: {'a real improvement' if d > 0 else 'a real deterioration'} of the "
                         "true quality on this prompt distribution.")
    if gg is not None and pg is not None and pg > 0 and pg > 2 * max(gg, 0.0) + 0.25:
        notes.append("The proxy rose much more than gold: part of what PPO learned pleases the reward model "
                     "without being better by the gold standard (Goodhart's law, in miniature).")
    la, lb = num(sft.get("length")), num(ppo.get("length"))
    longer = num(pairs.get("labels_prefer_longer"))
    if la and lb and lb > 1.15 * la:
        extra = (f" The labelers preferred the longer response in {pct(longer)} of their pairs, so the reward "
                 "model learned to pay for length." if longer is not None and longer > 0.55 else "")
        notes.append(f"Responses grew from {la:.1f} to {lb:.1f} words.{extra}")
    wa, wb = num(sft.get("well_formed")), num(ppo.get("well_formed"))
    if wa is not None and wb is not None and wb < wa - 0.03:
        notes.append(f"The share of well-formed reviews fell ({pct(wa)} to {pct(wb)}): more text is more chances to "
                     "break the grammar, and ill-formed reviews get gold &minus;1.")
    ka = num(ppo.get("kl"))
    if ka is not None:
        notes.append(f"The policy paid {ka:.2f} nats of KL per response to get there; the KL penalty is what keeps "
                     "it from drifting arbitrarily far from the SFT model.")
    if notes:
        out.append("<ul>" + "".join(f"<li>{n}</li>" for n in notes) + "</ul>")
    return "\n".join(out)


def _reward_rows(rm: Mapping, pairs: Mapping, by_model: Mapping[str, list[dict]], task,
                 rm_rows: list[dict]) -> tuple[list[list[str]], tuple[float | None, float | None]]:
    """The reward model's table, and the correlations of RM score and of gold with length (SFT responses)."""
    tcfg = getattr(task, "config", None)
    bias = getattr(tcfg, "labeler_length_bias", None)
    rows = [
        ["Preference pairs (train / held-out)", f"{pairs.get('pairs', 'n/a')} / {pairs.get('eval_pairs', 'n/a')}"],
        ["Labelers agree with gold", pct(pairs.get("labels_agree_with_gold"), 1)],
        ["Labelers prefer the longer response", pct(pairs.get("labels_prefer_longer"), 1)],
    ]
    if bias is not None:
        rows.append(["Labelers' built-in length bias", f"+{float(bias):g} utility per word"])
    final_train = [r for r in rm_rows if num(r.get("rm/accuracy")) is not None]
    if final_train:
        rows.append(["RM accuracy on its last training batch", pct(final_train[-1]["rm/accuracy"], 1)])
    rows += [
        ["<b>RM held-out accuracy vs labelers</b>", "<b>" + pct(rm.get("accuracy_vs_labelers"), 1) + "</b>"],
        ["<b>RM held-out accuracy vs gold</b>", "<b>" + pct(rm.get("accuracy_vs_gold"), 1) + "</b>"],
        ["RM held-out loss (Bradley-Terry)", fmt(rm.get("eval_loss"), 3)],
    ]
    slips_g = num(rm.get("slips_accuracy_vs_gold"))
    if slips_g is not None:
        rows += [["Held-out one-slip pairs (a sample vs the same sample with one word broken)",
                  str(pairs.get("slip_eval_pairs", "n/a"))],
                 ["Labelers choose the intact response", pct(pairs.get("slips_labels_choose_intact"), 1)],
                 ["<b>RM accuracy on one-slip pairs vs gold</b>", "<b>" + pct(slips_g, 1) + "</b>"]]
    sft_rows = by_model.get("sft") or []
    c_pl = c_gl = c_pg = None
    if sft_rows:
        lens = [float(len(str(r.get("response", "")).split())) for r in sft_rows]
        prox = [float(r["proxy"]) for r in sft_rows if num(r.get("proxy")) is not None]
        gold = [float(r["gold"]) for r in sft_rows if num(r.get("gold")) is not None]
        if len(prox) == len(lens) == len(gold):
            c_pl, c_gl, c_pg = _corr(prox, lens), _corr(gold, lens), _corr(prox, gold)
            rows += [["Correlation of RM score with length (SFT responses)", signed(c_pl)],
                     ["Correlation of gold with length (SFT responses)", signed(c_gl)],
                     ["Correlation of RM score with gold (SFT responses)", signed(c_pg)]]
    return rows, (c_pl, c_gl)


def _reward_section(summary: Mapping, by_model: Mapping[str, list[dict]], task, rm_rows: list[dict]) -> str:
    rm, pairs = summary.get("reward") or {}, summary.get("pairs") or {}
    rows, (c_pl, c_gl) = _reward_rows(rm, pairs, by_model, task, rm_rows)
    slips_g = num(rm.get("slips_accuracy_vs_gold"))
    acc_l, acc_g = num(rm.get("accuracy_vs_labelers")), num(rm.get("accuracy_vs_gold"))
    agree = num(pairs.get("labels_agree_with_gold"))
    text = ["<h2>2. The reward model: an imperfect proxy</h2>",
            "<p>The reward model (RM) was trained to predict which of two responses the simulated labelers "
            "chose. Its accuracy on held-out pairs says how well it learned the labelers, and its agreement "
            "with gold says how well it tracks what we actually want. Those are different things: the labelers "
            f"themselves are {_labelers(task)}.</p>",
            html_table(["quantity", "value"], rows, num_cols=(1,))]
    reading = []
    if acc_l is not None and acc_g is not None:
        reading.append(f"The RM picks the labelers' choice {pct(acc_l)} of the time and the gold-better response "
                       f"{pct(acc_g)} of the time (50% is chance).")
    if agree is not None:
        reading.append(f"Even the labelers agree with gold on only {pct(agree)} of pairs: the RM learns their "
                       "preferences, flaws included.")
    if c_pl is not None and c_gl is not None and c_pl > c_gl + 0.1:
        reading.append(f"On SFT responses the RM score correlates with length ({c_pl:+.2f}) much more than gold "
                       f"does ({c_gl:+.2f}): a longer answer earns RM score that it does not earn in gold.")
    if slips_g is not None:
        seen = ("it barely sees grammar, so nothing but the KL penalty keeps the policy's text well formed"
                if slips_g < 0.7 else "it has learned to see most grammar slips")
        reading.append(f"Shown a review and the same review with one word broken, the RM ranks them as gold does "
                       f"{pct(slips_g)} of the time: {seen}.")
    reading.append("So the RM is a <em>proxy</em>. Pushing hard on it (PPO) finds the places where proxy and truth "
                   "disagree; the KL penalty to the SFT model is what limits how far that goes.")
    text.append("<p>" + " ".join(reading) + "</p>")
    return "\n".join(text)


def _samples_section(by_model: Mapping[str, list[dict]], n: int) -> str:
    sft = by_model.get("sft") or []
    ppo = {}
    for r in by_model.get("ppo") or []:
        ppo.setdefault(r.get("prompt"), r)
    rows = []
    for r in sft:
        if len(rows) >= n:
            break
        q = ppo.get(r.get("prompt"))
        if q is None:
            continue
        rows.append([
            f'<span class="prompt">{esc(r.get("prompt", ""))}</span>',
            f'<span class="resp">{esc(r.get("response", ""))}</span>', fmt(r.get("proxy"), 2), fmt(r.get("gold"), 2),
            f'<span class="resp">{esc(q.get("response", ""))}</span>', fmt(q.get("proxy"), 2), fmt(q.get("gold"), 2),
        ])
    head = ("<h2>4. Samples: before and after</h2>"
            f"<p>The first {len(rows)} held-out prompts (not cherry-picked), with one sampled response from the SFT "
            "model and one from the PPO policy. <em>proxy</em> is the reward model's score, <em>gold</em> the hidden "
            "true reward (&minus;1 for a review that does not parse or repeats itself).</p>")
    if not rows:
        return head + '<p class="note">No samples found (stages/eval/samples.jsonl).</p>'
    return head + html_table(["prompt", "SFT response", "proxy", "gold", "PPO response", "proxy", "gold"], rows,
                         cls="samples", num_cols=(2, 3, 5, 6))


def _next_section(cfg: DemoConfig) -> str:
    kl, out_dir, quick = cfg.ppo.kl_coef, cfg.run.output_dir, cfg.quick
    cmd = esc("fourfold demo" + (" --quick" if quick else "")
              + (f" --output-dir {shlex.quote(str(out_dir))}" if out_dir != "runs/demo" else ""))
    return (
        "<h2>6. How to read this, and what to try next</h2><ul>"
        "<li><b>Proxy up, gold up</b>: RLHF working. <b>Proxy up, gold flat or down</b>: the policy is exploiting "
        "the reward model (reward hacking). Watch the gold curve against the proxy curve in section 3.</li>"
        "<li><b>KL</b> is the price paid: it grows as the policy leaves the SFT distribution. A reward gain with "
        "little KL is cheap; a large KL usually means the policy found something odd.</li>"
        "<li><b>Length and entropy</b> are early warnings: a steady climb in length or a collapse of entropy "
        "often precedes a drop in gold.</li>"
        "<li>The numbers come from one seed and small samples; differences of a few hundredths are noise "
        "(see the standard errors in section 1).</li></ul>"
        "<p>Try (in the same output directory, unchanged stages are reused from cache, so only what changed "
        "reruns; copy this <code>report.html</code> first if you want to compare):</p><ul>"
        f"<li><code>{cmd} ppo.kl_coef=0</code>: no KL penalty (this run: {esc(kl)}); the proxy typically keeps "
        "climbing while gold stalls or falls and length and KL run away: reward hacking.</li>"
        f"<li><code>{cmd} ppo.kl_coef=0.2</code>: a stronger leash; less KL, and less gain.</li>"
        f"<li><code>{cmd} task_options.labeler_length_bias=0</code>: unbiased labelers (reruns every stage); does "
        "the length growth go away?</li>"
        + ("<li><code>fourfold demo</code> without <code>--quick</code>: the full budget.</li>" if quick else "")
        + "<li><code>fourfold experiments</code>: these comparisons run systematically, over several seeds.</li></ul>"
        f'<p class="note">Every number on this page is read from the run directory <code>{esc(out_dir)}</code> '
        "(<code>eval.json</code>, <code>metrics.jsonl</code>, <code>stages/</code>); the models are plain "
        "Hugging Face directories (<code>sft/</code>, <code>reward/</code>, <code>policy/</code>, <code>critic/</code>).</p>"
    )


def write_report(out: Path, *, task, summary: dict) -> Path:
    """Write ``out/report.html`` (self-contained) for a finished demo run directory and return its path."""
    out = Path(out)
    summary = dict(summary or {})
    cfg = load_config(DemoConfig, out / "config.yaml")
    stages = _stage_results(out)
    for name in ("sft", "pairs", "reward"):
        if not summary.get(name) and name in stages:
            summary[name] = stages[name]
    ev = read_json(out / "eval.json") or summary.get("eval") or stages.get("eval") or {}
    samples = read_metrics(out / "stages" / "eval" / "samples.jsonl")
    by_model: dict[str, list[dict]] = {}
    for r in samples:
        by_model.setdefault(str(r.get("model")), []).append(r)
    ppo_rows = read_metrics(out / "stages" / "ppo" / "metrics.jsonl")
    sft_rows = read_metrics(out / "stages" / "sft" / "metrics.jsonl")
    rm_rows = read_metrics(out / "stages" / "reward" / "metrics.jsonl")
    n_show = cfg.eval.samples_in_report
    n_prompts = len(by_model.get("sft") or []) or cfg.eval.prompts

    body = [_EXTRA_CSS, _intro(cfg, stages, task), _headline(ev, by_model, summary.get("pairs") or {}, n_prompts)]
    body.append(_reward_section(summary, by_model, task, rm_rows))
    body.append(
        "<h2>3. Curves</h2>"
        "<p>One point per PPO iteration (a batch of freshly sampled responses to training prompts). The dashed red "
        "line is the SFT model on the held-out prompts, for reference. The proxy is what PPO optimises; gold is "
        "only measured. The critic's explained variance says how well the value model predicts returns "
        "(1 = perfectly, 0 = no better than a constant).</p>"
        + html_image(_ppo_figure(ppo_rows, ev),
                     "PPO curves: proxy reward, gold reward, KL, length, entropy, explained variance")
        + "<h3>Before PPO: supervised fine-tuning and the reward model</h3>"
        + html_image(_training_figure(sft_rows, rm_rows, summary.get("pairs") or {}, summary.get("reward") or {}),
                     "SFT loss and reward-model accuracy")
        + "<h3>Held-out responses</h3><p>Left: each held-out response's proxy score against its gold reward; a "
        "perfect proxy would put the points on a rising line. Right: the length distributions.</p>"
        + html_image(_eval_figure(by_model), "Proxy vs gold per response, and response lengths")
    )
    body.append(_samples_section(by_model, n_show))
    eval_prompts = [str(r.get("prompt")) for r in by_model.get("ppo") or by_model.get("sft") or [] if r.get("prompt")]
    body.append(credit_section(out, cfg, eval_prompts, n_show, task))
    body.append(_next_section(cfg))
    page = html_page("fourfold demo: RLHF from zero on product reviews", "\n".join(body))
    return write_text_atomic(out / "report.html", page)
