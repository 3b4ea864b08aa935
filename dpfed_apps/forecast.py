"""Is a round worth its budget? A forecast from public inputs only (issue 9 part 4;
method.md section 11).

Before a round, a coordinator knows only public numbers: the sites' n (or planned n), K, d, the
epsilons it considers, the bounds (or "choose them"), the neighbouring relation, and the public
rows with their target and features (round.toml). ``forecast_round`` simulates the round on
auxiliary populations shaped like the public rows (``dpfed.auxiliary``): every site's release
with the mechanism's clipping and Laplace noise (K independent draws summed), plus the exact
statistics of that population's public rows, fitted by ``fit`` (default: the closed form with the
noise-matched ridge the bounds were tuned with; any batched fit function can be plugged in, e.g.
``posterior_fit("laplace")``, the production noise-aware posterior), and scored by Spearman on
held-out rows of the same population. Per epsilon it reports the expected held-out Spearman of
public-only, of private + public and of the non-private fit, and the *gain* of private + public
over public-only: its mean and 10/90 % quantiles over populations x noise draws (what one round
may give) and over populations (its expectation given the population).

Nothing private is read; the simulation's random numbers are numpy's (synthetic data: they
protect nothing; never use this module to release anything). What the forecast assumes is what
``dpfed.auxiliary`` assumes (independent columns shaped like the public ones, a linear signal of
modest R^2): on data that break those assumptions the forecast is off by that much
(docs/evaluation.md, "Forecast vs realised", measures it on GDSC).

**Gaussian and joint rounds** (issue 23 part 3; method.md section 13). ``Mechanism(...,
mechanism="gaussian", delta=..., targets=M, response_rate=r)`` forecasts ONE representative
target of a joint release of M targets (M = 1: a single-target Gaussian round, which the
product runs as a joint round of one target). Its noise is the product's own calibration,
``dpfed.joint_noise.joint_calibration(d, M, ...)`` (the one the site and the aggregator use;
no second formula): per coordinate the Sxy / Syy / count noise of M targets (Gaussian: L2
sensitivity, sd ~ sqrt(M)), the Sxx noise of the shared matrix (independent of M). Rows lack
the target's response MCAR with probability 1 - r; the fit sees what a round's fit sees,
``dpfed.joint_targets.target_statistics`` of the simulated release (r Sxx with the MCAR subset
and count-ratio terms in its noise description) plus the target's exact public statistics.
The gain is per target; the round's (eps, delta) is paid once for all M targets. A secure
joint round of K sites is forecast as one draw on the sum with the variance of the product's
grid calibration (``dpfed.secagg.joint_calibration.calibrate_joint``, noise threshold T = K:
Skellam at ~1.1-1.2 x the central Gaussian's variance), drawn as a Gaussian (Laplace for a
pure-eps round) of that variance, and the aggregator's description of that sum.

No aggregator import at module import time (``posterior_fit`` imports it when called).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from dpfed.auxiliary import AuxiliarySource
from dpfed.preprocess import Preprocessing

from dpfed_apps.forecast_calibration import GAIN_BAND_MARGINS, checked_margins, widen_band

__all__ = ["NoiseScales", "Mechanism", "closed_form_fit", "posterior_fit", "simulate_release",
           "score_cell", "forecast_round", "DEFAULT_RIDGE_C", "summarise",
           "PUBLIC_FIT_POPULATION", "MIXED_POPULATION", "R2_FROM_PUBLIC_POPULATION",
           "CV_SIGNAL_POPULATION"]

#: The auxiliary populations a forecast simulates on when they are learned from the public
#: rows (docs/evaluation.md, issue 21 "Forecasts"): R^2 from its posterior given the public
#: rows under a uniform prior, every row a public row's copy with the continuous columns'
#: jitter (the columns' dependence kept), beta and sigma_y from their posterior given the
#: public rows, and the real public rows as the population's public rows.
PUBLIC_FIT_POPULATION = {"r2_prior": (1.0, 1.0), "r2_from_public": True,
                         "row_bootstrap": 1.0, "row_jitter": True,
                         "condition_on_public": True}

#: The default populations with each population's R^2 drawn from its posterior given the
#: public rows under the default Beta(2, 20) prior (``AuxiliarySource.r2_posterior``); beta,
#: the columns and the populations' own public rows drawn as by default (so the spread over
#: which rows were public stays in the band). A candidate, not adopted: with 10 public rows the
#: prior dominates (mean R^2 0.09-0.10 on UCI sets whose public fit says 0.4-0.65) and the band
#: covers no better than the default (issue 21 item 3, docs/evaluation.md "Band coverage with
#: 100 rounds per data set").
R2_FROM_PUBLIC_POPULATION = {"r2_from_public": True}

#: A two-component mixture of populations: each auxiliary population is a default one or a
#: ``PUBLIC_FIT_POPULATION`` one with probability 1/2 (a hierarchical prior between GDSC's
#: Beta(2, 20) signal and the public rows' own posterior). A candidate, not adopted (covers
#: 0.67-0.73 per data set against the default's 0.64-0.74 with the same test rows; ibid.).
MIXED_POPULATION = ((0.5, None), (0.5, PUBLIC_FIT_POPULATION))

#: Populations whose R^2 is drawn from its posterior given the public rows' leave-one-out
#: Spearman under a flat prior (``dpfed_apps.forecast_signal``; issue 21 item 3, fourth
#: session). A candidate, not adopted: the public-only level is right on the UCI sets and
#: synth (forecast 0.41-0.48 against realised 0.34-0.62) but not on GDSC (0.37 against 0.06),
#: and the band with matched test rows covers 0.59-0.71 (docs/evaluation.md "Forecast
#: populations with the right level (27 Nov, fourth session)").
CV_SIGNAL_POPULATION = {"r2_prior": (1.0, 1.0), "r2_from_cv": True}

#: Ridge c used when the bounds are given rather than chosen (no search to choose c in).
DEFAULT_RIDGE_C = 8.0


@dataclass(frozen=True)
class NoiseScales:
    """Scales of one site's release (per coordinate: Laplace b, or the Gaussian sd when
    ``law`` is "gaussian") and the number of independent draws the summed statistics carry
    (K independent site releases). Joint rounds also carry, per simulated draw, the noise
    description of the target's view (``views``; what the round's fit is given) and the mean
    sd of the view's Sxx noise (``view_xtx_sd``: release noise times r plus the MCAR terms)."""

    xtx: float
    xty: float
    yty: float
    n: float | None
    draws: int = 1
    law: str = "laplace"
    views: tuple = ()
    view_xtx_sd: float | None = None

    def sd(self, part: str) -> float:
        """sd of one coordinate's total release noise in ``part``: sqrt(2 K) b (Laplace) or
        sqrt(K) sigma (Gaussian); 0 for a count released without noise."""
        scale = getattr(self, part)
        if scale is None:
            return 0.0
        return math.sqrt((2.0 if self.law == "laplace" else 1.0) * self.draws) * scale

    def xtx_sd(self) -> float:
        """sd of one Sxx entry's noise as the fit sees it: sqrt(2 K) b_xx (Laplace), sqrt(K)
        sigma_xx (Gaussian), or the joint view's (``view_xtx_sd``)."""
        return self.view_xtx_sd if self.view_xtx_sd is not None else self.sd("xtx")


@dataclass(frozen=True)
class Mechanism:
    """The public parameters of a round's release."""

    epsilon: float
    x_bound: float
    y_bound: float
    budget_split: tuple[float, ...]
    neighbouring: str = "add_remove"
    xtx_sensitivity: str = "exact"
    x_norm_bound: float | None = None   # row-norm bound R (rows projected into the L2 ball)
    #: "laplace" or "gaussian" (issue 23); delta > 0 for gaussian, 0 for laplace.
    mechanism: str = "laplace"
    delta: float = 0.0
    #: 0: today's single-target release (site_node.release). M >= 1: a joint release of M
    #: targets (dpfed.joint_noise), forecast for one of them; gaussian needs M >= 1.
    targets: int = 0
    #: Share of rows that have the forecast target's response (MCAR; joint releases only).
    response_rate: float = 1.0
    #: A secure joint round: (K sites, the most rows of one site). Its noise is the grid
    #: calibration's (``dpfed.secagg.joint_calibration.calibrate_joint`` with T = K: one
    #: Skellam or discrete-Laplace draw on the sum, Skellam ~1.1-1.2 x the central variance).
    secure: tuple | None = None

    def __post_init__(self):
        from dpfed.joint_noise import GAUSSIAN, mechanism_of

        mech = mechanism_of(self.mechanism)
        if isinstance(self.targets, bool) or not isinstance(self.targets, (int, np.integer)) \
                or self.targets < 0:
            raise ValueError("targets must be an integer >= 0")
        if mech == GAUSSIAN and self.targets < 1:
            raise ValueError("a gaussian release is a joint release: targets must be >= 1")
        if mech == GAUSSIAN and not 0.0 < float(self.delta) < 1.0:
            raise ValueError("the gaussian mechanism needs 0 < delta < 1")
        if mech != GAUSSIAN and float(self.delta) != 0.0:
            raise ValueError("delta is for the gaussian mechanism only (laplace is pure "
                             "epsilon-DP)")
        if self.targets >= 1:
            if self.neighbouring != "add_remove":
                raise ValueError("a joint release (targets) releases every count with noise: "
                                 "neighbouring must be add_remove")
            if self.xtx_sensitivity != "exact":
                raise ValueError("a joint release uses the exact Sxx sensitivity")
        r = float(self.response_rate)
        if not (math.isfinite(r) and 0.0 < r <= 1.0):
            raise ValueError("response_rate must be in (0, 1]")
        if r < 1.0 and self.targets < 1:
            raise ValueError("a response rate below 1 needs a joint release (targets >= 1)")

    @property
    def joint(self) -> bool:
        return self.targets >= 1

    def calibration(self, d: int):
        """The product's calibration of this joint release (``dpfed.joint_noise.
        joint_calibration``: what the site draws and the aggregator expects)."""
        from dpfed.joint_noise import joint_calibration

        return joint_calibration(d, int(self.targets), mechanism=self.mechanism,
                                 epsilon=self.epsilon, delta=self.delta,
                                 x_bound=self.x_bound, y_bound=self.y_bound,
                                 budget_split=tuple(self.budget_split),
                                 x_norm_bound=self.x_norm_bound)

    def secure_noise(self, d: int):
        """The NoiseDescription of a secure joint round's sum (all K sites' shares), as the
        aggregator holds it; None for a central release."""
        if self.secure is None:
            return None
        from dpfed.secagg.joint_calibration import calibrate_joint

        k, n_max = (int(v) for v in self.secure)
        grid = calibrate_joint(self.calibration(d), n_max=max(n_max, 1), n_sites=k,
                               noise_threshold=k)
        return grid.noise_description(k)

    def scales(self, d: int, draws: int = 1) -> NoiseScales:
        if self.joint:
            cal = self.calibration(d)
            secure = self.secure_noise(d)
            if secure is not None:
                # One draw on the sum; the law's sd (Gaussian) or b (Laplace) per coordinate.
                f = 1.0 if cal.mechanism == "gaussian" else math.sqrt(0.5)
                sd = {p: f * math.sqrt(secure.variance(p)) for p in ("xtx", "xty", "yty", "n")}
                return NoiseScales(sd["xtx"], sd["xty"], sd["yty"], sd["n"], 1,
                                   law=cal.mechanism)
            return NoiseScales(cal.scales["xtx"], cal.scales["xty"], cal.scales["yty"],
                               cal.scales["n"], draws, law=cal.mechanism)
        if self.x_norm_bound is not None:
            from dpfed.sensitivity import noise_calibration

            cal = noise_calibration(d, self.epsilon, self.x_bound, self.y_bound,
                                    tuple(self.budget_split), neighbouring=self.neighbouring,
                                    xtx_sensitivity=self.xtx_sensitivity,
                                    x_norm_bound=self.x_norm_bound)
            return NoiseScales(cal.xtx_scale, cal.xty_scale, cal.yty_scale, cal.n_scale, draws)
        from dpfed.bounds import unit_scales

        u_xx, u_xy, u_yy, u_n = unit_scales(d, self.epsilon, self.budget_split,
                                            self.neighbouring, self.xtx_sensitivity)
        bx, by = self.x_bound, self.y_bound
        return NoiseScales(u_xx * bx * bx, u_xy * bx * by, u_yy * by * by, u_n, draws)

    def clip_rows(self, x: np.ndarray) -> np.ndarray:
        """Rows clipped like the release clips them (box, then the row-norm ball)."""
        z = np.clip(x, -self.x_bound, self.x_bound)
        if self.x_norm_bound is not None:
            norms = np.sqrt(np.einsum("ij,ij->i", z, z))
            z = z * np.minimum(1.0, self.x_norm_bound / np.where(norms > 0, norms, 1.0))[:, None]
        return z


Fit = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, NoiseScales], np.ndarray]


def closed_form_fit(ridge_c: float = 0.0) -> Fit:
    """The fixed-precision closed form with the noise-matched ridge (``dpfed.bounds``):
    beta = (PSD(Sxx) + r I)^-1 Sxy, r = 1 + c sqrt(2 K) b_xx. Batched: sxx (B, d, d),
    sxy (B, d) -> beta (B, d). ``ridge_c = 0`` is the paper's lambda = lambda0 = 1 form."""

    def fit(sxx, sxy, syy, n, noise: NoiseScales | None) -> np.ndarray:
        from dpfed.bounds import psd_ridge_solve

        r = 1.0 + (ridge_c * noise.xtx_sd() if noise is not None else 0.0)
        return psd_ridge_solve(sxx, np.asarray(sxy)[..., None, :], [r])[0][..., 0, :]

    fit.ridge_c = ridge_c  # type: ignore[attr-defined]
    return fit


def posterior_fit(method: str = "auto", *, draws: int = 1000, seed: int = 0,
                  on_refusal: str = "fallback", **kwargs) -> Fit:
    """The production posterior as a forecast's fit: ``posterior.fit_posterior`` called the
    way a round's FITTING phase calls it (``aggregator.rounds.fitting.fit_round`` ->
    ``aggregator.aggregate.fit``): the summed statistics (release + the public rows' exact
    clipped statistics) carrying the release's ``NoiseDescription``, ``public=`` the exact
    public statistics (their own likelihood and the design prior), ``x_bound=`` the round's
    Bx and ``y_unit=`` its By. ``score_cell`` passes ``public``, ``x_bound`` and ``y_unit``
    (the attribute ``production`` tells it to); predictions use ``beta_mean``. ``method``
    "auto" is a round's default (Laplace + importance sampling, HMC / NUTS fallbacks).
    ``draws`` (1000; a round's default is 5000: the mean of beta only needs a few hundred
    effective draws) and ``seed`` are fit_posterior's. ``public_only(public, y_unit)`` is the
    public-only baseline a round compares with (``aggregator.aggregate.information``).
    ``on_refusal``: "fallback" (a round's behaviour: a refused Laplace fit falls back to NUTS,
    minutes on a loaded machine) or "skip" (``fallback=None``; a refused fit gives a NaN
    beta, left out of the forecast's quantiles and counted in ``fit.refused``).
    Imported when called (not at import)."""
    if on_refusal not in ("fallback", "skip"):
        raise ValueError("on_refusal must be 'fallback' or 'skip'")
    if on_refusal == "skip":
        kwargs["fallback"] = None

    def _noise(noise: NoiseScales | None, b: int):
        from dpfed.noise import EXACT, NoiseDescription

        if noise is not None and noise.views:
            return noise.views[b]          # a joint round: the target's view's description
        return EXACT if noise is None else NoiseDescription.single(
            "laplace", xtx=noise.xtx, xty=noise.xty, yty=noise.yty, n=noise.n,
            draws=noise.draws)

    def fit(sxx, sxy, syy, n, noise: NoiseScales | None, *, public=None, x_bound=None,
            y_unit=None) -> np.ndarray:
        from posterior import ConvergenceError, fit_posterior

        out = []
        for b in range(sxx.shape[0]):
            stats = _statistics(sxx[b], sxy[b], syy[b], n[b], _noise(noise, b))
            try:
                post = fit_posterior(stats, method=method, public=public, x_bound=x_bound,
                                     y_unit=y_unit, draws=draws, seed=seed, **kwargs)
            except ConvergenceError:
                if on_refusal != "skip":
                    raise
                fit.refused += 1
                out.append(np.full(sxx.shape[-1], np.nan))
                continue
            out.append(np.asarray(post.beta_mean))
        return np.array(out)

    def public_only(public, y_unit=None) -> np.ndarray:
        from posterior import fit_posterior

        post = fit_posterior(public, y_unit=y_unit, draws=draws, seed=seed)
        return np.asarray(post.beta_mean)

    fit.production = True  # type: ignore[attr-defined]
    fit.refused = 0  # type: ignore[attr-defined]
    fit.public_only = public_only  # type: ignore[attr-defined]
    fit.__name__ = f"posterior_{method}"
    return fit


def _statistics(sxx, sxy, syy, n, noise):
    """``Statistics`` of one simulated sum: Sxx's upper triangle mirrored (as a release
    mirrors it), n rounded to an integer >= 1 (a release's n is an integer)."""
    from dpfed.statistics import Statistics

    a = np.triu(np.asarray(sxx, dtype=np.float64))
    a = a + np.triu(a, 1).T
    return Statistics(a, np.asarray(sxy, dtype=np.float64), float(syy),
                      max(int(round(float(n))), 1), noise)


def _symmetric_noise(rng, shape, d):
    iu = np.triu_indices(d)
    up = rng.laplace(size=shape + (iu[0].size,))
    e = np.zeros(shape + (d, d))
    e[..., iu[0], iu[1]] = up
    e[..., iu[1], iu[0]] = up
    return e


def simulate_release(rng: np.random.Generator, sites: Sequence[tuple[np.ndarray, np.ndarray]],
                     mech: Mechanism, n_noise: int, *, second_moments=None):
    """``n_noise`` draws of the sum of the K sites' releases (clip, statistics, independent
    Laplace noise per site with the mechanism's scales; numpy noise: synthetic evaluation only).
    Returns (sxx (N,d,d), sxy (N,d), syy (N,), n (N,), NoiseScales with draws = K).
    A joint ``mech`` (targets >= 1): ``simulate_joint_view`` (``second_moments``: the public
    rows' second moments, as the aggregator passes them)."""
    if mech.joint:
        return simulate_joint_view(rng, sites, mech, n_noise, second_moments=second_moments)
    d = sites[0][0].shape[1]
    k = len(sites)
    sc = mech.scales(d, draws=k)
    sxx = np.zeros((d, d))
    sxy = np.zeros(d)
    syy = 0.0
    n_total = 0
    for x, y in sites:
        xc = mech.clip_rows(x)
        yc = np.clip(y, -mech.y_bound, mech.y_bound)
        sxx += xc.T @ xc
        sxy += xc.T @ yc
        syy += float(yc @ yc)
        n_total += x.shape[0]
    e_xx = sum(_symmetric_noise(rng, (n_noise,), d) for _ in range(k))
    e_xy = rng.laplace(size=(k, n_noise, d)).sum(axis=0)
    e_yy = rng.laplace(size=(k, n_noise)).sum(axis=0)
    e_n = rng.laplace(size=(k, n_noise)).sum(axis=0) if sc.n is not None else np.zeros(n_noise)
    return (sxx + sc.xtx * e_xx, sxy + sc.xty * e_xy, syy + sc.yty * e_yy,
            n_total + (sc.n or 0.0) * e_n, sc)


def simulate_joint_view(rng: np.random.Generator, sites: Sequence[tuple[np.ndarray, np.ndarray]],
                        mech: Mechanism, n_noise: int, *, second_moments=None):
    """``n_noise`` draws of what the fit of ONE target of a joint round of ``mech.targets``
    targets sees (module docstring). Each row has the target's response with probability
    ``mech.response_rate`` (MCAR, drawn once per call: a property of the rows, not of the
    noise); per site the exact clipped Sxx over every row, Sxy, Syy and n_j over the rows with
    the response, n_x; noise per part with the scales of ``mech.calibration`` (Gaussian or
    Laplace; counts rounded, as the site's counts are integers; numpy noise: a forecast
    releases nothing), K independent draws summed; then
    ``dpfed.joint_targets.target_statistics`` of the sum, with the noise description the
    aggregator would hold (the calibration's, K draws) and the public ``second_moments``.
    Returns (sxx (N,d,d), sxy (N,d), syy (N,), n (N,), NoiseScales with the views)."""
    from dpfed.joint_statistics import JointStatistics
    from dpfed.joint_targets import target_statistics

    d = sites[0][0].shape[1]
    k = len(sites)
    cal = mech.calibration(d)
    gaussian = cal.mechanism == "gaussian"
    secure = mech.secure_noise(d)
    if secure is not None and k != 1:
        raise ValueError("a secure round is simulated as one block of every site's rows")
    per_draw = mech.scales(d)          # the calibration's scales, or the secure sum's
    iu = np.triu_indices(d)
    up = np.zeros(iu[0].size)
    sxy = np.zeros(d)
    syy = 0.0
    n_x = n_j = 0
    for x, y in sites:
        xc = mech.clip_rows(x)
        yc = np.clip(y, -mech.y_bound, mech.y_bound)
        has = rng.random(len(y)) < mech.response_rate
        up += (xc.T @ xc)[iu]
        sxy += xc[has].T @ yc[has]
        syy += float(yc[has] @ yc[has])
        n_x += len(y)
        n_j += int(has.sum())

    def draws(part, shape):
        """K independent draws of the part's noise, summed (per coordinate)."""
        scale = getattr(per_draw, part)
        if gaussian:
            e = rng.standard_normal((k,) + shape) * scale
        else:
            e = rng.laplace(size=(k,) + shape) * scale
        return np.rint(e).sum(axis=0) if part == "n" else e.sum(axis=0)

    e_xx = draws("xtx", (n_noise, iu[0].size))
    e_xy = draws("xty", (n_noise, d))
    e_yy = draws("yty", (n_noise,))
    e_n = draws("n", (n_noise, 2))
    noise = cal.noise() if secure is None else secure
    for _ in range(k - 1):
        noise = noise + cal.noise()
    out_xx, out_xy, out_yy, out_n, views = [], [], [], [], []
    for b in range(n_noise):
        a = np.zeros((d, d))
        a[iu] = up + e_xx[b]
        a = a + np.triu(a, 1).T
        joint = JointStatistics(a, int(max(n_x + e_n[b, 0], 0)), (sxy + e_xy[b])[None],
                                np.array([syy + e_yy[b]]),
                                np.array([int(max(n_j + e_n[b, 1], 0))]), noise)
        view = target_statistics(joint, 0, x_bound=mech.x_bound,
                                 x_norm_bound=mech.x_norm_bound, second_moments=second_moments)
        out_xx.append(view.xtx)
        out_xy.append(view.xty)
        out_yy.append(view.yty)
        out_n.append(view.n)
        views.append(view.noise)
    view_sd = math.sqrt(float(np.mean([v.variance("xtx") for v in views])))
    sc = NoiseScales(per_draw.xtx, per_draw.xty, per_draw.yty, per_draw.n, k,
                     law=cal.mechanism, views=tuple(views), view_xtx_sd=view_sd)
    return (np.array(out_xx), np.array(out_xy), np.array(out_yy, dtype=np.float64),
            np.array(out_n, dtype=np.float64), sc)


def _spearman_many(x_test, y_test, betas) -> np.ndarray:
    from dpfed.metrics import LinearTestRanks

    return LinearTestRanks(x_test, y_test).spearman_many(betas, constant=0.0)


def score_cell(rng, sites, x_public, y_public, x_test, y_test, mech: Mechanism, fit: Fit,
               n_noise: int) -> dict:
    """Spearman on the test rows of: public-only, private + public (``n_noise`` simulated
    releases of ``sites`` + the exact public statistics, fitted by ``fit``) and non-private
    (every row, unclipped, closed form).

    With the closed form: public-only is the closed form (lambda = lambda0 = 1) of the
    unclipped public rows. With a production fit (``posterior_fit``: attribute
    ``production``) both are what a round computes: the public rows clipped like the private
    ones (``dpfed.statistics.clipped_exact_statistics``, as the coordinator's round spec
    carries them) given to the fit as ``public=`` with ``x_bound`` = Bx and ``y_unit`` = By,
    and public-only = ``fit_posterior(public, y_unit=By)``. A joint ``mech``: the simulated
    release is the target's view (``simulate_joint_view``), its MCAR term bounded by the
    clipped public rows' second moments, as the aggregator bounds it."""
    from dpfed.statistics import clipped_exact_statistics

    d = x_test.shape[1]
    exact = closed_form_fit(0.0)
    production = getattr(fit, "production", False)
    public = clipped_exact_statistics(x_public, y_public, mech.x_bound, mech.y_bound,
                                      mech.x_norm_bound) if production or mech.joint else None
    # A joint round's view bounds its MCAR term by the target's public second moments
    # (aggregator.joint_fit.target_inputs).
    moments = public.xtx / public.n if mech.joint and public.n >= 1 else None
    sxx, sxy, syy, n, sc = simulate_release(rng, sites, mech, n_noise, second_moments=moments)
    if production:
        pub = fit.public_only(public, y_unit=mech.y_bound)[None]
        beta = fit(sxx + public.xtx, sxy + public.xty, syy + public.yty, n + public.n, sc,
                   public=public, x_bound=mech.x_bound, y_unit=mech.y_bound)
    else:
        sxx_p = x_public.T @ x_public
        sxy_p = x_public.T @ y_public
        syy_p = float(y_public @ y_public)
        pub = exact(sxx_p[None], sxy_p[None], np.array([syy_p]), np.array([len(y_public)]), None)
        # With the private release, the public rows clipped like the private ones (as a
        # round's spec carries them, coordinator.roundspec); public-only uses them as they are.
        xc, yc = mech.clip_rows(x_public), np.clip(y_public, -mech.y_bound, mech.y_bound)
        beta = fit(sxx + xc.T @ xc, sxy + xc.T @ yc, syy + float(yc @ yc), n + len(y_public), sc)
    xa = np.vstack([x_public] + [x for x, _ in sites])
    ya = np.concatenate([y_public] + [y for _, y in sites])
    nonp = exact((xa.T @ xa)[None], (xa.T @ ya)[None], np.array([ya @ ya]), np.array([len(ya)]), None)
    beta = beta.reshape(-1, d)
    refused = ~np.all(np.isfinite(beta), axis=1)     # posterior_fit(on_refusal="skip")
    sp = _spearman_many(x_test, y_test, np.vstack([pub, nonp, np.where(refused[:, None], 0.0, beta)]))
    priv = np.array(sp[2:], dtype=np.float64)
    priv[refused] = np.nan
    return {"public_only": float(sp[0]), "nonprivate": float(sp[1]), "private_public": priv}


def summarise(values) -> dict:
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {"mean": None, "q10": None, "q90": None}
    return {"mean": float(v.mean()), "q10": float(np.quantile(v, 0.1)),
            "q90": float(np.quantile(v, 0.9))}


def _r2_mean(source: AuxiliarySource) -> float:
    """Mean R^2 the populations are drawn with (prior, or posterior given the public rows)."""
    if source.r2_from_public:
        grid, w = source.r2_posterior()
        return float(grid @ w)
    a, b = source.r2_prior
    return a / (a + b)


def _simulation_sources(source, population, x_public, y_public, pre, feature_names):
    """The sources a forecast simulates on and their weights: ``population`` None (the
    default ``source``), a dict of ``AuxiliarySource`` options (plus ``r2_from_cv``,
    ``nonlinear_share``, ``residual_df``: the subclasses of ``forecast_signal`` and
    ``forecast_response``), or a mixture: a sequence of
    (weight, options-or-None) pairs, weights > 0 summing to 1 (``MIXED_POPULATION``)."""
    def one(opts):
        if not opts:
            return source
        opts = dict(opts)
        # "r2_from_cv": R^2 given the public rows' leave-one-out Spearman (forecast_signal);
        # "nonlinear_share" / "residual_df": a misspecified response (forecast_response).
        cv = opts.pop("r2_from_cv", False)
        for k in ("nonlinear_share", "residual_df"):
            if k in opts and opts[k] is None:     # None: the option off (a linear population)
                del opts[k]
        misspecified = any(k in opts for k in ("nonlinear_share", "residual_df"))
        cls = AuxiliarySource
        if cv or misspecified:
            from dpfed_apps.forecast_response import source_class

            cls = source_class(cv, misspecified)
        return cls(x_public, y_public, pre, feature_names=feature_names, **opts)

    if population is None or isinstance(population, dict):
        return [one(population)], [1.0]
    pairs = [(float(w), opts) for w, opts in population]
    weights = np.array([w for w, _ in pairs])
    if not pairs or not np.all(weights > 0) or abs(weights.sum() - 1.0) > 1e-9:
        raise ValueError("a population mixture needs (weight, options) pairs with weights > 0 "
                         "summing to 1")
    return [one(opts) for _, opts in pairs], list(weights / weights.sum())


def _split_sizes(n_per_site) -> list[int]:
    if isinstance(n_per_site, (int, np.integer)):
        return [int(n_per_site)]
    sizes = [int(v) for v in n_per_site]
    if not sizes or any(v < 2 for v in sizes):
        raise ValueError("every site needs n >= 2")
    return sizes


def forecast_round(*, x_public, y_public, n_per_site, epsilons: Sequence[float],
                   feature_names: Sequence[str] | None = None,
                   preprocessing: Preprocessing | None = None, bounds="choose",
                   neighbouring: str = "add_remove", xtx_sensitivity: str = "exact",
                   budget_split=None, ridge_c: float | None = None, search_sxx_share: bool = True,
                   n_test: int = 100, n_datasets: int = 20, n_noise: int = 10, seed: int = 0,
                   fit: Fit | None = None, choose_datasets: int = 10, choose_noise: int = 10,
                   omegas=None, row_bootstrap: float | None = None,
                   x_norm_bound="auto", aggregation: str = "independent",
                   population: dict | None = None, mechanism: str = "laplace",
                   delta: float = 0.0, targets: int | None = None,
                   response_rate: float = 1.0,
                   band_margins: tuple[float, float] | None = None) -> dict:
    """Forecast what a round buys, per epsilon (module docstring). Public inputs only.

    ``n_per_site``: an int (one site) or the list of the K sites' n. ``bounds``: "choose"
    (``dpfed.bounds.choose_bounds`` on auxiliary data of the same public rows, for the smallest
    site, with a seed disjoint from the forecast's) or ``(x_bound, y_bound)``. ``fit``: a batched
    fit ``fit(sxx, sxy, syy, n, NoiseScales) -> beta`` (default: ``closed_form_fit`` with the
    chosen ridge c, or ``ridge_c``/``DEFAULT_RIDGE_C`` when bounds are given).
    ``x_norm_bound``: the release's row-norm bound ("auto": 1 when the pre-processing
    normalises rows, ``dpfed.sensitivity.row_norm_bound``; None: coordinate clipping only);
    with it, "choose" uses ``dpfed.bounds.choose_bounds_table`` for the sites' total n and K.
    ``aggregation``: "independent" (each site's release carries its own draw) or "secure"
    (secure aggregation, method.md section 10: the sum of all sites' rows carries one draw,
    forecast as one release of the total n).
    ``population``: options of the ``AuxiliarySource`` the round is *simulated* on (the
    bounds are still chosen on the default source, as a round chooses them), e.g.
    ``PUBLIC_FIT_POPULATION`` (R^2 from the public rows' own fit, rows bootstrapped from the
    public rows with jitter), or a mixture of such options ((weight, options) pairs, e.g.
    ``MIXED_POPULATION``: each population drawn from one component with its weight). The
    option ``r2_from_cv`` (``CV_SIGNAL_POPULATION``) draws R^2 from its posterior given the
    public rows' leave-one-out Spearman (``dpfed_apps.forecast_signal``); the options
    ``nonlinear_share`` (lo, hi) and ``residual_df`` (lo, hi) give the populations a random
    smooth non-linear part of the signal and Student-t residuals
    (``dpfed_apps.forecast_response``; candidates, not adopted: docs/evaluation.md "Forecast
    populations with a misspecified signal"). None: the default source for both.
    ``mechanism`` ("laplace" | "gaussian"), ``delta``, ``targets`` and ``response_rate``: the
    release (``Mechanism``; module docstring). ``targets`` None: 1 for gaussian (the product's
    single-target Gaussian round is a joint round of one target), else today's single-target
    Laplace release. A joint release (targets >= 1) needs ``bounds`` given (the bound search
    is the Laplace single-target round's) and a 4-share ``budget_split`` (default
    ``dpfed.joint_noise.JOINT_DEFAULT_SPLIT``); the gain reported is per target.
    ``band_margins``: (Q_lo, Q_hi), the gain band's calibration margins
    (``dpfed_apps.forecast_calibration``): [q10, q90] is the populations' band widened to
    [q10 - Q_lo, q90 + Q_hi] (None: the calibrated ``GAIN_BAND_MARGINS``; (0, 0): the
    populations' own band, which is too narrow).
    Returns a JSON-ready dict; see ``docs/evaluation.md`` ("dpfed plan") for the keys.
    """
    from dpfed.secure_round import AGGREGATIONS, SECURE
    from dpfed.bounds import choose_bounds, default_split

    x_public = np.asarray(x_public, dtype=np.float64)
    y_public = np.asarray(y_public, dtype=np.float64)
    pre = preprocessing or Preprocessing.from_public_data(x_public, y_public, scale_columns=True)
    source = AuxiliarySource(x_public, y_public, pre, feature_names=feature_names,
                             **({} if row_bootstrap is None else {"row_bootstrap": row_bootstrap}))
    sim_sources, sim_weights = _simulation_sources(source, population, x_public, y_public,
                                                   pre, feature_names)
    sim_source = sim_sources[-1]
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    sizes = _split_sizes(n_per_site)
    # The blocks whose releases carry independent noise draws.
    draw_sizes = [sum(sizes)] if aggregation == SECURE else sizes
    d = source.d
    sigma_x, sigma_y = source.scales()
    if targets is None:
        targets = 1 if mechanism == "gaussian" else 0
    joint = int(targets) >= 1
    if joint and isinstance(bounds, str):
        raise ValueError("a gaussian or joint release needs its bounds given (x_bound, y_bound): "
                         "the bound search is for single-target Laplace rounds")
    if joint:
        from dpfed.joint_noise import JOINT_DEFAULT_SPLIT

        split0 = tuple(budget_split) if budget_split is not None else JOINT_DEFAULT_SPLIT
    else:
        split0 = tuple(budget_split) if budget_split is not None else default_split(neighbouring)
    eps_list = [float(e) for e in epsilons]
    # Checked here, before anything is simulated.
    margins = checked_margins(GAIN_BAND_MARGINS if band_margins is None else band_margins)
    if not eps_list or any(not (math.isfinite(e) and e > 0) for e in eps_list):
        raise ValueError("epsilons must be finite and > 0")
    results = []
    if x_norm_bound == "auto":
        from dpfed.sensitivity import row_norm_bound

        x_norm_bound = row_norm_bound(pre.normalize_rows)
    table = None
    if isinstance(bounds, str) and bounds == "choose" and x_norm_bound is not None:
        from dpfed.bounds import choose_bounds_table

        table = choose_bounds_table(source, [(sum(draw_sizes), len(draw_sizes))], eps_list,
                                    neighbouring=neighbouring, xtx_sensitivity=xtx_sensitivity,
                                    x_norm_bound=x_norm_bound, budget_split=split0,
                                    n_datasets=choose_datasets, seed=seed + 1_000_003,
                                    n_test=n_test)
    for i_eps, eps in enumerate(eps_list):
        if table is not None:
            choice = table[(sum(draw_sizes), len(draw_sizes), eps)]
            bx, by = choice.bounds(sigma_x, sigma_y)
            split, c = choice.budget_split, choice.ridge_c
            om = (choice.omega_x, choice.omega_y)
        elif isinstance(bounds, str):
            if bounds != "choose":
                raise ValueError("bounds must be 'choose' or (x_bound, y_bound)")
            choice = choose_bounds(min(draw_sizes), d, eps, auxiliary=source, neighbouring=neighbouring,
                                   xtx_sensitivity=xtx_sensitivity, budget_split=split0,
                                   ridge="noise_matched", search_sxx_share=search_sxx_share,
                                   n_datasets=choose_datasets, n_noise=choose_noise,
                                   seed=seed + 1_000_003, n_test=n_test, omegas=omegas)
            bx, by = choice.bounds(sigma_x, sigma_y)
            split, c = choice.budget_split, choice.ridge_c
            om = (choice.omega_x, choice.omega_y)
        else:
            bx, by = (float(v) for v in bounds)
            split, c = split0, DEFAULT_RIDGE_C if ridge_c is None else float(ridge_c)
            om = (bx / sigma_x, by / sigma_y)
        mech = Mechanism(eps, bx, by, tuple(split), neighbouring, xtx_sensitivity, x_norm_bound,
                         mechanism, float(delta), int(targets), float(response_rate),
                         (len(sizes), max(sizes)) if joint and aggregation == SECURE else None)
        mech.scales(d)     # a calibration the product would refuse fails here, before any fit
        fit_fn = fit or closed_form_fit(c)
        pub, nonp, priv = [], [], []
        for child in np.random.SeedSequence(seed).spawn(n_datasets):  # same populations per eps
            rng = np.random.default_rng(child)
            src = sim_source if len(sim_sources) == 1 else \
                sim_sources[int(rng.choice(len(sim_sources), p=sim_weights))]
            data = src.sample(rng, sum(draw_sizes), n_test)
            bounds_idx = np.cumsum(draw_sizes)[:-1]
            sites = list(zip(np.split(data.x, bounds_idx), np.split(data.y, bounds_idx)))
            cell = score_cell(rng, sites, data.x_public, data.y_public, data.x_test,
                              data.y_test, mech, fit_fn, n_noise)
            pub.append(cell["public_only"])
            nonp.append(cell["nonprivate"])
            priv.append(cell["private_public"])
        pub_a, priv_a = np.array(pub), np.array(priv)                  # (D,), (D, N)
        gain = priv_a - pub_a[:, None]
        sc = mech.scales(d, draws=len(draw_sizes))
        cal = mech.calibration(d) if joint else None
        g = widen_band(summarise(gain), margins)
        ok = np.isfinite(gain)           # a refused production fit is left out
        g["sd"] = float(np.std(gain[ok])) if ok.any() else None
        g["se_mean"] = float(np.nanstd(np.nanmean(gain, axis=1), ddof=1) / math.sqrt(n_datasets)) \
            if n_datasets > 1 and ok.any() else None
        g["p_positive"] = float(np.mean(gain[ok] > 0)) if ok.any() else None
        g["refused"] = int((~ok).sum())
        results.append({
            "epsilon": eps,
            "epsilon_per_site": eps,
            "epsilon_replace_one_equivalent": (None if mechanism == "gaussian" else
                                               2 * eps if neighbouring == "add_remove" else eps),
            # What each patient in the release pays, once for every target of the round.
            "per_patient": {"epsilon": eps, "delta": float(delta) if joint else 0.0,
                            "gdp_mu": cal.mu if cal is not None and cal.mu else None},
            "bounds": {"x_bound": bx, "y_bound": by, "omega_x": om[0], "omega_y": om[1],
                       "sigma_x": sigma_x, "sigma_y": sigma_y,
                       "chosen": isinstance(bounds, str)},
            "budget_split": list(split),
            "ridge_c": c if fit is None else None,
            "noise_scales": {"xtx": sc.xtx, "xty": sc.xty, "yty": sc.yty, "n": sc.n,
                             "draws": sc.draws, "law": sc.law},
            # sd per coordinate of the summed release's noise (all draws), per part.
            "noise_sd": {p: sc.sd(p) for p in ("xtx", "xty", "yty", "n")},
            "spearman_public_only": summarise(pub_a),
            "spearman_private_public": summarise(priv_a),
            "spearman_nonprivate": summarise(nonp),
            "gain": g,
            "gain_expected": summarise(gain.mean(axis=1)),
        })
    return {
        "d": d, "n_public": source.m, "n_per_site": sizes, "sites": len(sizes),
        "aggregation": aggregation,
        "mechanism": mechanism, "delta": float(delta) if joint else 0.0,
        "targets": max(int(targets), 1), "joint_release": joint,
        "response_rate": float(response_rate),
        "gain_per_target": joint and int(targets) > 1,
        "neighbouring": neighbouring, "xtx_sensitivity": xtx_sensitivity,
        "x_norm_bound": x_norm_bound,
        "fit": "closed_form_noise_matched_ridge" if fit is None else getattr(fit, "__name__", "custom"),
        "n_datasets": n_datasets, "n_noise": n_noise, "n_test": n_test, "seed": seed,
        "auxiliary": {"column_kinds": {str(k): v for k, v in source.column_kinds().items()},
                      "exclusive_groups": [list(g) for g in source.groups],
                      "r2_prior_beta": list(sim_source.r2_prior),
                      "r2_from_public": sim_source.r2_from_public,
                      "r2_mean": float(sum(w * _r2_mean(s) for s, w in
                                           zip(sim_sources, sim_weights))),
                      "mixture_weights": list(sim_weights) if len(sim_sources) > 1 else None,
                      "row_bootstrap": sim_source.row_bootstrap,
                      "row_jitter": sim_source.row_jitter},
        "per_epsilon": results,
        "notes": ("public inputs only; auxiliary populations shaped like the public rows "
                  "(dpfed.auxiliary); gain = Spearman(private+public) - Spearman(public-only) "
                  "on held-out auxiliary rows; quantiles over populations x noise draws "
                  "(gain) and over populations (gain_expected)"
                  + ("; a joint release (dpfed.joint_noise): the gain of ONE target (these "
                     "public rows) in a release of every target, its rows lacking the response "
                     "at random at response_rate, fitted on the aggregator's per-target view "
                     "(dpfed.joint_targets); each patient pays the round's budget once for all "
                     "targets" if joint else "")),
    }
