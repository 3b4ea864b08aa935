"""dpfed.secagg.skellam: one share follows Poisson(lam/T) - Poisson(lam/T), T shares sum to
Sk(lam) exactly, c colluders leave Sk((C - c) lam / T); a scale 5 % off is rejected.

The samplers draw from os.urandom, so nothing is seeded: each statistical test is set to a
false-failure probability of about 1e-6 (chi-square and z thresholds below, as in
tests/test_secagg_dlaplace.py), and its power is shown on the same samples by a control law
whose standard deviation is 5 % larger or smaller, which must be rejected."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpfed import accounting as acc
from dpfed.secagg import skellam as sk
from dpfed.secagg.errors import ParameterError

ALPHA = 1e-6
Z = stats.norm.isf(ALPHA / 2)          # ~4.9
N = 30_000


def _cdf(lam):
    return stats.skellam(lam, lam).cdf


def _bins(lam, n_bins=30):
    """Integer edges (bin j: (e_{j-1}, e_j]) at the normal approximation's equal-probability
    quantiles of Sk(lam) (variance 2 lam); the expected counts use the exact law, so unequal
    bins only cost a little power. Only the ~30 edges need the exact cdf (fast at any lam)."""
    q = stats.norm.ppf(np.linspace(0, 1, n_bins + 1)[1:-1]) * math.sqrt(2 * lam)
    return np.unique(np.floor(q).astype(np.int64))


def _chi2(x, lam, law_lam=None):
    """Chi-square of samples x against Sk(law_lam) on the bins of Sk(lam)."""
    law = _cdf(lam if law_lam is None else law_lam)
    edges = _bins(lam)
    observed = np.bincount(np.searchsorted(edges, x, side="left"), minlength=len(edges) + 1)
    expected = np.diff(np.concatenate([[0.0], law(edges), [1.0]])) * x.size
    assert expected.min() >= 5
    chi2 = float(np.sum((observed - expected) ** 2 / expected))
    return chi2, stats.chi2.isf(ALPHA, len(expected) - 1)


def _variance_z(x, target):
    c = x - x.mean()
    return (np.mean(c * c) - target) / (np.std(c * c) / math.sqrt(x.size))


def _check_law(x, lam):
    """x follows Sk(lam), and Sk with a standard deviation 5 % off either way is rejected."""
    chi2, crit = _chi2(x, lam)
    assert chi2 < crit, (chi2, crit)
    assert abs(_variance_z(x, 2 * lam)) < Z
    for f in (1.05 ** 2, 0.95 ** 2):
        wrong = f * lam
        rejected = abs(_variance_z(x, 2 * wrong)) > Z or _chi2(x, lam, wrong)[0] > crit
        assert rejected, f


@pytest.mark.parametrize("T,lam", [(1, 3.0), (5, 10.0), (10, 1.0e4), (100, 200.0), (4, 3.0e6)])
def test_sum_of_T_shares_is_skellam(T, lam):
    total = sum(sk.sample_share(lam, T, N) for _ in range(T))
    _check_law(total, lam)


@pytest.mark.parametrize("T,lam", [(4, 8.0), (3, 3.0e6), (20, 40.0)])
def test_one_share_is_skellam_of_lam_over_T(T, lam):
    _check_law(sk.sample_share(lam, T, N), lam / T)


def test_colluders_leave_the_honest_shares_law():
    T, lam, c = 5, 50.0, 2
    shares = [sk.sample_share(lam, T, N) for _ in range(T)]
    honest = sum(shares[c:])                  # the colluders subtract their own shares
    _check_law(honest, (T - c) * lam / T)
    noise = sk.DistributedSkellam(lam, T, T, colluders=c)
    assert noise.honest_lam == pytest.approx((T - c) * lam / T)
    assert not noise.complete and noise.variance == pytest.approx(2 * lam)
    more = sk.DistributedSkellam(lam, T, T + 3, colluders=2)
    assert more.complete and more.total_lam == pytest.approx((T + 3) * lam / T)
    assert more.privacy_lam() == pytest.approx((T + 1) * lam / T)
    ev = noise.event(10, 5)
    assert isinstance(ev, acc.Skellam) and ev.lam == pytest.approx(noise.honest_lam)
    with pytest.raises(ParameterError):
        sk.DistributedSkellam(lam, T, 2, colluders=2).privacy_lam()


def test_skellam_rdp_approaches_the_gaussian_of_equal_variance():
    l1, l2 = 40.0, 10.0
    for rho in (0.05, 0.5):
        lam = sk.lam_for_rho(l2, rho)
        assert sk.skellam_variance(lam) == pytest.approx(l2 ** 2 / (2 * rho))
        for a in (2, 8, 32):
            r = acc.skellam_rdp(a, lam, l1, l2)
            assert r >= a * rho                      # never below the Gaussian's
            assert r <= a * rho * 1.05 + 0.01        # and close to it at these lam
    # less noise, more loss; fractional orders use the next integer
    assert acc.skellam_rdp(4, 100.0, l1, l2) > acc.skellam_rdp(4, 200.0, l1, l2)
    assert acc.skellam_rdp(3.5, 100.0, l1, l2) == acc.skellam_rdp(4, 100.0, l1, l2)


def _exact_renyi(alphas, lam, shift):
    """D_alpha(Sk(lam) + shift || Sk(lam)) for an integer shift and each alpha, summed
    numerically over +-(40 sd + 40 shift) (the rest of the sum is far below 1e-100)."""
    from scipy.special import logsumexp

    half = int(40 * math.sqrt(2 * lam) + 40 * abs(shift) + 200)
    k = np.arange(-half, half + 1)
    lp = stats.skellam.logpmf(k - shift, lam, lam)
    lq = stats.skellam.logpmf(k, lam, lam)
    ok = np.isfinite(lp) & np.isfinite(lq)
    return {a: float(logsumexp(a * lp[ok] + (1 - a) * lq[ok])) / (a - 1) for a in alphas}


@pytest.mark.parametrize("lam", [0.5, 2.0, 10.0, 100.0, 1000.0])
def test_skellam_rdp_bound_holds_against_the_exact_divergence(lam):
    # eq. A2 is an upper bound on the exact Renyi divergence of the product of coordinates
    # shifted by an integer vector, and tight at the lam of real rounds: a constant 5 % off
    # either way fails one of the two assertions
    alphas = (2, 5, 16)
    one = {v: _exact_renyi(alphas, lam, v) for v in (1, 3, 4)}
    for shifts in ((1,), (3,), (3, 4), (1, 1, 1, 1, 1)):
        l1 = float(sum(abs(v) for v in shifts))
        l2 = math.sqrt(sum(v * v for v in shifts))
        for a in alphas:
            exact = sum(one[v][a] for v in shifts)
            bound = acc.skellam_rdp(a, lam, l1, l2)
            assert exact <= bound * (1 + 1e-9), (lam, shifts, a, exact, bound)
            if lam >= 100:
                assert exact >= 0.97 * bound, (lam, shifts, a, exact, bound)


def test_bad_parameters_are_refused():
    with pytest.raises(ParameterError):
        sk.sample_share(0.0, 3, 10)
    with pytest.raises(ParameterError):
        sk.sample_share(1.0, 0, 10)
    with pytest.raises(ParameterError):
        sk.sample_skellam(2.0 ** 51, 3)
    with pytest.raises(ValueError):
        acc.Skellam(10.0, 1.0, 2.0)              # l2 > l1 is impossible
