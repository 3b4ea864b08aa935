"""Laplace approximation of a smooth log density (pure function; Bishop 2006, section 4.4).

The posterior of (beta, log lambda) is approximated by the normal distribution centred at the
mode with covariance the inverse of the negative Hessian there. The Hessian is taken by central
differences of the analytic gradient (2 (d + 1) gradient evaluations, symmetrised). The mode is
found by Newton's method when the caller supplies one (``newton``: the compiled damped Newton
of ``posterior.noise_aware_jit``, a handful of iterations instead of BFGS's 15-50), else, or
when Newton fails, by scipy's BFGS on the analytic gradient. Cheap at these sizes: d + 1
parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import optimize, special

from posterior.psis import pareto_khat

__all__ = ["LaplaceResult", "laplace_approximation", "hessian", "hessian_batch",
           "newton_batched", "ImportanceResult", "laplace_importance",
           "mixture_importance", "adaptive_importance", "distinct_modes", "default_proposals",
           "MAX_PROPOSALS"]

LogDensity = Callable[[np.ndarray], tuple[float, np.ndarray]]
#: newton(u0, tol=...) -> (status, mode, value, gradient, minus Hessian, iterations); status 0
#: means max |gradient| <= tol (``posterior.noise_aware_jit.Target.newton``).
Newton = Callable[..., tuple]

#: Most importance proposals drawn (``laplace_importance``).
MAX_PROPOSALS = 4000
#: Fewer effective draws than this after the first batch of proposals: draw the rest, up to
#: ``MAX_PROPOSALS`` (2 x the ESS below which ``fit_posterior`` refuses the fit; on noisy
#: d = 10 releases 2000 proposals give an ESS of 36-320, median ~140, so about a third of
#: the fits with draws = 1000 are topped up).
TOP_UP_ESS = 100.0


@dataclass(frozen=True)
class LaplaceResult:
    mode: np.ndarray
    cov: np.ndarray
    log_density: float
    converged: bool
    iterations: int
    gradient_norm: float
    message: str
    optimiser: str = "bfgs"          # which optimiser found ``mode``: "newton" or "bfgs"
    newton_iterations: int = 0       # Newton iterations tried (also when BFGS took over)


def hessian(f: LogDensity, u: np.ndarray, step: float = 1e-5) -> np.ndarray:
    """Hessian of ``f`` at ``u`` by central differences of its gradient, symmetrised."""
    k = u.size
    h = np.empty((k, k))
    for i in range(k):
        e = np.zeros(k)
        e[i] = step * max(1.0, abs(u[i]))
        h[i] = (f(u + e)[1] - f(u - e)[1]) / (2 * e[i])
    return 0.5 * (h + h.T)


def hessian_batch(fgb: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]], u: np.ndarray,
                  step: float = 1e-5) -> np.ndarray:
    """``hessian`` with the 2k gradients from one call of ``fgb`` (values, gradients at the
    rows of a stack of points; ``posterior.batched``)."""
    u = np.asarray(u, dtype=np.float64)
    k = u.size
    e = step * np.maximum(1.0, np.abs(u))
    pts = np.concatenate([u + np.diag(e), u - np.diag(e)])
    g = fgb(pts)[1]
    h = (g[:k] - g[k:]) / (2.0 * e)[:, None]
    return 0.5 * (h + h.T)


def newton_batched(f: LogDensity, fgb, u0: np.ndarray, *, tol: float,
                   max_iterations: int = 100, max_step: float = 10.0, step: float = 1e-5):
    """Damped Newton for the mode of ``f``, the algorithm of
    ``posterior.noise_aware_jit._newton`` (Levenberg damping when minus the Hessian is not
    positive definite, steps capped at ``max_step`` per coordinate, Armijo backtracking;
    stops when max |gradient| <= ``tol``) with the forward-difference Hessian's k gradients
    from one call of ``fgb`` (``posterior.batched``). Same return value as that ``newton``:
    (status, mode, value, gradient, minus the central-difference Hessian, iterations);
    status 0 converged, 1 iteration limit, 2 no increase found, 3 not finite, 4 no damping
    made the Hessian positive definite."""
    u = np.array(u0, dtype=np.float64)
    k = u.size
    val, g = f(u)
    status, it = 1, 0
    if not np.isfinite(val):
        return 3, u, val, g, np.full((k, k), np.nan), 0
    while it < max_iterations:
        if np.max(np.abs(g)) <= tol:
            status = 0
            break
        it += 1
        e = step * np.maximum(1.0, np.abs(u))
        gp = fgb(u + np.diag(e))[1]
        if not np.all(np.isfinite(gp)):
            status = 3
            break
        h = -(gp - g) / e[:, None]
        h = 0.5 * (h + h.T)
        hscale = max(float(np.max(np.abs(np.diag(h)))), 1e-300)
        mu, low = 0.0, None
        while mu <= 1e8 * hscale:
            try:
                low = np.linalg.cholesky(h + mu * np.eye(k))
                break
            except np.linalg.LinAlgError:
                mu = 1e-8 * hscale if mu == 0.0 else 10.0 * mu
        if low is None:
            status = 4
            break
        p = np.linalg.solve(low.T, np.linalg.solve(low, g))
        pmax = float(np.max(np.abs(p)))
        if pmax > max_step:
            p *= max_step / pmax
        slope = float(g @ p)
        t, accepted = 1.0, False
        for _ in range(60):
            vn, gn = f(u + t * p)
            if np.isfinite(vn) and vn >= val + 1e-4 * t * slope:
                accepted = True
                break
            t *= 0.5
        if not accepted:
            status = 2
            break
        u, val, g = u + t * p, vn, gn
    prec = -hessian_batch(fgb, u, step)
    if not np.all(np.isfinite(prec)):
        prec = np.full((k, k), np.nan)
        status = 3 if status == 0 else status
    return status, u, float(val), g, prec, it


def _covariance(prec: np.ndarray) -> tuple[np.ndarray, bool]:
    try:
        if not np.all(np.isfinite(prec)):
            raise np.linalg.LinAlgError("not finite")
        chol = np.linalg.cholesky(prec)
        inv_chol = np.linalg.solve(chol, np.eye(prec.shape[0]))
        return inv_chol.T @ inv_chol, True
    except np.linalg.LinAlgError:
        return np.full(prec.shape, np.nan), False


def laplace_approximation(f: LogDensity, u0: np.ndarray, *, gtol: float = 1e-6,
                          max_iterations: int = 1000, newton: Newton | None = None,
                          neg_hessian: Callable[[np.ndarray], np.ndarray] | None = None
                          ) -> LaplaceResult:
    """Mode and covariance of the Laplace approximation to the density ``exp(f)``.

    ``converged`` is False when the optimiser stopped without meeting ``gtol`` (relative to
    the scale of the gradient at the start) or the negative Hessian at the mode is not
    positive definite; the caller decides what to do then.

    ``newton``: tried first (tolerance: max |gradient| <= gtol * max(1, |g(u0)|), the test
    BFGS uses); its result is kept when it passes the same acceptance test as BFGS's (finite,
    negative Hessian positive definite, |gradient| <= max(1e-4, 1e3 gtol) max(1, |g(u0)|)),
    else BFGS starts again from ``u0``. ``neg_hessian(u)``: minus the Hessian (same
    definition as ``hessian``, e.g. compiled); default ``-hessian(f, u)``.
    """
    u0 = np.asarray(u0, dtype=np.float64)
    g0 = float(np.linalg.norm(f(u0)[1]))
    scale = max(1.0, g0)
    accept = max(1e-4, 1e3 * gtol) * scale
    newton_it = 0
    if newton is not None:
        status, mode, val, grad, prec, newton_it = newton(u0, tol=gtol * scale,
                                                          max_iterations=min(max_iterations, 100))
        gnorm = float(np.linalg.norm(grad))
        cov, pd = _covariance(prec)
        if np.isfinite(val) and pd and gnorm <= accept:
            msg = ("Newton converged" if status == 0 else
                   f"Newton stopped (status {status}) within the acceptance tolerance")
            return LaplaceResult(mode, cov, float(val), True, newton_it, gnorm, msg, "newton",
                                 newton_it)

    def neg(u):
        v, g = f(u)
        if not np.isfinite(v):
            return np.inf, np.zeros_like(u)
        return -v, -g

    res = optimize.minimize(neg, u0, jac=True, method="BFGS",
                            options={"gtol": gtol * scale, "maxiter": max_iterations})
    mode = np.asarray(res.x, dtype=np.float64)
    val, grad = f(mode)
    gnorm = float(np.linalg.norm(grad))
    prec = neg_hessian(mode) if neg_hessian is not None else -hessian(f, mode)
    cov, pd = _covariance(prec)
    ok = bool(np.isfinite(val) and pd and gnorm <= accept)
    msg = str(res.message) if pd else "the negative Hessian at the mode is not positive definite"
    if newton is not None:
        msg = f"Newton failed ({newton_it} iterations); BFGS: {msg}"
    return LaplaceResult(mode, cov, float(val), ok, int(res.nit), gnorm, msg, "bfgs", newton_it)


@dataclass(frozen=True)
class ImportanceResult:
    """Draws resampled from the importance-weighted proposal, and how good the weights were."""

    draws: np.ndarray          # (draws, k) approximately from the target
    ess: float                 # effective sample size of the (truncated) weights
    proposals: int             # proposal draws made
    laplace: LaplaceResult
    settled: bool = True       # adaptive_importance: the proposal stopped moving
    # Pareto k-hat of the raw log importance ratios (posterior.psis): <= 0.7 the estimate is
    # reliable, above it the ESS of the (truncated) weights cannot be believed.
    khat: float = float("inf")
    # adaptive_importance: the proposal it would use next, (centre, scale's Cholesky factor):
    # the target's weighted moments of the last round (None where there is none).
    proposal: tuple | None = None


def _log_mvt(z: np.ndarray, chol: np.ndarray, df: float) -> np.ndarray:
    """Log density of the multivariate t (location 0, scale chol chol^T, ``df``) at rows z."""
    sol = np.linalg.solve(chol, z.T).T
    return _log_mvt_q(np.sum(sol * sol, axis=1), chol, df)


def _log_mvt_q(q: np.ndarray, chol: np.ndarray, df: float) -> np.ndarray:
    """``_log_mvt`` given q = |chol^-1 z|^2 per row."""
    k = chol.shape[0]
    return (special.gammaln(0.5 * (df + k)) - special.gammaln(0.5 * df)
            - 0.5 * k * np.log(df * np.pi) - np.sum(np.log(np.diag(chol)))
            - 0.5 * (df + k) * np.log1p(q / df))


def default_proposals(draws: int) -> int:
    """Importance proposals for ``draws`` draws: 2 per draw, at least 1000, at most 4000."""
    return int(min(max(1000, 2 * int(draws)), MAX_PROPOSALS))


def _propose(rng, count, mode, chol, df, f_batch):
    k = mode.size
    g = rng.standard_normal((count, k))
    w_chi = rng.chisquare(df, size=count) / df
    z = (g @ chol.T) / np.sqrt(w_chi)[:, None]
    u = mode + z
    # chol^-1 z = g / sqrt(w_chi): the t's quadratic form without a triangular solve.
    q = np.einsum("ij,ij->i", g, g) / w_chi
    lw = f_batch(u) - _log_mvt_q(q, chol, df)
    lw[~np.isfinite(lw)] = -np.inf
    return u, lw


def _weights(lw: np.ndarray) -> tuple[np.ndarray, float]:
    w = np.exp(lw - np.max(lw))
    w = np.minimum(w, np.mean(w) * np.sqrt(lw.size))
    w /= w.sum()
    return w, float(1.0 / np.sum(w * w))


def laplace_importance(f: LogDensity, f_batch: Callable[[np.ndarray], np.ndarray],
                       u0: np.ndarray, *, draws: int, rng: np.random.Generator,
                       proposals: int | None = None, max_proposals: int = MAX_PROPOSALS,
                       top_up_ess: float | None = None, df: float = 5.0, scale: float = 1.2,
                       newton: Newton | None = None,
                       neg_hessian: Callable[[np.ndarray], np.ndarray] | None = None,
                       laplace: LaplaceResult | None = None) -> ImportanceResult:
    """Draws from exp(f) by importance sampling with a Laplace-approximation proposal.

    The proposal is a multivariate Student-t (``df`` degrees of freedom, heavier tails than
    the target's normal approximation) centred at the mode with scale ``scale^2`` times the
    Laplace covariance. Weights are truncated at mean * sqrt(S) (truncated importance
    sampling, Ionides 2008, J. Comput. Graph. Stat. 17:295) and ``draws`` draws resampled
    from them (systematic resampling). ``ess`` near ``proposals`` means the Laplace
    approximation was already good; a small ess means the target is far from normal and the
    caller should say so (or use NUTS).

    ``proposals`` (default ``default_proposals(draws)``: 2 per draw, 1000-4000) are drawn
    first; if their ESS is below ``top_up_ess`` the rest up to ``max_proposals`` are drawn
    from the same proposal and all are weighted together, so a fit is never refused for
    having started with fewer proposals than ``max_proposals``. ``newton``/``neg_hessian``:
    see ``laplace_approximation``; ``laplace``: its result, if already computed (a retry with
    a wider proposal reuses it).
    """
    lap = laplace if laplace is not None else laplace_approximation(
        f, u0, newton=newton, neg_hessian=neg_hessian)
    k = u0.size
    if not lap.converged:
        return ImportanceResult(np.empty((0, k)), 0.0, 0, lap)
    first = default_proposals(draws) if proposals is None else int(proposals)
    top_up_ess = TOP_UP_ESS if top_up_ess is None else float(top_up_ess)
    max_proposals = max(int(max_proposals), first)
    chol = np.linalg.cholesky(lap.cov) * scale
    u, lw = _propose(rng, first, lap.mode, chol, df, f_batch)
    ess = 0.0
    if np.any(np.isfinite(lw)):
        w, ess = _weights(lw)
    # A top-up cannot repair weights with a heavy tail (k-hat > 0.7): not drawn then.
    if ess < top_up_ess and first < max_proposals and pareto_khat(lw) <= 0.7:
        u2, lw2 = _propose(rng, max_proposals - first, lap.mode, chol, df, f_batch)
        u, lw = np.concatenate([u, u2]), np.concatenate([lw, lw2])
    total = lw.size
    if not np.any(np.isfinite(lw)):
        return ImportanceResult(np.empty((0, k)), 0.0, total, lap)
    if total != first:
        w, ess = _weights(lw)
    # Systematic resampling: each draw's count differs from draws * w_i by less than 1.
    positions = (rng.random() + np.arange(draws)) / draws
    idx = np.minimum(np.searchsorted(np.cumsum(w), positions), total - 1)
    out = u[rng.permutation(idx)]
    return ImportanceResult(out, ess, total, lap, khat=pareto_khat(lw))


def distinct_modes(laps, min_distance: float = 1.0) -> list[LaplaceResult]:
    """The converged ``laps`` with distinct modes, highest density first: a mode within
    ``min_distance`` (Mahalanobis, in the covariance of the higher one) of a higher one is the
    same mode found twice."""
    out: list[LaplaceResult] = []
    for lap in sorted((lap for lap in laps if lap.converged), key=lambda r: -r.log_density):
        same = False
        for kept in out:
            diff = lap.mode - kept.mode
            try:
                dist = float(np.sqrt(diff @ np.linalg.solve(kept.cov, diff)))
            except np.linalg.LinAlgError:
                dist = float(np.linalg.norm(diff))
            if dist < min_distance:
                same = True
                break
        if not same:
            out.append(lap)
    return out


def mixture_importance(f_batch: Callable[[np.ndarray], np.ndarray], laps, *, draws: int,
                       rng: np.random.Generator, proposals: int = 16000, df: float = 3.0,
                       scale: float = 2.0) -> ImportanceResult:
    """Importance sampling from a mixture of multivariate t proposals, one per mode in ``laps``
    (converged Laplace approximations, e.g. from several starting points): component k is
    centred at mode k with scale ``scale^2`` times its Laplace covariance; its weight is the
    mode's Laplace estimate of its mass, exp(log density) sqrt(det cov), floored at
    1 / (4 K) of the total so that a mode the approximation undervalues is still explored.
    Weights are truncated and resampled as in ``laplace_importance``; with one mode this is
    ``laplace_importance`` with that wider proposal. ``laplace`` of the result is the highest
    mode's approximation."""
    laps = [lap for lap in laps if lap.converged]
    if not laps:
        raise ValueError("mixture_importance needs at least one converged Laplace approximation")
    k = laps[0].mode.size
    m = len(laps)
    chols = [np.linalg.cholesky(lap.cov) * scale for lap in laps]
    log_mass = np.array([lap.log_density + float(np.sum(np.log(np.diag(c)))) for lap, c in
                         zip(laps, chols)])
    mass = np.exp(log_mass - np.max(log_mass))
    mass /= mass.sum()
    mass = np.maximum(mass, 1.0 / (4 * m))
    mass /= mass.sum()
    counts = rng.multinomial(int(proposals), mass)
    us = []
    for lap, chol, c in zip(laps, chols, counts):
        if c == 0:
            continue
        g = rng.standard_normal((c, k))
        w_chi = rng.chisquare(df, size=c) / df
        us.append(lap.mode + (g @ chol.T) / np.sqrt(w_chi)[:, None])
    u = np.concatenate(us)
    log_q = np.full((m, u.shape[0]), -np.inf)
    for i, (lap, chol) in enumerate(zip(laps, chols)):
        log_q[i] = np.log(mass[i]) + _log_mvt(u - lap.mode, chol, df)
    top = np.max(log_q, axis=0)
    lq = top + np.log(np.sum(np.exp(log_q - top), axis=0))
    lw = f_batch(u) - lq
    lw[~np.isfinite(lw)] = -np.inf
    if not np.any(np.isfinite(lw)):
        return ImportanceResult(np.empty((0, k)), 0.0, u.shape[0], laps[0])
    w, ess = _weights(lw)
    positions = (rng.random() + np.arange(draws)) / draws
    idx = np.minimum(np.searchsorted(np.cumsum(w), positions), u.shape[0] - 1)
    return ImportanceResult(u[rng.permutation(idx)], ess, u.shape[0], laps[0],
                            khat=pareto_khat(lw))


def adaptive_importance(f_batch: Callable[[np.ndarray], np.ndarray], lap: LaplaceResult, *,
                        draws: int, rng: np.random.Generator, proposals: int = 16000,
                        iterations: int = 6, df: float = 3.0, scale: float = 2.0,
                        adapted_scale: float = 1.3, target_ess: float = 200.0,
                        max_shift: float = 0.2) -> ImportanceResult:
    """Importance sampling whose t proposal is moved to the target's weighted mean and
    covariance (population Monte Carlo; Cappe et al. 2004): the first proposal is
    t(``df``) around the Laplace mode with ``scale^2`` times its covariance; each next one is
    centred at the previous round's weighted mean with ``adapted_scale^2`` times its weighted
    covariance. It stops when, after at least one move, a round of ``proposals`` draws has
    an effective sample size of at least ``target_ess`` *and* its weighted mean lies within
    ``max_shift`` (Mahalanobis, in the weighted covariance) of the proposal's centre, i.e. the
    proposal has settled on the target; else after ``iterations`` rounds. (A proposal that
    misses part of the target can still show a large ESS: on a banana-shaped target the
    Laplace proposal kept 400-650 effective draws of 16000 with E[u2] at a third of its
    value; on a GDSC release three rounds gave an ESS of 258 with a mean still moving by
    half a posterior sd.) Each round's draws and weights are a valid (truncated) importance
    sample of the target on their own; the last round's are returned, resampled as in
    ``laplace_importance``."""
    k = lap.mode.size
    mean = np.array(lap.mode, dtype=np.float64)
    chol = np.linalg.cholesky(lap.cov) * scale
    u = np.empty((0, k))
    w = np.empty(0)
    ess = 0.0
    settled = False
    for it in range(int(iterations)):
        g = rng.standard_normal((int(proposals), k))
        w_chi = rng.chisquare(df, size=int(proposals)) / df
        z = (g @ chol.T) / np.sqrt(w_chi)[:, None]
        u = mean + z
        q = np.einsum("ij,ij->i", g, g) / w_chi
        lw = f_batch(u) - _log_mvt_q(q, chol, df)
        lw[~np.isfinite(lw)] = -np.inf
        if not np.any(np.isfinite(lw)):
            return ImportanceResult(np.empty((0, k)), 0.0, int(proposals) * (it + 1), lap)
        w, ess = _weights(lw)
        new_mean = w @ u
        centred = u - new_mean
        cov = (centred * w[:, None]).T @ centred
        cov = 0.5 * (cov + cov.T) + 1e-12 * np.trace(cov) / k * np.eye(k)
        try:
            new_chol = np.linalg.cholesky(cov)
        except np.linalg.LinAlgError:
            new_chol = None
            break
        shift = float(np.linalg.norm(np.linalg.solve(new_chol, new_mean - mean)))
        settled = it >= 1 and ess >= target_ess and shift <= max_shift
        if settled or it == iterations - 1:
            break
        mean, chol = new_mean, new_chol * adapted_scale
    positions = (rng.random() + np.arange(draws)) / draws
    idx = np.minimum(np.searchsorted(np.cumsum(w), positions), u.shape[0] - 1)
    moved = (new_mean, new_chol * adapted_scale) if new_chol is not None else None
    return ImportanceResult(u[rng.permutation(idx)], ess, int(proposals) * (it + 1), lap,
                            settled, khat=pareto_khat(lw), proposal=moved)
