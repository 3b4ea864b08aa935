"""Calibration of posterior intervals on synthetic data from the model's prior (issue 9).

``prior_problem`` draws (lambda, lambda0, beta) from the priors of method.md section 1, rows
x with unit L2 norm (so |x_ij| <= 1), y from the model, and a release of the statistics with
Laplace noise of the add/remove mechanism's scales (method.md section 9: Sxx d(d+1)/2 Bx^2,
Sxy d Bx By, Syy By^2, n 1, split (0.35, 0.60, 0.03, 0.02)), K independent site releases, plus
``n_public`` exact public rows. With ``clip=False`` the bounds are wide enough that nothing
is clipped, so the generating beta is exactly what the statistics estimate; with
``clip=True`` By is a third of max|y| (heavy clipping of the target) and the statistics
estimate the coefficients of the clipped data instead (``beta_clipped``).

``coverage(..., y_unit="bound")`` fits as the product does (aggregator.aggregate.fit): with
the priors stated in units of the round's y bound (``fit_posterior(y_unit=By)``,
docs/method.md "The response unit of the priors"), while the data still come from the priors
in y's own units; the default (None) fits in y's units, the model's own setting.

The noise here is numpy's: this is a simulation of the mechanism's *law* to test the fit;
the mechanism itself (OpenDP, CSPRNG) is tested in tests/test_release*.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpfed.intervals import CREDIBLE_LEVEL
from dpfed.noise import NoiseDescription
from dpfed.sensitivity import expected_noise
from dpfed.statistics import Statistics, exact_statistics

__all__ = ["SPLIT", "prior_problem", "coverage", "PriorProblem"]

SPLIT = (0.35, 0.60, 0.03, 0.02)


@dataclass(frozen=True)
class PriorProblem:
    beta: np.ndarray            # generating coefficients
    beta_clipped: np.ndarray    # least squares of the clipped data (what clipped stats estimate)
    y_bound: float              # By of the release
    release: Statistics         # sum of the K noisy site releases (noise described)
    public: Statistics          # exact public statistics


def _noise(d, eps, bx, by, k) -> NoiseDescription:
    """K independent releases of the add/remove mechanism (dpfed.sensitivity)."""
    one = expected_noise(d, eps, bx, by, SPLIT, neighbouring="add_remove",
                         xtx_sensitivity="exact")
    return sum([one] * (k - 1), one)


def prior_problem(rng: np.random.Generator, d: int, n: int, eps: float, k: int = 1, *,
                  n_public: int = 10, clip: bool = False) -> PriorProblem:
    lam, lam0 = rng.gamma(2, 0.5), rng.gamma(2, 0.5)
    beta = rng.standard_normal(d) / np.sqrt(lam0)
    x = rng.standard_normal((n + n_public, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = x @ beta + rng.standard_normal(n + n_public) / np.sqrt(lam)
    y_max = float(np.max(np.abs(y[:n])))
    by = y_max / 3 if clip else y_max
    noise = _noise(d, eps, 1.0, by, k)
    yc = np.clip(y[:n], -by, by)
    s = exact_statistics(x[:n], yc)
    beta_clipped = np.linalg.lstsq(x[:n], yc, rcond=None)[0]
    m = d * (d + 1) // 2
    values = s.upper_values().copy()
    scale = {p: getattr(noise, p)[0].scale for p in ("xtx", "xty", "yty", "n")}
    for _ in range(k):
        values[:m] += rng.laplace(size=m) * scale["xtx"]
        values[m:m + d] += rng.laplace(size=d) * scale["xty"]
        values[-1] += rng.laplace() * scale["yty"]
    n_rel = max(n + int(np.sum(np.round(rng.laplace(size=k) * scale["n"]))), 1)
    release = Statistics.from_upper(d, n_rel, values, noise)
    return PriorProblem(beta, beta_clipped, by, release, exact_statistics(x[n:], y[n:]))


def _unit(y_unit: str | None, p: PriorProblem) -> float | None:
    """The priors' unit of y for ``coverage``'s ``y_unit``: None, the bound By, or the root
    mean square of the clipped y that the released statistics imply (sqrt(Syy / n) of release
    plus public rows; post-processing, so free of privacy cost), kept within [By / 20, By]."""
    if y_unit is None:
        return None
    if y_unit == "bound":
        return p.y_bound
    total = p.release + p.public
    rms = float(np.sqrt(max(total.yty, 0.0) / max(total.n, 1)))
    return float(np.clip(rms, p.y_bound / 20, p.y_bound))


def coverage(d: int, n: int, eps: float, k: int, reps: int, *, plug_in: bool = False,
             level: float = CREDIBLE_LEVEL, clip: bool = False, seed: int = 0, draws: int = 1000,
             y_unit: str | None = None) -> dict:
    """Share of the ``level`` intervals covering the generating (and the clipped-data)
    coefficients over ``reps`` problems; also the mean interval width. ``y_unit``: None
    (priors in y's units) or "bound" (in units of By, as a round fits)."""
    if y_unit not in (None, "bound", "rms"):
        raise ValueError(f"y_unit must be None, 'bound' or 'rms', got {y_unit!r}")
    from posterior import PosteriorError, fit_posterior

    rng = np.random.default_rng(seed)
    hits, hits_clipped, widths, failed = [], [], [], 0
    for r in range(reps):
        p = prior_problem(rng, d, n, eps, k, clip=clip)
        try:
            post = fit_posterior(p.release + p.public, public=p.public, x_bound=1.0,
                                 plug_in=plug_in, draws=draws, seed=r,
                                 y_unit=_unit(y_unit, p))
        except PosteriorError:
            failed += 1   # refused fits are counted, not hidden
            continue
        lo, hi = post.credible_interval(level).T
        hits.append((p.beta >= lo) & (p.beta <= hi))
        hits_clipped.append((p.beta_clipped >= lo) & (p.beta_clipped <= hi))
        widths.append(np.mean(hi - lo))
    return {"coverage": float(np.mean(hits)), "coverage_clipped": float(np.mean(hits_clipped)),
            "width": float(np.mean(widths)), "reps": reps, "failed": failed,
            "checks": (reps - failed) * d}
