"""The Gaussian mechanism's privacy, calibrated exactly (pure functions; issue 23).

Adding N(0, sigma^2 I) to a vector statistic of L2 sensitivity Delta_2 is, with mu = Delta_2 /
sigma:

- **mu-GDP** (Gaussian differential privacy; Dong, Roth & Su, "Gaussian differential privacy",
  JRSS-B 2022, arXiv 1905.02383, Theorem 2.7): its trade-off function is that of testing
  N(0, 1) against N(mu, 1), and its privacy profile is exactly (Balle & Wang, "Improving the
  Gaussian mechanism for differential privacy: analytical calibration and optimal denoising",
  ICML 2018, Theorem 8; Dong et al. Corollary 2.13)

      delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2),          (eq. G1)

  the smallest delta for which the mechanism is (eps, delta)-DP: nothing tighter exists.
- **rho-zCDP** with rho = Delta_2^2 / (2 sigma^2) = mu^2 / 2 (Bun & Steinke, "Concentrated
  differential privacy", TCC 2016, Proposition 1.6); as Renyi DP, eps(alpha) = alpha rho for
  every alpha > 1 (Mironov 2017, Proposition 7).
- **composition**: k Gaussian mechanisms with mu_1 .. mu_k (adaptively chosen) are together
  sqrt(sum mu_i^2)-GDP (Dong et al., Corollary 3.3), so eq. G1 with that mu is the exact
  profile of the composition; rho adds (Bun & Steinke, Lemma 2.3).

The functions take and return plain floats; Phi is computed with ``math.erfc`` (no SciPy: the
core and the site must not import it, pyproject ``core-deps``). Calibration is by bisection on
a monotone function and always rounds toward privacy: ``calibrate_sigma`` returns a sigma at
least as large as the exact one (to a relative 1e-12), ``epsilon_for_delta`` an eps at least
as large, ``delta_for_epsilon`` is the closed form.

Accuracy of eq. G1 in floating point: each term is computed to ~1e-16 relative, so the
difference is accurate to ~1e-16 absolute; deltas that matter (1e-12 .. 1e-3) are far above
that. For very large eps (e^eps Phi(.) both tiny) the second term is computed in log space.
"""

from __future__ import annotations

import math

__all__ = ["normal_cdf", "gdp_mu", "rho_from_sigma", "sigma_for_rho", "mu_from_rho",
           "rho_from_mu", "gaussian_delta", "gaussian_epsilon", "mu_for_epsilon_delta",
           "calibrate_sigma", "compose_mu", "compose_rho"]

_SQRT2 = math.sqrt(2.0)


def _positive(name: str, value) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return value


def normal_cdf(x: float) -> float:
    """Phi(x) = erfc(-x / sqrt 2) / 2 (accurate in both tails)."""
    return 0.5 * math.erfc(-x / _SQRT2)


def _log_normal_cdf(x: float) -> float:
    """log Phi(x); for x < -37 (Phi underflows) the asymptotic series of Mills' ratio."""
    if x > -37.0:
        return math.log(normal_cdf(x))
    z = -x
    # log Phi(-z) = -z^2/2 - log(z sqrt(2 pi)) + log(1 - 1/z^2 + 3/z^4 - 15/z^6)
    return (-0.5 * z * z - math.log(z * math.sqrt(2 * math.pi))
            + math.log1p(-1 / z ** 2 + 3 / z ** 4 - 15 / z ** 6))


def gdp_mu(l2_sensitivity: float, sigma: float) -> float:
    """mu = Delta_2 / sigma (Dong, Roth & Su, Theorem 2.7)."""
    return _positive("l2_sensitivity", l2_sensitivity) / _positive("sigma", sigma)


def rho_from_sigma(l2_sensitivity: float, sigma: float) -> float:
    """rho = Delta_2^2 / (2 sigma^2) (Bun & Steinke 2016, Proposition 1.6)."""
    return gdp_mu(l2_sensitivity, sigma) ** 2 / 2.0


def sigma_for_rho(l2_sensitivity: float, rho: float) -> float:
    """sigma = Delta_2 / sqrt(2 rho): the Gaussian that is exactly rho-zCDP."""
    return _positive("l2_sensitivity", l2_sensitivity) / math.sqrt(2.0 * _positive("rho", rho))


def mu_from_rho(rho: float) -> float:
    """The mu of a Gaussian mechanism that is rho-zCDP: sqrt(2 rho). (For a Gaussian the two
    are the same statement; a general rho-zCDP mechanism is *not* sqrt(2 rho)-GDP.)"""
    return math.sqrt(2.0 * _positive("rho", rho))


def rho_from_mu(mu: float) -> float:
    """rho = mu^2 / 2: a mu-GDP Gaussian mechanism is (mu^2/2)-zCDP."""
    return _positive("mu", mu) ** 2 / 2.0


def gaussian_delta(epsilon: float, mu: float) -> float:
    """Exact privacy profile of mu-GDP (eq. G1): the smallest delta with (eps, delta)-DP.
    Decreasing in eps, increasing in mu; eps = 0 gives 2 Phi(mu/2) - 1 (total variation)."""
    mu = _positive("mu", mu)
    epsilon = float(epsilon)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    a = -epsilon / mu + mu / 2.0
    b = -epsilon / mu - mu / 2.0
    first = normal_cdf(a)
    second = math.exp(epsilon + _log_normal_cdf(b))
    return max(0.0, first - second)


def gaussian_epsilon(delta: float, mu: float) -> float:
    """The smallest eps with gaussian_delta(eps, mu) <= delta (eq. G1 inverted by bisection),
    rounded up: the returned eps always satisfies the profile. 0 if delta >= delta(0)."""
    mu = _positive("mu", mu)
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if gaussian_delta(0.0, mu) <= delta:
        return 0.0
    lo, hi = 0.0, max(1.0, mu * mu)
    while gaussian_delta(hi, mu) > delta:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if gaussian_delta(mid, mu) > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return hi


def mu_for_epsilon_delta(epsilon: float, delta: float) -> float:
    """The largest mu (to a relative 1e-12, rounded down) whose Gaussian is (eps, delta)-DP:
    the analytic Gaussian mechanism of Balle & Wang (2018), Algorithm 1, by bisection on the
    exact profile (eq. G1 is increasing in mu)."""
    epsilon = float(epsilon)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    lo, hi = 0.0, 1.0
    while gaussian_delta(epsilon, hi) <= delta:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if gaussian_delta(epsilon, mid) <= delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    if lo == 0.0:
        raise ValueError("no Gaussian mechanism meets this (epsilon, delta)")  # pragma: no cover
    return lo


def calibrate_sigma(l2_sensitivity: float, *, rho: float | None = None,
                    epsilon: float | None = None, delta: float | None = None) -> float:
    """sigma for a target ``rho`` (zCDP) or a target (``epsilon``, ``delta``) (exact profile).
    Exactly one of the two targets."""
    if (rho is None) == (epsilon is None and delta is None):
        raise ValueError("give either rho or (epsilon, delta)")
    if rho is not None:
        return sigma_for_rho(l2_sensitivity, rho)
    if epsilon is None or delta is None:
        raise ValueError("give both epsilon and delta")
    return _positive("l2_sensitivity", l2_sensitivity) / mu_for_epsilon_delta(epsilon, delta)


def compose_mu(mus) -> float:
    """sqrt(sum mu_i^2): the GDP parameter of the (adaptive) composition (Dong et al., Cor. 3.3)."""
    mus = [_positive("mu", m) for m in mus]
    return math.sqrt(math.fsum(m * m for m in mus))


def compose_rho(rhos) -> float:
    """sum rho_i (Bun & Steinke 2016, Lemma 2.3)."""
    return math.fsum(_positive("rho", r) for r in rhos)
