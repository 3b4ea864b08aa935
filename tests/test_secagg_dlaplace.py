"""dpfed.secagg.dlaplace: each share follows NB(1/T) - NB(1/T); T shares sum to DL(p); fewer do
not; a wrong law is caught by the same test.

The samplers draw from os.urandom, so nothing here is seeded: every statistical test is set to a
false-failure probability of about 1e-6 (chi-square and z thresholds below), and its power is
shown by a control that the same test rejects."""

import math

import numpy as np
import pytest
from scipy import stats

from dpfed.noise import NoiseTerm
from dpfed.secagg import dlaplace as dl
from dpfed.secagg.errors import ParameterError, TooFewSurvivors

ALPHA = 1e-6
Z = stats.norm.isf(ALPHA / 2)          # ~4.9


def _quantile(cdf, q, lo, hi):
    """Smallest integer k in [lo, hi] with cdf(k) >= q (bisection)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if float(cdf(np.array([mid]))[0]) >= q:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _quantile_bins(cdf, lo, hi, n_bins):
    """Integer bin edges e_0 < e_1 < ... with roughly equal probabilities under ``cdf``: bin j
    holds the integers in (e_{j-1}, e_j]; the outer bins are open."""
    edges = []
    for q in np.linspace(0, 1, n_bins + 1)[1:-1]:
        e = _quantile(cdf, q, lo, hi)
        if not edges or e > edges[-1]:
            edges.append(e)
    return np.array(edges)


def _chi_square(samples, cdf, edges):
    samples = np.asarray(samples)
    idx = np.searchsorted(edges, samples, side="left")      # bin j: e_{j-1} < k <= e_j
    observed = np.bincount(idx, minlength=len(edges) + 1)
    c = np.concatenate([[0.0], cdf(edges), [1.0]])
    expected = np.diff(c) * samples.size
    assert expected.min() >= 20, expected.min()
    chi2 = float(np.sum((observed - expected) ** 2 / expected))
    df = len(expected) - 1
    return chi2, stats.chi2.isf(ALPHA, df)


def _dl_test(samples, b, n_bins=40):
    cdf = lambda k: dl.dl_cdf(k, b)                         # noqa: E731
    span = int(60 * b) + 10
    return _chi_square(samples, cdf, _quantile_bins(cdf, -span, span, n_bins))


@pytest.mark.parametrize("T,b", [(1, 2.5), (3, 2.0), (10, 8.0), (6, 3.0e6)])
def test_sum_of_T_shares_is_discrete_laplace(T, b):
    n = 30_000
    total = sum(dl.sample_share(b, T, n) for _ in range(T))
    chi2, crit = _dl_test(total, b)
    assert chi2 < crit, (chi2, crit)


@pytest.mark.parametrize("T,b", [(3, 2.0), (10, 50.0)])
def test_each_share_half_is_negative_binomial(T, b):
    n, r, p = 30_000, 1.0 / T, dl.dl_parameter(b)
    x = dl.sample_negative_binomial(r, b, n)
    hi = int(x.max()) + 1
    cdf_table = np.cumsum(np.exp(dl.nb_logpmf(np.arange(hi + 1), r, p)))
    cdf = lambda k: cdf_table[np.clip(np.asarray(k), 0, hi)]   # noqa: E731
    edges = _quantile_bins(cdf, 0, hi, 30)
    edges = edges[cdf(edges) < 1 - 20 / n]                     # keep the last bin populated
    chi2, crit = _chi_square(x, cdf, edges)
    assert chi2 < crit, (chi2, crit)


@pytest.mark.parametrize("lam", [0.3, 3.7, 25.0, 1e5, 1e12])
def test_poisson_sampler_matches_its_law(lam):
    n = 30_000
    x = dl.sample_poisson(np.full(n, lam))
    cdf = stats.poisson(lam).cdf
    half = int(40 * math.sqrt(lam)) + 40
    edges = _quantile_bins(cdf, max(0, int(lam) - half), int(lam) + half, 30)
    chi2, crit = _chi_square(x, cdf, edges)
    assert chi2 < crit, (chi2, crit)


def _variance_z(samples, target):
    """z of the sample variance against ``target``, with the sample's own standard error."""
    c = samples - samples.mean()
    v = np.mean(c ** 2)
    se = np.std(c ** 2) / math.sqrt(samples.size)
    return (v - target) / se


@pytest.mark.parametrize("T,b", [(4, 3.0), (10, 6.0)])
def test_T_shares_carry_the_full_noise_and_fewer_carry_less(T, b):
    n = 40_000
    shares = [dl.sample_share(b, T, n) for _ in range(T)]
    full = dl.dl_variance(b)
    assert abs(_variance_z(sum(shares), full)) < Z
    # T - 1 honest shares (one colluder subtracts its own): detectably less noise ...
    short = sum(shares[:-1])
    assert _variance_z(short, full) < -Z
    # ... which is (T-1)/T of the variance, and not the DL law at all
    assert abs(_variance_z(short, full * (T - 1) / T)) < Z
    chi2, crit = _dl_test(short, b)
    assert chi2 > crit


def test_wrong_law_naive_rounding_of_continuous_shares_is_detected():
    # The continuous split Laplace(b) = sum of T Gamma(1/T, b) - Gamma(1/T, b) shares, each
    # naively rounded to an integer: plausible, but not DL(p). (numpy's generator is fine in a
    # test of a *wrong* sampler.)
    rng = np.random.default_rng(5)
    T, b, n = 8, 1.5, 30_000
    naive = sum(np.rint(rng.gamma(1 / T, b, n) - rng.gamma(1 / T, b, n)) for _ in range(T))
    chi2, crit = _dl_test(naive.astype(np.int64), b)
    assert chi2 > crit
    # the right sampler at the same (T, b) passes the same test
    right = sum(dl.sample_share(b, T, n) for _ in range(T))
    assert _dl_test(right, b)[0] < crit


def test_single_draw_discrete_laplace_has_the_right_variance():
    b = 5.0
    x = dl.sample_discrete_laplace(b, 40_000)
    assert abs(_variance_z(x, dl.dl_variance(b))) < Z
    assert dl.dl_variance(b) == pytest.approx(NoiseTerm("discrete_laplace", b, 1, 1.0).variance())


def test_noise_facts_of_a_sum():
    b, s, T = 1.0e6, 2.0 ** 20, 5
    full = dl.DistributedNoise(b, s, T, T)
    term = full.noise_term()
    assert (term.law, term.draws, term.grid) == ("discrete_laplace", 1, 1 / s)
    assert term.scale == pytest.approx(b / s)
    assert term.variance() == pytest.approx(full.variance_real, rel=1e-9)
    assert dl.DistributedNoise(b, s, T, 2 * T).noise_term("exact").draws == 2
    more = dl.DistributedNoise(b, s, T, T + 2)
    assert more.full_draws == pytest.approx(7 / 5)
    assert more.noise_term("down").draws == 1 and more.noise_term("up").draws == 2
    assert more.variance_grid == pytest.approx(7 / 5 * dl.dl_variance(b))
    with pytest.raises(ParameterError):
        more.noise_term("exact")
    with pytest.raises(TooFewSurvivors):
        dl.DistributedNoise(b, s, T, T - 1).noise_term()
    desc = dl.describe_sum({"xtx": b, "xty": b, "yty": b, "n": 10.0},
                           {"xtx": s, "xty": s, "yty": s, "n": 1.0}, T, T)
    assert desc.draws("xty") == 1 and desc.n[0].grid == 1.0
    assert desc.variance("n") == pytest.approx(dl.dl_variance(10.0))


def test_scales_beyond_the_sampler_limit_are_refused():
    with pytest.raises(ParameterError):
        dl.sample_share(2.0 ** 41, 3, 10)
    with pytest.raises(ParameterError):
        dl.grid_noise_scale(0, 1.0)
    assert dl.grid_noise_scale(10, 0.5) == 20.0
