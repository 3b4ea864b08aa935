"""dpfed.gaussian (the exact privacy of the Gaussian mechanism) and site_node.gaussian (OpenDP's
sampler at the site): closed forms, agreement with Google's dp-accounting PLD, and the law and
scale of the noise the site draws.

The noise comes from OpenDP's CSPRNG, so nothing is seeded: the statistical tests are set to a
false-failure probability of about 1e-6 each, and each is shown to reject the same samples
when the scale is wrong by 5 % (the control), so a sampler 5 % off would fail."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpfed import gaussian as g

ALPHA = 1e-6
Z = stats.norm.isf(ALPHA / 2)          # ~4.9


def test_profile_closed_forms():
    mu = 1.3
    # eps = 0: total variation between N(0,1) and N(mu,1)
    assert g.gaussian_delta(0.0, mu) == pytest.approx(2 * stats.norm.cdf(mu / 2) - 1, rel=1e-12)
    # eq. G1 against scipy's Phi
    for eps in (0.1, 1.0, 3.0, 8.0):
        want = stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        assert g.gaussian_delta(eps, mu) == pytest.approx(want, rel=1e-9, abs=1e-300)
    # monotone: decreasing in eps, increasing in mu
    eps = np.linspace(0, 6, 61)
    d = [g.gaussian_delta(e, mu) for e in eps]
    assert all(a > b for a, b in zip(d, d[1:]))
    assert g.gaussian_delta(1.0, 1.0) < g.gaussian_delta(1.0, 1.1)
    # very large eps: no overflow, essentially 0
    assert 0.0 <= g.gaussian_delta(500.0, 2.0) < 1e-300


def test_inverse_and_calibration_round_trip_toward_privacy():
    for mu in (0.2, 1.0, 4.0):
        for delta in (1e-3, 1e-6, 1e-10):
            eps = g.gaussian_epsilon(delta, mu)
            assert g.gaussian_delta(eps, mu) <= delta                 # rounded toward privacy
            assert g.gaussian_delta(eps * (1 - 1e-9), mu) > delta or eps == 0
    for eps, delta in ((0.5, 1e-6), (1.0, 1e-5), (4.0, 1e-8)):
        mu = g.mu_for_epsilon_delta(eps, delta)
        assert g.gaussian_delta(eps, mu) <= delta < g.gaussian_delta(eps, mu * (1 + 1e-9))
        sigma = g.calibrate_sigma(2.0, epsilon=eps, delta=delta)
        assert sigma == pytest.approx(2.0 / mu)
        if eps < 1:   # the classical bound (Dwork & Roth, Theorem A.1) is valid and looser
            assert sigma < 2.0 * math.sqrt(2 * math.log(1.25 / delta)) / eps


def test_zcdp_and_gdp_conversions():
    assert g.sigma_for_rho(3.0, 0.5) == pytest.approx(3.0)
    assert g.rho_from_sigma(3.0, 3.0) == pytest.approx(0.5)
    assert g.rho_from_mu(g.mu_from_rho(0.37)) == pytest.approx(0.37)
    assert g.calibrate_sigma(3.0, rho=0.5) == pytest.approx(3.0)
    # k Gaussians of mu are one Gaussian of sqrt(k) mu; rho adds
    assert g.compose_mu([0.5] * 9) == pytest.approx(1.5)
    assert g.compose_rho([0.1] * 7) == pytest.approx(0.7)
    with pytest.raises(ValueError):
        g.calibrate_sigma(1.0, rho=0.5, epsilon=1.0, delta=1e-6)
    with pytest.raises(ValueError):
        g.gaussian_epsilon(0.0, 1.0)


def test_agrees_with_dp_accounting_pld():
    pld = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    for mu, k in ((1.0, 1), (0.5, 4), (0.3, 10)):
        p = pld.from_gaussian_mechanism(1.0 / mu, sensitivity=1.0, value_discretization_interval=1e-4)
        p = p.self_compose(k) if k > 1 else p
        total = g.compose_mu([mu] * k)
        for delta in (1e-5, 1e-8):
            # PLD's pessimistic estimate is an upper bound, within its discretisation of exact
            assert g.gaussian_epsilon(delta, total) == pytest.approx(
                p.get_epsilon_for_delta(delta), abs=1e-3 * k)
            assert g.gaussian_epsilon(delta, total) <= p.get_epsilon_for_delta(delta) + 1e-9


# ---------------------------------------------------------------- the site's sampler

def _normal_chi2(x, sigma, n_bins=30):
    edges = stats.norm.ppf(np.linspace(0, 1, n_bins + 1)[1:-1], scale=sigma)
    observed = np.bincount(np.searchsorted(edges, x), minlength=n_bins)
    expected = np.diff(np.concatenate([[0.0], stats.norm.cdf(edges, scale=sigma), [1.0]])) * x.size
    chi2 = float(np.sum((observed - expected) ** 2 / expected))
    return chi2, stats.chi2.isf(ALPHA, n_bins - 1)


def _variance_z(x, target_var):
    c = x - x.mean()
    return (np.mean(c * c) - target_var) / (np.std(c * c) / math.sqrt(x.size))


def test_site_gaussian_noise_has_its_law_and_scale():
    pytest.importorskip("opendp")
    from site_node.gaussian import add_gaussian_noise, gaussian_scale

    n, sens, rho = 30_000, 2.0, 0.5
    values = np.linspace(-5.0, 5.0, n)
    noisy, certified = add_gaussian_noise(values, sens, rho)
    assert certified <= rho
    sigma = gaussian_scale(n, sens, rho)
    assert sigma == pytest.approx(g.sigma_for_rho(sens, rho), rel=1e-7)
    e = noisy - values
    assert abs(e.mean()) / (sigma / math.sqrt(n)) < Z
    assert abs(_variance_z(e, sigma ** 2)) < Z
    chi2, crit = _normal_chi2(e, sigma)
    assert chi2 < crit, (chi2, crit)
    # power: the same samples reject a scale 5 % off either way (variance 10 % off: z ~ 12,
    # 7 sd beyond the threshold). The chi-square's own power at 5 % is only ~3 sd at this n,
    # so it checks the shape and the variance test the scale.
    for wrong in (1.05, 0.95):
        assert abs(_variance_z(e, (wrong * sigma) ** 2)) > Z


def test_site_gaussian_refuses_bad_input():
    pytest.importorskip("opendp")
    from site_node.gaussian import add_gaussian_noise

    with pytest.raises(ValueError):
        add_gaussian_noise(np.array([np.nan]), 1.0, 0.5)
    with pytest.raises(ValueError):
        add_gaussian_noise(np.zeros(3), 1.0, 0.0)
