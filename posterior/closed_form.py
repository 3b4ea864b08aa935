"""Closed-form posterior of beta with fixed precisions (pure functions).

Honkela et al. (2018), eqs. (3)-(4); method.md section 1: with lambda and lambda0 fixed,
beta | data ~ N(mu, L^-1) with L = lambda0 I + lambda Sxx and mu = L^-1 (lambda Sxy).
"""

from __future__ import annotations

import numpy as np


def posterior_precision(xtx: np.ndarray, lam: float = 1.0, lam0: float = 1.0) -> np.ndarray:
    """L = lambda0 I + lambda Sxx."""
    return lam0 * np.eye(xtx.shape[-1]) + lam * xtx


def closed_form_mean(xtx: np.ndarray, xty: np.ndarray, lam: float = 1.0, lam0: float = 1.0) -> np.ndarray:
    """mu = (lambda0 I + lambda Sxx)^-1 lambda Sxy. Works on stacks (..., d, d) and (..., d)."""
    prec = lam0 * np.eye(xtx.shape[-1]) + lam * np.asarray(xtx)
    return np.linalg.solve(prec, lam * np.asarray(xty)[..., None])[..., 0]
