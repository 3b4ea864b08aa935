"""What the mode search and importance sampling of the Laplace fit work on: each model's log
posterior density on u = (beta, log lambda), lambda0 integrated out (method.md sections 1 and
8; ``posterior.noise_aware``), and where to start looking for its modes.

The densities are the compiled twins of ``posterior.noise_aware_jit`` with their damped Newton
(``LAPLACE_BACKEND = "numba"``) or the numpy reference functions of ``posterior.noise_aware``
with BFGS (``"numpy"``): the same model and algorithm either way.
"""

from __future__ import annotations

import numpy as np

from dpfed.statistics import Statistics

__all__ = ["LAPLACE_BACKEND", "laplace_functions", "start", "extra_starts"]

#: How the Laplace fit evaluates the densities: "numba" (compiled twins in
#: ``posterior.noise_aware_jit``, damped Newton for the mode) or "numpy" (the reference
#: functions of ``posterior.noise_aware``, BFGS). Same model and algorithm either way.
LAPLACE_BACKEND = "numba"


def start(stats: Statistics, xtx: np.ndarray, ridge: float) -> np.ndarray:
    """Starting point (beta, log lambda): a ridge solution and the implied residual scale."""
    d = stats.dim
    beta = np.linalg.solve(xtx + ridge * np.eye(d), stats.xty)
    rss = stats.yty - float(beta @ stats.xty)
    rss = max(rss, 0.1 * abs(stats.yty), 1e-6)
    lam = min(max(max(stats.n, 1) / rss, 1e-4), 1e4)
    return np.concatenate([beta, [np.log(lam)]])


def laplace_functions(stats, public, model, x_bound=None):
    """(f, f_batch, u0, newton, neg_hessian) of the exact or noise-aware model for
    ``posterior.laplace.laplace_importance``, compiled unless LAPLACE_BACKEND == "numpy";
    u0 is the ridge start (``start``)."""
    from posterior import noise_aware as na

    inp = na.noise_aware_inputs(stats, public, x_bound) if model == "noise-aware" else None
    if model == "noise-aware":
        u0 = start(stats, inp.abar, 3.0 * float(np.sqrt(inp.v_xx)) + 1.0)
    else:
        u0 = start(stats, stats.xtx, 1.0)
    if LAPLACE_BACKEND == "numba":
        from posterior.noise_aware_jit import target_for

        t = target_for(model, stats, inp)
        return t.logp_grad, t.logp_batch, u0, t.newton, t.neg_hessian
    if model == "noise-aware":
        f = lambda u: na.log_posterior_noise_aware(u, inp)  # noqa: E731
        fb = lambda u: na.log_posterior_noise_aware_batch(u, inp)  # noqa: E731
    else:
        f = lambda u: na.log_posterior_exact(u, stats)  # noqa: E731
        fb = lambda u: na.log_posterior_exact_batch(u, stats)  # noqa: E731
    return f, fb, u0, None, None


def extra_starts(stats, public, u0, lap) -> list[np.ndarray]:
    """More starting points for the mode search when the first Laplace approximation does not
    carry importance sampling: the posterior can have several modes (a small-coefficient one
    near the ridge start, and one with larger coefficients and a smaller lambda that explains
    a noisy Sxy by a strong signal; seen on GDSC releases under replace-one) or a long ridge.
    From: a weakly regularised solve, the public rows' own fit, zero coefficients, and the
    first mode with its coefficients tripled and lambda lowered."""
    d = stats.dim
    starts = []
    xtx = np.array(stats.xtx)
    w, v = np.linalg.eigh(xtx)
    psd = (v * np.maximum(w, 0.0)) @ v.T
    starts.append(start(stats, psd, 1.0))
    if public is not None and public.n >= 2:
        starts.append(start(public, public.xtx, 1.0))
    zero = u0.copy()
    zero[:d] = 0.0
    starts.append(zero)
    if lap is not None and lap.converged:
        big = lap.mode.copy()
        big[:d] *= 3.0
        big[d] -= 1.5
        starts.append(big)
    return starts
