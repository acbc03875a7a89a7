"""The overoptimization family's curves, fits and claims (:func:`summarize_curves`,
:func:`compute_overopt_claims`; unit-tested on hand-made curves).

A *curve* is one seed's points of one method at one reward-model size: ``d`` (sqrt of the KL to the
SFT model, nats), ``gold`` and ``proxy`` (the size's RM) at each point, the first point the SFT
model itself (d = 0): best-of-n at n = 1..N (``n``; KL = log n - (n - 1)/n, gold and proxy by the
unbiased estimator) or PPO at its evaluated iterations (``iteration``; KL measured on held-out
prompts). R is the gold gain over the first point, fitted per seed by R_bon(d) = d (alpha - beta d)
(best-of-n) and R_rl(d) = d (alpha - beta log d) (PPO) (:mod:`fourfold.core.overoptimization`).
Peaks are read off the mean curve over seeds, in units of the SFT model's per-sample gold sd.

The claims and their thresholds (``overoptimization.claims``), fixed before the family's first run:

- ``peak``: for each method, at every size, gold rises (its peak is after the first point), peaks
  before the curve's last point and falls by at least ``fall_min_sd`` from the peak to the last
  point, while the proxy at the last point is above the proxy at the gold peak (gold peaks and
  falls while proxy rises).
- ``fit``: each form fits its method: mean R^2 over seeds >= ``r2_min`` at every size.
- ``size-peak``: the larger reward models have the higher gold peak (strictly increasing in pairs).
- ``size-beta``: the larger reward models have the smaller fitted beta (strictly decreasing).
- ``default-kl``: the demo's default KL coefficient stops PPO at or before the gold peak of the
  unpenalised run: its final d at most the d of that curve's gold peak, at every size.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from fourfold.apps.claim_kinds import annotate
from fourfold.apps.claim_kit import ClaimTable
from fourfold.apps.report_kit import fmt, mean, signed, std
from fourfold.core.overoptimization import fit_bon, fit_rl

METHODS = ("bon", "ppo")
METHOD_NAMES = {"bon": "best-of-n", "ppo": "PPO"}
OVEROPT_GROUPS = ("peak", "fit", "size-peak", "size-beta", "default-kl")


def mean_curve(curves: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, list[float]]:
    """The pointwise mean over seeds of d, gold and proxy (curves cut to the shortest)."""
    m = min(len(c["d"]) for c in curves)
    return {k: [mean([c[k][i] for c in curves]) for i in range(m)] for k in ("d", "gold", "proxy")}


def summarize_curves(curves: Sequence[Mapping[str, Sequence[float]]], method: str, sd: float) -> dict:
    """One method at one size over seeds: the fit per seed (alpha, beta, R^2: mean and sd over seeds),
    and from the mean curve the gold peak (gain in sd, its d and index), the last point's gain, and
    the proxy at the peak and at the last point."""
    fit = fit_bon if method == "bon" else fit_rl
    fits = [fit(c["d"], [g - c["gold"][0] for g in c["gold"]]) for c in curves]
    mc = mean_curve(curves)
    gain = [(g - mc["gold"][0]) / sd for g in mc["gold"]]
    peak = max(range(len(gain)), key=lambda i: gain[i])
    out = {"peak_gain_sd": gain[peak], "peak_d": mc["d"][peak], "peak_index": peak, "points": len(gain),
           "last_gain_sd": gain[-1], "last_d": mc["d"][-1], "proxy_at_peak": mc["proxy"][peak],
           "proxy_last": mc["proxy"][-1], "proxy_first": mc["proxy"][0], "seeds": len(curves)}
    for k in ("alpha", "beta", "r2"):
        vals = [getattr(f, k) for f in fits]
        out[k], out[k + "_sd"] = mean(vals), std(vals)
    return out


def _sizes(summaries: Mapping[str, Mapping[int, Mapping]], method: str) -> list[int]:
    return sorted(summaries.get(method, {}))


def compute_overopt_claims(summaries: Mapping[str, Mapping[int, Mapping]], default: Mapping[int, Sequence[Mapping]],
                           cc, *, expected_sizes: Sequence[int]) -> tuple[list[dict], list[str]]:
    """The claims table: ``summaries`` {method: {size: :func:`summarize_curves`}}, ``default``
    {size: [per-seed final evaluation of PPO at the demo's KL: d, gold, ...]}, ``cc`` the thresholds
    (:class:`~fourfold.apps.experiments.config.OveroptimizationClaimsConfig`), ``expected_sizes``
    the sizes configured (a size without results fails every claim that needs it, with a note).
    Returns (rows {group, claim, measured, threshold, holds}, notes)."""
    t = ClaimTable()
    rows, notes, add = t.rows, t.notes, t.add
    sizes = sorted(expected_sizes)

    for method in METHODS:
        have = _sizes(summaries, method)
        missing = [p for p in sizes if p not in have]
        if missing:
            notes.append(f"{METHOD_NAMES[method]}: no results at {', '.join(f'{p} pairs' for p in missing)}")
        if not have:
            continue
        s = summaries[method]
        name = METHOD_NAMES[method]
        falls = {p: s[p]["peak_gain_sd"] - s[p]["last_gain_sd"] for p in have}
        ok = [0 < s[p]["peak_index"] < s[p]["points"] - 1 and falls[p] >= cc.fall_min_sd
              and s[p]["proxy_last"] > s[p]["proxy_at_peak"] for p in have]
        add("peak", f"{name}: gold rises, peaks and falls while the proxy rises",
            "; ".join(f"{p} pairs: peak {signed(s[p]['peak_gain_sd'])} sd at d={fmt(s[p]['peak_d'], 2)}, last "
                      f"{signed(s[p]['last_gain_sd'])} sd at d={fmt(s[p]['last_d'], 2)}, proxy "
                      f"{fmt(s[p]['proxy_at_peak'], 3)} -> {fmt(s[p]['proxy_last'], 3)}" for p in have),
            f"at every size: the peak after the first point and before the last, fall >= {cc.fall_min_sd:g} sd, "
            "proxy higher at the last point than at the gold peak", not missing and all(ok))
        form = "d (alpha - beta d)" if method == "bon" else "d (alpha - beta log d)"
        add("fit", f"{name}: R = {form} fits (R = gold gain over the SFT model)",
            "; ".join(f"{p} pairs: R^2 {fmt(s[p]['r2'], 3)} (sd {fmt(s[p]['r2_sd'], 3)}), alpha "
                      f"{fmt(s[p]['alpha'], 3)}, beta {fmt(s[p]['beta'], 3)}" for p in have),
            f"mean R^2 over seeds >= {cc.r2_min:g} at every size",
            not missing and all(s[p]["r2"] >= cc.r2_min for p in have))
        if len(sizes) >= 2:
            peaks = [s[p]["peak_gain_sd"] for p in have]
            add("size-peak", f"{name}: the larger reward models have the higher gold peak",
                ", ".join(f"{p}: {signed(s[p]['peak_gain_sd'])}" for p in have) + " sd",
                "strictly increasing with the pairs", not missing and all(b > a for a, b in zip(peaks, peaks[1:])))
            betas = [s[p]["beta"] for p in have]
            add("size-beta", f"{name}: the larger reward models have the smaller beta",
                ", ".join(f"{p}: {fmt(s[p]['beta'], 3)}" for p in have), "strictly decreasing with the pairs",
                not missing and all(b < a for a, b in zip(betas, betas[1:])))
    if default:
        ppo = summaries.get("ppo", {})
        both = [p for p in sizes if p in ppo and default.get(p)]
        if len(both) < len(sizes):
            notes.append("default-kl: not every size has both the default-KL runs and the unpenalised curve")
        if both:
            d_def = {p: mean([math.sqrt(max(r["kl"], 0.0)) for r in default[p]]) for p in both}
            add("default-kl", "the demo's default KL coefficient stops PPO at or before the unpenalised run's gold peak",
                "; ".join(f"{p} pairs: d={fmt(d_def[p], 2)} (gold peak at d={fmt(ppo[p]['peak_d'], 2)})"
                          for p in both),
                "final d <= the d of the gold peak, at every size",
                len(both) == len(sizes) and all(d_def[p] <= ppo[p]["peak_d"] for p in both))
    return annotate("overopt", rows), notes
