"""Closed-form posterior of beta with fixed precisions: the formulas (pure functions), and
the ``method="fixed"`` fit that draws from it.

Honkela et al. (2018), eqs. (3)-(4); method.md section 1: with lambda and lambda0 fixed,
beta | data ~ N(mu, L^-1) with L = lambda0 I + lambda Sxx and mu = L^-1 (lambda Sxy).
"""

from __future__ import annotations

import math

import numpy as np

from posterior.result import Posterior, PosteriorError, fixed_summary

__all__ = ["posterior_precision", "closed_form_mean", "fit_fixed"]


def posterior_precision(xtx: np.ndarray, lam: float = 1.0, lam0: float = 1.0) -> np.ndarray:
    """L = lambda0 I + lambda Sxx."""
    return lam0 * np.eye(xtx.shape[-1]) + lam * xtx


def closed_form_mean(xtx: np.ndarray, xty: np.ndarray, lam: float = 1.0, lam0: float = 1.0) -> np.ndarray:
    """mu = (lambda0 I + lambda Sxx)^-1 lambda Sxy. Works on stacks (..., d, d) and (..., d)."""
    prec = lam0 * np.eye(xtx.shape[-1]) + lam * np.asarray(xtx)
    return np.linalg.solve(prec, lam * np.asarray(xty)[..., None])[..., 0]


def fit_fixed(stats, rep, diag, ss, draws, lam, lam0):
    """``method="fixed"``: ``draws`` draws of beta ~ N(mu, L^-1) at the fixed precisions
    ``lam``, ``lam0`` (a ``posterior.result.Posterior``; for the exact and plug-in models)."""
    lam, lam0 = float(lam), float(lam0)
    if not (lam > 0 and lam0 > 0 and math.isfinite(lam) and math.isfinite(lam0)):
        raise ValueError(f"lam and lam0 must be finite and > 0, got {lam!r}, {lam0!r}")
    mu = closed_form_mean(stats.xtx, stats.xty, lam, lam0)
    prec = posterior_precision(stats.xtx, lam, lam0)
    try:
        chol = np.linalg.cholesky(prec)
    except np.linalg.LinAlgError as exc:  # cannot happen after the repair; kept as a guard
        raise PosteriorError(f"posterior precision is not positive definite: {exc}") from exc
    eps = np.random.default_rng(ss).standard_normal((draws, stats.dim))
    # beta = mu + C^-T eps has covariance (C C^T)^-1 = L^-1.
    beta_draws = mu + np.linalg.solve(chol.T, eps.T).T
    diag.update(converged=True, iterations=0)
    return Posterior("fixed", mu, beta_draws, fixed_summary(lam), fixed_summary(lam0), diag,
                     rep, stats)
