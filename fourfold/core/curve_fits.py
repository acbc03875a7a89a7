"""Fits that can lose: the overoptimization law's forms against curves without a peak, judged out
of sample, and a peak test that does not pick its own winner.

Gao, Schulman and Hilton (2023) fit gold gain ``R`` against ``d = sqrt(KL)`` with
``d (alpha - beta d)`` (best-of-n) and ``d (alpha - beta log d)`` (RL). Both fit a saturating curve
with no peak almost as well as a peaked one (R^2 0.98-0.999 and a spurious fitted peak), so an
in-sample fit cannot tell them apart. Here each form competes with peak-free alternatives:

===============  =================================  ==========================
form             R(d)                               parameters
===============  =================================  ==========================
``bon``          ``d (a - b d)``                    a, b (linear)
``rl``           ``d (a - b log d)``                a, b (linear)
``linear``       ``a d``                            a
``saturating``   ``a (1 - exp(-d / tau))``          a, tau (tau on a grid)
``hyperbolic``   ``a d / (1 + d / tau)``            a, tau (tau on a grid)
===============  =================================  ==========================

* :func:`fit_form` - least squares of one form (for ``tau`` forms: ``a`` in closed form at each
  ``tau`` of a log grid, the best kept), with its Gaussian AIC ``n log(SSE / n) + 2 (k + 1)``.
* :func:`compare_forms` - every form fit on the small-``d`` points and scored on the large-``d``
  ones (held-out extrapolation RMSE), beside its AIC on all points.
* :func:`peak_test` - "rise, peak and fall" with the selection bias removed: the peak's position is
  chosen on one half of the prompts and its rise over the start and fall to the last point are
  measured on the other half (paired standard errors), both ways round; a flat or saturating curve
  then says "no" as often as the threshold allows, where picking the best of many points on the
  same data says "yes".
* :func:`beta_bootstrap` - a bootstrap over prompts of a law's ``beta``: the share of resamples with
  ``beta > 0`` and a percentile interval.

Pure: float64 torch tensors in, floats out; seeded generators only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

__all__ = ["FORMS", "FormFit", "fit_form", "compare_forms", "PeakTest", "peak_test", "beta_bootstrap"]

FORMS = ("bon", "rl", "linear", "saturating", "hyperbolic")
"""The forms :func:`fit_form` knows: the law's two and three without a peak."""

_PARAMS = {"bon": 2, "rl": 2, "linear": 1, "saturating": 2, "hyperbolic": 2}


def _dlogd(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d > 0, d * torch.log(d.clamp_min(1e-300)), torch.zeros_like(d))


def _shape(form: str, tau: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """The curve of a one-amplitude form at ``tau``: R = a * shape(d)."""
    if form == "saturating":
        return lambda d: -torch.expm1(-d / tau)
    return lambda d: d / (1 + d / tau)


@dataclass(frozen=True)
class FormFit:
    """One form fitted to points ``(d, R)``."""

    form: str
    params: tuple[float, ...]
    """bon/rl: (alpha, beta); linear: (a,); saturating/hyperbolic: (a, tau)."""
    sse: float
    """Sum of squared residuals over the fitted points."""
    n: int
    """How many points were fitted."""

    @property
    def aic(self) -> float:
        """Gaussian AIC, ``n log(SSE / n) + 2 (k + 1)`` (k parameters plus the noise's variance);
        -inf for an exact fit."""
        k = _PARAMS[self.form] + 1
        return -math.inf if self.sse <= 0 else self.n * math.log(self.sse / self.n) + 2 * k

    def predict(self, d: Sequence[float] | torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(d, dtype=torch.float64)
        if self.form == "bon":
            return x * (self.params[0] - self.params[1] * x)
        if self.form == "rl":
            return self.params[0] * x - self.params[1] * _dlogd(x)
        if self.form == "linear":
            return self.params[0] * x
        return self.params[0] * _shape(self.form, self.params[1])(x)


def _points(d, r) -> tuple[torch.Tensor, torch.Tensor]:
    d_t = torch.as_tensor(d, dtype=torch.float64).flatten()
    r_t = torch.as_tensor(r, dtype=torch.float64).flatten()
    if d_t.shape != r_t.shape or d_t.numel() < 2:
        raise ValueError(f"need d and R of the same length >= 2, got {d_t.numel()} and {r_t.numel()}")
    if bool((d_t < 0).any()) or not bool(torch.isfinite(d_t).all() and torch.isfinite(r_t).all()):
        raise ValueError("d = sqrt(KL) must be finite and >= 0, and R finite")
    return d_t, r_t


def fit_form(d: Sequence[float], r: Sequence[float], form: str, taus: int = 400) -> FormFit:
    """Least squares of ``form`` (one of :data:`FORMS`) over the points ``(d, R)``; for the ``tau``
    forms, ``taus`` log-spaced values of tau from 1e-3 to 1e3 times the largest d."""
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; expected one of {', '.join(FORMS)}")
    d_t, r_t = _points(d, r)
    if form in ("bon", "rl"):
        X = torch.stack([d_t, -(d_t * d_t if form == "bon" else _dlogd(d_t))], 1)
        coef = torch.linalg.lstsq(X, r_t[:, None], driver="gelsd").solution[:, 0]
        sse = float(((r_t - X @ coef) ** 2).sum())
        return FormFit(form, (float(coef[0]), float(coef[1])), sse, d_t.numel())
    if form == "linear":
        dd = float((d_t * d_t).sum())
        a = float((d_t * r_t).sum()) / dd if dd > 0 else 0.0
        return FormFit(form, (a,), float(((r_t - a * d_t) ** 2).sum()), d_t.numel())
    top = max(float(d_t.max()), 1e-12)
    best = None
    for tau in torch.logspace(math.log10(top * 1e-3), math.log10(top * 1e3), taus, dtype=torch.float64).tolist():
        f = _shape(form, tau)(d_t)
        ff = float((f * f).sum())
        a = float((f * r_t).sum()) / ff if ff > 0 else 0.0
        sse = float(((r_t - a * f) ** 2).sum())
        if best is None or sse < best.sse:
            best = FormFit(form, (a, tau), sse, d_t.numel())
    return best


def compare_forms(d: Sequence[float], r: Sequence[float], forms: Sequence[str] = FORMS,
                  train_share: float = 0.6) -> dict[str, dict[str, float]]:
    """Each form fit on the points of the smallest ``train_share`` of d and scored on the rest:
    ``{form: {"heldout_rmse", "aic" (all points), "train_points", "test_points"}}``. The form with the
    lowest held-out RMSE extrapolates best; a law that loses to a peak-free form out of sample has
    not shown its peak."""
    d_t, r_t = _points(d, r)
    order = torch.argsort(d_t, stable=True)
    d_t, r_t = d_t[order], r_t[order]
    cut = int(round(train_share * d_t.numel()))
    if not 2 <= cut <= d_t.numel() - 1:
        raise ValueError(f"train_share={train_share} leaves {cut} of {d_t.numel()} points to fit: need >= 2 and a test point")
    out = {}
    for form in forms:
        part = fit_form(d_t[:cut], r_t[:cut], form)
        err = part.predict(d_t[cut:]) - r_t[cut:]
        out[form] = {"heldout_rmse": float(err.pow(2).mean().sqrt()), "aic": fit_form(d_t, r_t, form).aic,
                     "train_points": cut, "test_points": d_t.numel() - cut}
    return out


@dataclass(frozen=True)
class PeakTest:
    """:func:`peak_test`'s answer, for each way round of the two prompt halves."""

    peak_index: tuple[int, int]
    """The point chosen as the peak on the selecting half (A then B)."""
    rise: tuple[float, float]
    """Mean gold at that point minus at the first, on the other half."""
    fall: tuple[float, float]
    """Mean gold at that point minus at the last, on the other half."""
    rise_se: tuple[float, float]
    fall_se: tuple[float, float]
    z: float

    @property
    def peaks(self) -> bool:
        """Both ways round: the peak is inside the range and its rise and fall on held-out prompts
        each exceed ``z`` standard errors."""
        return all(0 < j for j in self.peak_index) and all(
            r > self.z * rs and f > self.z * fs
            for r, f, rs, fs in zip(self.rise, self.fall, self.rise_se, self.fall_se))


def _paired(gold: torch.Tensor, j: int, k: int) -> tuple[float, float]:
    diff = gold[:, j] - gold[:, k]
    n = diff.numel()
    se = float(diff.std(unbiased=True)) / math.sqrt(n) if n > 1 else math.inf
    return float(diff.mean()), se


def peak_test(gold: torch.Tensor, seed: int = 0, z: float = 2.0) -> PeakTest:
    """``gold [P, M]``: each prompt's gold at M points ordered by d (column 0 the start). The prompts
    are split in two seeded halves; each half picks the point of highest mean gold, and the other
    half measures that point's rise over column 0 and fall to column M - 1."""
    g = torch.as_tensor(gold, dtype=torch.float64)
    if g.dim() != 2 or g.shape[0] < 4 or g.shape[1] < 3:
        raise ValueError(f"peak_test: gold must be [P >= 4 prompts, M >= 3 points], got {tuple(g.shape)}")
    perm = torch.randperm(g.shape[0], generator=torch.Generator().manual_seed(seed))
    half = g.shape[0] // 2
    a, b = g[perm[:half]], g[perm[half:]]
    picks, rises, falls, rse, fse = [], [], [], [], []
    for sel, meas in ((a, b), (b, a)):
        j = int(torch.argmax(sel.mean(0)))
        rise, rs = _paired(meas, j, 0)
        fall, fs = _paired(meas, j, g.shape[1] - 1)
        picks.append(j)
        rises.append(rise)
        falls.append(fall)
        rse.append(rs)
        fse.append(fs)
    return PeakTest(tuple(picks), tuple(rises), tuple(falls), tuple(rse), tuple(fse), z)


def beta_bootstrap(d: Sequence[float], gold: torch.Tensor, form: str, reps: int = 200,
                   seed: int = 0) -> dict[str, float]:
    """A bootstrap over prompts (rows of ``gold [P, M]``, M points at ``d``) of the law ``form``
    ('bon' or 'rl') fitted to the mean gain ``mean gold - mean gold at column 0``: ``{"beta",
    "share_positive", "low", "high"}`` (the full-sample beta, the share of resamples with beta > 0,
    the 2.5% and 97.5% percentiles)."""
    if form not in ("bon", "rl"):
        raise ValueError(f"beta_bootstrap: form must be 'bon' or 'rl', got {form!r}")
    g = torch.as_tensor(gold, dtype=torch.float64)
    d_t = torch.as_tensor(d, dtype=torch.float64)
    if g.dim() != 2 or g.shape[1] != d_t.numel() or g.shape[0] < 2:
        raise ValueError(f"beta_bootstrap: gold must be [P >= 2, {d_t.numel()}], got {tuple(g.shape)}")

    def beta_of(rows: torch.Tensor) -> float:
        m = rows.mean(0)
        return fit_form(d_t, m - m[0], form).params[1]

    gen = torch.Generator().manual_seed(seed)
    betas = torch.tensor([beta_of(g[torch.randint(g.shape[0], (g.shape[0],), generator=gen)])
                          for _ in range(reps)], dtype=torch.float64)
    return {"beta": beta_of(g), "share_positive": float((betas > 0).double().mean()),
            "low": float(torch.quantile(betas, 0.025)), "high": float(torch.quantile(betas, 0.975))}
