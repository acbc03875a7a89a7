"""Best-of-n and the overoptimization forms of Gao, Schulman and Hilton (2023), as pure functions.

* :func:`bon_kl` - the analytic KL of best-of-n to the sampling policy, ``log n - (n - 1) / n``
  (nats; exact for a continuous score, an upper bound when ties are possible).
* :func:`bon_choice_probs` - the probability that the ``i``-th best of ``N`` samples (by proxy) is
  the proxy-best of a uniformly random ``n``-subset of them: ``C(N - i, n - 1) / C(N, n)`` (the
  ``n - 1`` others must all come from the ``N - i`` ranked below it).
* :func:`expected_best_of_n` - the paper's unbiased estimator (its appendix): for every ``n <= N``
  the expected gold of the proxy-best of ``n`` samples, averaged exactly over all ``C(N, n)``
  subsets of the ``N`` samples drawn per prompt (not one draw per ``n``). Ties in proxy go to the
  earlier sample, as ``fourfold bon`` picks.
* :func:`fit_bon` / :func:`fit_rl` - least-squares fits of ``R_bon(d) = d (alpha - beta d)`` and
  ``R_rl(d) = d (alpha - beta log d)`` (``d = sqrt(KL)``, ``R`` = gold gain over the initial
  policy), both linear in (alpha, beta) and without intercept; with the fit's R^2.

See docs/experiments.md ("The overoptimization family").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["bon_kl", "bon_choice_probs", "expected_best_of_n", "Fit", "fit_bon", "fit_rl"]


def bon_kl(n: int) -> float:
    """KL(best-of-n || policy) = log n - (n - 1) / n, in nats (0 at n = 1)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"bon_kl: n must be an integer >= 1, got {n!r}")
    return math.log(n) - (n - 1) / n


def bon_choice_probs(N: int) -> torch.Tensor:
    """``W [N, N]`` (float64): ``W[n - 1, i - 1]`` = P(the ``i``-th best of ``N`` is the best of a
    uniform ``n``-subset) = ``C(N - i, n - 1) / C(N, n)``; every row sums to 1."""
    if not isinstance(N, int) or N < 1:
        raise ValueError(f"bon_choice_probs: N must be an integer >= 1, got {N!r}")
    W = torch.zeros(N, N, dtype=torch.float64)
    for n in range(1, N + 1):
        total = math.comb(N, n)
        for i in range(1, N - n + 2):  # rank i needs n - 1 samples below it: i <= N - n + 1
            W[n - 1, i - 1] = math.comb(N - i, n - 1) / total  # big-integer division, correctly rounded
    return W


def expected_best_of_n(proxy: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """``E[gold of the proxy-best of n]`` for n = 1..N, per prompt: ``[P, N]`` (float64) from
    ``proxy`` and ``gold`` ``[P, N]`` (N samples of each of P prompts; a ``[N]`` input gives ``[N]``).
    Column 0 is the mean gold; column N - 1 the gold of the proxy-argmax (first on ties)."""
    one = proxy.dim() == 1
    proxy, gold = (proxy[None], gold[None]) if one else (proxy, gold)
    if proxy.shape != gold.shape or proxy.dim() != 2 or proxy.shape[1] < 1:
        raise ValueError(f"expected_best_of_n: proxy and gold must both be [P, N], got {tuple(proxy.shape)} "
                         f"and {tuple(gold.shape)}")
    # rank by proxy, best first; a stable sort keeps the earlier sample first among equal scores
    order = torch.sort(proxy.double(), dim=1, descending=True, stable=True).indices
    ranked_gold = torch.gather(gold.double(), 1, order)  # (P, N)
    out = ranked_gold @ bon_choice_probs(proxy.shape[1]).T  # (P, N): [p, n-1] = sum_i W[n-1, i] g_(i)
    return out[0] if one else out


@dataclass(frozen=True)
class Fit:
    """A fitted form ``R(d) = d (alpha - beta f(d))``."""

    alpha: float
    beta: float
    r2: float
    """1 - SS_res / SS_tot (SS_tot about the mean of R); nan with fewer than 3 points or constant R."""
    form: str
    """'bon' (f(d) = d) or 'rl' (f(d) = log d)."""

    def predict(self, d: float) -> float:
        if d <= 0:
            return 0.0
        return d * (self.alpha - self.beta * (d if self.form == "bon" else math.log(d)))

    @property
    def peak(self) -> tuple[float, float]:
        """(d*, R(d*)) of the fitted curve's maximum (nan, nan when beta <= 0: no peak)."""
        if self.beta <= 0:
            return math.nan, math.nan
        if self.form == "bon":
            d = self.alpha / (2 * self.beta)  # d/dd (alpha d - beta d^2) = 0
        else:
            d = math.exp(self.alpha / self.beta - 1)  # alpha - beta (log d + 1) = 0
        return d, self.predict(d)


def _fit(d: Sequence[float], r: Sequence[float], form: str) -> Fit:
    d_t = torch.as_tensor(list(d), dtype=torch.float64)
    r_t = torch.as_tensor(list(r), dtype=torch.float64)
    if d_t.shape != r_t.shape or d_t.numel() < 2:
        raise ValueError(f"fit_{form}: need d and R of the same length >= 2, got {d_t.numel()} and {r_t.numel()}")
    if bool((d_t < 0).any()):
        raise ValueError(f"fit_{form}: d = sqrt(KL) must be >= 0")
    if form == "bon":
        second = d_t * d_t
    else:  # d log d -> 0 as d -> 0
        second = torch.where(d_t > 0, d_t * torch.log(d_t.clamp_min(1e-300)), torch.zeros_like(d_t))
    X = torch.stack([d_t, -second], 1)  # (M, 2): R = alpha d - beta d f(d)
    coef = torch.linalg.lstsq(X, r_t[:, None]).solution[:, 0]
    resid = r_t - X @ coef
    ss_tot = float(((r_t - r_t.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / ss_tot if ss_tot > 0 and d_t.numel() >= 3 else math.nan
    return Fit(alpha=float(coef[0]), beta=float(coef[1]), r2=r2, form=form)


def fit_bon(d: Sequence[float], r: Sequence[float]) -> Fit:
    """Least squares of ``R = d (alpha - beta d)`` over the points ``(d, R)``."""
    return _fit(d, r, "bon")


def fit_rl(d: Sequence[float], r: Sequence[float]) -> Fit:
    """Least squares of ``R = d (alpha - beta log d)`` over the points ``(d, R)``."""
    return _fit(d, r, "rl")
