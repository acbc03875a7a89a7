"""The re-posed overoptimization family's claims (issue 41; docs/experiments.md, "Overoptimization
that can turn over"), written before its first run, each with Gao, Schulman and Hilton's (2023)
finding beside it (:data:`PAPER`) and, where the data give it, its null computed by the run.

A *curve* is ``(d [M], gold [P, M])``: gold per prompt (mean over seeds) at M points ordered by
d = sqrt(KL to the SFT model), column 0 the SFT model; a gain is gold minus column 0. The row
functions (unit-tested on synthetic curves in tests/test_goodhart_claims.py):

- :func:`peak_rows` (group ``peak``): gold rises, peaks and falls: the split-half peak test
  (fourfold.core.curve_fits.peak_test) and the law's beta > 0 over a bootstrap of prompts;
- :func:`form_rows` (``form``): the law's form extrapolates better than every peak-free form
  (held-out RMSE) and has the lower AIC (compare_forms);
- :func:`quality_axis_rows` (``quality-axis``), :func:`quality_rows` (``quality``): the RM levels
  differ in gold accuracy; ordered by it, the peak rises and beta falls;
- :func:`kl_rows` (``kl-stop``, ``kl-frontier``): where a KL coefficient stops PPO against the
  unpenalised curve's peak, and whether it lies on that curve's KL-gold frontier (TOST);
- :func:`efficiency_rows` (``efficiency``): best-of-n gains more gold than PPO at equal d.

The computed nulls (``peak``, ``form``): the same verdict on a peak-free curve matched to the data
(the saturating form fitted to the mean gain, each prompt's deviations from the mean resampled),
"yes" when it passes on more than ``null_rate`` of ``null_draws`` draws.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch

from fourfold.apps.claim_kinds import annotate
from fourfold.apps.claim_kit import claim_row
from fourfold.apps.claim_stats import margin_verdict
from fourfold.apps.experiments.goodhart_config import GoodhartClaimsConfig
from fourfold.core.curve_fits import beta_bootstrap, compare_forms, fit_form, peak_test

FAMILY = "goodhart"
METHODS = {"bon": "best-of-n", "ppo": "PPO"}
LAW = {"bon": "bon", "ppo": "rl"}
"""Each method's form of the law: best-of-n d (alpha - beta d), RL d (alpha - beta log d)."""
PEAK_FREE = ("linear", "saturating", "hyperbolic")

PAPER = {
    "peak": "Gao et al.: gold rises, peaks and falls for both best-of-n and RL while the proxy rises; "
            "seen within their KL range for the smaller RMs",
    "form": "Gao et al.: R_bon = d (alpha - beta d), R_rl = d (alpha - beta log d) fit their curves "
            "(in sample; no peak-free alternative compared)",
    "quality-axis": "Gao et al.: the RM axis is parameters (3M-3B) fitting a gold RM's labels; small RM "
                    "datasets (< ~2k comparisons) give little signal",
    "quality": "Gao et al.: the peak gold rises and beta falls smoothly (about logarithmically) with RM size",
    "kl-stop": "Gao et al. report no default coefficient; fourfold's demo runs PPO at kl_coef 0.05",
    "kl-frontier": "Gao et al.: a KL penalty does not change the KL-gold frontier; it acts like early stopping",
    "efficiency": "Gao et al.: as a function of KL, RL is slower than best-of-n at both optimization and "
                  "overoptimization",
}
"""{group: the paper's finding}: shown beside each claim (docs/experiments.md)."""


def _curve(d, gold) -> tuple[torch.Tensor, torch.Tensor]:
    d_t = torch.as_tensor(d, dtype=torch.float64).flatten()
    g = torch.as_tensor(gold, dtype=torch.float64)
    if g.dim() != 2 or g.shape[1] != d_t.numel():
        raise ValueError(f"a curve is d [M] and gold [P, M]: got d {tuple(d_t.shape)}, gold {tuple(g.shape)}")
    return d_t, g


def _rows(rows: list[dict], group: str) -> list[dict]:
    return [{**r, "paper": PAPER[group]} for r in annotate(FAMILY, rows)]


# --- null curves: peak-free, matched to the data ------------------------------------------------


def null_curves(d, gold, draws: int, seed: int = 0):
    """``draws`` curves without a peak shaped like ``(d, gold)``: each prompt's row is the saturating
    form fitted to the mean gain, plus the start, plus a resampled prompt's deviations from the
    mean curve (which keeps each prompt's correlation across points)."""
    d_t, g = _curve(d, gold)
    mean = g.mean(0)
    sat = fit_form(d_t, mean - mean[0], "saturating").predict(d_t) + mean[0]  # (M,)
    dev = g - mean  # (P, M)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(draws):
        yield sat[None, :] + dev[torch.randint(g.shape[0], (g.shape[0],), generator=gen)]


def _null_text(rate: float, cc: GoodhartClaimsConfig, what: str) -> str:
    verdict = "yes" if rate > cc.null_rate else "no"
    return f"{verdict} (computed: the rule passes on {rate:.0%} of {cc.null_draws} draws of {what})"


# --- rise, peak and fall -------------------------------------------------------------------------


def level_peak(d, gold, method: str, cc: GoodhartClaimsConfig, seed: int = 0) -> dict:
    """One curve's verdict: the peak test (``peaks``, the chosen points, rises and falls) and the
    law's beta bootstrap; ``holds`` when both say so."""
    d_t, g = _curve(d, gold)
    pt = peak_test(g, seed=seed, z=cc.peak_z)
    bb = beta_bootstrap(d_t, g, LAW[method], reps=cc.bootstrap_reps, seed=seed)
    return {"holds": pt.peaks and bb["share_positive"] >= cc.beta_share, "peaks": pt.peaks,
            "peak_d": [float(d_t[j]) for j in pt.peak_index], "rise": list(pt.rise), "fall": list(pt.fall),
            "rise_se": list(pt.rise_se), "fall_se": list(pt.fall_se), **{f"beta_{k}": v for k, v in bb.items()}}


def peak_rows(world: str, method: str, levels: Mapping[int, tuple], cc: GoodhartClaimsConfig) -> list[dict]:
    """``levels`` {pairs: (d, gold)}: 'gold rises, peaks and falls' at >= peak_min_levels levels."""
    got = {p: level_peak(*levels[p], method, cc) for p in sorted(levels)}
    n_yes = sum(v["holds"] for v in got.values())
    measured = "; ".join(
        f"{p} pairs: {'peaks' if v['peaks'] else 'no peak'} at d={v['peak_d'][0]:.2f}/{v['peak_d'][1]:.2f}, rise "
        f"{v['rise'][0]:+.3f}/{v['rise'][1]:+.3f}, fall {v['fall'][0]:+.3f}/{v['fall'][1]:+.3f}; beta "
        f"{v['beta_beta']:.3f} [{v['beta_low']:.3f}, {v['beta_high']:.3f}], > 0 in {v['beta_share_positive']:.0%}"
        for p, v in got.items())
    rate, gens = 0.0, {p: null_curves(*levels[p], cc.null_draws, seed=1000 + p) for p in levels}
    for k in range(cc.null_draws):
        rate += sum(level_peak(levels[p][0], next(gens[p]), method, cc, seed=k)["holds"]
                    for p in levels) >= cc.peak_min_levels
    null = _null_text(rate / cc.null_draws, cc, "the saturating curve fitted to each level's mean gain, "
                      "prompts' deviations resampled")
    row = claim_row("peak", f"{METHODS[method]} ({world}): gold rises, peaks and falls", measured,
                    f"at >= {cc.peak_min_levels} RM level(s): the peak's rise and fall each > {cc.peak_z:g} paired SE "
                    f"on the prompts that did not choose it, both ways round, and beta > 0 in >= {cc.beta_share:.0%} "
                    f"of {cc.bootstrap_reps} bootstrap resamples", n_yes >= cc.peak_min_levels, null)
    return _rows([row], "peak")


# --- the law's form against peak-free forms ------------------------------------------------------


def level_form(d, gold, method: str, cc: GoodhartClaimsConfig) -> dict:
    """compare_forms on the mean gain: ``wins`` when the law has the lowest held-out RMSE and AIC of
    itself and the peak-free forms."""
    d_t, g = _curve(d, gold)
    mean = g.mean(0)
    law = LAW[method]
    c = compare_forms(d_t, mean - mean[0], (law,) + PEAK_FREE, train_share=cc.train_share)
    wins = all(c[law]["heldout_rmse"] < c[f]["heldout_rmse"] and c[law]["aic"] < c[f]["aic"] for f in PEAK_FREE)
    return {"wins": wins, "forms": c}


def form_rows(world: str, method: str, levels: Mapping[int, tuple], cc: GoodhartClaimsConfig) -> list[dict]:
    """``levels`` {pairs: (d, gold)}: the law beats every peak-free form out of sample at every level."""
    got = {p: level_form(*levels[p], method, cc) for p in sorted(levels)}
    law = LAW[method]
    measured = "; ".join(f"{p} pairs: held-out RMSE " + ", ".join(f"{f} {v['forms'][f]['heldout_rmse']:.3f}"
                                                                  for f in (law,) + PEAK_FREE)
                         for p, v in got.items())
    rate, gens = 0.0, {p: null_curves(*levels[p], cc.null_draws, seed=2000 + p) for p in levels}
    for _ in range(cc.null_draws):
        rate += all(level_form(levels[p][0], next(gens[p]), method, cc)["wins"] for p in levels)
    null = _null_text(rate / cc.null_draws, cc, "the saturating curve fitted to each level's mean gain")
    row = claim_row("form", f"{METHODS[method]} ({world}): the law's form beats peak-free forms out of sample", measured,
                    f"at every RM level: {law} has a lower held-out RMSE (fit on the smallest {cc.train_share:.0%} of d) "
                    f"and a lower AIC than each of {', '.join(PEAK_FREE)}",
                    bool(got) and all(v["wins"] for v in got.values()), null)
    return _rows([row], "form")


# --- reward-model quality ------------------------------------------------------------------------


def _strict(xs: Sequence[float], up: bool) -> bool:
    return all((b > a) if up else (b < a) for a, b in zip(xs, xs[1:]))


def quality_axis_rows(world: str, accuracy: Mapping[int, float], cc: GoodhartClaimsConfig) -> list[dict]:
    """``accuracy`` {pairs: gold pair accuracy on the policies' own samples}: the levels differ."""
    ps = sorted(accuracy)
    acc = [accuracy[p] for p in ps]
    ok = len(ps) >= cc.min_levels and _strict(acc, True) and acc[-1] - acc[0] >= cc.accuracy_min_spread
    row = claim_row("quality-axis", f"({world}) more preference pairs give RMs of higher gold accuracy",
                    ", ".join(f"{p}: {a:.3f}" for p, a in zip(ps, acc)),
                    f">= {cc.min_levels} levels, strictly increasing with the pairs, highest - lowest >= "
                    f"{cc.accuracy_min_spread:g}", ok)
    return _rows([row], "quality-axis")


def quality_rows(world: str, method: str, levels: Mapping[int, Mapping[str, float]],
                 cc: GoodhartClaimsConfig) -> list[dict]:
    """``levels`` {pairs: {accuracy, peak_gain, beta}}: ordered by measured accuracy, the peak gain
    strictly rises and beta strictly falls (two rows)."""
    order = sorted(levels, key=lambda p: levels[p]["accuracy"])
    enough = len(order) >= cc.min_levels
    rows = []
    for key, up, what in (("peak_gain", True, "the gold peak rises"), ("beta", False, "beta falls")):
        vals = [levels[p][key] for p in order]
        rows.append(claim_row("quality", f"{METHODS[method]} ({world}): with RM gold accuracy, {what}",
                              ", ".join(f"{p} pairs (acc {levels[p]['accuracy']:.3f}): {levels[p][key]:+.3f}" for p in order),
                              f">= {cc.min_levels} levels ordered by gold accuracy, {key} strictly "
                              f"{'increasing' if up else 'decreasing'}", enough and _strict(vals, up)))
    return _rows(rows, "quality")


# --- where the KL coefficient stops, and the frontier ---------------------------------------------


def interp_rows(d, gold, at: float) -> torch.Tensor:
    """Each prompt's gold at distance ``at``, linear in d between the curve's points (points sorted
    by d; beyond the range: the nearest end)."""
    d_t, g = _curve(d, gold)
    order = torch.argsort(d_t, stable=True)
    d_t, g = d_t[order], g[:, order]
    if at <= float(d_t[0]):
        return g[:, 0]
    if at >= float(d_t[-1]):
        return g[:, -1]
    j = int(torch.searchsorted(d_t, torch.tensor([at], dtype=torch.float64), right=True)[0])
    w = (at - float(d_t[j - 1])) / max(float(d_t[j] - d_t[j - 1]), 1e-300)
    return g[:, j - 1] * (1 - w) + g[:, j] * w


def kl_rows(world: str, unpenalised: tuple, finals: Mapping[float, tuple[float, Sequence[float]]],
            cc: GoodhartClaimsConfig) -> list[dict]:
    """``unpenalised`` (d, gold) the kl_coef 0 curve; ``finals`` {kl_coef > 0: (final d, final gold
    per prompt, the same prompts)}: 'kl-stop' (final d <= the unpenalised gold peak's d, which must
    exist by the peak test) and 'kl-frontier' (the final gold equals the unpenalised curve's gold at
    the same d within margin_share of its peak gain, TOST)."""
    d_t, g = _curve(*unpenalised)
    pt = peak_test(g, z=cc.peak_z)
    mean = g.mean(0)
    j = int(torch.argmax(mean))
    peak_d, peak_gain = float(d_t[j]), float(mean[j] - mean[0])
    rows = []
    for coef in sorted(finals):
        fd, fg = finals[coef]
        fg = torch.as_tensor(fg, dtype=torch.float64)
        rows.append(claim_row("kl-stop", f"({world}) PPO at kl_coef {coef:g} stops at or before the unpenalised gold peak",
                              f"final d={fd:.2f}; unpenalised peak at d={peak_d:.2f} ({'peaks' if pt.peaks else 'no peak'} "
                              "by the peak test)", "the unpenalised curve peaks (peak test) and final d <= its peak's d",
                              pt.peaks and fd <= peak_d,
                              f"{'yes' if pt.peaks and float(d_t[-1]) <= peak_d else 'no'} (computed: the rule on the "
                              f"unpenalised run's own last point, d={float(d_t[-1]):.2f})"))
        diff = fg - interp_rows(d_t, g, fd)  # (P,): paired by prompt
        se = float(diff.std(unbiased=True)) / math.sqrt(diff.numel()) if diff.numel() > 1 else math.inf
        b = margin_verdict(float(diff.mean()), se, peak_gain, share=cc.margin_share, two_sided=True)
        rows.append(claim_row("kl-frontier", f"({world}) PPO at kl_coef {coef:g} lies on the unpenalised KL-gold frontier",
                              f"gold at d={fd:.2f} minus the unpenalised curve's there: {float(diff.mean()):+.3f} "
                              f"(SE {se:.3f}; 90% interval {b.lower:+.3f} to {b.upper:+.3f})",
                              f"90% interval inside +-{cc.margin_share:.0%} of the unpenalised peak gain "
                              f"(+-{b.margin:.3f}): equivalence (TOST)", b.holds))
    return _rows([r for r in rows if r["group"] == "kl-stop"], "kl-stop") + \
        _rows([r for r in rows if r["group"] == "kl-frontier"], "kl-frontier")


# --- best-of-n against PPO in KL ------------------------------------------------------------------


def mean_gain_over(d, gold, top: float, points: int = 20) -> torch.Tensor:
    """Each prompt's mean gain over ``points`` d values evenly spaced in (0, top]."""
    d_t, g = _curve(d, gold)
    grid = [top * (k + 1) / points for k in range(points)]
    return torch.stack([interp_rows(d_t, g, x) for x in grid], 1).mean(1) - g[:, 0]


def _gap(a: tuple, b: tuple) -> tuple[float, float, float]:
    top = min(float(torch.as_tensor(a[0]).max()), float(torch.as_tensor(b[0]).max()))
    ga, gb = mean_gain_over(*a, top), mean_gain_over(*b, top)
    se = math.sqrt(float(ga.var(unbiased=True)) / ga.numel() + float(gb.var(unbiased=True)) / gb.numel())
    return float(ga.mean() - gb.mean()), se, top


def efficiency_rows(world: str, bon: tuple, ppo: tuple, cc: GoodhartClaimsConfig, seed: int = 0) -> list[dict]:
    """``bon``, ``ppo``: (d, gold) curves against the same RM (their own prompts): best-of-n's mean
    gain over their common d range exceeds PPO's by more than noise_z SE. Null: the rule on
    best-of-n's prompts split in two halves (the same method against itself)."""
    gap, se, top = _gap(bon, ppo)
    d_b, g_b = _curve(*bon)
    perm = torch.randperm(g_b.shape[0], generator=torch.Generator().manual_seed(seed))
    h = g_b.shape[0] // 2
    ngap, nse, _ = _gap((d_b, g_b[perm[:h]]), (d_b, g_b[perm[h:]]))
    row = claim_row("efficiency", f"({world}) best-of-n gains more gold than PPO at equal d",
                    f"mean gain over d in (0, {top:.2f}]: best-of-n minus PPO {gap:+.3f} (SE {se:.3f})",
                    f"> {cc.noise_z:g} SE", gap > cc.noise_z * se,
                    f"{'yes' if ngap > cc.noise_z * nse else 'no'} (computed: best-of-n's prompts in two halves, "
                    f"{ngap:+.3f}, SE {nse:.3f})")
    return _rows([row], "efficiency")


# --- the whole table from a family record ----------------------------------------------------------


def level_summary(d, gold, method: str) -> dict:
    """A curve's peak gain (the mean curve's maximum over its start), its d, and the law's beta."""
    d_t, g = _curve(d, gold)
    mean = g.mean(0)
    gain = mean - mean[0]
    j = int(torch.argmax(gain))
    return {"peak_gain": float(gain[j]), "peak_d": float(d_t[j]), "beta": fit_form(d_t, gain, LAW[method]).params[1]}


def compute_goodhart_claims(record: Mapping[str, Mapping], cc: GoodhartClaimsConfig) -> tuple[list[dict], list[str]]:
    """Every claim of every world from the family's ``record`` {world: {"bon": bon_measures(...)
    (fourfold.apps.experiments.goodhart_eval), "ppo": {level: {"d", "gold_by_prompt"}} (kl_coef 0
    against each level's RM), "accuracy": {level: pair accuracy on the policies' own samples},
    "kl": {kl_coef: {"d", "gold_by_prompt"}} (the final points of kl_coef > 0 at sweep_pairs),
    "sweep_pairs": level}} (levels as strings, as JSON keeps them). Returns (rows, notes): a world
    without a piece leaves out the claims that need it, with a note."""
    rows: list[dict] = []
    notes: list[str] = []
    for world in sorted(record):
        w = record[world]
        curves = {"bon": {int(p): (v["d"], v["gold_by_prompt"]) for p, v in (w.get("bon") or {}).get("levels", {}).items()},
                  "ppo": {int(p): (v["d"], v["gold_by_prompt"]) for p, v in (w.get("ppo") or {}).items()}}
        acc = {int(p): float(a) for p, a in (w.get("accuracy") or {}).items()}
        for method in METHODS:
            levels = curves[method]
            if not levels:
                notes.append(f"{world}: no {METHODS[method]} curves")
                continue
            rows += peak_rows(world, method, levels, cc) + form_rows(world, method, levels, cc)
            if acc and set(acc) >= set(levels):
                summ = {p: {"accuracy": acc[p], **level_summary(*levels[p], method)} for p in levels}
                rows += quality_rows(world, method, summ, cc)
            else:
                notes.append(f"{world}: {METHODS[method]}'s quality claims need every level's accuracy")
        if acc:
            rows += quality_axis_rows(world, acc, cc)
        sweep = w.get("sweep_pairs")
        unpen = curves["ppo"].get(int(sweep)) if sweep is not None else None
        if unpen is not None and w.get("kl"):
            finals = {float(c): (float(v["d"]), v["gold_by_prompt"]) for c, v in w["kl"].items()}
            rows += kl_rows(world, unpen, finals, cc)
        else:
            notes.append(f"{world}: the KL claims need the unpenalised curve at sweep_pairs and the kl_coef > 0 runs")
        bon_at = curves["bon"].get(int(sweep)) if sweep is not None else None
        if bon_at is not None and unpen is not None:
            rows += efficiency_rows(world, bon_at, unpen, cc)
        else:
            notes.append(f"{world}: the efficiency claim needs best-of-n and PPO against the sweep_pairs RM")
    return rows, notes
