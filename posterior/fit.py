"""``fit_posterior``: the posterior of method.md sections 1 and 8 fitted to (aggregated,
noisy) statistics. The one place that decides which model is fitted and which inference
strategies run, in which order; each strategy is a call into its own module.

Which *model* is fitted follows from what the statistics say about their noise
(``Statistics.noise``, a public ``dpfed.noise.NoiseDescription``):

- noisy statistics: the **noise-aware** model (``posterior.noise_aware``, method.md
  section 8), which knows the released values are the clipped data's statistics plus
  privacy noise of the stated law and scale, so its intervals include that noise;
- exact statistics (public data, or a non-private baseline): the **exact** model of
  method.md section 1;
- statistics of unknown noise: refused, unless the caller states ``plug_in=True``: the
  **plug-in** fit treats them as exact after ``posterior.repair`` (what the paper did; its
  intervals ignore the privacy noise and are far too narrow on releases).

Methods (``method=``):

- ``"auto"`` (default): ``"laplace"``, and if that refuses the fit (importance sampling keeps
  too few effective draws even from several modes, or no mode is found) the reference
  ``"nuts"`` on the same model (``fallback``); ``Posterior.method`` and
  ``diagnostics["fallback_from"]`` say which ran.
- ``"laplace"``: Laplace approximation with importance sampling
  (``posterior.laplace.laplace_importance``) of the posterior of (beta, log lambda) with
  lambda0 integrated out, checked by its Pareto k-hat (``posterior.psis``); where that is
  above 0.7, HMC preconditioned by the Laplace covariance (``posterior.hmc``). From d = 32
  on, the noise-aware model is first importance sampled from a nested Laplace proposal
  built on its O(d) envelope (``posterior.envelope_importance``; attempt 0), with the same
  checks: the mode's Laplace approximation is not the posterior there (k-hat 1.1-1.4 at
  d = 64) and HMC on the exact density costs seconds.
  Densities in numpy over stacks of points (``posterior.batched``; the compiled twins of
  posterior.noise_aware_jit with ``DPFED_POSTERIOR_BACKEND=numba``). Works for every model.
- ``"nuts"``: PyMC's NUTS on the PyMC definition of the model (the reference;
  ``posterior.nuts``); reports divergences, r-hat and ESS (ArviZ).
- ``"advi"``, ``"fixed"``: the paper's mean-field ADVI (``posterior.advi``; Honkela et al.
  2018 section 4.5) and the fixed-precision closed form (``posterior.closed_form``; paper
  eqs. (3)-(4)), for the exact and plug-in models only (they have no noise-aware form here).

The path of a fit (``fit_posterior``):

1. the model, from the statistics' noise; the response in units of ``y_unit``;
2. the repair, for the plug-in model only (``posterior.repair``; free post-processing of the
   DP release, method.md section 6);
3. ``"laplace"`` (``_fit_laplace``): the model's density and its ridge starting point
   (``posterior.targets``), the Laplace approximation + importance sampling at the mode
   (``posterior.laplace``); if that keeps too few effective draws, modes from extra starting
   points, then a mixture over several modes or adaptive rounds around one; refused ->
   NUTS on the same model (``posterior.nuts``) when ``fallback`` says so. Or ``"nuts"``,
   ``"advi"``, ``"fixed"`` directly;
4. the result back in the caller's units (``posterior.result.in_caller_units``).

All randomness (optimiser noise, MCMC, posterior draws) comes from ``seed``; it is Monte Carlo
noise of the computation, not DP noise, so numpy/PyMC generators are fine here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time

import numpy as np

from dpfed.statistics import Statistics, realisable
from posterior import advi, closed_form, nuts, targets
from posterior.model import DEFAULT_MODE
from posterior.names import FIT_METHODS, METHODS, MODELS, fit_method_options
from posterior.repair import no_repair, repair_statistics
from posterior.result import (ConvergenceError, Posterior, PosteriorError, UnknownNoiseError,
                              draws_summary, in_caller_units)

__all__ = ["fit_posterior", "METHODS", "MODELS", "FIT_METHODS", "fit_method_options"]

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
# Pareto k-hat above which an importance sample is not trusted (posterior.psis; Vehtari et
# al. 2024: 0.7 for the sample sizes used here).
_KHAT_MAX = 0.7
# Modes whose Laplace mass is below this fraction of the largest one's are ignored.
_MIN_MODE_MASS = 1e-3
# HMC (attempt 4, posterior.hmc): chains, warm-up and kept iterations per chain (480 states:
# ESS 430-460 at d = 64, 140-150 at d = 128; more draws than states repeat states, the ESS
# says what they are worth), leapfrog steps; chains that disagree more than this split r-hat
# are refused.
_HMC_CHAINS = 8
_HMC_WARMUP = 40
_HMC_ITERATIONS = 60
_HMC_STEPS = 6
_HMC_RHAT_MAX = 1.05
# Above _HMC_RHAT_MAX but at most this after every extension: kept with a warning (the classic
# cut-off of Gelman & Rubin 1992 / Brooks & Gelman 1998); above it: refused.
_HMC_RHAT_ROUGH = 1.1
# Attempt 0 (posterior.envelope_importance) from this many coefficients on (below it the
# Laplace proposal is good and fast: d = 10 in ~10-40 ms); its sample is kept with at least
# _ENVELOPE_MIN_ESS effective draws and a Pareto k-hat within _KHAT_MAX.
_ENVELOPE_MIN_DIM = 32
_ENVELOPE_MIN_ESS = 200
# When HMC fails too, keep an importance sample with >= _MIN_ESS draws, with a warning.
_KEEP_IMPORTANCE = True
# Runs on from the last states (4x, then 16x the kept iterations) before a refusal.
_HMC_EXTENSIONS = 2
# Chains whose first run misses _HMC_RHAT_MAX but not this (Brooks & Gelman 1998's looser
# 1.2: nearly agreeing) first run on once as the same chains (posterior.hmc.hmc_continue:
# as many kept iterations again, no new warm-up; judged on all kept states) before an
# extension's new warm-up and 4x iterations. bench_fit's d = 128 releases, 20 fits of
# attempt 0b: 6 ran on and then agreed, ~0.6 CPU-s each; before, 5 were extended (~1.3 CPU-s
# each) and 2 never agreed (the old path, 9-16 s) (docs/benchmarks.md).
_HMC_CONTINUE_RHAT = 1.2
# Proposals tried in turn: the default (posterior.laplace), then a wider, heavier-tailed t.
_WIDER_PROPOSALS = ({}, dict(scale=2.0, df=3.0, proposals=16000, max_proposals=16000))


def _seed_sequence(seed) -> tuple[np.random.SeedSequence, int]:
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (2 ** 63))
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    return np.random.SeedSequence(int(seed)), int(seed)


def _priors_of_the_unit(fit):
    """Run ``fit`` with the priors of its response's unit: the bound's (``BOUND_PRIOR``) when
    ``y_unit`` is given (the y bound: every round), else the paper's (``PRIOR``)
    (``posterior.noise_aware.active_prior``; issue 21 item 2, docs/method.md)."""
    @functools.wraps(fit)
    def wrapper(*args, y_unit=None, **kwargs):
        from posterior import noise_aware as na

        with na.priors_in_bound_units(y_unit is not None):
            return fit(*args, y_unit=y_unit, **kwargs)
    return wrapper


@_priors_of_the_unit
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
    ``grad_tol`` posterior sds of the stationary point (``advi.stationarity``), else
    ``ConvergenceError``. ``"nuts"``: ``chains`` chains after ``tune`` steps; r-hat above
    ``rhat_max`` raises ``ConvergenceError``. ``eigen_floor``/``rss_floor``/``project_xty``
    tune the plug-in repair. ``fallback``: what runs when the Laplace fit refuses ("nuts" or
    None: raise ``ConvergenceError``); "auto" means "nuts" for ``method="auto"`` and None for
    an explicit ``method="laplace"``. ``check_first_attempt=False``: the noise-aware fit
    trusts its first importance sample down to 50 effective draws, as before the second and
    third attempts existed (faster; for baselines whose fit quality does not matter).

    ``y_unit``: the unit of the response in which the priors are stated (``in_caller_units``):
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
    # At d >= _ENVELOPE_MIN_DIM under the fit's one BLAS thread too: a two-thread BLAS call
    # leaves OpenBLAS's second thread spinning ~0.1 CPU-s (d = 64: 136 -> 244 ms of process
    # CPU per fit, a core taken from the fit on a loaded machine).
    with _one_blas_thread(stats.dim):
        public_ok = public is None or public.n == 0 or realisable(public)
    if not public_ok:
        # They get their own exact likelihood (posterior.noise_aware), unbounded for these.
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
        fitted, rep = stats, no_repair()
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
                post = nuts.fit_noise_aware(fitted, public, rep, diag, ss, draws,
                                            x_bound=x_bound, tune=tune, chains=chains,
                                            target_accept=target_accept, rhat_max=rhat_max)
            else:
                post = nuts.fit_exact(fitted, rep, diag, ss, draws, tune=tune, chains=chains,
                                      target_accept=target_accept, rhat_max=rhat_max)
    elif method == "fixed":
        post = closed_form.fit_fixed(fitted, rep, diag, ss, draws, lam, lam0)
    elif method == "advi":
        post = advi.fit_advi(fitted, rep, diag, ss, draws, max_iterations=max_iterations,
                             learning_rate=learning_rate, window=window, grad_tol=grad_tol,
                             min_windows=min_windows, init=init, mode=mode)
    elif model == "noise-aware":
        post = nuts.fit_noise_aware(fitted, public, rep, diag, ss, draws, x_bound=x_bound,
                                    tune=tune, chains=chains, target_accept=target_accept,
                                    rhat_max=rhat_max)
    else:
        post = nuts.fit_exact(fitted, rep, diag, ss, draws, tune=tune, chains=chains,
                              target_accept=target_accept, rhat_max=rhat_max)
    object.__setattr__(post, "model", model)
    if not (np.all(np.isfinite(post.beta_mean)) and np.all(np.isfinite(post.beta_draws))):
        raise PosteriorError(f"{method}: the fitted posterior is not finite")
    if unit != 1.0:
        post = in_caller_units(post, unit)
    post.diagnostics["fit_seconds"] = time.perf_counter() - t_start
    return post


def _laplace_mass(lap) -> float:
    """Log of a mode's Laplace estimate of its mass: log density + log sqrt(det cov)."""
    return float(lap.log_density + 0.5 * np.linalg.slogdet(lap.cov)[1])


def _one_blas_thread(d: int):
    """At d >= _ENVELOPE_MIN_DIM, BLAS limited to one thread for the fit (threadpoolctl, a
    base dependency): its matrices are at most a few hundred wide, where OpenBLAS's threads
    cost more than they bring, and on a loaded 2-core machine far more (the d = 64 fit 2-3x
    slower at load 9). One controller per process (``_blas_controller``): a fresh
    ``threadpool_limits`` scans the process's libraries each time (2.1 ms against 0.05 ms)."""
    if d < _ENVELOPE_MIN_DIM:
        return contextlib.nullcontext()
    return _blas_controller().limit(limits=1, user_api="blas")


@functools.lru_cache(maxsize=1)
def _blas_controller():
    """The process's thread pools (threadpoolctl), found once, when the first large fit runs;
    scipy.linalg is imported first so that its BLAS (a library apart from numpy's) is among
    them."""
    import scipy.linalg  # noqa: F401
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _fit_laplace(stats, public, model, rep, diag, ss, draws, x_bound=None,
                 check_first_attempt: bool = True) -> Posterior:
    with _one_blas_thread(stats.dim):
        return _fit_laplace_inner(stats, public, model, rep, diag, ss, draws, x_bound,
                                  check_first_attempt)


def _fit_laplace_inner(stats, public, model, rep, diag, ss, draws, x_bound=None,
                       check_first_attempt: bool = True) -> Posterior:
    """Laplace approximation + importance sampling (posterior.laplace) of the exact or the
    noise-aware model, lambda0 integrated out and drawn given beta afterwards; HMC
    preconditioned by the Laplace approximation where importance sampling does not hold up.

    Attempt 0, noise-aware model at d >= ``_ENVELOPE_MIN_DIM``: importance sampling from the
    nested Laplace proposal on the envelope (``posterior.envelope_importance``; a second try
    with a wider proposal when the first's k-hat is above the threshold), kept with k-hat <=
    ``_KHAT_MAX`` and >= ``_ENVELOPE_MIN_ESS`` effective draws; else attempts 1-4.

    Attempt 1: the Laplace approximation at the mode found from the ridge start, its t
    proposal. It is trusted when its Pareto k-hat (``posterior.psis``) is at most
    ``_KHAT_MAX`` and it keeps at least ``_SETTLED_ESS`` effective draws. Otherwise modes are
    sought from more starting points (``posterior.targets.extra_starts``). With a k-hat
    within the threshold but few effective draws (the target is skewed near one mode, or has
    several): attempt 2, a mixture of wider, heavier-tailed t proposals, one per distinct mode
    (``posterior.laplace.mixture_importance``), or attempt 3, with one mode, the proposal
    moved to the target's weighted moments (``posterior.laplace.adaptive_importance``). If
    the first k-hat is above the threshold (the approximation at the mode is not the
    posterior: at d = 64 its mass lies ~3 sd away in log lambda), or the importance sample
    that attempts 2-3 leave is not reliable (k-hat above the threshold or fewer than
    ``_MIN_ESS`` effective draws), attempt 4: HMC preconditioned by the Laplace covariance
    of the mode with the largest Laplace mass (``posterior.hmc``). The fit is refused
    (``ConvergenceError``) if HMC's chains do not agree after their extensions (split r-hat >
    ``_HMC_RHAT_ROUGH``; between ``_HMC_RHAT_MAX`` and it the fit is kept with a warning) or
    keep fewer than ``_MIN_ESS`` effective draws."""
    from posterior.laplace import (adaptive_importance, distinct_modes, laplace_approximation,
                                   laplace_importance, mixture_importance)

    d = stats.dim
    inp = None
    if model == "noise-aware":
        from posterior import noise_aware as na
        inp = na.noise_aware_inputs(stats, public, x_bound)
    f, fb, u0, newton, neg_hessian = targets.laplace_functions(stats, public, model, x_bound,
                                                               inp)
    rng = np.random.default_rng(ss)
    if model == "noise-aware" and d >= _ENVELOPE_MIN_DIM:
        env, env_fit = _envelope_attempt(inp, fb, u0, draws, rng, diag)
        if env is not None:
            return _posterior_from_draws(env.draws, d, rng, diag, rep, stats, model)
        if env_fit is not None:
            u_draws = _surrogate_hmc_attempt(env_fit, fb, draws, rng, diag)
            if u_draws is not None:
                return _posterior_from_draws(u_draws, d, rng, diag, rep, stats, model)
    res = laplace_importance(f, fb, u0, draws=draws, rng=rng, newton=newton,
                             neg_hessian=neg_hessian)
    attempt, modes = 1, 1
    first_khat = res.khat
    # The exact model's posterior (exact statistics) is close to normal: its first attempt
    # is trusted down to _MIN_ESS; the noise-aware one's only from _SETTLED_ESS.
    settled = min(_SETTLED_ESS, 0.2 * max(res.proposals, 1)) \
        if model == "noise-aware" and check_first_attempt else _MIN_ESS
    use_hmc = False
    found = [res.laplace]
    # Exact statistics with a k-hat between 0.7 and 1 (the importance estimate's mean exists;
    # Vehtari et al. 2024) and enough draws: kept with the warning below. These are the
    # public-only and non-private fits with n close to d, whose (beta, log lambda) posterior
    # is a ridge that HMC and NUTS may not mix on either; the private fit (noise-aware) still
    # goes on to HMC.
    tolerated = (model == "exact" and _KHAT_MAX < res.khat < 1.0 and res.ess >= _MIN_ESS)
    if res.laplace.converged and not tolerated and (res.ess < settled or res.khat > _KHAT_MAX):
        laps = [res.laplace] + [laplace_approximation(f, u, newton=newton,
                                                      neg_hessian=neg_hessian)
                                for u in targets.extra_starts(stats, public, u0, res.laplace)]
        found = distinct_modes(laps)
        modes = len(found)
        if found:
            # Modes with a negligible Laplace mass (below 1e-3 of the largest) are dropped.
            mass = np.array([_laplace_mass(lap) for lap in found])
            found = [lap for lap, m in sorted(zip(found, mass), key=lambda t: -t[1])
                     if m >= mass.max() + np.log(_MIN_MODE_MASS)]
        if res.khat > _KHAT_MAX and len(found) == 1:
            use_hmc = True
        elif len(found) > 1:
            # Attempt 2: several modes, a mixture of wider t proposals, one per mode.
            attempt = 2
            wider = dict(_WIDER_PROPOSALS[1])
            res = mixture_importance(fb, found, draws=draws, rng=rng,
                                     proposals=wider["proposals"], df=wider["df"],
                                     scale=wider["scale"])
        elif len(found) == 1:
            # Attempt 3: one mode, but the target is skewed or ridge-shaped around it: move
            # the proposal to the target's weighted moments (adaptive_importance).
            attempt = 3
            res = adaptive_importance(fb, found[0], draws=draws, rng=rng,
                                      proposals=_ADAPTIVE_PROPOSALS)
            if not res.settled:   # again with 4x the draws per round
                res = adaptive_importance(fb, found[0], draws=draws, rng=rng,
                                          proposals=4 * _ADAPTIVE_PROPOSALS)
        if attempt > 1 and (res.khat > _KHAT_MAX or res.ess < _MIN_ESS) and found:
            use_hmc = True
    diag["importance_attempts"] = attempt
    diag["modes"] = modes
    diag["importance_khat"] = float(first_khat) if attempt == 1 else float(res.khat)
    lap = res.laplace
    diag.update(iterations=lap.iterations, gradient_norm=lap.gradient_norm,
                importance_ess=res.ess, importance_proposals=res.proposals,
                laplace_message=lap.message, optimiser=lap.optimiser,
                newton_iterations=lap.newton_iterations)
    if not lap.converged:
        diag["converged"] = False
        raise ConvergenceError(f"Laplace approximation failed: {lap.message}", diag)
    if use_hmc:
        # Attempt 4: HMC with the Laplace covariance of the heaviest mode as inverse mass.
        top = found[0]
        fgb = targets.gradient_batch(stats, public, model, x_bound)
        h, ok = _hmc_chains(fgb, top.mode, top.cov, rng, diag)
        diag.update(importance_attempts=4)
        rough = (not ok and h.rhat <= _HMC_RHAT_ROUGH and h.ess >= _MIN_ESS)
        if rough:
            # Chains that agree to r-hat 1.1 but not 1.05 after every extension (a weakly
            # identified posterior: n close to d): kept, saying so, rather than failing the
            # round; the intervals are approximate.
            ok = True
            diag.setdefault("warnings", []).append(
                f"hmc: the chains agree only to split r-hat {h.rhat:.3f} (> {_HMC_RHAT_MAX}): "
                "the posterior is weakly identified; intervals are approximate")
        if not ok and _KEEP_IMPORTANCE and res.ess >= _MIN_ESS:
            # Neither sampler is reliable here (several modes, or a ridge: NUTS did no
            # better in the cases seen, r-hat 1.2-1.5). The importance sample, whose
            # mixture/adaptive attempts cover several modes, is kept and the result says
            # plainly that its intervals are approximate, rather than failing a round whose
            # budget is already spent.
            diag.setdefault("warnings", []).append(
                f"neither importance sampling (Pareto k-hat {res.khat:.2f}) nor HMC (split "
                f"r-hat {h.rhat:.2f}) is reliable for this posterior: it is multimodal or far "
                "from normal; the intervals are approximate")
            diag.update(sampler="importance", ess=res.ess, hmc_refused=True)
            diag["converged"] = True
            use_hmc = False
        elif not ok:
            diag["converged"] = False
            raise ConvergenceError(
                f"importance sampling was unreliable (Pareto k-hat {diag['importance_khat']:.2f})"
                f" and HMC kept {h.ess:.0f} effective draws with split r-hat {h.rhat:.3f}: "
                "use method='nuts'", diag)
        diag["converged"] = True
    if use_hmc:
        u_draws = _hmc_draws(h, d, draws, rng)
    else:
        diag.update(sampler="importance", ess=res.ess)
        ok = res.ess >= _MIN_ESS
        diag["converged"] = bool(ok)
        if not ok:
            raise ConvergenceError(
                f"importance sampling kept only {res.ess:.0f} effective draws of "
                f"{res.proposals}: the posterior is far from normal; use method='nuts'", diag)
        u_draws = res.draws
    if diag["sampler"] == "importance" and diag["importance_khat"] > _KHAT_MAX:
        diag.setdefault("warnings", []).append(
            f"importance sampling: Pareto k-hat {diag['importance_khat']:.2f} > {_KHAT_MAX}: "
            "the effective sample size is not reliable; compare with method='nuts'")
    if diag["ess"] < 2 * _MIN_ESS:
        diag.setdefault("warnings", []).append(
            f"{diag['sampler']}: only {diag['ess']:.0f} effective draws; intervals are rough")
    return _posterior_from_draws(u_draws, d, rng, diag, rep, stats, model)


def _hmc_chains(fgb, mode, cov, rng, diag, exact=None, starts=None):
    """Attempt 4's HMC (``posterior.hmc``) with the inverse mass matrix ``cov``, chains started
    around ``mode``. Chains that nearly agree (split r-hat at most ``_HMC_CONTINUE_RHAT``)
    first run on as the same chains for as many iterations again (``hmc_continue``); chains
    that still have not agreed are run on from where they stand, with a new warm-up and 4x
    then 16x the kept iterations (a few d ~ 10 releases with a borderline k-hat needed more
    than 60 iterations: 7 of 448 evaluation cells refused before this).
    ``exact``: the target when ``fgb`` is a surrogate (``hmc``'s docstring); ``starts``: the
    chains' first states (default: draws of N(mode, cov)). Returns (the
    last HMCResult, whether r-hat <= _HMC_RHAT_MAX with >= _MIN_ESS draws); the run is
    recorded in ``diag``."""
    from posterior import hmc as hmc_mod

    d = mode.size - 1
    chol = np.linalg.cholesky(cov)
    if starts is None:
        starts = mode + rng.standard_normal((_HMC_CHAINS, d + 1)) @ chol.T
    evaluations, continued = 0, False
    for extension in range(_HMC_EXTENSIONS + 1):
        h = hmc_mod.hmc(fgb, mode, chol, starts, iterations=_HMC_ITERATIONS * 4 ** extension,
                        warmup=_HMC_WARMUP, rng=rng, steps=_HMC_STEPS, exact=exact)
        evaluations += h.evaluations
        ok = h.rhat <= _HMC_RHAT_MAX and h.ess >= _MIN_ESS
        if not ok and extension == 0 and h.rhat <= _HMC_CONTINUE_RHAT:
            first = h.evaluations
            h = hmc_mod.hmc_continue(h, fgb, mode, chol, iterations=_HMC_ITERATIONS, rng=rng,
                                     steps=_HMC_STEPS, exact=exact)
            evaluations += h.evaluations - first
            continued = True
            ok = h.rhat <= _HMC_RHAT_MAX and h.ess >= _MIN_ESS
        if ok:
            break
        starts = h.samples[-1]
    diag.update(sampler="hmc", ess=h.ess, hmc_rhat=h.rhat,
                hmc_step_size=h.step_size, hmc_acceptance=h.acceptance,
                hmc_evaluations=evaluations, hmc_chains=_HMC_CHAINS,
                hmc_iterations=h.samples.shape[0], hmc_warmup=_HMC_WARMUP,
                hmc_extensions=extension, hmc_continued=continued)
    return h, ok


def _hmc_draws(h, d, draws, rng):
    """``draws`` draws from the pooled chains: all of them, in a random order, repeated as
    needed."""
    pool = h.samples.reshape(-1, d + 1)
    idx = rng.permutation(np.resize(rng.permutation(pool.shape[0]), draws))
    return pool[idx]


def _surrogate_hmc_attempt(env_fit, fb, draws, rng, diag):
    """Attempt 0b, when attempt 0's importance sample fails its checks: HMC whose leapfrog
    follows the envelope's gradient and whose Metropolis step uses the exact density
    (``posterior.hmc``, ``exact=``), preconditioned by the nested proposal's covariance and
    started from its draws resampled by their weights (``EnvelopeImportance.starts``).
    Draws of u, or None (attempts 1-4 then run) when its chains do not agree."""
    lap, fgb_env, starts = env_fit
    sub = {}
    h, ok = _hmc_chains(fgb_env, lap.mode, lap.cov, rng, sub, exact=fb, starts=starts)
    diag["envelope"]["hmc"] = {key: sub[key] for key in ("ess", "hmc_rhat", "hmc_acceptance",
                                                         "hmc_extensions", "hmc_continued")}
    if not ok:
        return None
    diag.update(sub)
    diag.update(importance_attempts=0, modes=1, iterations=lap.iterations,
                gradient_norm=lap.gradient_norm, laplace_message=lap.message,
                optimiser=lap.optimiser, newton_iterations=lap.newton_iterations,
                importance_khat=diag["envelope"]["tries"][-1]["khat"],
                importance_ess=diag["envelope"]["tries"][-1]["ess"],
                importance_proposals=diag["envelope"]["tries"][-1]["proposals"],
                proposal="envelope-hmc", converged=True)
    if h.ess < 2 * _MIN_ESS:
        diag.setdefault("warnings", []).append(
            f"hmc: only {h.ess:.0f} effective draws; intervals are rough")
    return _hmc_draws(h, lap.mode.size - 1, draws, rng)


def _posterior_from_draws(u_draws, d, rng, diag, rep, stats, model) -> Posterior:
    """The Posterior of draws of u = (beta, log lambda); lambda0 drawn given beta."""
    from posterior import noise_aware as na

    beta_draws = u_draws[:, :d]
    lam_draws = np.exp(u_draws[:, d])
    lam0_draws = na.draw_lam0(beta_draws, rng, lam_draws)
    return Posterior("laplace", beta_draws.mean(axis=0), beta_draws, draws_summary(lam_draws),
                     draws_summary(lam0_draws), diag, rep, stats, model)


def _envelope_attempt(inp, fb, u0, draws, rng, diag):
    """Attempt 0 at large d (``posterior.envelope_importance``): importance sampling of the
    exact noise-aware posterior from the nested Laplace proposal built on its O(d) envelope.
    Returns (its ImportanceResult, None) when its Pareto k-hat is at most ``_KHAT_MAX`` and
    it has at least ``_ENVELOPE_MIN_ESS`` effective draws; else (None, (the proposal's
    moments as a Laplace approximation, the envelope's density and gradient, the chains'
    starts)) for attempt 0b, or (None, None) when the envelope gave no proposal; recorded in
    ``diag``."""
    from posterior.envelope_importance import WIDER, envelope_importance, prepare_envelope

    prepared = prepare_envelope(inp, u0)
    tries = []
    res = None
    if prepared is not None:
        for widen in (None, WIDER):
            # A k-hat above _KHAT_MAX: once more with the wider, heavier-tailed mixture.
            res = envelope_importance(prepared, fb, draws=draws, rng=rng, widen=widen,
                                      chains=_HMC_CHAINS)
            if res is None:
                break
            # No draws: screened by the envelope's own weights (d >= SCREEN_MIN_DIM).
            screened = res.draws.shape[0] == 0
            ok = res.khat <= _KHAT_MAX and res.ess >= _ENVELOPE_MIN_ESS and not screened
            tries.append({"ess": float(res.ess), "khat": float(res.khat),
                          "proposals": int(res.proposals), "screened": screened})
            # A wider proposal mends a k-hat a little above the threshold (d = 64: 0.75 ->
            # 0.5), not one above 1 (d = 128: 1.3-2.1 either way): then straight to 0b.
            if ok or res.khat <= _KHAT_MAX or res.khat > 1.0:
                break
    if res is None:
        diag["envelope"] = {"used": False, "reason": "no envelope mode or proposal",
                            "tries": tries}
        return None, None
    diag["envelope"] = {"used": bool(ok), "tries": tries}
    if not ok:
        # Attempt 0b's HMC is preconditioned by the nested proposal's mean and covariance,
        # which follow the marginal of log lambda; from the envelope's joint Laplace
        # approximation instead, 2 of 5 d = 128 releases had chains that never agreed
        # (r-hat 55-87 after both extensions; 5 of 5 agreed from the proposal's).
        # Its chains start from the proposals resampled by their weights (res.starts; the
        # envelope's when screened): EnvelopeImportance's docstring.
        lap = res.laplace
        if res.proposal is not None:
            centre, chol = res.proposal
            lap = dataclasses.replace(lap, mode=centre, cov=chol @ chol.T)
        return None, (lap, prepared.fgb, res.starts)
    lap = res.laplace
    diag.update(importance_attempts=0, modes=1, importance_khat=float(res.khat),
                iterations=lap.iterations, gradient_norm=lap.gradient_norm,
                importance_ess=res.ess, importance_proposals=res.proposals,
                laplace_message=lap.message, optimiser=lap.optimiser,
                newton_iterations=lap.newton_iterations, sampler="importance",
                proposal="nested-envelope", ess=res.ess, converged=True)
    return res, None
