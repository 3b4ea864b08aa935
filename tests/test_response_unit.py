"""The response unit of the priors (posterior.fit_posterior ``y_unit``).

The Gamma priors of method.md section 1 are stated for a response of unit scale, so a fit
without a unit depends on the units y is measured in. With ``y_unit`` the fit sees y / unit and
answers in y's units; a round passes its public y bound. Checked, each able to fail:
- ``NoiseDescription.scaled`` and ``Statistics.in_y_units`` scale values and noise variances
  as the response's units require;
- ``y_unit`` is exactly the fit of the statistics in that unit, mapped back (beta times the
  unit, the precisions divided by its square);
- with the unit following the response (a round's y bound in the same units as y), the fit
  is equivariant: y in other units gives the same predictions in those units; without a
  unit it is not (the reason for the unit);
- the aggregator's fit passes the round's y bound.
"""

import numpy as np
import pytest

from dpfed.noise import EXACT, NoiseDescription, NoiseError, NoiseTerm
from dpfed.sensitivity import expected_noise
from dpfed.statistics import Statistics, StatisticsError, clipped_exact_statistics
from posterior import fit_posterior

D = 4
X_BOUND, Y_BOUND = 0.5, 0.3


def _release(seed: int, n: int = 300):
    """(release, public): clipped statistics of synthetic rows whose responses mostly exceed
    the y bound, plus numpy Laplace noise of the mechanism's scales (a test double: the
    production release draws from OpenDP, which cannot be seeded), and 20 public rows."""
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=D)
    x = rng.normal(size=(n + 20, D)) * 0.4
    y = x @ beta + 0.5 * rng.normal(size=n + 20)
    noise = expected_noise(D, 2.0, X_BOUND, Y_BOUND)
    exact = clipped_exact_statistics(x[:n], y[:n], X_BOUND, Y_BOUND)
    v = noise.variances()
    e = rng.laplace(size=(D, D)) * np.sqrt(v["xtx"] / 2)
    release = Statistics(exact.xtx + np.triu(e) + np.triu(e, 1).T,
                         exact.xty + rng.laplace(size=D) * np.sqrt(v["xty"] / 2),
                         exact.yty + rng.laplace() * np.sqrt(v["yty"] / 2), n, noise)
    public = clipped_exact_statistics(x[n:], y[n:], X_BOUND, Y_BOUND)
    return release, public


def _in_units(stats: Statistics, k: float) -> Statistics:
    """The statistics of the same rows with y multiplied by k."""
    return stats.in_y_units(1.0 / k)


def test_noise_description_scales_each_part():
    noise = NoiseDescription(xtx=NoiseTerm("laplace", 2.0, 3), xty=NoiseTerm("laplace", 1.5),
                             yty=NoiseTerm("laplace", 0.5),
                             n=NoiseTerm("discrete_laplace", 4.0, 1, grid=1.0))
    scaled = noise.scaled(xty=0.1, yty=0.01)
    assert scaled.variance("xty") == pytest.approx(noise.variance("xty") * 0.01, rel=1e-12)
    assert scaled.variance("yty") == pytest.approx(noise.variance("yty") * 1e-4, rel=1e-12)
    assert scaled.xtx == noise.xtx and scaled.n == noise.n
    assert scaled.draws("xtx") == 3
    # A discrete law keeps its variance ratio when scale and grid scale together.
    grid = noise.scaled(n=0.5)
    assert grid.variance("n") == pytest.approx(noise.variance("n") * 0.25, rel=1e-12)
    for bad in ({"xty": 0.0}, {"yty": -1.0}, {"xty": float("nan")}, {"beta": 2.0}):
        with pytest.raises(NoiseError):
            noise.scaled(**bad)


def test_statistics_in_y_units():
    release, public = _release(0)
    s = release.in_y_units(0.25)
    np.testing.assert_array_equal(s.xtx, release.xtx)
    np.testing.assert_allclose(s.xty, release.xty / 0.25, rtol=1e-15)
    assert s.yty == pytest.approx(release.yty / 0.0625, rel=1e-15) and s.n == release.n
    assert s.noise.variance("xty") == pytest.approx(release.noise.variance("xty") * 16)
    assert public.in_y_units(0.25).noise == EXACT
    assert Statistics(release.xtx, release.xty, release.yty, 3).in_y_units(2.0).noise is None
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(StatisticsError):
            release.in_y_units(bad)


@pytest.mark.parametrize("model", ["noise-aware", "exact"])
def test_y_unit_is_the_fit_in_that_unit_mapped_back(model, monkeypatch):
    import posterior.noise_aware as na

    release, public = _release(1)
    stats = release + public if model == "noise-aware" else public
    pub = public if model == "noise-aware" else None
    unit = 0.3
    a = fit_posterior(stats, public=pub, x_bound=X_BOUND, draws=400, seed=5, y_unit=unit)
    # With a unit the fit states the bound's priors (BOUND_PRIOR); the same priors given to
    # a fit without a unit on the statistics in that unit give the same draws.
    monkeypatch.setattr(na, "PRIOR", na.BOUND_PRIOR)
    b = fit_posterior(stats.in_y_units(unit), public=None if pub is None else
                      pub.in_y_units(unit), x_bound=X_BOUND, draws=400, seed=5)
    assert a.model == model and a.diagnostics["y_unit"] == unit
    np.testing.assert_array_equal(a.beta_draws, b.beta_draws * unit)
    assert a.lam["mean"] == pytest.approx(b.lam["mean"] / unit ** 2, rel=1e-12)
    assert a.lam["q95"] == pytest.approx(b.lam["q95"] / unit ** 2, rel=1e-12)
    np.testing.assert_allclose(a.stats.xty, stats.xty, rtol=1e-12)
    with pytest.raises(ValueError):
        fit_posterior(stats, public=pub, draws=10, seed=0, y_unit=0.0)


@pytest.mark.parametrize("seed", [2, 3])
def test_fit_is_equivariant_in_the_units_of_y_when_the_unit_follows_them(seed):
    release, public = _release(seed)
    k = 7.0   # y measured in units 7 times smaller: every y-statistic and the y bound times k
    base = fit_posterior(release + public, public=public, x_bound=X_BOUND, draws=1000,
                         seed=4, y_unit=Y_BOUND)
    other = fit_posterior(_in_units(release, k) + _in_units(public, k),
                          public=_in_units(public, k), x_bound=X_BOUND, draws=1000, seed=4,
                          y_unit=Y_BOUND * k)
    np.testing.assert_allclose(other.beta_mean, k * base.beta_mean, rtol=1e-6, atol=0)
    # Without a unit the priors are stated in whatever units y has: not equivariant.
    plain = fit_posterior(release + public, public=public, x_bound=X_BOUND, draws=1000, seed=4)
    plain_k = fit_posterior(_in_units(release, k) + _in_units(public, k),
                            public=_in_units(public, k), x_bound=X_BOUND, draws=1000, seed=4)
    assert np.max(np.abs(plain_k.beta_mean / k - plain.beta_mean)) > 1e-3 * np.max(
        np.abs(plain.beta_mean))


def test_aggregator_fit_uses_the_round_y_bound(y_units_seen):
    from aggregator import aggregate

    seen = y_units_seen
    release, public = _release(4)
    beta, _, diag = aggregate.fit(release + public, "laplace", 200, 1, public=public,
                                  x_bound=X_BOUND, y_bound=Y_BOUND)
    # The round's fit and its public-only reference (the information statement) alike.
    assert seen == [Y_BOUND, Y_BOUND]
    assert diag["y_unit"] == Y_BOUND and np.all(np.isfinite(beta))
