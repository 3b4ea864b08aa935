"""What the mode search and importance sampling of the Laplace fit work on: each model's log
posterior density on u = (beta, log lambda), lambda0 integrated out (method.md sections 1 and
8; ``posterior.noise_aware``), and where to start looking for its modes.

The densities are numpy functions vectorised over many points (``posterior.batched``; damped
Newton for the mode with each Hessian from one batched call of k gradients up to d = 31, BFGS
above or if Newton fails), by default: nothing to compile, so the
first fit of a new install costs what every fit costs. ``DPFED_POSTERIOR_BACKEND=numba`` in
the environment (or ``LAPLACE_BACKEND = "numba"``) selects the compiled twins of
``posterior.noise_aware_jit`` with their damped Newton instead: faster per fit at d ~ 10
(2-3 ms against ~10 ms), for bulk fitting (the evaluation) on a machine whose Numba cache is
warm; its first compile costs 6-20 s. The same model and algorithm either way.
"""

from __future__ import annotations

import os

import numpy as np

from dpfed.statistics import Statistics
from posterior import batched
from posterior.laplace import hessian_batch, newton_batched

__all__ = ["LAPLACE_BACKEND", "laplace_functions", "gradient_batch", "start", "extra_starts"]

#: How the Laplace fit evaluates the densities: "numpy" (``posterior.batched``, damped Newton
#: for the mode; default) or "numba" (compiled twins in ``posterior.noise_aware_jit``, damped Newton).
LAPLACE_BACKEND = os.environ.get("DPFED_POSTERIOR_BACKEND", "numpy")
# numpy backend: damped Newton (laplace.newton_batched) up to this many parameters, BFGS above.
_NEWTON_MAX_K = 32


def start(stats: Statistics, xtx: np.ndarray, ridge: float) -> np.ndarray:
    """Starting point (beta, log lambda): a ridge solution and the implied residual scale."""
    d = stats.dim
    beta = np.linalg.solve(xtx + ridge * np.eye(d), stats.xty)
    rss = stats.yty - float(beta @ stats.xty)
    rss = max(rss, 0.1 * abs(stats.yty), 1e-6)
    lam = min(max(max(stats.n, 1) / rss, 1e-4), 1e4)
    return np.concatenate([beta, [np.log(lam)]])


def laplace_functions(stats, public, model, x_bound=None, inp=None):
    """(f, f_batch, u0, newton, neg_hessian) of the exact or noise-aware model for
    ``posterior.laplace.laplace_importance``, compiled unless LAPLACE_BACKEND == "numpy";
    u0 is the ridge start (``start``). ``inp``: the noise-aware inputs if already computed
    (``noise_aware.noise_aware_inputs(stats, public, x_bound)``)."""
    from posterior import noise_aware as na

    if model == "noise-aware" and inp is None:
        inp = na.noise_aware_inputs(stats, public, x_bound)
    if model == "noise-aware":
        u0 = start(stats, inp.abar, 3.0 * float(np.sqrt(inp.v_xx)) + 1.0)
    else:
        u0 = start(stats, stats.xtx, 1.0)
    if LAPLACE_BACKEND == "numba":
        from posterior.noise_aware_jit import target_for

        t = target_for(model, stats, inp)
        return t.logp_grad, t.logp_batch, u0, t.newton, t.neg_hessian
    fgb = gradient_batch(stats, public, model, x_bound, inp)
    # One point at a time (BFGS): the reference functions, fewer numpy calls than a stack of 1.
    if model == "noise-aware":
        f = lambda u: na.log_posterior_noise_aware(u, inp)  # noqa: E731
        fb = lambda us: batched.noise_aware_logp(us, inp)  # noqa: E731
    else:
        f = lambda u: na.log_posterior_exact(u, stats)  # noqa: E731
        fb = lambda us: batched.exact_logp(us, stats)  # noqa: E731
    def newton(u, tol, max_iterations=100):
        return newton_batched(f, fgb, u, tol=tol, max_iterations=max_iterations)

    # Newton's k gradients per iteration pay at small k (d = 10: 4 iterations, ~4x faster
    # than BFGS's ~18); at d = 64 BFGS's ~50 single gradients were faster (0.44-0.73 s
    # against 0.62-1.8 s under load 8, same mode).
    small = stats.dim + 1 <= _NEWTON_MAX_K
    return f, fb, u0, newton if small else None, lambda u: -hessian_batch(fgb, u)


def gradient_batch(stats, public, model, x_bound=None, inp=None):
    """``fgb(us)`` -> (values, gradients) of the model's log density at the rows of ``us``
    (numpy, ``posterior.batched``), for samplers that move many points at once."""
    from posterior import noise_aware as na

    if model == "noise-aware":
        inp = inp if inp is not None else na.noise_aware_inputs(stats, public, x_bound)
        return lambda us: batched.noise_aware_logp_grad(us, inp)  # noqa: E731
    return lambda us: batched.exact_logp_grad(us, stats)  # noqa: E731


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
