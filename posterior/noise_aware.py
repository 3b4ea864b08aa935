"""The noise-aware model of released statistics, as pure functions (method.md section 8).

The plug-in fit treats a release ``R = S + E`` as if it were the exact statistics ``S`` of
the clipped rows; its posterior sees n rows' worth of information and none of the noise, so
its intervals are far too narrow and it can lose to the public rows alone. This module
writes down a model of the *release*, with the noise variances that the public
``dpfed.noise.NoiseDescription`` gives, and its log density with an analytic gradient.

Model (parameters theta = (beta, lambda, lambda0) with the priors of method.md section 1):

1. Design. The true Sxx = A is unknown. Its prior is normal, centred at
   A0 = Sxx_public + n_private M (M: the second moments E[x x^T] of the public rows, clipped
   like the private rows (diagonal at most Bx^2, correlations kept), shrunk half-way to
   isotropic), with the Wishart-shaped error of second moments from few rows: independent
   per entry in M's eigenbasis (``DESIGN_PRIOR_WISHART``, ``_wishart_inputs``; the older
   rule, off: sd 0.1 n_private sqrt(M_jj M_kk) per entry, ``design_prior``); its
   release is R_xx = A + E_xx with noise variance v_xx per upper-triangle entry. So
   A | R_xx is normal per entry of that basis (precision-weighted mean A_post, variances
   v_post: a matrix P, whose terms replace the scalar ones below: ``design_error_terms``,
   with the density evaluated at U^T beta). A proper
   prior matters: with a flat one, when E_xx dwarfs A the model lets A be as large as the
   noise and pulls beta to 0 (90 % intervals covered 20-40 % in that regime).
2. Data given A (the normal-approximation of Bernstein & Sheldon 2019, section 4, for a fixed
   design): Sxy = A beta + X^T eps, Syy = beta^T A beta + 2 beta^T X^T eps + eps^T eps with
   eps ~ N(0, I / lambda), so (Sxy, Syy) has mean (A beta, beta^T A beta + n / lambda) and
   covariance [[A/lam, 2 A beta/lam], [., 4 beta^T A beta/lam + 2 n/lam^2]] (the chi-square
   of eps^T eps by its first two moments). In the covariance A is replaced by its public
   estimate Abar, the PSD projection of R_xx (posterior.repair.project_psd).
3. Release noise: R_xy = Sxy + e_xy, R_yy = Syy + e_yy, released n = n + e_n, with the
   variances v_xy, v_yy, v_n of the description (Laplace noise by its first two moments, as
   in the Gaussian approximation that Bernstein & Sheldon compare with their Gibbs sampler).

Exact public statistics (``public``; rows not in any private set, method.md section 3) are
not part of the release: they enter through their own exact likelihood (method.md section 1),
multiplied with the release's (the two sets of rows are independent given beta and lambda).
So when the release carries little information (large noise, many sites) the posterior tends
to the public-only one instead of being pulled to zero by the release's errors-in-variables
term, as it was when the public statistics were fitted as part of a noisy sum (GDSC, 10 sites:
below the public rows alone, docs/evaluation.md). Steps 1-3 describe the private part
R = released total - public statistics, with n the private (released) count.

Integrating out A and the data noise gives a (d+1)-variate normal likelihood whose mean is
linear and whose covariance is quadratic/quartic in beta:

    r1 = R_xy - R_xx beta,   r2 = R_yy - beta^T R_xx beta - n rho,   rho = 1/lambda
    C11 = rho Abar + v_xy I + v_xx (|beta|^2 I + beta beta^T - diag(beta^2))
    C12 = 2 rho Abar beta + v_xx beta * (2 |beta|^2 - beta^2)
    C22 = 4 rho beta^T Abar beta + (2 n + v_n) rho^2 + v_yy + v_xx (2 |beta|^4 - sum beta^4)

The v_xx terms are the errors-in-variables part: noise on Sxx moves the normal equations by
E_xx beta, whose variance grows with |beta|^2. On GDSC-sized problems (d = 10, n = 700,
eps 2) it is the largest error of all, which is why a fit that ignores it is overconfident.
With every variance zero the model is the large-n normal form of the exact model; exact
statistics are fitted with the exact model instead (``log_posterior_exact``).

Both densities are on the unconstrained scale u = (beta, log lambda), with the Gamma
prior's log-Jacobian, and with lambda0 integrated out exactly: beta | lambda0 ~ N(0, I/lambda0)
and lambda0 ~ Gamma(a, b) give beta the multivariate Student-t prior

    p(beta) = Gamma(a + d/2) / Gamma(a) * b^a (2 pi)^(-d/2) (b + |beta|^2 / 2)^-(a + d/2).

Integrating lambda0 out removes the funnel between beta and lambda0 in which a joint mode
collapses (beta -> 0, lambda0 -> infinity) when the data are weak; lambda0 | beta is
Gamma(a + d/2, b + |beta|^2/2) and is drawn afterwards. So the densities equal the marginals
of the PyMC models of ``posterior.model`` (``build_model``, ``build_noise_aware_model``) over
lambda0, up to an additive constant; the tests check that, and the gradients against finite
differences. ``*_batch`` variants evaluate many points at once (no gradient) for importance
sampling.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import numpy as np
from scipy import special

from dpfed.statistics import Statistics

from posterior.repair import project_psd

__all__ = ["NoiseAwareInputs", "noise_aware_inputs", "log_posterior_noise_aware",
           "log_posterior_exact", "log_posterior_noise_aware_batch", "log_posterior_exact_batch",
           "draw_lam0", "psd_estimate", "design_prior", "PRIOR_SHAPE", "PRIOR_RATE", "Prior",
           "PRIORS", "PRIOR", "BOUND_PRIOR", "active_prior", "priors_in_bound_units",
           "prior_params", "prior_value"]

#: Gamma(a, b) prior of lambda and lambda0 (shape, rate), paper section 4.5.
PRIOR_SHAPE = 2.0
PRIOR_RATE = 2.0
_LOG_2PI = float(np.log(2 * np.pi))


@dataclass(frozen=True)
class Prior:
    """The priors of the precisions (method.md section 1 and its variants; docs/method.md).

    lambda ~ Gamma(shape, rate), and lambda0 | lambda ~ Gamma(shape0, c(lambda)) with

    - ``kind="independent"`` (the paper's, section 4.5): c = rate0, lambda0 independent;
    - ``kind="scaled"`` (the conjugate normal-gamma prior, O'Hagan & Forster 2004, Kendall's
      Advanced Theory of Statistics 2B, section 11.8; Gelman et al., BDA3, section 14.8):
      c = rate0 / lambda, i.e. lambda0 = lambda g with g ~ Gamma(shape0, rate0): the
      coefficients' prior scale is a multiple of the residual sd;
    - ``kind="total"`` (a total-variance prior, issue 21 item 2): c = rate0 sp(total - 1 /
      lambda), sp a softplus of width 0.1 total (a floor at small signal). With rate0 =
      shape0 - 1, E[1 / lambda0 | lambda] (the signal's variance for rows with E|x|^2 = 1) is
      total - 1 / lambda: in units of the y bound the clipped response's variance is at most
      ~1, so signal and residual variance share a total instead of being independent; for the
      product's generator 1 / (lambda0 By^2) + 1 / (lambda By^2) = 1 / omega^2 exactly
      (docs/evaluation.md).

    In each case lambda0 is integrated out in closed form: beta | lambda has the Student-t
    density Gamma(a0 + d/2) / Gamma(a0) c^a0 (2 pi)^(-d/2) (c + |beta|^2 / 2)^-(a0 + d/2)."""

    name: str
    shape: float
    rate: float
    shape0: float
    rate0: float
    kind: str = "independent"
    total: float = 1.0
    # The softplus's width as a fraction of ``total`` ("total" only): how soft the knee
    # where the residual variance reaches the total is.
    width: float = 0.1

    @property
    def scaled(self) -> bool:
        """Whether lambda0's prior depends on lambda (draws of lambda0 need lambda)."""
        return self.kind != "independent"

    def params(self, d: int) -> np.ndarray:
        """[log-density constant, a, b, a0, b0, kind code, total, width] for the compiled
        densities."""
        const = (special.gammaln(self.shape0 + 0.5 * d) - special.gammaln(self.shape0)
                 - 0.5 * d * _LOG_2PI + self.shape * np.log(self.rate)
                 - special.gammaln(self.shape))
        code = {"independent": 0.0, "scaled": 1.0, "total": 2.0}[self.kind]
        return np.array([const, self.shape, self.rate, self.shape0, self.rate0, code,
                         self.total, self.width])

    def rate_of_lam0(self, lam):
        """c(lambda) (class docstring), for arrays of lambda."""
        lam = np.asarray(lam, dtype=float)
        return _rate_and_slope(np.log(lam), self.params(1))[0]


def _rate_and_slope(a, pr):
    """c(lambda) and d log c / d log lambda at a = log lambda (``Prior``)."""
    rt0, code, total, width = pr[4], pr[5], pr[6], pr[7]
    a = np.asarray(a, dtype=float)
    if code == 0.0:
        return np.full_like(a, rt0), np.zeros_like(a)
    if code == 1.0:
        return rt0 * np.exp(-a), -np.ones_like(a)
    tau = width * total
    x = (total - np.exp(-a)) / tau
    sp = tau * np.logaddexp(0.0, x)
    sig = special.expit(x)
    return rt0 * sp, sig * np.exp(-a) / sp


#: Named priors (``PRIOR`` is the one every fit uses). "gamma": the paper's, both Gamma(2, 2).
#: "scaled": the normal-gamma prior in units of By, lambda ~ Gamma(2, 1) (residual variance
#: 1 / lambda: mean 1, median 0.6 By^2), g ~ Gamma(2, 2). "total": signal and residual variance
#: share total = 0.5 By^2 (the clipped response's variance at omega_y 1-1.4), lambda ~
#: Gamma(2, 0.5) (residual variance median 0.3 By^2), lambda0 | lambda ~ Gamma(2, total -
#: 1 / lambda). Measured in docs/evaluation.md ("Priors that know the bound").
PRIORS = {
    "gamma": Prior("gamma", PRIOR_SHAPE, PRIOR_RATE, PRIOR_SHAPE, PRIOR_RATE),
    "scaled": Prior("scaled", 2.0, 1.0, 2.0, 2.0, "scaled"),
    "total": Prior("total", 2.0, 0.5, 2.0, 1.0, "total", 0.5),
    # "bound": the paper's shapes, rates for a response in units of its bound (issue 21 item
    # 2): the clipped response's variance is at most 1 By^2 and 0.25-2 / omega_y^2 for the
    # bound search's omega_y, so residual and signal variance are each ~0.3 By^2 (median of
    # 1 / Gamma(2, 0.5)), where Gamma(2, 2) said ~1.2 By^2 each (4x too wide).
    "bound": Prior("bound", 2.0, 0.5, 2.0, 0.5),
}
#: The priors of a fit whose response is in its own units (``fit_posterior(y_unit=None)``):
#: the paper's.
PRIOR = PRIORS["gamma"]
#: The priors of a fit whose response is in units of its y bound (``y_unit=By``: every
#: round, ``aggregator.aggregate.fit``, robust_private in the evaluation): "bound" (issue 21
#: item 2; with the count's term and the Wishart-shaped design, 90 % intervals in the
#: product's own setting cover 0.86-0.96 in all 36 cells of the grid, the paper's Gamma(2, 2)
#: 0.82-1.00). Its cost: GDSC private / non-private at eps 2 0.83 -> 0.81 (docs/evaluation.md
#: "The design's error with the Wishart shape").
BOUND_PRIOR = PRIORS["bound"]

_IN_BOUND_UNITS = contextvars.ContextVar("dpfed_priors_in_bound_units", default=False)


def active_prior() -> Prior:
    """``BOUND_PRIOR`` inside ``priors_in_bound_units(True)`` (a fit with y_unit), else
    ``PRIOR``. Read when a density or model is built, so each fit sees one prior."""
    return BOUND_PRIOR if _IN_BOUND_UNITS.get() else PRIOR


@contextlib.contextmanager
def priors_in_bound_units(in_bound_units: bool):
    """Within this block (this thread / task), ``active_prior`` is the bound's prior if
    ``in_bound_units``, else the paper's (``posterior.fit.fit_posterior`` wraps each fit)."""
    token = _IN_BOUND_UNITS.set(bool(in_bound_units))
    try:
        yield
    finally:
        _IN_BOUND_UNITS.reset(token)


def prior_params(d: int) -> np.ndarray:
    """``active_prior().params(d)``: what the compiled and batched densities read."""
    return active_prior().params(d)

# Abar's eigenvalues are floored at this fraction of the largest |eigenvalue| (and at the
# noise sd of one entry, below which the release cannot tell an eigenvalue from zero).
_RELATIVE_FLOOR = 1e-3


@dataclass(frozen=True)
class NoiseAwareInputs:
    """Released values and public noise variances the noise-aware density needs."""

    rxx: np.ndarray          # A_post: the design's posterior mean given its release and prior
    rxy: np.ndarray
    ryy: float
    n: float
    abar: np.ndarray
    v_xx: float              # v_post: the design's remaining variance per entry; a (d, d)
    #                          matrix of per-entry variances in ``wishart``'s rotated inputs
    v_xy: float
    v_yy: float
    v_n: float
    # Exact public statistics, fitted with their own exact likelihood (module docstring);
    # None: no public rows.
    pxx: np.ndarray | None = None
    pxy: np.ndarray | None = None
    pyy: float = 0.0
    pn: float = 0.0
    # Mc = (1 - w) o M: how the design's posterior mean moves with the private count, whose
    # noise (variance v_n) then enters the likelihood as one rank-one term (``count_vector``).
    # None: the count's noise enters through n rho only (the model before issue 21's fix).
    mc: np.ndarray | None = None
    # The Wishart-shaped design prior (``DESIGN_PRIOR_WISHART``): (U, inputs in U's basis).
    # The densities evaluate at beta' = U^T beta on the rotated inputs, whose v_xx is the
    # matrix of per-entry variances (independent there); these fields stay in the original
    # basis with v_xx their mean, for readers that need a scalar (starting points, envelope).
    wishart: tuple | None = None

    def count_vector(self, beta: np.ndarray, rho):
        """(u1, u2) with r = R - mean(n) moving by -e_n (u1, u2) under an error e_n of the
        released private count: u1 = Mc beta (the design mean n M), u2 = beta^T Mc beta + rho
        (that and the n rho of Syy's mean). Works on one point or a stack (rows)."""
        if self.mc is None:
            u1 = np.zeros_like(beta)
            return u1, np.asarray(rho, dtype=float) + 0.0
        u1 = beta @ self.mc
        return u1, np.sum(beta * u1, axis=-1) + rho

    def public_parts(self) -> tuple[np.ndarray, np.ndarray, float, float]:
        """(Sxx, Sxy, Syy, n) of the public rows, zeros when there are none."""
        d = self.dim
        if self.pxx is None:
            return np.zeros((d, d)), np.zeros(d), 0.0, 0.0
        return self.pxx, self.pxy, float(self.pyy), float(self.pn)

    @property
    def dim(self) -> int:
        return self.rxy.shape[0]


def psd_estimate(rxx: np.ndarray, v_xx: float) -> np.ndarray:
    """Abar: R_xx with eigenvalues floored (post-processing of the release, free of privacy
    cost; posterior.repair.project_psd). The floor is the larger of 1e-3 max|eigenvalue| and
    the sd of one entry's noise."""
    def floor(w: np.ndarray) -> float:
        scale = float(np.max(np.abs(w))) if w.size else 0.0
        return max(_RELATIVE_FLOOR * scale, float(np.sqrt(v_xx)), 1e-12)

    return project_psd(rxx, floor)[0]


#: Relative prior sd of the private design's second moments (``design_prior``). 0.1: on
#: auxiliary populations shaped like GDSC public lines (public lines of drugs outside the
#: evaluation set; no test rows) the posterior mean predicted held-out rows better with 0.1
#: than with 0.3 by 0.012 (replace-one) and 0.014 (add/remove) Spearman, se 0.002, paired over
#: 576 releases; 0.05 was no better than 0.1. Coverage on data from the model's prior
#: (benchmarks/bench_coverage.py) stayed within 0.85-0.95 in all 36 cells with either value.
#: It is a strong statement about the design (10 public rows estimate second moments only to
#: ~30 %): the intervals on binary GDSC features may be somewhat narrow (docs/method.md).
DESIGN_PRIOR_RELATIVE_SD = 0.1

#: If set, the relative sd is this / sqrt(d) instead of ``DESIGN_PRIOR_RELATIVE_SD``: with
#: independent entry errors of relative sd s, the design's action A beta is off by about
#: s sqrt(d) of itself, so a fixed s states a worse design the larger d is; this states the
#: action's relative error instead. Off (None): measured as part of issue 21 item 2's
#: candidate (0.1 sqrt(5): 0.1 at d = 5, 0.071 at d = 10; docs/evaluation.md "The count's
#: noise and the bound's priors"), where it fixed d = 10, K = 10 (0.96 -> 0.93) but
#: under-covered d = 10, n = 2000, K = 1 (0.83): a constant per-entry sd is the wrong shape.
DESIGN_PRIOR_ACTION_SD: float | None = None

#: Whether ``design_prior`` adds the released count's noise to each entry's variance
#: (M_jk^2 v_n: the prior mean n_priv M takes n_priv from the released n, whose noise is
#: public). Off (the default): on the coverage grid it moved the d = 5 cells that under-cover
#: into the band but pushed d = 10 further above it with the paper's priors; with the "scaled"
#: prior it is the candidate of docs/evaluation.md ("Priors that know the bound").
DESIGN_PRIOR_COUNT_NOISE = False

#: Whether the released count's noise enters the likelihood as the rank-one term it is
#: (``NoiseAwareInputs.mc``, ``count_vector``): an error e_n of the private count moves the
#: design's prior mean by e_n M and Syy's mean by e_n rho together, so (R_xy, R_yy) share one
#: error along (Mc beta, beta^T Mc beta + rho). Off (the default): only n rho carries it
#: (v_n rho^2). Where the count's noise is large (d 5, n 100, eps 0.5, K 10: sd 447 for
#: n = 100) the fit then takes the noisy count's design at face value: 0.72-0.76 coverage
#: with the bound's priors, 0.86-0.90 with the term (docs/evaluation.md). On (issue 21 item 2).
COUNT_IN_LIKELIHOOD = True


#: Whether the design prior's error has the shape it has (issue 21 item 2): the private Sxx is
#: n_priv M plus the error of M, second moments estimated from n_pub public rows, plus the
#: private rows' own sampling error. For rows with second moments M both are Wishart-shaped,
#: Cov(S_ij, S_kl) proportional to M_ik M_jl + M_il M_jk (Anderson 2003, An Introduction to
#: Multivariate Statistical Analysis, section 7.3), so in M's eigenbasis (M = U diag(l) U^T)
#: the entries are independent with variance c l_i l_j (1 + delta_ij), c = kappa n_priv^2 /
#: n_pub + n_priv, kappa = ``DESIGN_PRIOR_WISHART_SHARE``. The release's noise (iid per entry) is treated as iid there too; each
#: entry is then updated on its own and the remaining variances are kept as a matrix (not
#: averaged), so the design's error acts on beta as it would: along M's large directions.
#: The per-entry rule (False) states errors of relative sd 0.1 independent per entry in the
#: original basis, whose action on beta is 1.4-2x the realised one at d = 10: one constant
#: suited either the K = 1 or the K = 10 cells of the grid, not both (docs/evaluation.md
#: "The count's noise and the bound's priors"). On (issue 21 item 2).
DESIGN_PRIOR_WISHART = True
#: kappa. Normal theory with the half-way shrinkage says 0.25 (a quarter of M_hat's error
#: variance); on the coverage grid 0.25 over-covers (0.97-0.98 at d = 10, n = 2000), 0.05 and
#: 0.08 under-cover K = 1 (0.76-0.86), 0.1 covers 0.86-0.96 in all 36 cells (docs/evaluation.md
#: "The design's error with the Wishart shape"). The unit-norm rows of the grid have smaller
#: fourth moments than normal ones, and the shrinkage target (isotropic) is right for them.
DESIGN_PRIOR_WISHART_SHARE = 0.1


def design_moments(stats: Statistics, public: Statistics | None,
                   x_bound: float | None = None) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(M, Sxx_public, iso, n_priv): the second moments that describe one private row
    (``design_prior``), the public rows' Sxx (zeros without them), M's mean diagonal and the
    private count the prior assumes."""
    d = stats.dim
    n_pub = public.n if public is not None else 0
    n_priv = max(float(stats.n) - n_pub, 1.0)
    if public is not None and public.n >= 2:
        m = public.xtx / public.n
        if x_bound is not None:
            # Scale feature j by sqrt(min(1, Bx^2 / M_jj)): the diagonal becomes
            # min(M_jj, Bx^2), the correlations stay (a feature never seen is left alone).
            diag = np.diag(m)
            shrink = np.sqrt(np.minimum(1.0, float(x_bound) ** 2
                                        / np.where(diag > 0, diag, np.inf)))
            m = m * np.outer(shrink, shrink)
        iso = np.trace(m) / d
        m = 0.5 * m + 0.5 * iso * np.eye(d)
        base = np.array(public.xtx, dtype=float)
    else:
        iso = max(float(np.mean(np.diag(stats.xtx))) / max(float(stats.n), 1.0), 1e-12)
        if x_bound is not None:
            iso = min(iso, float(x_bound) ** 2)
        m = iso * np.eye(d)
        base = np.zeros((d, d))
    return m, base, float(iso), n_priv


def design_prior(stats: Statistics, public: Statistics | None,
                 x_bound: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Prior mean A0 and per-entry variance of the true Sxx (module docstring, step 1).

    The private rows were clipped to [-x_bound, x_bound] before their Sxx was computed, the
    public rows were not; so the public second moments M are clipped too before they
    describe a private row: each diagonal entry to at most x_bound^2, the correlations kept
    (``x_bound=None``: no clipping known). Reads only public quantities: the exact public
    statistics, the public bound and the released n (with no public rows, the released
    diagonal of Sxx sets an isotropic scale: post-processing)."""
    d = stats.dim
    m, base, iso, n_priv = design_moments(stats, public, x_bound)
    diag = np.maximum(np.diag(m), 1e-12 * max(iso, 1e-300))
    rel = DESIGN_PRIOR_RELATIVE_SD if DESIGN_PRIOR_ACTION_SD is None \
        else DESIGN_PRIOR_ACTION_SD / np.sqrt(d)
    sd = rel * n_priv * np.sqrt(np.outer(diag, diag))
    var = sd * sd
    if DESIGN_PRIOR_COUNT_NOISE:
        var = var + count_noise_variance(m, stats)
    return base + n_priv * m, var


def count_noise_variance(m: np.ndarray, stats: Statistics) -> np.ndarray:
    """Per-entry variance that the released count's noise adds to the design prior's mean
    n_priv M (``DESIGN_PRIOR_COUNT_NOISE``): M_jk^2 v_n, v_n the count's public noise variance
    (zero when the statistics carry no noise description)."""
    v_n = stats.noise.variances()["n"] if stats.noise is not None else 0.0
    return m * m * float(v_n)


def noise_aware_inputs(stats: Statistics, public: Statistics | None = None,
                       x_bound: float | None = None) -> NoiseAwareInputs:
    """The inputs of the noise-aware density for statistics with a known, noisy description;
    ``public`` are the exact public statistics included in ``stats`` (None if there are none:
    they are then split off and get their own exact likelihood), ``x_bound`` the public
    clipping bound of the private features (``design_prior``)."""
    if stats.noise is None:
        raise ValueError("the noise of these statistics is unknown")
    v = stats.noise.variances()
    if DESIGN_PRIOR_WISHART and v["xtx"] > 0:
        return _wishart_inputs(stats, public, x_bound, v)
    a0, va = design_prior(stats, public, x_bound)
    has_public = public is not None and public.n > 0
    rxx, rxy, ryy, n = _private_parts(stats, public)
    if has_public:
        a0 = a0 - public.xtx
    # d A0 / d n_priv = M: the private prior mean is n_priv M with n_priv = max(n, 1).
    m_count = a0 / max(n, 1.0)
    if v["xtx"] > 0:
        w = va / (va + v["xtx"])
        a_post = w * rxx + (1 - w) * a0
        v_post = float(np.mean((va * v["xtx"] / (va + v["xtx"]))[np.triu_indices(stats.dim)]))
        mc = (1 - w) * m_count
    else:
        a_post, v_post, mc = rxx, 0.0, None
    a_post = 0.5 * (a_post + a_post.T)
    pub = (np.array(public.xtx), np.array(public.xty), float(public.yty), float(public.n)) \
        if has_public else (None, None, 0.0, 0.0)
    mc = 0.5 * (mc + mc.T) if (COUNT_IN_LIKELIHOOD and mc is not None and v["n"] > 0) else None
    return NoiseAwareInputs(a_post, rxy, ryy, n, psd_estimate(a_post, v_post), v_post,
                            v["xty"], v["yty"], v["n"], *pub, mc=mc)


def _private_parts(stats: Statistics, public: Statistics | None):
    """(R_xx, R_xy, R_yy, n) of the release's private part: the total minus the exact
    public statistics (all of it without public rows)."""
    if public is not None and public.n > 0:
        return (np.array(stats.xtx) - public.xtx, np.array(stats.xty) - public.xty,
                float(stats.yty) - float(public.yty), float(stats.n) - float(public.n))
    return np.array(stats.xtx), np.array(stats.xty), float(stats.yty), float(stats.n)


def _wishart_inputs(stats: Statistics, public: Statistics | None, x_bound: float | None,
                    v: dict) -> NoiseAwareInputs:
    """``noise_aware_inputs`` with the Wishart-shaped design prior (``DESIGN_PRIOR_WISHART``).

    In M's eigenbasis U the private design's prior is independent per entry: mean n_priv l_i
    on the diagonal, variance c l_i l_j (1 + delta_ij). Each rotated entry of the release's
    private R_xx (noise variance v_xx, treated as iid in the rotated basis too: exact off the
    diagonal for a rotation-invariant noise, within a factor 2 on it) is combined with it on
    its own, and the remaining variances stay a matrix. The inputs are built in U's basis
    (beta' = U^T beta; the prior of beta is isotropic, so the density is the same function
    of beta' as of beta) and kept in ``wishart``; the returned inputs hold the same design in
    the original basis for readers that need one scalar variance."""
    d = stats.dim
    has_public = public is not None and public.n > 0
    m, _, iso, n_priv = design_moments(stats, public, x_bound)
    lam, u = np.linalg.eigh(0.5 * (m + m.T))
    lam = np.maximum(lam, 1e-12 * max(iso, 1e-300))
    n_pub = float(public.n) if has_public else 0.0
    kappa = DESIGN_PRIOR_WISHART_SHARE / n_pub if n_pub >= 2 else DESIGN_PRIOR_RELATIVE_SD ** 2
    c = kappa * n_priv ** 2 + n_priv
    pv = c * np.outer(lam, lam) * (1.0 + np.eye(d))
    rxx, rxy, ryy, n = _private_parts(stats, public)
    vxx = float(v["xtx"])
    rot = u.T @ rxx @ u
    a0 = np.diag(n_priv * lam)
    w = pv / (pv + vxx)
    a_post = w * rot + (1.0 - w) * a0
    a_post = 0.5 * (a_post + a_post.T)
    p_post = pv * vxx / (pv + vxx)
    v_mean = float(np.mean(p_post[np.triu_indices(d)]))
    abar = psd_estimate(a_post, v_mean)
    # d A0 / d n_priv = diag(l): the count's term (COUNT_IN_LIKELIHOOD), as in the rule by entry.
    mc = (1.0 - w) * np.diag(lam) if (COUNT_IN_LIKELIHOOD and v["n"] > 0) else None
    if has_public:
        pub = (np.array(public.xtx, dtype=float), np.array(public.xty, dtype=float),
               float(public.yty), float(public.n))
        pub_rot = (u.T @ pub[0] @ u, u.T @ pub[1], pub[2], pub[3])
    else:
        pub = pub_rot = (None, None, 0.0, 0.0)
    inner = NoiseAwareInputs(a_post, u.T @ rxy, ryy, n, abar, p_post, v["xty"], v["yty"],
                             v["n"], *pub_rot, mc=mc)

    def back(x):
        # Exactly symmetric, as released matrices are (``Statistics`` checks it).
        if x is None:
            return None
        y = u @ x @ u.T
        return 0.5 * (y + y.T)

    return NoiseAwareInputs(back(a_post), rxy, ryy, n, back(abar), v_mean, v["xty"],
                            v["yty"], v["n"], *pub, mc=back(mc), wishart=(u, inner))


def rotate_in(us: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Rows (beta, log lambda) -> (U^T beta, log lambda) (``NoiseAwareInputs.wishart``)."""
    out = np.array(us, dtype=float, copy=True)
    d = u.shape[0]
    out[..., :d] = out[..., :d] @ u
    return out


def rotate_gradient_out(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """A gradient in (beta', log lambda) -> in (beta, log lambda): d/dbeta = U d/dbeta'."""
    out = np.array(g, dtype=float, copy=True)
    d = u.shape[0]
    out[..., :d] = out[..., :d] @ u.T
    return out


def design_error_terms(beta: np.ndarray, p: np.ndarray):
    """The design error's part of C for independent symmetric entries of variances p (a
    (d, d) matrix, ``NoiseAwareInputs.wishart``; or one variance for all), at rows ``beta``
    ((m, d) or (d,)): E beta has
    Var (E beta)_i = (p beta^2)_i and Cov((E beta)_i, (E beta)_k) = p_ik beta_i beta_k (i != k);
    with beta^T E beta: beta_i (2 (p beta^2)_i - p_ii beta_i^2) and variance
    2 (beta^2)^T p beta^2 - sum_i p_ii beta_i^4. Returns (C11's diagonal addition beyond
    p o beta beta^T's own diagonal, c12, c22); the scalar p = v reduces to the module
    docstring's v_xx terms."""
    b2 = beta * beta
    if np.ndim(p) == 0:
        # One variance v for every entry: v (|b|^2 - b_i^2), v b (2 |b|^2 - b^2),
        # v (2 |b|^4 - sum b^4).
        v = float(p)
        s = np.einsum("...i,...i->...", beta, beta)[..., None]
        return (v * (s - b2), v * beta * (2.0 * s - b2),
                v * (2.0 * s[..., 0] ** 2 - np.einsum("...i,...i->...", b2, b2)))
    pb2 = b2 @ p
    pd = np.diag(p)
    diag_add = pb2 - pd * b2
    c12 = beta * (2.0 * pb2 - pd * b2)
    c22 = 2.0 * np.einsum("...i,...i->...", b2, pb2) - np.einsum("...i,...i->...", pd * b2, b2)
    return diag_add, c12, c22


def prior_value(beta, a, pr, grad: bool = False):
    """Log prior of (beta, log lambda) rows (``Prior``'s density with its log-Jacobian) for
    parameters ``pr = Prior.params(d)``; with ``grad``, also its gradient."""
    const, sh, rt, sh0 = pr[0], pr[1], pr[2], pr[3]
    d = beta.shape[-1]
    s = np.einsum("...i,...i->...", beta, beta)
    lam = np.exp(a)
    c, dlc = _rate_and_slope(a, pr)
    den = c + 0.5 * s
    kk = sh0 + 0.5 * d
    val = const + sh0 * np.log(c) - kk * np.log(den) + sh * a - rt * lam
    if not grad:
        return val, None
    gb = -kk * beta / np.asarray(den)[..., None]
    ga = dlc * (sh0 - kk * c / den) + sh - rt * lam
    return val, (gb, ga)


def _log_prior(u: np.ndarray, d: int) -> tuple[float, np.ndarray]:
    """Student-t prior of beta (lambda0 integrated out) and the Gamma prior on lambda with the
    log-transform Jacobian (``Prior``); gradient in u = (beta, log lambda)."""
    val, (gb, ga) = prior_value(u[:d], u[d], prior_params(d), grad=True)
    g = np.empty(d + 1)
    g[:d] = gb
    g[d] = ga
    return float(val), g


# |log lambda| beyond this is outside any data's support (lambda = e^60): treated as zero
# density so that an optimiser's trial step cannot overflow exp().
_MAX_LOG_LAMBDA = 60.0


def _in_range(u: np.ndarray, d: int) -> bool:
    return bool(np.all(np.isfinite(u)) and abs(u[d]) <= _MAX_LOG_LAMBDA)


def _log_prior_batch(u: np.ndarray, d: int) -> np.ndarray:
    return prior_value(u[:, :d], u[:, d], prior_params(d))[0]


def draw_lam0(beta: np.ndarray, rng: np.random.Generator,
              lam: np.ndarray | None = None) -> np.ndarray:
    """lambda0 | beta (, lambda) ~ Gamma(a0 + d/2, rate c + |beta|^2/2), c = b0 lambda^-k
    (``Prior``), one per row of ``beta``; ``lam`` (the rows' lambda) is needed when scaled."""
    d = beta.shape[1]
    p = active_prior()
    if p.scaled and lam is None:
        raise ValueError("this prior draws lambda0 given lambda: pass lam")
    c = p.rate_of_lam0(lam) if p.scaled else p.rate0
    rate = c + 0.5 * np.einsum("ij,ij->i", beta, beta)
    return rng.gamma(p.shape0 + 0.5 * d, 1.0 / rate)


def log_posterior_exact(u: np.ndarray, stats: Statistics) -> tuple[float, np.ndarray]:
    """Log joint density of method.md section 1 at u (exact statistics), and its gradient."""
    d = stats.dim
    if not _in_range(u, d):
        return -np.inf, np.zeros(d + 1)
    val, g = _log_prior(u, d)
    beta, a = u[:d], u[d]
    lam = np.exp(a)
    sxx_b = stats.xtx @ beta
    quad = float(beta @ sxx_b - 2 * beta @ stats.xty + stats.yty)
    val += 0.5 * stats.n * (a - _LOG_2PI) - 0.5 * lam * quad
    g[:d] += -lam * (sxx_b - stats.xty)
    g[d] += 0.5 * stats.n - 0.5 * lam * quad
    return float(val), g


def _likelihood_parts(beta, rho, inp: NoiseAwareInputs):
    """Residual r and covariance C of the noise-aware likelihood (module docstring)."""
    d = inp.dim
    s = float(beta @ beta)
    b2 = beta * beta
    ab = inp.abar @ beta
    rb = inp.rxx @ beta
    r = np.empty(d + 1)
    r[:d] = inp.rxy - rb
    r[d] = inp.ryy - beta @ rb - inp.n * rho
    c = np.empty((d + 1, d + 1))
    # The design's error (one variance, or per entry: ``NoiseAwareInputs.wishart``).
    dg, c12v, c22 = design_error_terms(beta, inp.v_xx)
    c11 = rho * inp.abar + inp.v_xx * np.outer(beta, beta)
    c11[np.diag_indices(d)] += inp.v_xy + dg
    c12 = 2 * rho * ab + c12v
    c[:d, :d] = c11
    c[:d, d] = c12
    c[d, :d] = c12
    c[d, d] = (4 * rho * float(beta @ ab) + 2 * inp.n * rho * rho + inp.v_yy + float(c22))
    # The count's noise: one rank-one term v_n u u^T (``NoiseAwareInputs.count_vector``).
    u1, u2 = inp.count_vector(beta, rho)
    u = np.append(u1, u2)
    c += inp.v_n * np.outer(u, u)
    return r, c, ab, rb, s, b2


def log_posterior_noise_aware(u: np.ndarray, inp: NoiseAwareInputs) -> tuple[float, np.ndarray]:
    """Log joint density of the noise-aware model at u, and its gradient (module docstring).

    Returns (-inf, zeros) where the covariance is not positive definite (cannot happen when
    some release variance is positive; kept as a guard)."""
    d = inp.dim
    if not _in_range(u, d):
        return -np.inf, np.zeros(d + 1)
    if inp.wishart is not None:
        rot, inner = inp.wishart
        val, g = log_posterior_noise_aware(rotate_in(u, rot), inner)
        return val, rotate_gradient_out(g, rot)
    val, g = _log_prior(u, d)
    beta, a = u[:d], u[d]
    rho = float(np.exp(-a))
    r, c, ab, rb, s, b2 = _likelihood_parts(beta, rho, inp)
    try:
        chol = np.linalg.cholesky(c)
    except np.linalg.LinAlgError:
        return -np.inf, np.zeros(d + 1)
    w = np.linalg.inv(c)  # (d+1)^2, needed whole for the gradient
    alpha = w @ r
    logdet = 2 * float(np.sum(np.log(np.diag(chol))))
    val += -0.5 * logdet - 0.5 * float(r @ alpha) - 0.5 * (d + 1) * _LOG_2PI
    # d ll = alpha^T dm + tr(G dC), G = (alpha alpha^T - W) / 2, m the mean (r = R - m).
    gm = 0.5 * (np.outer(alpha, alpha) - w)
    g11, g12, g22 = gm[:d, :d], gm[:d, d], gm[d, d]
    a1, a2 = alpha[:d], alpha[d]
    vxx = inp.v_xx
    # mean: m1 = Rxx beta, m2 = beta^T Rxx beta + n rho
    grad_b = inp.rxx @ a1 + 2 * a2 * rb
    grad_a = -a2 * inp.n * rho
    # covariance, d/d log lambda (rho' = -rho)
    grad_a += (-rho * float(np.sum(g11 * inp.abar)) - 4 * rho * float(g12 @ ab)
               + g22 * (-4 * rho * float(beta @ ab) - 4 * inp.n * rho * rho))
    # The count's rank-one term: tr(G d(v_n u u^T)) = 2 v_n h^T du with h = G u;
    # du1 = Mc dbeta, du2 = 2 (Mc beta)^T dbeta - rho d log lambda.
    u1, u2 = inp.count_vector(beta, rho)
    h1 = g11 @ u1 + g12 * u2
    h2 = float(g12 @ u1) + g22 * u2
    if inp.mc is not None:
        grad_b += 2 * inp.v_n * (inp.mc @ h1 + 2 * h2 * u1)
    grad_a += -2 * inp.v_n * rho * h2
    # covariance, d/d beta_k
    grad_b += 4 * rho * (inp.abar @ g12) + 8 * rho * g22 * ab
    if np.ndim(vxx) == 0:
        g11b = g11 @ beta
        grad_b += vxx * (2 * beta * np.trace(g11) + 2 * g11b - 2 * beta * np.diag(g11))
        grad_b += 2 * vxx * (4 * beta * float(g12 @ beta) + g12 * (2 * s - 3 * b2))
        grad_b += g22 * vxx * (8 * s * beta - 4 * beta * b2)
    else:
        # ``design_error_terms`` with per-entry variances p: d tr(G C_p) / d beta.
        p, pd = vxx, np.diag(vxx)
        pb2 = p @ b2
        grad_b += (2 * (g11 * p) @ beta - 2 * np.diag(g11) * pd * beta
                   + 2 * beta * (p @ np.diag(g11)))
        grad_b += 2 * (g12 * (2 * pb2 - 3 * pd * b2) + 4 * beta * (p @ (g12 * beta)))
        grad_b += g22 * (8 * beta * pb2 - 4 * pd * beta * b2)
    g[:d] += grad_b
    g[d] += grad_a
    pv, pg = _public_loglik(u, inp)
    return float(val + pv), g + pg


def _public_loglik(u: np.ndarray, inp: NoiseAwareInputs) -> tuple[float, np.ndarray]:
    """The exact likelihood of the public statistics (method.md section 1, no prior) and its
    gradient in u; zero without public rows."""
    d = inp.dim
    g = np.zeros(d + 1)
    if inp.pxx is None:
        return 0.0, g
    beta, a = u[:d], u[d]
    lam = np.exp(a)
    pb = inp.pxx @ beta
    quad = float(beta @ pb - 2 * beta @ inp.pxy + inp.pyy)
    g[:d] = -lam * (pb - inp.pxy)
    g[d] = 0.5 * inp.pn - 0.5 * lam * quad
    return 0.5 * inp.pn * (a - _LOG_2PI) - 0.5 * lam * quad, g


def _public_loglik_batch(u: np.ndarray, inp: NoiseAwareInputs) -> np.ndarray:
    if inp.pxx is None:
        return np.zeros(u.shape[0])
    d = inp.dim
    beta, a = u[:, :d], np.clip(u[:, d], -_MAX_LOG_LAMBDA, _MAX_LOG_LAMBDA)
    quad = (np.einsum("ij,jk,ik->i", beta, inp.pxx, beta) - 2 * beta @ inp.pxy + inp.pyy)
    return 0.5 * inp.pn * (a - _LOG_2PI) - 0.5 * np.exp(a) * quad


def log_posterior_exact_batch(u: np.ndarray, stats: Statistics) -> np.ndarray:
    """``log_posterior_exact`` at every row of ``u`` (S, d + 1), without gradients."""
    d = stats.dim
    beta, a = u[:, :d], np.clip(u[:, d], -_MAX_LOG_LAMBDA, _MAX_LOG_LAMBDA)
    quad = (np.einsum("ij,jk,ik->i", beta, stats.xtx, beta) - 2 * beta @ stats.xty + stats.yty)
    out = (_log_prior_batch(u, d) + 0.5 * stats.n * (a - _LOG_2PI) - 0.5 * np.exp(a) * quad)
    out[np.abs(u[:, d]) > _MAX_LOG_LAMBDA] = -np.inf
    return out


def log_posterior_noise_aware_batch(u: np.ndarray, inp: NoiseAwareInputs) -> np.ndarray:
    """``log_posterior_noise_aware`` at every row of ``u`` (S, d + 1), without gradients;
    -inf where the covariance is not positive definite."""
    if inp.wishart is not None:
        rot, inner = inp.wishart
        return log_posterior_noise_aware_batch(rotate_in(u, rot), inner)
    d = inp.dim
    beta, a = u[:, :d], u[:, d]
    rho = np.exp(-a)
    ab = beta @ inp.abar
    rb = beta @ inp.rxx
    m = u.shape[0]
    r = np.empty((m, d + 1))
    r[:, :d] = inp.rxy - rb
    r[:, d] = inp.ryy - np.einsum("ij,ij->i", beta, rb) - inp.n * rho
    c = np.empty((m, d + 1, d + 1))
    c[:, :d, :d] = (rho[:, None, None] * inp.abar
                    + inp.v_xx * (beta[:, :, None] * beta[:, None, :]))
    idx = np.arange(d)
    dg, c12v, c22v = design_error_terms(beta, inp.v_xx)
    c[:, idx, idx] += inp.v_xy + dg
    c12 = 2 * rho[:, None] * ab + c12v
    c[:, :d, d] = c12
    c[:, d, :d] = c12
    c[:, d, d] = (4 * rho * np.einsum("ij,ij->i", beta, ab) + 2 * inp.n * rho ** 2
                  + inp.v_yy + c22v)
    # The count's rank-one term (``_likelihood_parts``).
    u1, u2 = inp.count_vector(beta, rho)
    uu = np.concatenate([u1, u2[:, None]], axis=1)
    c += inp.v_n * (uu[:, :, None] * uu[:, None, :])
    out = np.full(m, -np.inf)
    # Cholesky of the whole stack; rows whose matrix is not PD (a guard) stay at -inf.
    try:
        chol = np.linalg.cholesky(c)
        ok = np.ones(m, dtype=bool)
    except np.linalg.LinAlgError:
        ok = np.array([np.all(np.linalg.eigvalsh(ci) > 0) for ci in c])
        chol = np.zeros_like(c)
        if ok.any():
            chol[ok] = np.linalg.cholesky(c[ok])
    z = np.linalg.solve(chol[ok], r[ok][:, :, None])[:, :, 0]
    logdet = 2 * np.sum(np.log(np.diagonal(chol[ok], axis1=1, axis2=2)), axis=1)
    out[ok] = (_log_prior_batch(u[ok], d) - 0.5 * logdet - 0.5 * np.sum(z * z, axis=1)
               - 0.5 * (d + 1) * _LOG_2PI + _public_loglik_batch(u[ok], inp))
    return out
