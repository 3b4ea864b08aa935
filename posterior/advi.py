"""The paper's mean-field ADVI fit (``method="advi"``), for the exact and plug-in models only
(it has no noise-aware form here).

Mean-field ADVI over (log lambda, log lambda0, beta), as in Honkela et al. (2018) section 4.5
(Kucukelbir et al. 2017), run by the compiled engine of ``posterior.model`` (Adam on the
one-sample ELBO) from the coordinate-ascent starting point ``variational_init``, with a
convergence check (``stationarity``): a fit that has not converged is refused with
``ConvergenceError``. Predictions average x^T beta over ``draws`` (m = 5000 in the paper,
eq. (8)) draws from the fitted approximation.
"""

from __future__ import annotations

import time

import numpy as np
from scipy import special

from dpfed.statistics import Statistics
from posterior.closed_form import posterior_precision
from posterior.model import PRIOR_RATE, PRIOR_SHAPE, AdviState, get_advi_engine
from posterior.result import ConvergenceError, Posterior, draws_summary

__all__ = ["fit_advi", "variational_init", "stationarity"]


def _softplus(x):
    return np.logaddexp(0.0, x)


def _inv_softplus(y):
    y = np.asarray(y, dtype=np.float64)
    return y + np.log(-np.expm1(-y))


def variational_init(stats: Statistics, iterations: int = 30):
    """Starting point for ADVI: coordinate-ascent VB with factorisation q(beta) q(lam) q(lam0).

    Returns ``(mu, sd)`` over the flat unconstrained vector (log lam, log lam0, beta): the
    Gaussian q(beta) = N(m, diag(1/diag(P))) with P = E[lam0] I + E[lam] Sxx, and log lam,
    log lam0 at E[log lambda] of their Gamma factors with sd sqrt(trigamma(shape)). This only
    shortens the optimisation; the optimum is the mean-field ADVI one. Needs repaired (PSD)
    statistics so that every Gamma rate is positive.
    """
    d, n = stats.dim, stats.n
    a_lam = PRIOR_SHAPE + 0.5 * n
    a_lam0 = PRIOR_SHAPE + 0.5 * d
    e_lam, e_lam0 = 1.0, 1.0
    b_lam = b_lam0 = PRIOR_RATE
    for _ in range(iterations):
        prec = posterior_precision(stats.xtx, e_lam, e_lam0)
        chol = np.linalg.cholesky(prec)
        m = np.linalg.solve(prec, e_lam * stats.xty)
        cinv = np.linalg.solve(chol, np.eye(d))
        cov = cinv.T @ cinv
        quad = m @ stats.xtx @ m - 2 * m @ stats.xty + stats.yty + np.sum(stats.xtx * cov)
        b_lam = PRIOR_RATE + 0.5 * max(quad, 0.0)
        b_lam0 = PRIOR_RATE + 0.5 * (m @ m + np.trace(cov))
        e_lam, e_lam0 = a_lam / b_lam, a_lam0 / b_lam0
    prec = posterior_precision(stats.xtx, e_lam, e_lam0)
    m = np.linalg.solve(prec, e_lam * stats.xty)
    mu = np.concatenate([[special.digamma(a_lam) - np.log(b_lam),
                          special.digamma(a_lam0) - np.log(b_lam0)], m])
    sd = np.concatenate([[np.sqrt(special.polygamma(1, a_lam)),
                          np.sqrt(special.polygamma(1, a_lam0))], 1.0 / np.sqrt(np.diag(prec))])
    return mu, sd


def stationarity(chunk) -> dict:
    """Distance of a window of ADVI iterates from the ELBO's stationary point, in natural units.

    For a Gaussian target with precision P the loss gradient in the variational mean is
    ``P (mu - mu*)``; with the mean-field sd ``s_i = P_ii^-1/2`` the product ``s_i * g_i`` is the
    offset from the optimum in standard deviations (exact for independent coordinates). The
    gradient in ``log s_i`` is ``s_i^2 P_ii - 1``, the relative error of the variance. Returns
    those offsets (averaged over the window) and their Monte Carlo standard errors.
    """
    sd = _softplus(chunk.rho)
    dsd_drho = special.expit(chunk.rho)
    to_logsd = sd / dsd_drho  # d loss / d log sd = d loss / d rho * (d rho / d log sd)
    k = max(chunk.steps, 1)
    se_mu = np.sqrt(np.maximum(chunk.grad_mu_sq - chunk.grad_mu ** 2, 0.0) / k)
    se_rho = np.sqrt(np.maximum(chunk.grad_rho_sq - chunk.grad_rho ** 2, 0.0) / k)
    return {"mean_offset_sd": np.abs(chunk.grad_mu) * sd, "mean_offset_se": se_mu * sd,
            "log_sd_offset": np.abs(chunk.grad_rho) * to_logsd, "log_sd_offset_se": se_rho * to_logsd}


def _is_stationary(check: dict, tol: float) -> bool:
    # No slack for the standard errors: they assume independent steps, but Adam's iterates
    # revert to the optimum, so the window mean of the gradient nearly telescopes (it is
    # about the net displacement over the window / (learning rate x steps)) and is far less
    # noisy than the i.i.d. standard error says. The errors are reported, not used.
    return bool(np.all(check["mean_offset_sd"] <= tol) and np.all(check["log_sd_offset"] <= tol))


def fit_advi(stats, rep, diag, ss, draws, *, max_iterations, learning_rate, window,
             grad_tol, min_windows, init, mode) -> Posterior:
    """Adam with ``learning_rate`` for at most ``max_iterations`` steps in windows of
    ``window``; converged when the window-averaged gradients put every variational mean
    within ``grad_tol`` posterior sds of the stationary point (``stationarity``), after at
    least ``min_windows`` windows, else ``ConvergenceError``. ``init``: "vb"
    (``variational_init``) or "prior"; ``mode``: the PyTensor backend of the engine."""
    max_iterations, window = int(max_iterations), int(window)
    if max_iterations < 1 or window < 2:
        raise ValueError("max_iterations must be >= 1 and window >= 2")
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate!r}")
    t0 = time.perf_counter()
    engine, cached = get_advi_engine(mode)
    compile_seconds = 0.0 if cached else time.perf_counter() - t0
    if init == "vb":
        mu0, sd0 = variational_init(stats)
    elif init == "prior":
        mu0, sd0 = np.zeros(stats.dim + 2), np.ones(stats.dim + 2)
    else:
        raise ValueError(f"init must be 'vb' or 'prior', got {init!r}")
    opt_ss, draw_ss = ss.spawn(2)
    rng = np.random.default_rng(opt_ss)
    state = AdviState.start(mu0, _inv_softplus(sd0))
    diag.update(compiled_now=not cached, compile_seconds=compile_seconds, backend=engine.mode,
                learning_rate=float(learning_rate), window=window, max_iterations=max_iterations,
                init=init)

    it, windows, converged, history = 0, 0, False, []
    t_opt = time.perf_counter()
    while it < max_iterations:
        k = min(window, max_iterations - it)
        eps = rng.standard_normal((k, stats.dim + 2))
        state, losses, chunk = engine.run(state, eps, learning_rate, stats)
        it += k
        windows += 1
        if not (np.all(np.isfinite(losses)) and np.all(np.isfinite(state.mu))
                and np.all(np.isfinite(state.rho))):
            diag.update(converged=False, iterations=it, reason="non-finite loss or parameters")
            raise ConvergenceError(f"ADVI diverged after {it} iterations (non-finite loss)", diag)
        history.append(float(losses.mean()))
        check = stationarity(chunk)
        diag.update({key: float(np.max(v)) for key, v in check.items()})
        if windows >= min_windows and k == window and _is_stationary(check, grad_tol):
            converged = True
            break
    diag.update(converged=converged, iterations=it, final_loss=history[-1],
                loss_history=history, optimise_seconds=time.perf_counter() - t_opt)
    if not converged:
        diag["reason"] = "convergence criteria not met within max_iterations"
        raise ConvergenceError(
            f"ADVI did not converge within {max_iterations} iterations (window {window}): "
            f"mean gradient {diag['mean_offset_sd']:.3g} sd, log-sd gradient "
            f"{diag['log_sd_offset']:.3g} (tolerance {grad_tol}); "
            f"increase max_iterations or learning_rate", diag)

    cur = {"mu": chunk.mu, "rho": chunk.rho}
    mu, sd = cur["mu"], _softplus(cur["rho"])
    eps = np.random.default_rng(draw_ss).standard_normal((draws, stats.dim + 2))
    z = mu + sd * eps
    s = engine.slices(stats.dim)
    beta_draws = z[:, s["beta"]]
    lam_draws = np.exp(z[:, s["lam_log__"]]).ravel()
    lam0_draws = np.exp(z[:, s["lam0_log__"]]).ravel()
    diag["beta_sd"] = sd[s["beta"]].tolist()
    return Posterior("advi", mu[s["beta"]], beta_draws, draws_summary(lam_draws),
                     draws_summary(lam0_draws), diag, rep, stats)
