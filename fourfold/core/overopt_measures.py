"""What an overoptimization curve is measured with (issue 41), as pure functions.

* :func:`bon_weights` - ``W [len(ns), N]``: the probability that the ``i``-th best of ``N``
  samples (by proxy) is the proxy-best of a uniform ``n``-subset, ``C(N - i, n - 1) / C(N, n)``,
  for each ``n`` of a grid (float64, by the ratio recurrence ``w_1 = n / N``,
  ``w_{i+1} = w_i (N - i - n + 1) / (N - i)``: no big binomials, so N = 1024 is cheap).
* :func:`expected_best_of_n_grid` - the unbiased estimator of the expected gold (or any score) of
  the proxy-best of ``n`` samples, averaged exactly over all ``C(N, n)`` subsets of the ``N`` drawn,
  for every ``n`` of a grid; ties in proxy go to the earlier sample (``ties="first"``, as
  ``fourfold bon`` picks) or to a uniform choice among the tied (``ties="average"``).
* :func:`bon_kl_empirical` - a plug-in estimate of KL(best-of-n || policy) from the ``N`` samples
  of a prompt: best-of-n of ``n`` i.i.d. draws from the empirical distribution, where a candidate
  seen more than once (or tied in proxy with another) is an atom and a candidate seen once is a
  piece of continuous mass (``singletons="continuous"``; ``"atoms"``: every candidate an atom, the
  exact discrete KL of Beirami et al. 2024). With all candidates distinct the continuous version
  is exactly ``log n - (n - 1) / n``; repeats only lower it (a coarser partition).
* :func:`distinct_ids` - per prompt, each sample's candidate id (by first appearance); the number
  of distinct candidates is ``ids.max(1) + 1``.
* :func:`pair_accuracy` - pairwise gold accuracy of a reward on given samples: over the pairs of
  samples of the same prompt whose gold differs, the share the reward orders as gold does (a tie
  in reward counts one half).
* :func:`checkpoint_schedule` - the iterations to evaluate: every one early, sparser later.

See docs/experiments.md ("The overoptimization family").
"""

from __future__ import annotations

import math
from typing import Hashable, Sequence

import torch

__all__ = ["bon_weights", "expected_best_of_n_grid", "bon_kl_empirical", "distinct_ids", "pair_accuracy",
           "checkpoint_schedule"]


def _grid(ns: Sequence[int], N: int, who: str) -> list[int]:
    ns = list(ns)
    if not ns or any(not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= N for n in ns):
        raise ValueError(f"{who}: ns must be integers in 1..N = {N}, got {ns!r}")
    return ns


def bon_weights(N: int, ns: Sequence[int]) -> torch.Tensor:
    """``W [len(ns), N]`` (float64): ``W[k, i - 1]`` = P(the ``i``-th best of ``N`` is the best of a
    uniform ``ns[k]``-subset) = ``C(N - i, n - 1) / C(N, n)``; every row sums to 1."""
    if not isinstance(N, int) or isinstance(N, bool) or N < 1:
        raise ValueError(f"bon_weights: N must be an integer >= 1, got {N!r}")
    ns = _grid(ns, N, "bon_weights")
    i = torch.arange(1, N, dtype=torch.float64)  # the ranks 1..N-1 whose successor's weight we need
    rows = []
    for n in ns:
        factors = ((N - i - n + 1) / (N - i)).clamp_min(0.0)  # w_{i+1} / w_i; 0 once rank i+1 > N - n + 1
        rows.append(torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(factors, 0)]) * (n / N))
    return torch.stack(rows)


def _as_rows(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    x = torch.as_tensor(x)
    return (x[None], True) if x.dim() == 1 else (x, False)


def expected_best_of_n_grid(proxy: torch.Tensor, gold: torch.Tensor, ns: Sequence[int],
                            ties: str = "first") -> torch.Tensor:
    """``E[gold of the proxy-best of n]`` for each ``n`` of ``ns``, per prompt: ``[P, len(ns)]``
    (float64) from ``proxy`` and ``gold`` ``[P, N]`` (a ``[N]`` input gives ``[len(ns)]``).
    ``ties``: ``"first"`` (the earlier sample wins a tie in proxy) or ``"average"`` (a uniform
    choice among the tied: the tied samples' gold is replaced by its mean)."""
    if ties not in ("first", "average"):
        raise ValueError(f"expected_best_of_n_grid: ties must be 'first' or 'average', got {ties!r}")
    (proxy, one), (gold, _) = _as_rows(proxy), _as_rows(gold)
    if proxy.shape != gold.shape or proxy.dim() != 2 or proxy.shape[1] < 1:
        raise ValueError(f"expected_best_of_n_grid: proxy and gold must both be [P, N], got "
                         f"{tuple(proxy.shape)} and {tuple(gold.shape)}")
    P, N = proxy.shape
    sorted_proxy, order = torch.sort(proxy.double(), dim=1, descending=True, stable=True)
    ranked = torch.gather(gold.double(), 1, order)  # (P, N), best proxy first
    if ties == "average":
        new = torch.ones(P, N, dtype=torch.bool)
        new[:, 1:] = sorted_proxy[:, 1:] != sorted_proxy[:, :-1]  # a new tie group starts here
        gid = (torch.cumsum(new.long(), 1) - 1) + N * torch.arange(P)[:, None]  # (P, N): unique per row
        sums = torch.zeros(P * N, dtype=torch.float64).scatter_add_(0, gid.flatten(), ranked.flatten())
        counts = torch.zeros(P * N, dtype=torch.float64).scatter_add_(0, gid.flatten(), torch.ones(P * N, dtype=torch.float64))
        ranked = (sums / counts.clamp_min(1))[gid]
    out = ranked @ bon_weights(N, ns).T  # (P, len(ns))
    return out[0] if one else out


def _xlogx_pow(u: torch.Tensor, n: int) -> torch.Tensor:
    """u^n log u with 0 log 0 = 0."""
    return torch.where(u > 0, u.pow(n) * torch.log(u.clamp_min(1e-300)), torch.zeros_like(u))


def _kl_one(proxy: torch.Tensor, ids: torch.Tensor | None, ns: list[int], continuous: bool) -> list[float]:
    N = proxy.numel()
    if ids is not None:  # one score per candidate: the mean over its copies (equal unless scoring is noisy)
        uniq, inv = torch.unique(ids, return_inverse=True)
        count = torch.zeros(uniq.numel(), dtype=torch.float64).scatter_add_(0, inv, torch.ones(N, dtype=torch.float64))
        score = torch.zeros(uniq.numel(), dtype=torch.float64).scatter_add_(0, inv, proxy) / count
    else:
        score, count = proxy, torch.ones(N, dtype=torch.float64)
    # candidates tied in proxy are one atom of best-of-n (a uniform choice among them)
    values, inv = torch.unique(score, return_inverse=True)  # ascending
    mass = torch.zeros(values.numel(), dtype=torch.float64).scatter_add_(0, inv, count)  # samples per piece
    atom = mass > 1 if continuous else torch.ones_like(mass, dtype=torch.bool)  # seen once: continuous mass
    hi = torch.cumsum(mass, 0) / N
    lo = torch.cat([torch.zeros(1, dtype=torch.float64), hi[:-1]])
    hi[-1] = 1.0
    m = mass / N
    out = []
    for n in ns:
        q = hi.pow(n) - lo.pow(n)  # P(best of n falls in each piece)
        atoms = torch.where(atom & (q > 0), q * torch.log(q.clamp_min(1e-300) / m), torch.zeros_like(q))
        # a continuous piece [lo, hi]: the integral of n u^(n-1) log(n u^(n-1)) du
        cont = math.log(n) * q + (n - 1) * (_xlogx_pow(hi, n) - _xlogx_pow(lo, n)) - (n - 1) / n * q
        out.append(float(torch.where(atom, atoms, cont).sum()))
    return out


def bon_kl_empirical(proxy: torch.Tensor, ns: Sequence[int], ids: torch.Tensor | None = None,
                     singletons: str = "continuous") -> torch.Tensor:
    """Plug-in KL(best-of-n || policy) in nats, ``[P, len(ns)]`` (float64) from ``proxy [P, N]``
    (``[N]`` gives ``[len(ns)]``) and optionally ``ids [P, N]`` (which samples are the same
    candidate, :func:`distinct_ids`; without them candidates are told apart by their proxy alone).
    ``singletons``: ``"continuous"`` (a candidate seen once and tied with none is continuous mass:
    all distinct gives exactly ``log n - (n - 1) / n``) or ``"atoms"`` (the discrete KL, lower)."""
    if singletons not in ("continuous", "atoms"):
        raise ValueError(f"bon_kl_empirical: singletons must be 'continuous' or 'atoms', got {singletons!r}")
    proxy, one = _as_rows(proxy)
    if proxy.dim() != 2 or proxy.shape[1] < 1:
        raise ValueError(f"bon_kl_empirical: proxy must be [P, N], got {tuple(proxy.shape)}")
    if ids is not None:
        ids = _as_rows(ids)[0]
        if ids.shape != proxy.shape:
            raise ValueError(f"bon_kl_empirical: ids {tuple(ids.shape)} must match proxy {tuple(proxy.shape)}")
    ns = _grid(ns, proxy.shape[1], "bon_kl_empirical")
    rows = [_kl_one(proxy[p].double(), None if ids is None else ids[p], ns, singletons == "continuous")
            for p in range(proxy.shape[0])]
    out = torch.tensor(rows, dtype=torch.float64)
    return out[0] if one else out


def distinct_ids(rows: Sequence[Sequence[Hashable]]) -> torch.Tensor:
    """``[P, N]`` (int64): each sample's candidate id within its prompt, numbered by first appearance
    (``rows``: P prompts' N samples each, e.g. response texts)."""
    out = []
    for row in rows:
        seen: dict = {}
        out.append([seen.setdefault(x, len(seen)) for x in row])
    if len({len(r) for r in out}) > 1:
        raise ValueError("distinct_ids: every prompt needs the same number of samples")
    return torch.tensor(out, dtype=torch.int64)


def pair_accuracy(reward: torch.Tensor, gold: torch.Tensor) -> tuple[float, int]:
    """(accuracy, pairs): over every pair of samples of the same prompt (rows of ``reward`` and
    ``gold`` ``[P, N]``; ``[N]`` is one prompt) whose gold differs, the share the reward orders as
    gold does, a tie in reward counting 1/2; nan with no such pair."""
    (reward, _), (gold, _) = _as_rows(reward), _as_rows(gold)
    if reward.shape != gold.shape or reward.dim() != 2:
        raise ValueError(f"pair_accuracy: reward and gold must both be [P, N], got {tuple(reward.shape)} "
                         f"and {tuple(gold.shape)}")
    N = reward.shape[1]
    upper = torch.triu(torch.ones(N, N, dtype=torch.bool), diagonal=1)
    score, pairs = 0.0, 0
    for r, g in zip(reward.double(), gold.double()):
        dg = torch.sign(g[:, None] - g[None, :])[upper]  # (pairs,)
        dr = torch.sign(r[:, None] - r[None, :])[upper]
        keep = dg != 0
        agree = (dr[keep] * dg[keep] + 1) / 2  # 1 same order, 1/2 a reward tie, 0 reversed
        score += float(agree.sum())
        pairs += int(keep.sum())
    return (score / pairs if pairs else math.nan), pairs


def checkpoint_schedule(iterations: int, dense: int, every: int) -> list[int]:
    """The iterations to evaluate: ``1..dense`` each, then every ``every``-th, and always the last
    (``iterations``); iteration 0 (the initial policy) is the caller's."""
    for name, v, least in (("iterations", iterations, 1), ("dense", dense, 0), ("every", every, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise ValueError(f"checkpoint_schedule: {name} must be an integer >= {least}, got {v!r}")
    its = set(range(1, min(dense, iterations) + 1)) | set(range(dense + every, iterations + 1, every)) | {iterations}
    return sorted(its)
