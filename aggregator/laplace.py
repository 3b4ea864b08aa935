"""Laplace approximation of a smooth log density (pure function; Bishop 2006, section 4.4).

The posterior of (beta, log lambda, log lambda0) is approximated by the normal distribution
centred at the mode with covariance the inverse of the negative Hessian there. The mode is
found by BFGS on the analytic gradient; the Hessian by central differences of the gradient
(2 (d + 2) gradient evaluations, symmetrised). Cheap at these sizes: d + 2 parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import optimize

__all__ = ["LaplaceResult", "laplace_approximation", "ImportanceResult", "laplace_importance"]

LogDensity = Callable[[np.ndarray], tuple[float, np.ndarray]]


@dataclass(frozen=True)
class LaplaceResult:
    mode: np.ndarray
    cov: np.ndarray
    log_density: float
    converged: bool
    iterations: int
    gradient_norm: float
    message: str


def hessian(f: LogDensity, u: np.ndarray, step: float = 1e-5) -> np.ndarray:
    """Hessian of ``f`` at ``u`` by central differences of its gradient, symmetrised."""
    k = u.size
    h = np.empty((k, k))
    for i in range(k):
        e = np.zeros(k)
        e[i] = step * max(1.0, abs(u[i]))
        h[i] = (f(u + e)[1] - f(u - e)[1]) / (2 * e[i])
    return 0.5 * (h + h.T)


def laplace_approximation(f: LogDensity, u0: np.ndarray, *, gtol: float = 1e-6,
                          max_iterations: int = 1000) -> LaplaceResult:
    """Mode and covariance of the Laplace approximation to the density ``exp(f)``.

    ``converged`` is False when the optimiser stopped without meeting ``gtol`` (relative to
    the scale of the gradient at the start) or the negative Hessian at the mode is not
    positive definite; the caller decides what to do then.
    """
    def neg(u):
        v, g = f(u)
        if not np.isfinite(v):
            return np.inf, np.zeros_like(u)
        return -v, -g

    g0 = np.linalg.norm(f(u0)[1])
    res = optimize.minimize(neg, u0, jac=True, method="BFGS",
                            options={"gtol": gtol * max(1.0, g0), "maxiter": max_iterations})
    mode = np.asarray(res.x, dtype=np.float64)
    val, grad = f(mode)
    gnorm = float(np.linalg.norm(grad))
    prec = -hessian(f, mode)
    try:
        chol = np.linalg.cholesky(prec)
        inv_chol = np.linalg.solve(chol, np.eye(mode.size))
        cov = inv_chol.T @ inv_chol
        pd = True
    except np.linalg.LinAlgError:
        cov = np.full((mode.size, mode.size), np.nan)
        pd = False
    ok = bool(np.isfinite(val) and pd and gnorm <= max(1e-4, 1e3 * gtol) * max(1.0, g0))
    msg = str(res.message) if pd else "the negative Hessian at the mode is not positive definite"
    return LaplaceResult(mode, cov, float(val), ok, int(res.nit), gnorm, msg)


@dataclass(frozen=True)
class ImportanceResult:
    """Draws resampled from the importance-weighted proposal, and how good the weights were."""

    draws: np.ndarray          # (draws, k) approximately from the target
    ess: float                 # effective sample size of the (truncated) weights
    proposals: int             # proposal draws made
    laplace: LaplaceResult


def _log_mvt(z: np.ndarray, chol: np.ndarray, df: float) -> np.ndarray:
    """Log density of the multivariate t (location 0, scale chol chol^T, ``df``) at rows z."""
    from scipy import special

    k = z.shape[1]
    sol = np.linalg.solve(chol, z.T).T
    q = np.sum(sol * sol, axis=1)
    return (special.gammaln(0.5 * (df + k)) - special.gammaln(0.5 * df)
            - 0.5 * k * np.log(df * np.pi) - np.sum(np.log(np.diag(chol)))
            - 0.5 * (df + k) * np.log1p(q / df))


def laplace_importance(f: LogDensity, f_batch: Callable[[np.ndarray], np.ndarray],
                       u0: np.ndarray, *, draws: int, rng: np.random.Generator,
                       proposals: int = 4000, df: float = 5.0,
                       scale: float = 1.2) -> ImportanceResult:
    """Draws from exp(f) by importance sampling with a Laplace-approximation proposal.

    The proposal is a multivariate Student-t (``df`` degrees of freedom, heavier tails than
    the target's normal approximation) centred at the mode with scale ``scale^2`` times the
    Laplace covariance. Weights are truncated at mean * sqrt(S) (truncated importance
    sampling, Ionides 2008, J. Comput. Graph. Stat. 17:295) and ``draws`` draws resampled
    from them (systematic resampling). ``ess`` near ``proposals`` means the Laplace
    approximation was already good; a small ess means the target is far from normal and the
    caller should say so (or use NUTS).
    """
    lap = laplace_approximation(f, u0)
    if not lap.converged:
        return ImportanceResult(np.empty((0, u0.size)), 0.0, 0, lap)
    k = u0.size
    chol = np.linalg.cholesky(lap.cov) * scale
    g = rng.standard_normal((proposals, k))
    w_chi = rng.chisquare(df, size=proposals) / df
    z = (g @ chol.T) / np.sqrt(w_chi)[:, None]
    u = lap.mode + z
    lw = f_batch(u) - _log_mvt(z, chol, df)
    lw[~np.isfinite(lw)] = -np.inf
    if not np.any(np.isfinite(lw)):
        return ImportanceResult(np.empty((0, k)), 0.0, proposals, lap)
    w = np.exp(lw - np.max(lw))
    w = np.minimum(w, np.mean(w) * np.sqrt(proposals))
    w /= w.sum()
    ess = float(1.0 / np.sum(w * w))
    # Systematic resampling: each draw's count differs from draws * w_i by less than 1.
    positions = (rng.random() + np.arange(draws)) / draws
    idx = np.minimum(np.searchsorted(np.cumsum(w), positions), proposals - 1)
    out = u[rng.permutation(idx)]
    return ImportanceResult(out, ess, proposals, lap)
