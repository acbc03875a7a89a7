"""The re-posed overoptimization family's best-of-n record from scored samples (issue 41;
docs/experiments.md, "Overoptimization that can turn over"): :func:`bon_measures` turns one set of
SFT samples (texts, gold, each reward model's scores) into every level's curve on the n grid, the
empirical KL beside the analytic bound, the distinct candidates, the RMs' pair accuracy on those
samples, and best-of-n by gold (the ceiling). No models: the subprocess that samples and scores
calls it; unit-tested in tests/test_goodhart_eval.py.
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
