"""Distributed discrete Laplace noise: T shares whose sum is one discrete Laplace draw.

Law (method.md section 10). On the integer grid of ``dpfed.secagg.fixedpoint`` the discrete
Laplace DL(p), p = exp(-1/b), has P(k) = (1 - p)/(1 + p) p^|k| and variance 2p/(1 - p)^2; b is
its scale in grid units. For an integer-valued statistic of L1 sensitivity Delta (grid units,
``fixedpoint.grid_sensitivity``) independent DL noise with b = Delta / eps on every entry is
eps-DP: the ratio of the output probabilities of two neighbours is at most
p^-||f(D) - f(D')||_1 <= e^eps (the geometric mechanism of Ghosh, Roughgarden & Sundararajan,
STOC 2009, in L1 form; the integer analogue of the Laplace mechanism of method.md section 2).

Divisibility. The geometric law on {0, 1, ...} with P(k) = (1 - p) p^k is the negative binomial
NB(1, p) (k failures before the first success), NB(r1, p) + NB(r2, p) = NB(r1 + r2, p) for
independent terms, and DL(p) is the law of G1 - G2 for independent geometrics (Inusah & Kozubowski
2006). Hence with T sites each adding

    Z_u = N_u - N'_u,   N_u, N'_u ~ NB(1/T, p) independent,

the sum of any T shares is NB(1, p) - NB(1, p) = DL(p): one full eps-DP draw. This is the integer
counterpart of the Gamma(1/T) split of the Laplace law (Goryczka & Xiong, IEEE TDSC 2017) and of
the distributed discrete Gaussian / Skellam constructions (Kairouz et al., ICML 2021; Agarwal et
al. 2021). C >= T contributing shares sum to NB(C/T, p) - NB(C/T, p): DL(p) plus independent extra
noise (variance C/T times that of one draw; exactly C/T independent DL draws when T divides C).
Only k < T honest shares give NB(k/T, p) - NB(k/T, p), which carries k/T of the variance and no
eps-DP guarantee at the calibrated eps (its mass near 0 is too concentrated: P(0)/P(1) grows like
T/k). So a round must refuse to unmask with fewer than T honest contributors, i.e. fewer than
T + c contributors when up to c of them may collude (a colluder knows and can subtract its own
share). ``DistributedNoise`` states these facts for a sum.

Sampler and how far it is from the exact law. NB(r, p) for non-integer r is drawn as the
Poisson-Gamma mixture: lambda ~ Gamma(shape r, scale theta), theta = p / (1 - p), then
K | lambda ~ Poisson(lambda) (Johnson, Kemp & Kotz, *Univariate Discrete Distributions*, 3rd ed.,
section 5.3). Every uniform comes from ``dpfed.secagg.csprng`` (os.urandom), never from a seeded
generator. The algorithms are exact in exact arithmetic:

- Gamma(a) for a >= 1 by Marsaglia & Tsang (ACM TOMS 2000) rejection; for a < 1 as
  Gamma(a + 1) U^(1/a) (same paper, section 6), kept in log space so shapes 1/T with large T do
  not underflow (log lambda = log G + log(U)/a + log theta);
- Poisson(lambda) by inversion (sequential search, Devroye 1986, X.3.3) for lambda < 10 and by
  Hormann's transformed rejection with squeeze PTRS (Insurance: Math. & Econ. 12, 1993) for
  lambda >= 10, whose acceptance test uses log P(k) computed as -stirlerr(k) - bd0(k, lambda) -
  log(2 pi k)/2 (Loader 2000, "Fast and accurate computation of binomial probabilities"), which
  has no catastrophic cancellation even at lambda ~ 2^45;
- the single-draw DL (T = 1) as G1 - G2 with geometrics by inversion, G = floor(-b ln U).

The floating-point departures are (i) uniforms on a 2^-53 grid, (ii) relative errors ~1e-16 in
the densities and thresholds the rejection steps compare, (iii) ~1e-16 accumulated error of the
inversion CDFs. Each perturbs the probability of an outcome by a relative ~1e-15 or an absolute
~2^-53, so the total-variation distance of one share from its law is of order 1e-13 or less (an
argument, not a proof). The tests check the law by chi-square goodness of fit
(tests/test_secagg_dlaplace.py). Because the output is an *integer* added to integers, there are
no low-order float bits to leak (Mironov, CCS 2012): the output depends on the input only through
the integer sum. A total-variation error tau per draw turns eps-DP into (eps, delta)-DP with
delta <= (number of draws) * tau by coupling: a pure eps claim would need an exact sampler.
Integer noise scales are limited to ``fixedpoint.MAX_GRID_NOISE_SCALE`` = 2^40 so that Poisson
means stay far below 2^53 (every integer representable).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping

import numpy as np

from dpfed.noise import NoiseDescription, NoiseTerm
from dpfed.secagg import csprng
from dpfed.secagg.errors import ParameterError, TooFewSurvivors
from dpfed.secagg.fixedpoint import MAX_GRID_NOISE_SCALE, PARTS

__all__ = ["dl_parameter", "dl_pmf", "dl_cdf", "dl_variance", "nb_logpmf", "grid_noise_scale",
           "sample_gamma_log", "sample_poisson", "sample_negative_binomial",
           "sample_discrete_laplace", "sample_share", "noise_share", "DistributedNoise",
           "describe_sum", "LAW"]

#: The law name of ``dpfed.noise`` this module produces (already known there; no new law).
LAW = "discrete_laplace"
_PTRS_MIN = 10.0
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_lgamma = np.vectorize(math.lgamma, otypes=[np.float64])


def _check_b(b) -> np.ndarray:
    arr = np.asarray(b, dtype=np.float64)
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ParameterError("the discrete Laplace scale b must be finite and > 0")
    if np.any(arr > MAX_GRID_NOISE_SCALE):
        raise ParameterError(f"b above {MAX_GRID_NOISE_SCALE:.3g} grid units is not supported "
                             "(choose a coarser fixed-point scale)")
    return arr


def dl_parameter(b: float) -> float:
    """p = exp(-1/b) of DL with scale b (grid units)."""
    return math.exp(-1.0 / float(_check_b(b)))


def dl_pmf(k, b: float) -> np.ndarray:
    """P(X = k) = (1 - p)/(1 + p) p^|k| for X ~ DL(exp(-1/b))."""
    b = float(_check_b(b))
    one_minus_p = -math.expm1(-1.0 / b)
    p = 1.0 - one_minus_p
    return one_minus_p / (1.0 + p) * np.exp(-np.abs(np.asarray(k, dtype=np.float64)) / b)


def dl_cdf(k, b: float) -> np.ndarray:
    """P(X <= k): p^-k/(1 + p) for k < 0 and 1 - p^(k+1)/(1 + p) for k >= 0."""
    b = float(_check_b(b))
    p = math.exp(-1.0 / b)
    k = np.floor(np.asarray(k, dtype=np.float64))
    neg = np.exp(np.minimum(k, 0) / b) / (1.0 + p)           # p^-k, k < 0
    pos = 1.0 - np.exp(-(np.maximum(k, 0) + 1) / b) / (1.0 + p)
    return np.where(k < 0, neg, pos)


def dl_variance(b: float) -> float:
    """Var DL(p) = 2p/(1 - p)^2."""
    b = float(_check_b(b))
    one_minus_p = -math.expm1(-1.0 / b)
    return 2.0 * (1.0 - one_minus_p) / one_minus_p ** 2


def nb_logpmf(k, r: float, p: float) -> np.ndarray:
    """log P(K = k), K ~ NB(r, p): Gamma(k + r)/(Gamma(r) k!) (1 - p)^r p^k."""
    k = np.asarray(k, dtype=np.float64)
    return (_lgamma(k + r) - math.lgamma(r) - _lgamma(k + 1.0) + r * math.log1p(-p)
            + k * math.log(p))


def grid_noise_scale(grid_sensitivity: int, epsilon: float) -> float:
    """b = Delta_grid / eps: the DL scale (grid units) that makes one draw eps-DP."""
    if not (isinstance(grid_sensitivity, int) and grid_sensitivity >= 1):
        raise ParameterError("the grid sensitivity must be a positive integer")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ParameterError("epsilon must be finite and > 0")
    return float(_check_b(grid_sensitivity / epsilon))


# ------------------------------------------------------------------ Gamma (log space)

def _log_gamma_mt(a: float, n: int) -> np.ndarray:
    """log of n Gamma(a, 1) variates, a >= 1 (Marsaglia & Tsang 2000)."""
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    out = np.empty(n)
    todo = np.arange(n)
    while todo.size:
        m = todo.size
        x = csprng.standard_normal(m)
        v = 1.0 + c * x
        u = csprng.uniform(m)
        ok = v > 0
        v3 = np.where(ok, v, 1.0) ** 3
        with np.errstate(divide="ignore", invalid="ignore"):
            accept = ok & (np.log(u) < 0.5 * x * x + d - d * v3 + d * np.log(v3))
        out[todo[accept]] = math.log(d) + np.log(v3[accept])
        todo = todo[~accept]
    return out


def sample_gamma_log(shape: float, n: int) -> np.ndarray:
    """log of n independent Gamma(shape, 1) variates (log space: no underflow for tiny shapes)."""
    if not (math.isfinite(shape) and shape > 0):
        raise ParameterError("the Gamma shape must be finite and > 0")
    if shape >= 1.0:
        return _log_gamma_mt(shape, n)
    return _log_gamma_mt(shape + 1.0, n) + np.log(csprng.uniform(n)) / shape


# ------------------------------------------------------------------ Poisson

def _stirlerr(k: np.ndarray) -> np.ndarray:
    """log k! - (k + 1/2) log k + k - log sqrt(2 pi), k >= 1 (Loader 2000)."""
    out = np.empty_like(k)
    small = k <= 15
    ks = k[small]
    out[small] = _lgamma(ks + 1.0) - (ks + 0.5) * np.log(ks) + ks - _LOG_SQRT_2PI
    kb = k[~small]
    nn = kb * kb
    s0, s1, s2, s3, s4 = 1 / 12, 1 / 360, 1 / 1260, 1 / 1680, 1 / 1188
    out[~small] = (s0 - (s1 - (s2 - (s3 - s4 / nn) / nn) / nn) / nn) / kb
    return out


def _bd0(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """x log(x/m) + m - x without cancellation (Loader 2000): a series in v = (x-m)/(x+m)
    when |x - m| < 0.1 (x + m)."""
    out = x * np.log(x / m) + m - x
    close = np.abs(x - m) < 0.1 * (x + m)
    if close.any():
        xc, mc = x[close], m[close]
        v = (xc - mc) / (xc + mc)
        s = (xc - mc) * v
        ej = 2.0 * xc * v
        v2 = v * v
        for j in range(1, 20):   # |v| < 0.1: 20 terms reach far below double precision
            ej = ej * v2
            s = s + ej / (2 * j + 1)
        out[close] = s
    return out


def _poisson_logpmf(k: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """log P(K = k) for K ~ Poisson(lam), k >= 1, accurate for huge lam."""
    return -_stirlerr(k) - _bd0(k, lam) - 0.5 * np.log(2 * math.pi * k)


def _poisson_inversion(lam: np.ndarray) -> np.ndarray:
    n = lam.size
    u = csprng.uniform(n)
    k = np.zeros(n, dtype=np.int64)
    p = np.exp(-lam)
    cdf = p.copy()
    active = np.flatnonzero(u > cdf)
    steps = 0
    # For lam < 10 the search ends within ~60 steps except with probability < 1e-30; the cap
    # only guards against a CDF that rounding leaves a hair below u.
    while active.size and steps < 400:
        k[active] += 1
        p[active] *= lam[active] / k[active]
        cdf[active] += p[active]
        active = active[u[active] > cdf[active]]
        steps += 1
    return k


def _poisson_ptrs(lam: np.ndarray) -> np.ndarray:
    n = lam.size
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    slam = np.sqrt(lam)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    log_invalpha = np.log(1.1239 + 1.1328 / (b - 3.4))
    vr = 0.9277 - 3.6224 / (b - 2.0)
    while todo.size:
        m = todo.size
        L, A, B = lam[todo], a[todo], b[todo]
        u = csprng.uniform(m) - 0.5
        v = csprng.uniform(m)
        us = 0.5 - np.abs(u)
        kf = np.floor((2.0 * A / us + B) * u + L + 0.43)
        accept = (us >= 0.07) & (v <= vr[todo])
        cand = (~accept & (kf >= 0) & (kf < 2.0 ** 62)
                & ~((us < 0.013) & (v > us)))
        idx = np.flatnonzero(cand)
        if idx.size:
            kc = kf[idx]
            lhs = (np.log(v[idx]) + log_invalpha[todo[idx]]
                   - np.log(A[idx] / (us[idx] * us[idx]) + B[idx]))
            rhs = np.where(kc == 0, -L[idx], _poisson_logpmf(np.maximum(kc, 1.0), L[idx]))
            accept[idx] = lhs <= rhs
        out[todo[accept]] = kf[accept].astype(np.int64)
        todo = todo[~accept]
    return out


def sample_poisson(lam) -> np.ndarray:
    """Independent Poisson(lam_i) variates for an array of means (0 <= lam < 2^52)."""
    lam = np.asarray(lam, dtype=np.float64).ravel()
    if not np.all(np.isfinite(lam)) or np.any(lam < 0) or np.any(lam >= 2.0 ** 52):
        raise ParameterError("Poisson means must be finite, >= 0 and < 2^52")
    out = np.zeros(lam.size, dtype=np.int64)
    small = (lam > 0) & (lam < _PTRS_MIN)
    large = lam >= _PTRS_MIN
    if small.any():
        out[small] = _poisson_inversion(lam[small])
    if large.any():
        out[large] = _poisson_ptrs(lam[large])
    return out


# ------------------------------------------------------------------ NB, DL, shares

def _theta(b: np.ndarray) -> np.ndarray:
    """p / (1 - p) for p = exp(-1/b), without cancellation."""
    return np.exp(-1.0 / b) / -np.expm1(-1.0 / b)


def sample_negative_binomial(r: float, b, n: int) -> np.ndarray:
    """n independent NB(r, p) variates, p = exp(-1/b) (b scalar or per entry): Poisson-Gamma."""
    b = np.broadcast_to(_check_b(b), (n,))
    if not (math.isfinite(r) and r > 0):
        raise ParameterError("r must be finite and > 0")
    log_lam = sample_gamma_log(r, n) + np.log(_theta(b))
    lam = np.exp(np.minimum(log_lam, math.log(2.0 ** 51)))
    return sample_poisson(lam)


def sample_discrete_laplace(b, n: int) -> np.ndarray:
    """n independent DL(exp(-1/b)) variates: the difference of two geometrics by inversion."""
    b = np.broadcast_to(_check_b(b), (n,))
    g1 = np.floor(-b * np.log(csprng.uniform(n)))
    g2 = np.floor(-b * np.log(csprng.uniform(n)))
    return g1.astype(np.int64) - g2.astype(np.int64)


def sample_share(b, n_shares: int, n: int) -> np.ndarray:
    """n independent shares NB(1/T, p) - NB(1/T, p), T = ``n_shares``: T of them sum to DL(p).
    With T = 1 this is one DL draw (two geometrics)."""
    if isinstance(n_shares, bool) or not isinstance(n_shares, int) or n_shares < 1:
        raise ParameterError("the number of shares T must be a positive integer")
    if n_shares == 1:
        return sample_discrete_laplace(b, n)
    r = 1.0 / n_shares
    return sample_negative_binomial(r, b, n) - sample_negative_binomial(r, b, n)


def noise_share(grid_scales, n_shares: int) -> np.ndarray:
    """One site's noise share for a whole vector: ``grid_scales`` is the per-entry b (grid
    units; e.g. ``StatisticsLayout.per_entry({part: b})``). int64, to be added to the encoded
    statistics with ``fixedpoint.add_signed``."""
    b = np.asarray(grid_scales, dtype=np.float64).ravel()
    return sample_share(b, n_shares, b.size)


@dataclass(frozen=True)
class DistributedNoise:
    """What the sum of ``contributors`` shares (threshold ``threshold`` = T) of DL with grid
    scale ``grid_scale`` carries, at fixed-point ``scale`` s (grid = 1/s real units).

    - ``complete``: at least T shares; the sum holds at least one full DL draw, and with C
      contributors exactly NB(C/T) - NB(C/T): ``full_draws`` = C/T (a Fraction);
    - ``variance_grid`` / ``variance_real``: exact variance of the sum's noise per entry;
    - ``noise_term(rounding)``: the ``dpfed.noise.NoiseTerm`` (law ``discrete_laplace``, real
      scale b/s, grid 1/s). ``dpfed.noise`` counts whole draws, so unless T divides C the term
      is a rounding: ``"down"`` (default) floor(C/T) draws, the privacy floor (1 draw for
      T <= C < 2T; understates the variance by the factor floor(C/T)/(C/T) >= 1/2), ``"up"``
      ceil(C/T) (overstates it), ``"exact"`` refuses a non-integer C/T.
    With fewer than T contributors every method raises ``TooFewSurvivors``: the noise of k < T
    shares is not the calibrated law (module docstring)."""

    grid_scale: float
    scale: float
    threshold: int
    contributors: int

    def __post_init__(self):
        _check_b(self.grid_scale)
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ParameterError("scale must be > 0")
        if not (isinstance(self.threshold, int) and self.threshold >= 1):
            raise ParameterError("threshold must be a positive integer")
        if not (isinstance(self.contributors, int) and self.contributors >= 0):
            raise ParameterError("contributors must be a non-negative integer")

    law = LAW

    @property
    def complete(self) -> bool:
        return self.contributors >= self.threshold

    @property
    def full_draws(self) -> Fraction:
        return Fraction(self.contributors, self.threshold)

    @property
    def p(self) -> float:
        return dl_parameter(self.grid_scale)

    @property
    def real_scale(self) -> float:
        return self.grid_scale / self.scale

    @property
    def grid(self) -> float:
        return 1.0 / self.scale

    @property
    def variance_grid(self) -> float:
        return float(self.full_draws) * dl_variance(self.grid_scale)

    @property
    def variance_real(self) -> float:
        return self.variance_grid / self.scale ** 2

    def noise_term(self, rounding: str = "down") -> NoiseTerm:
        if not self.complete:
            raise TooFewSurvivors(
                f"{self.contributors} noise shares < threshold {self.threshold}: the sum does "
                "not carry the calibrated noise; it must not be unmasked")
        c, t = self.contributors, self.threshold
        if rounding == "down":
            draws = c // t
        elif rounding == "up":
            draws = -(-c // t)
        elif rounding == "exact":
            if c % t:
                raise ParameterError(f"{c} shares of threshold {t} are {c}/{t} draws, not a "
                                     "whole number")
            draws = c // t
        else:
            raise ParameterError(f"rounding must be 'down', 'up' or 'exact', not {rounding!r}")
        return NoiseTerm(LAW, self.real_scale, draws, self.grid)


def describe_sum(grid_scales: Mapping[str, float | None], scales: Mapping[str, float],
                 threshold: int, contributors: int, rounding: str = "down"
                 ) -> NoiseDescription:
    """The ``NoiseDescription`` of a secure sum: one ``DistributedNoise`` term per part whose
    grid scale is not None (``None``: that part has no noise, e.g. n under replace-one)."""
    terms = {}
    for part in PARTS:
        b = grid_scales.get(part)
        terms[part] = () if b is None else (
            DistributedNoise(float(b), float(scales[part]), threshold, contributors)
            .noise_term(rounding),)
    return NoiseDescription(**terms)
