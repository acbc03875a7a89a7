"""The re-posed overoptimization family's best-of-n record from scored samples (issue 41;
docs/experiments.md, "Overoptimization that can turn over"): :func:`bon_measures` turns one set of
SFT samples (texts, gold, each reward model's scores) into every level's curve on the n grid, the
empirical KL beside the analytic bound, the distinct candidates, the RMs' pair accuracy on those
samples, and best-of-n by gold (the ceiling). :func:`curve_point` does the same for one PPO
checkpoint's samples (gold per prompt, d, every RM's pair accuracy on the policy's own samples);
:func:`mean_curve`, :func:`ppo_curve` and :func:`pooled_accuracy` turn the points of runs and
seeds into the curves and accuracies :func:`~fourfold.apps.experiments.goodhart_claims.compute_goodhart_claims`
reads. No models: the subprocesses that sample and score (fourfold.apps.experiments.goodhart_sample)
call them; unit-tested in tests/test_goodhart_eval.py.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch

from fourfold.core.overopt_measures import (
    bon_kl_empirical,
    distinct_ids,
    expected_best_of_n_grid,
    pair_accuracy,
)
from fourfold.core.overoptimization import bon_kl


def _curve(proxy: torch.Tensor, gold: torch.Tensor, ids: torch.Tensor, grid: list[int]) -> dict:
    by_prompt = expected_best_of_n_grid(proxy, gold, grid, ties="average")  # (P, len(grid))
    kl = bon_kl_empirical(proxy, grid, ids=ids)  # (P, len(grid))
    kl_mean = kl.mean(0)
    return {"gold": by_prompt.mean(0).tolist(),
            "gold_by_prompt": [[round(x, 6) for x in row] for row in by_prompt.tolist()],
            "proxy": expected_best_of_n_grid(proxy, proxy, grid, ties="average").mean(0).tolist(),
            "kl_empirical": kl_mean.tolist(), "d": kl_mean.clamp_min(0).sqrt().tolist()}


def bon_measures(texts: Sequence[Sequence[str]], gold: torch.Tensor, proxies: Mapping[object, torch.Tensor],
                 grid: Sequence[int]) -> dict:
    """``texts`` P prompts' N responses, ``gold [P, N]``, ``proxies`` {level: scores [P, N]}, ``grid``
    the n (1 first: the SFT model). Returns {n, d_analytic, distinct: {mean, min, max, by_prompt},
    levels: {str(level): {gold, gold_by_prompt, proxy, kl_empirical, d (sqrt of the mean empirical
    KL: the curves' d), accuracy (pair accuracy against gold on these samples), pairs}}, gold_ceiling
    (best-of-n by gold, the same keys but accuracy)}; ties averaged (a uniform choice among equals)."""
    grid = sorted(set(int(n) for n in grid))
    if not grid or grid[0] != 1:
        raise ValueError(f"bon_measures: the grid must start at n = 1 (the SFT model), got {grid}")
    g = torch.as_tensor(gold, dtype=torch.float64)
    ids = distinct_ids(texts)
    if tuple(ids.shape) != tuple(g.shape):
        raise ValueError(f"bon_measures: texts {tuple(ids.shape)} and gold {tuple(g.shape)} differ in shape")
    distinct = (ids.max(1).values + 1).tolist()
    levels = {}
    for level, scores in proxies.items():
        p = torch.as_tensor(scores, dtype=torch.float64)
        if p.shape != g.shape:
            raise ValueError(f"bon_measures: level {level!r}'s scores {tuple(p.shape)} differ from gold {tuple(g.shape)}")
        acc, pairs = pair_accuracy(p, g)
        levels[str(level)] = {**_curve(p, g, ids, grid), "accuracy": acc, "pairs": pairs}
    return {"n": grid, "d_analytic": [math.sqrt(bon_kl(n)) for n in grid],
            "distinct": {"mean": sum(distinct) / len(distinct), "min": min(distinct), "max": max(distinct),
                         "by_prompt": distinct},
            "levels": levels, "gold_ceiling": _curve(g, g, ids, grid)}


def curve_point(gold, kl, proxies: Mapping[object, torch.Tensor], trained_on: object = None) -> dict:
    """One evaluated policy: ``gold [P, A]`` and ``kl [P, A]`` (each sample's KL to the SFT model,
    summed over its tokens) of ``A`` samples of each of ``P`` prompts, ``proxies`` {level: scores
    [P, A]} (every RM of the world). Returns {kl (the mean), d = sqrt(max(kl, 0)), gold,
    gold_by_prompt [P] (the mean of each prompt's A samples), proxy (the mean score of the RM
    ``trained_on``; gold's for None or 'gold'), accuracy {str(level): pair accuracy against gold on
    these samples}, pairs {str(level): pairs whose gold differs}}."""
    g = torch.as_tensor(gold, dtype=torch.float64)
    k = torch.as_tensor(kl, dtype=torch.float64)
    if g.dim() != 2 or k.shape != g.shape:
        raise ValueError(f"curve_point: gold and kl must both be [P, A], got {tuple(g.shape)} and {tuple(k.shape)}")
    acc, pairs = {}, {}
    for level, scores in proxies.items():
        p = torch.as_tensor(scores, dtype=torch.float64)
        if p.shape != g.shape:
            raise ValueError(f"curve_point: level {level!r}'s scores {tuple(p.shape)} differ from gold {tuple(g.shape)}")
        acc[str(level)], pairs[str(level)] = pair_accuracy(p, g)
    key = None if trained_on in (None, "gold") else str(trained_on)
    if key is not None and key not in {str(x) for x in proxies}:
        raise ValueError(f"curve_point: the trained-on RM {trained_on!r} is not among the proxies {list(proxies)}")
    proxy = g if key is None else torch.as_tensor(next(v for lv, v in proxies.items() if str(lv) == key), dtype=torch.float64)
    kl_mean = float(k.mean())
    return {"kl": kl_mean, "d": math.sqrt(max(kl_mean, 0.0)), "gold": float(g.mean()),
            "gold_by_prompt": [round(x, 6) for x in g.mean(1).tolist()], "proxy": float(proxy.mean()),
            "accuracy": acc, "pairs": pairs}


def ppo_curve(points: Sequence[Mapping]) -> dict:
    """One run's curve from its evaluated points (iteration order, the SFT model first): {iteration,
    d, kl, gold, proxy: [M], gold_by_prompt: [P, M] (prompts by points, as the claims read it)}."""
    if not points:
        raise ValueError("ppo_curve: a curve needs at least one point")
    pts = sorted(points, key=lambda p: p["iteration"])
    out = {k: [p[k] for p in pts] for k in ("iteration", "d", "kl", "gold", "proxy")}
    out["gold_by_prompt"] = [list(row) for row in zip(*(p["gold_by_prompt"] for p in pts))]
    return out


def mean_curve(curves: Sequence[Mapping], keys: Sequence[str] = ("d", "kl", "gold", "proxy")) -> dict:
    """The mean over seeds of curves on the same points and prompts: each of ``keys`` (lists of
    numbers, where present) and ``gold_by_prompt`` ([P, M]) elementwise; the other keys from the
    first curve. ValueError when the seeds' shapes differ."""
    if not curves:
        raise ValueError("mean_curve: no curves")
    first = curves[0]
    out = dict(first)
    for k in [*keys, "gold_by_prompt"]:
        if k not in first:
            continue
        xs = [torch.as_tensor(c[k], dtype=torch.float64) for c in curves]
        if any(x.shape != xs[0].shape for x in xs):
            raise ValueError(f"mean_curve: the seeds' {k} differ in shape: {[tuple(x.shape) for x in xs]}")
        m = torch.stack(xs).mean(0)
        out[k] = [[round(v, 6) for v in row] for row in m.tolist()] if k == "gold_by_prompt" else m.tolist()
    out["seeds"] = len(curves)
    return out


def pooled_accuracy(points: Sequence[Mapping]) -> dict[str, dict]:
    """Each RM level's pair accuracy pooled over evaluated points (:func:`curve_point` records):
    {level: {accuracy: the agreeing pairs over all pairs, pairs, points}} (a point's accuracy counts
    with its number of pairs; points without pairs at a level add nothing; nan with none)."""
    agree: dict[str, float] = {}
    total: dict[str, int] = {}
    count: dict[str, int] = {}
    for pt in points:
        for level, acc in pt.get("accuracy", {}).items():
            n = int(pt.get("pairs", {}).get(level, 0))
            agree.setdefault(level, 0.0)
            total.setdefault(level, 0)
            count[level] = count.get(level, 0) + 1
            if n and acc == acc:  # not nan
                agree[level] += acc * n
                total[level] += n
    return {lv: {"accuracy": agree[lv] / total[lv] if total[lv] else math.nan, "pairs": total[lv], "points": count[lv]}
            for lv in agree}
