"""Fitting the posterior of method.md sections 1 and 8 to (aggregated, noisy) statistics.

Which *model* is fitted follows from what the statistics say about their noise
(``Statistics.noise``, a public ``dpfed.noise.NoiseDescription``):

- noisy statistics: the **noise-aware** model (``aggregator.noise_aware``, method.md
  section 8), which knows the released values are the clipped data's statistics plus
  privacy noise of the stated law and scale, so its intervals include that noise;
- exact statistics (public data, or a non-private baseline): the **exact** model of
  method.md section 1;
- statistics of unknown noise: refused, unless the caller states ``plug_in=True``: the
  **plug-in** fit treats them as exact after ``aggregator.repair`` (what the paper did; its
  intervals ignore the privacy noise and are far too narrow on releases).

Methods (``method=``):

- ``"auto"`` (default): ``"laplace"``, and if that refuses the fit (importance sampling keeps
  too few effective draws even from several modes, or no mode is found) the reference
  ``"nuts"`` on the same model (``fallback``); ``Posterior.method`` and
  ``diagnostics["fallback_from"]`` say which ran.
- ``"laplace"``: Laplace approximation with importance sampling
  (``aggregator.laplace.laplace_importance``) of the posterior of (beta, log lambda) with
  lambda0 integrated out; compiled with Numba (aggregator.noise_aware_jit; the numpy
  reference in aggregator.noise_aware), milliseconds. Works for every model.
- ``"nuts"``: PyMC's NUTS on the PyMC definition of the model (the reference).
- ``"advi"``, ``"fixed"``: the paper's mean-field ADVI and the fixed-precision closed form,
  for the exact and plug-in models only (they have no noise-aware form here).

For the plug-in model (and the historical ADVI path) the statistics are repaired first
(``aggregator.repair``; free post-processing of the DP release, method.md section 6); the
old methods are:

- ``"advi"`` (default): mean-field ADVI over (log lambda, log lambda0, beta), as in Honkela et
  al. (2018) section 4.5, with a convergence check; a fit that has not converged is refused
  with ``ConvergenceError``. Predictions average x^T beta over ``draws`` (m = 5000 in the
  paper, eq. (8)) draws from the fitted approximation.
- ``"nuts"``: PyMC's NUTS on the same model; reports divergences, r-hat and ESS (ArviZ).
- ``"fixed"``: the closed form with fixed precisions (paper eqs. (3)-(4)),
  beta ~ N(mu, L^-1), L = lam0 I + lam Sxx, mu = L^-1 lam Sxy.

All randomness (optimiser noise, MCMC, posterior draws) comes from ``seed``; it is Monte Carlo
noise of the computation, not DP noise, so numpy/PyMC generators are fine here.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from scipy import special

from aggregator.closed_form import closed_form_mean, posterior_precision
from aggregator.model import (DEFAULT_MODE, PRIOR_RATE, PRIOR_SHAPE, AdviState, build_model,
                              get_advi_engine)
from aggregator.repair import Repair, repair_statistics
from dpfed.intervals import CREDIBLE_LEVEL, credible_interval, interval_quantiles
from dpfed.jsonsafe import jsonable
from dpfed.statistics import Statistics, realisable

__all__ = ["Posterior", "PosteriorError", "ConvergenceError", "fit_posterior", "METHODS",
           "MODELS", "variational_init", "UnknownNoiseError"]

METHODS = ("auto", "laplace", "nuts", "advi", "fixed")
MODELS = ("noise-aware", "exact", "plug-in")
# Importance sampling with fewer effective draws than this is refused (use NUTS).
_MIN_ESS = 50
# Below this many effective draws the first (Laplace) proposal is not trusted: on GDSC
# releases its mean then differed from the adaptive sampler's (which agreed with NUTS) by more
# than 0.3 posterior sd in a quarter of the fits (ESS 100-400 of 2000-4000 proposals), against
# 2 % above 400. The fit then looks for more modes and moves the proposal (``_fit_laplace``).
_SETTLED_ESS = 400
# Draws per round of the adaptive proposal (attempt 3; 2-6 rounds; 4x as many if it has not
# settled after 6).
_ADAPTIVE_PROPOSALS = 4000
# Proposals tried in turn: the default (aggregator.laplace), then a wider, heavier-tailed t.
_WIDER_PROPOSALS = ({}, dict(scale=2.0, df=3.0, proposals=16000, max_proposals=16000))


class UnknownNoiseError(ValueError):
    """Statistics whose noise is unknown were given without ``plug_in=True``."""


class PosteriorError(RuntimeError):
    """The posterior could not be fitted (bad input, numerical failure)."""


class ConvergenceError(PosteriorError):
    """The fit did not converge; no posterior is returned. ``diagnostics`` says why."""

    def __init__(self, message: str, diagnostics: dict | None = None):
        super().__init__(message)
        self.diagnostics = dict(diagnostics or {})


def _readonly(a) -> np.ndarray:
    a = np.array(a, dtype=np.float64, copy=True)
    a.setflags(write=False)
    return a


def _summary(draws: np.ndarray) -> dict:
    q = np.quantile(draws, [0.05, 0.5, 0.95])
    return {"mean": float(np.mean(draws)), "sd": float(np.std(draws)),
            "q05": float(q[0]), "median": float(q[1]), "q95": float(q[2])}


def _fixed_summary(value: float) -> dict:
    v = float(value)
    return {"mean": v, "sd": 0.0, "q05": v, "median": v, "q95": v, "fixed": True}


@dataclass(frozen=True, eq=False)
class Posterior:
    """A fitted posterior of beta (and of the precisions, except for ``"fixed"``).

    ``beta_draws`` (draws x d) are draws from the fitted posterior (the variational
    approximation for ADVI, the chains for NUTS, the Gaussian for ``"fixed"``);
    ``beta_mean`` is its mean (exact for ``"fixed"`` and ADVI, the sample mean for NUTS).
    ``lam`` and ``lam0`` summarise the precisions (mean, sd, 5%/50%/95% quantiles).
    Arrays are read-only.
    """

    method: str
    beta_mean: np.ndarray
    beta_draws: np.ndarray
    lam: dict
    lam0: dict
    diagnostics: dict
    repair: Repair
    stats: Statistics = field(repr=False)  # the (repaired, for plug-in) statistics fitted
    model: str = "plug-in"                 # "noise-aware", "exact" or "plug-in" (MODELS)

    def __post_init__(self):
        object.__setattr__(self, "beta_mean", _readonly(self.beta_mean))
        object.__setattr__(self, "beta_draws", _readonly(self.beta_draws))

    @property
    def dim(self) -> int:
        return self.beta_mean.shape[0]

    def _x(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must have shape (m, {self.dim}), got {np.shape(x)}")
        return x

    def predict(self, x) -> np.ndarray:
        """Average of x^T beta over the draws (paper eq. (8), with its 1/m): shape (m,)."""
        return self._x(x) @ self.beta_draws.mean(axis=0)

    def predict_interval(self, x, level: float = CREDIBLE_LEVEL) -> tuple[np.ndarray, np.ndarray]:
        """Central credible interval of the linear predictor x^T beta (no observation noise)."""
        lo, hi = interval_quantiles(level)
        lin = self._x(x) @ self.beta_draws.T
        return np.quantile(lin, lo, axis=1), np.quantile(lin, hi, axis=1)

    def credible_interval(self, level: float = CREDIBLE_LEVEL) -> np.ndarray:
        """Central credible interval of each coefficient: array (d, 2) of (lower, upper)
        (dpfed.intervals)."""
        return credible_interval(self.beta_draws, level)

    def to_dict(self, include_draws: bool = False) -> dict:
        """JSON-ready summary (dpfed.jsonsafe: NaN and infinities as None); the draws only
        with ``include_draws=True``."""
        ci = self.credible_interval(0.9)      # the "beta_ci90" key; CREDIBLE_LEVEL is 0.9
        out = {
            "method": self.method,
            "model": self.model,
            "dim": self.dim,
            "n_draws": int(self.beta_draws.shape[0]),
            "beta_mean": self.beta_mean.tolist(),
            "beta_sd": self.beta_draws.std(axis=0).tolist(),
            "beta_ci90": ci.tolist(),
            "lam": dict(self.lam),
            "lam0": dict(self.lam0),
            "diagnostics": jsonable(self.diagnostics),
        }
        if include_draws:
            out["beta_draws"] = self.beta_draws.tolist()
        return out


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


def _seed_sequence(seed) -> tuple[np.random.SeedSequence, int]:
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (2 ** 63))
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    return np.random.SeedSequence(int(seed)), int(seed)


def fit_posterior(stats: Statistics, *, method: str = "auto", public: Statistics | None = None,
                  x_bound: float | None = None, plug_in: bool = False, draws: int = 5000,
                  seed=None,
                  lam: float = 1.0, lam0: float = 1.0,
                  max_iterations: int = 40_000, learning_rate: float = 0.01,
                  window: int = 1000, grad_tol: float = 0.1, min_windows: int = 2,
                  init: str = "vb", mode: str = DEFAULT_MODE,
                  tune: int = 1000, chains: int = 2, target_accept: float = 0.9,
                  rhat_max: float = 1.05,
                  eigen_floor: float | None = None, rss_floor: float | None = None,
                  project_xty: bool = True, fallback: str | None = "auto",
                  check_first_attempt: bool = True, y_unit: float | None = None) -> Posterior:
    """Fit the posterior of beta to ``stats`` and return a ``Posterior`` (module docstring).

    ``public``: the exact public statistics that ``stats`` includes (their second moments set
    the noise-aware model's prior on the private design; optional). ``x_bound``: the public
    clipping bound of the private features (the design prior clips the public moments like
    the private rows were clipped; give it whenever the release was clipped). ``plug_in=True`` fits
    noisy or unknown-noise statistics as if exact (the paper's fit; intervals ignore the
    noise). ``draws``: posterior draws of beta; ``seed`` makes the computation
    deterministic (None: fresh entropy, recorded in ``diagnostics["seed"]``).

    ``"fixed"``: ``lam``, ``lam0`` are the fixed precisions. ``"advi"``: Adam with
    ``learning_rate`` for at most ``max_iterations`` steps in windows of ``window``;
    converged when the window-averaged gradients put every variational mean within
    ``grad_tol`` posterior sds of the stationary point (``stationarity``), else
    ``ConvergenceError``. ``"nuts"``: ``chains`` chains after ``tune`` steps; r-hat above
    ``rhat_max`` raises ``ConvergenceError``. ``eigen_floor``/``rss_floor``/``project_xty``
    tune the plug-in repair. ``fallback``: what runs when the Laplace fit refuses ("nuts" or
    None: raise ``ConvergenceError``); "auto" means "nuts" for ``method="auto"`` and None for
    an explicit ``method="laplace"``. ``check_first_attempt=False``: the noise-aware fit
    trusts its first importance sample down to 50 effective draws, as before the second and
    third attempts existed (faster; for baselines whose fit quality does not matter).

    ``y_unit``: the unit of the response in which the priors are stated (``_in_caller_units``):
    the fit sees y / y_unit, and the result is returned in the caller's units. Rounds give
    the public clipping bound of y, so that the clipped responses lie in [-1, 1] whatever
    the data's own units (None: the statistics' units, as the paper's model).
    """
    t_start = time.perf_counter()
    if not isinstance(stats, Statistics):
        raise TypeError(f"stats must be a dpfed Statistics, got {type(stats).__name__}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if public is not None and not (isinstance(public, Statistics) and public.is_exact):
        raise ValueError("public must be exact Statistics (noise=EXACT)")
    if public is not None and public.n > 0 and not realisable(public):
        # They get their own exact likelihood (aggregator.noise_aware), unbounded for these.
        raise PosteriorError("the public statistics are not the exact statistics of any rows "
                             "(their augmented Gram matrix is not positive semidefinite)")
    draws = int(draws)
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    # Statistics.in_y_units refuses a unit that is not finite and > 0 (a ValueError).
    unit = 1.0 if y_unit is None else float(y_unit)
    if unit != 1.0:
        stats = stats.in_y_units(unit)
        public = public.in_y_units(unit) if public is not None else None
    if plug_in:
        model = "plug-in"
    elif stats.noise is None:
        raise UnknownNoiseError(
            "the noise of these statistics is unknown: attach its public description "
            "(Statistics.with_noise, dpfed.sensitivity.expected_noise) for the noise-aware "
            "fit, or pass plug_in=True to fit them as if exact (intervals then ignore the "
            "privacy noise)")
    else:
        model = "exact" if stats.noise.is_exact else "noise-aware"
    if fallback == "auto":
        fallback = "nuts" if method == "auto" else None
    if fallback not in (None, "nuts"):
        raise ValueError(f"fallback must be 'auto', 'nuts' or None, got {fallback!r}")
    if method == "auto":
        method = "laplace"
    if model == "noise-aware" and method in ("advi", "fixed"):
        raise ValueError(f"method {method!r} has no noise-aware form; use 'laplace' or "
                         "'nuts', or plug_in=True for the paper's plug-in fit")
    ss, seed_int = _seed_sequence(seed)
    diag = {"method": method, "model": model, "seed": seed_int, "n": stats.n,
            "dim": stats.dim}
    if stats.noise is not None:
        diag["noise"] = stats.noise.summary()
    if model == "exact" and np.linalg.eigvalsh(stats.xtx)[0] < -1e-9 * max(
            1.0, float(np.max(np.abs(stats.xtx)))):
        raise PosteriorError("statistics said to be exact have an indefinite Sxx (no real "
                             "rows give that): they are not exact statistics")
    if model == "plug-in":
        fitted, rep = repair_statistics(stats, eigen_floor=eigen_floor, rss_floor=rss_floor,
                                        project_xty=project_xty)
    else:
        fitted, rep = stats, _no_repair(stats)
    diag["repair"] = rep.to_dict()
    if method == "laplace":
        try:
            post = _fit_laplace(fitted, public, model, rep, diag, ss, draws, x_bound,
                                check_first_attempt)
        except ConvergenceError as exc:
            if fallback != "nuts":
                raise
            # The reference sampler on the same model; recorded as such.
            diag = dict(diag, fallback_from="laplace", laplace_refusal=str(exc),
                        laplace_importance_ess=exc.diagnostics.get("importance_ess"))
            diag["method"] = "nuts"
            if model == "noise-aware":
                post = _fit_nuts_noise_aware(fitted, public, rep, diag, ss, draws,
                                             x_bound=x_bound, tune=tune, chains=chains,
                                             target_accept=target_accept, rhat_max=rhat_max)
            else:
                post = _fit_nuts(fitted, rep, diag, ss, draws, tune=tune, chains=chains,
                                 target_accept=target_accept, rhat_max=rhat_max)
    elif method == "fixed":
        post = _fit_fixed(fitted, rep, diag, ss, draws, lam, lam0)
    elif method == "advi":
        post = _fit_advi(fitted, rep, diag, ss, draws, max_iterations=max_iterations,
                         learning_rate=learning_rate, window=window, grad_tol=grad_tol,
                         min_windows=min_windows, init=init, mode=mode)
    elif model == "noise-aware":
        post = _fit_nuts_noise_aware(fitted, public, rep, diag, ss, draws, x_bound=x_bound, tune=tune,
                                     chains=chains, target_accept=target_accept,
                                     rhat_max=rhat_max)
    else:
        post = _fit_nuts(fitted, rep, diag, ss, draws, tune=tune, chains=chains,
                         target_accept=target_accept, rhat_max=rhat_max)
    object.__setattr__(post, "model", model)
    if not (np.all(np.isfinite(post.beta_mean)) and np.all(np.isfinite(post.beta_draws))):
        raise PosteriorError(f"{method}: the fitted posterior is not finite")
    if unit != 1.0:
        post = _in_caller_units(post, unit)
    post.diagnostics["fit_seconds"] = time.perf_counter() - t_start
    return post


# Why a response unit: the priors of method.md section 1 (lambda ~ Gamma(2, 2): residual
# sd near 1; beta | lambda0 with lambda0 ~ Gamma(2, 2)) are stated for a response of unit
# scale, so without one the posterior depends on the units y is measured in. That matters
# most for the noise-aware model: on UCI wine quality (docs/evaluation.md) a release whose
# responses were all clipped to +-0.2 got a noise-aware posterior mean with held-out
# Spearman -0.36 (NUTS agreed: the model, not the approximation), and 0.59 with the same
# rows in units of the bound (the exact clipped statistics give 0.59).
def _in_caller_units(post: Posterior, unit: float) -> Posterior:
    """``post`` fitted to y / unit, in y's units: beta and its draws times unit, the noise
    and prior precisions lambda, lambda0 divided by unit^2 (every summary statistic of a
    positive multiple is that multiple of the statistic), the statistics back in y."""
    def precision(summary: dict) -> dict:
        return {k: (v / unit ** 2 if isinstance(v, float) else v)   # not the bool "fixed"
                for k, v in summary.items()}

    diagnostics = dict(post.diagnostics, y_unit=unit)
    return Posterior(post.method, post.beta_mean * unit, post.beta_draws * unit,
                     precision(post.lam), precision(post.lam0), diagnostics, post.repair,
                     post.stats.in_y_units(1.0 / unit), post.model)


def _no_repair(stats: Statistics) -> Repair:
    """The record of a repair that changed nothing (the noise-aware and exact models fit the
    statistics as released)."""
    return Repair(False, 0, 0, float("nan"), 0.0, 0.0, 0.0, float("nan"), 0.0, 0.0)


def _start(stats: Statistics, xtx: np.ndarray, ridge: float) -> np.ndarray:
    """Starting point (beta, log lambda): a ridge solution and the implied residual scale."""
    d = stats.dim
    beta = np.linalg.solve(xtx + ridge * np.eye(d), stats.xty)
    rss = stats.yty - float(beta @ stats.xty)
    rss = max(rss, 0.1 * abs(stats.yty), 1e-6)
    lam = min(max(max(stats.n, 1) / rss, 1e-4), 1e4)
    return np.concatenate([beta, [np.log(lam)]])


#: How ``_fit_laplace`` evaluates the densities: "numba" (compiled twins in
#: ``aggregator.noise_aware_jit``, damped Newton for the mode) or "numpy" (the reference
#: functions of ``aggregator.noise_aware``, BFGS). Same model and algorithm either way.
LAPLACE_BACKEND = "numba"


def _laplace_functions(stats, public, model, x_bound=None):
    """(f, f_batch, u0, newton, neg_hessian) of the exact or noise-aware model for
    ``aggregator.laplace.laplace_importance``, compiled unless LAPLACE_BACKEND == "numpy"."""
    from aggregator import noise_aware as na

    inp = na.noise_aware_inputs(stats, public, x_bound) if model == "noise-aware" else None
    if model == "noise-aware":
        u0 = _start(stats, inp.abar, 3.0 * float(np.sqrt(inp.v_xx)) + 1.0)
    else:
        u0 = _start(stats, stats.xtx, 1.0)
    if LAPLACE_BACKEND == "numba":
        from aggregator.noise_aware_jit import target_for

        t = target_for(model, stats, inp)
        return t.logp_grad, t.logp_batch, u0, t.newton, t.neg_hessian
    if model == "noise-aware":
        f = lambda u: na.log_posterior_noise_aware(u, inp)  # noqa: E731
        fb = lambda u: na.log_posterior_noise_aware_batch(u, inp)  # noqa: E731
    else:
        f = lambda u: na.log_posterior_exact(u, stats)  # noqa: E731
        fb = lambda u: na.log_posterior_exact_batch(u, stats)  # noqa: E731
    return f, fb, u0, None, None


def _extra_starts(stats, public, model, u0, lap) -> list[np.ndarray]:
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
    starts.append(_start(stats, psd, 1.0))
    if public is not None and public.n >= 2:
        starts.append(_start(public, public.xtx, 1.0))
    zero = u0.copy()
    zero[:d] = 0.0
    starts.append(zero)
    if lap is not None and lap.converged:
        big = lap.mode.copy()
        big[:d] *= 3.0
        big[d] -= 1.5
        starts.append(big)
    return starts


def _fit_laplace(stats, public, model, rep, diag, ss, draws, x_bound=None,
                 check_first_attempt: bool = True) -> Posterior:
    """Laplace approximation + importance sampling (aggregator.laplace) of the exact or the
    noise-aware model, lambda0 integrated out and drawn given beta afterwards.

    Attempt 1: the Laplace approximation at the mode found from the ridge start, its t
    proposal. If that keeps fewer than ``_SETTLED_ESS`` effective draws, modes are sought
    from more starting points (``_extra_starts``): with several, attempt 2, a mixture of
    wider, heavier-tailed t proposals, one per distinct mode
    (``aggregator.laplace.mixture_importance``); with one, attempt 3, the proposal moved to
    the target's weighted moments (``aggregator.laplace.adaptive_importance``). The fit is
    refused (``ConvergenceError``) if the result keeps fewer than ``_MIN_ESS``."""
    from aggregator import noise_aware as na
    from aggregator.laplace import (adaptive_importance, distinct_modes, laplace_approximation,
                                    laplace_importance, mixture_importance)

    d = stats.dim
    f, fb, u0, newton, neg_hessian = _laplace_functions(stats, public, model, x_bound)
    rng = np.random.default_rng(ss)
    res = laplace_importance(f, fb, u0, draws=draws, rng=rng, newton=newton,
                             neg_hessian=neg_hessian)
    attempt, modes = 1, 1
    # The exact model's posterior (exact statistics) is close to normal: its first attempt
    # is trusted down to _MIN_ESS; the noise-aware one's only from _SETTLED_ESS.
    settled = min(_SETTLED_ESS, 0.2 * max(res.proposals, 1)) \
        if model == "noise-aware" and check_first_attempt else _MIN_ESS
    if res.ess < settled:
        laps = [res.laplace] + [laplace_approximation(f, u, newton=newton,
                                                      neg_hessian=neg_hessian)
                                for u in _extra_starts(stats, public, model, u0, res.laplace)]
        found = distinct_modes(laps)
        modes = len(found)
        if modes > 1:
            # Attempt 2: several modes, a mixture of wider t proposals, one per mode.
            attempt = 2
            wider = dict(_WIDER_PROPOSALS[1])
            res = mixture_importance(fb, found, draws=draws, rng=rng,
                                     proposals=wider["proposals"], df=wider["df"],
                                     scale=wider["scale"])
        elif modes == 1:
            # Attempt 3: one mode, but the target is skewed or ridge-shaped around it: move
            # the proposal to the target's weighted moments (adaptive_importance).
            attempt = 3
            res = adaptive_importance(fb, found[0], draws=draws, rng=rng,
                                      proposals=_ADAPTIVE_PROPOSALS)
            if not res.settled:   # again with 4x the draws per round
                res = adaptive_importance(fb, found[0], draws=draws, rng=rng,
                                          proposals=4 * _ADAPTIVE_PROPOSALS)
    diag["importance_attempts"] = attempt
    diag["modes"] = modes
    lap = res.laplace
    diag.update(converged=bool(lap.converged and res.ess >= _MIN_ESS),
                iterations=lap.iterations, gradient_norm=lap.gradient_norm,
                importance_ess=res.ess, importance_proposals=res.proposals,
                laplace_message=lap.message, optimiser=lap.optimiser,
                newton_iterations=lap.newton_iterations)
    if not lap.converged:
        raise ConvergenceError(f"Laplace approximation failed: {lap.message}", diag)
    if res.ess < _MIN_ESS:
        raise ConvergenceError(
            f"importance sampling kept only {res.ess:.0f} effective draws of "
            f"{res.proposals}: the posterior is far from normal; use method='nuts'", diag)
    beta_draws = res.draws[:, :d]
    lam_draws = np.exp(res.draws[:, d])
    lam0_draws = na.draw_lam0(beta_draws, rng)
    return Posterior("laplace", beta_draws.mean(axis=0), beta_draws, _summary(lam_draws),
                     _summary(lam0_draws), diag, rep, stats, model)


def _fit_nuts_noise_aware(stats, public, rep, diag, ss, draws, *, x_bound=None, tune, chains,
                          target_accept, rhat_max) -> Posterior:
    """NUTS on ``aggregator.model.build_noise_aware_model`` (the reference sampler)."""
    from aggregator import noise_aware as na
    from aggregator.model import build_noise_aware_model

    inp = na.noise_aware_inputs(stats, public, x_bound)
    u0 = _start(stats, inp.abar, 3.0 * float(np.sqrt(inp.v_xx)) + 1.0)
    initvals = {"lam": float(np.exp(u0[-1])), "lam0": 1.0, "beta": u0[:-1]}
    return _nuts(build_noise_aware_model(inp), initvals, stats, rep, diag, ss, draws,
                 model_name="noise-aware", tune=tune, chains=chains,
                 target_accept=target_accept, rhat_max=rhat_max)


def _nuts(model, initvals, stats, rep, diag, ss, draws, *, model_name, tune, chains,
          target_accept, rhat_max) -> Posterior:
    """PyMC's NUTS on ``model`` (value variables lam, lam0, beta), with r-hat, ESS and
    divergences (ArviZ) in ``diag``; not converged (r-hat above ``rhat_max``) raises."""
    import logging

    import arviz as az
    import pymc as pm

    chains = int(chains)
    per_chain = int(math.ceil(draws / chains))
    seed_int = int(ss.generate_state(1, dtype=np.uint32)[0])
    pm_logger = logging.getLogger("pymc")
    level = pm_logger.level
    pm_logger.setLevel(logging.ERROR)
    try:
        with model:
            idata = pm.sample(draws=per_chain, tune=int(tune), chains=chains, cores=1,
                              random_seed=seed_int, progressbar=False, initvals=initvals,
                              target_accept=target_accept, compute_convergence_checks=False,
                              return_inferencedata=True)
    finally:
        pm_logger.setLevel(level)
    post = idata.posterior
    beta_draws = post["beta"].values.reshape(-1, stats.dim)[:draws]
    rhat, ess = az.rhat(idata), az.ess(idata)
    max_rhat = float(max(float(rhat[v].max()) for v in ("beta", "lam", "lam0")))
    min_ess = float(min(float(ess[v].min()) for v in ("beta", "lam", "lam0")))
    divergences = int(idata.sample_stats["diverging"].sum())
    converged = bool(max_rhat <= rhat_max)
    diag.update(converged=converged, iterations=per_chain * chains, chains=chains,
                tune=int(tune), max_rhat=max_rhat, min_ess_bulk=min_ess,
                divergences=divergences, rhat_max=rhat_max)
    if not converged:
        raise ConvergenceError(f"NUTS did not converge: max r-hat {max_rhat:.3f} > {rhat_max}",
                               diag)
    return Posterior("nuts", beta_draws.mean(axis=0), beta_draws,
                     _summary(post["lam"].values.ravel()), _summary(post["lam0"].values.ravel()),
                     diag, rep, stats, model_name)


def _fit_fixed(stats, rep, diag, ss, draws, lam, lam0) -> Posterior:
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
    return Posterior("fixed", mu, beta_draws, _fixed_summary(lam), _fixed_summary(lam0), diag,
                     rep, stats)


def _fit_advi(stats, rep, diag, ss, draws, *, max_iterations, learning_rate, window,
              grad_tol, min_windows, init, mode) -> Posterior:
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
    return Posterior("advi", mu[s["beta"]], beta_draws, _summary(lam_draws),
                     _summary(lam0_draws), diag, rep, stats)


def _fit_nuts(stats, rep, diag, ss, draws, *, tune, chains, target_accept, rhat_max) -> Posterior:
    """NUTS on ``aggregator.model.build_model`` (the exact model of method.md section 1)."""
    import pymc as pm

    model, _ = build_model(stats.dim)
    with model:
        pm.set_data({"xtx": stats.xtx, "xty": stats.xty, "yty": np.float64(stats.yty),
                     "n": np.float64(stats.n)})
    mu0, _ = variational_init(stats)
    initvals = {"lam": float(np.exp(mu0[0])), "lam0": float(np.exp(mu0[1])), "beta": mu0[2:]}
    return _nuts(model, initvals, stats, rep, diag, ss, draws, model_name="exact", tune=tune,
                 chains=chains, target_accept=target_accept, rhat_max=rhat_max)
