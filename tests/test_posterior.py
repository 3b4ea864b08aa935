"""Tests of posterior.fit_posterior (method.md sections 1 and 6; Honkela et al. 2018, 4.1)."""

import json
import warnings

import numpy as np
import pytest

from dpfed.sensitivity import expected_noise
from dpfed.statistics import Statistics, clipped_exact_statistics, exact_statistics
from posterior import ConvergenceError, Posterior, PosteriorError, fit_posterior
from posterior.closed_form import closed_form_mean, posterior_precision
from posterior.model import get_advi_engine
from site_node.release import release_statistics

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning",
                                        "ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def advi_engine():
    """The compiled ADVI graph, shared by every test of the module (compiled once)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine, _ = get_advi_engine()
    return engine


@pytest.fixture(scope="module")
def large_exact():
    """Exact statistics of n=20000, d=5 synthetic data with known beta."""
    rng = np.random.default_rng(2024)
    d, n = 5, 20000
    beta = rng.normal(size=d)
    x = rng.normal(size=(n, d))
    y = x @ beta + rng.normal(size=n)
    return exact_statistics(x, y), beta


def _synthetic(rng, n, d, noise_sd=0.3):
    """Pre-processed like method.md 2.1: unit-norm rows, centred y."""
    beta = rng.normal(size=d)
    x = rng.normal(size=(n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = x @ beta + noise_sd * rng.normal(size=n)
    return x, y - y.mean()


@pytest.fixture(scope="module")
def noisy_release():
    """A release of n=800, d=10 synthetic data at eps=2 whose Sxx is indefinite (method.md
    section 6). The noise is Laplace at the release's own scales but drawn from a seeded
    generator, so the fixture (and the NUTS run on it) is the same on every run: a site's
    CSPRNG release made ADVI-vs-NUTS a lottery on r-hat (1.053 > 1.05 once in CI)."""
    rng = np.random.default_rng(7)
    noise = expected_noise(10, 2.0, 0.3, 1.0)
    sd = {k: np.sqrt(v / 2) for k, v in noise.variances().items()}
    for _ in range(20):
        x, y = _synthetic(rng, 800, 10)
        exact = clipped_exact_statistics(x, y, 0.3, 1.0)
        e = rng.laplace(size=(10, 10)) * sd["xtx"]
        s = Statistics(exact.xtx + np.triu(e) + np.triu(e, 1).T,
                       exact.xty + rng.laplace(size=10) * sd["xty"],
                       exact.yty + rng.laplace() * sd["yty"],
                       max(0, 800 + int(round(rng.laplace() * sd["n"]))), noise)
        if np.linalg.eigvalsh(s.xtx)[0] < 0:
            return s
    pytest.fail("no indefinite release in 20 tries")


# ---------------------------------------------------------------------------- fixed

def test_fixed_equals_closed_form_and_numpy_solve(large_exact):
    stats, _ = large_exact
    for lam, lam0 in [(1.0, 1.0), (0.3, 4.0)]:
        post = fit_posterior(stats, plug_in=True, method="fixed", lam=lam, lam0=lam0, seed=0)
        explicit = np.linalg.solve(lam0 * np.eye(stats.dim) + lam * stats.xtx, lam * stats.xty)
        np.testing.assert_allclose(post.beta_mean, explicit, rtol=0, atol=1e-10)
        np.testing.assert_allclose(post.beta_mean, closed_form_mean(stats.xtx, stats.xty, lam, lam0),
                                   rtol=0, atol=1e-10)
        assert post.lam["mean"] == lam and post.lam0["mean"] == lam0
        assert not post.diagnostics["repair"]["changed"]


def test_fixed_draws_have_the_posterior_covariance():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 3))
    stats = exact_statistics(x, x @ [1.0, -1.0, 0.5] + rng.normal(size=30))
    post = fit_posterior(stats, plug_in=True, method="fixed", draws=200_000, seed=3)
    cov = np.linalg.inv(posterior_precision(stats.xtx, 1.0, 1.0))
    np.testing.assert_allclose(np.cov(post.beta_draws.T), cov, atol=0.02 * np.abs(cov).max())
    np.testing.assert_allclose(post.beta_draws.mean(0), post.beta_mean, atol=0.01)


def test_fixed_repairs_indefinite_statistics(noisy_release):
    post = fit_posterior(noisy_release, plug_in=True, method="fixed", seed=0)
    rep = post.diagnostics["repair"]
    assert rep["changed"] and rep["negative_eigenvalues"] > 0
    assert np.linalg.eigvalsh(post.stats.xtx)[0] > 0
    np.testing.assert_allclose(post.beta_mean, closed_form_mean(post.stats.xtx, post.stats.xty),
                               atol=1e-10)


# ---------------------------------------------------------------------------- truth recovery

def test_fixed_and_advi_recover_truth(large_exact, advi_engine):
    stats, beta = large_exact
    for method in ("fixed", "advi"):
        post = fit_posterior(stats, plug_in=True, method=method, seed=11, draws=2000)
        np.testing.assert_allclose(post.beta_mean, beta, atol=0.03, err_msg=method)
        assert post.diagnostics["converged"]
    # The noise precision is 1 in the simulation.
    assert post.lam["mean"] == pytest.approx(1.0, rel=0.05)


@pytest.mark.slow
def test_nuts_recovers_truth(large_exact):
    stats, beta = large_exact
    post = fit_posterior(stats, plug_in=True, method="nuts", seed=5, draws=1000, tune=500)
    np.testing.assert_allclose(post.beta_mean, beta, atol=0.03)
    d = post.diagnostics
    assert d["converged"] and d["max_rhat"] < 1.05 and d["divergences"] == 0 and d["min_ess_bulk"] > 100
    assert post.lam["mean"] == pytest.approx(1.0, rel=0.05)


# ---------------------------------------------------------------------------- ADVI vs NUTS

@pytest.mark.slow
def test_advi_agrees_with_nuts_on_repaired_noisy_statistics(noisy_release, advi_engine):
    advi = fit_posterior(noisy_release, plug_in=True, method="advi", seed=1)
    nuts = fit_posterior(noisy_release, plug_in=True, method="nuts", seed=1, draws=1000, tune=500)
    sd = nuts.beta_draws.std(axis=0)
    z = np.abs(advi.beta_mean - nuts.beta_mean) / sd
    assert z.max() < 0.3, z
    assert advi.lam["mean"] == pytest.approx(nuts.lam["mean"], rel=0.1)
    assert advi.diagnostics["repair"] == nuts.diagnostics["repair"]
    assert advi.diagnostics["repair"]["negative_eigenvalues"] > 0


# ---------------------------------------------------------------------------- robustness

@pytest.mark.slow
def test_posterior_proper_and_finite_on_many_noisy_releases(advi_engine):
    rng = np.random.default_rng(99)
    repaired = 0
    for i in range(20):
        x, y = _synthetic(rng, 60, 10)
        s = release_statistics(x, y, epsilon=0.5, x_bound=0.3, y_bound=1.0)
        for method in ("advi", "fixed"):
            post = fit_posterior(s, plug_in=True, method=method, seed=i, draws=500)
            assert np.all(np.isfinite(post.beta_mean)) and np.all(np.isfinite(post.beta_draws))
            assert np.all(np.isfinite(post.predict(x)))
            assert post.diagnostics["converged"]
            assert "repair" in post.diagnostics
        if post.diagnostics["repair"]["changed"]:
            repaired += 1
            assert np.isfinite(post.lam["mean"]) or method == "fixed"
    assert repaired >= 15  # at this n and eps nearly every release is indefinite


def test_unrepaired_naive_model_is_unbounded(noisy_release):
    # Why the repair exists: the naive quadratic form has no lower bound.
    # Along the eigenvector of the negative eigenvalue the form falls like t^2 |w_min|,
    # whatever that eigenvalue's size (the release's noise is a CSPRNG's: not seeded).
    w, v = np.linalg.eigh(noisy_release.xtx)
    assert w[0] < 0

    def q(t):
        b = t * v[:, 0]
        return b @ noisy_release.xtx @ b - 2 * b @ noisy_release.xty + noisy_release.yty

    # t^2 |w_min| >= 1e8 and at least 4x the linear term's 2 t |v . Sxy|.
    t = max(1e4 / np.sqrt(-w[0]), 8 * abs(v[:, 0] @ noisy_release.xty) / -w[0])
    assert q(10 * t) < q(t) < -1e6


# ---------------------------------------------------------------------------- convergence

def test_nonconvergence_is_refused(advi_engine, large_exact):
    stats, _ = large_exact
    with pytest.raises(ConvergenceError) as err:
        fit_posterior(stats, plug_in=True, method="advi", max_iterations=50, seed=0)
    assert err.value.diagnostics["converged"] is False
    assert isinstance(err.value, PosteriorError)
    # From the prior with a tiny learning rate the fit cannot converge in 3 windows either.
    with pytest.raises(ConvergenceError):
        fit_posterior(stats, plug_in=True, method="advi", init="prior", learning_rate=1e-4,
                      max_iterations=3000, window=1000, seed=0)


def test_advi_from_prior_converges(advi_engine, large_exact):
    stats, beta = large_exact
    post = fit_posterior(stats, plug_in=True, method="advi", init="prior", seed=2, draws=1000)
    np.testing.assert_allclose(post.beta_mean, beta, atol=0.03)
    assert post.diagnostics["iterations"] > 2000


# ---------------------------------------------------------------------------- determinism, API

def test_deterministic_given_seed(advi_engine, noisy_release):
    for method in ("advi", "fixed"):
        a = fit_posterior(noisy_release, plug_in=True, method=method, seed=42, draws=300)
        b = fit_posterior(noisy_release, plug_in=True, method=method, seed=42, draws=300)
        c = fit_posterior(noisy_release, plug_in=True, method=method, seed=43, draws=300)
        assert np.array_equal(a.beta_draws, b.beta_draws) and np.array_equal(a.beta_mean, b.beta_mean)
        assert not np.array_equal(a.beta_draws, c.beta_draws)
    p = fit_posterior(noisy_release, plug_in=True, method="fixed", draws=10)
    assert isinstance(p.diagnostics["seed"], int)
    again = fit_posterior(noisy_release, plug_in=True, method="fixed", draws=10, seed=p.diagnostics["seed"])
    assert np.array_equal(p.beta_draws, again.beta_draws)


def test_posterior_api(advi_engine, noisy_release):
    post = fit_posterior(noisy_release, plug_in=True, method="advi", seed=0, draws=400)
    assert isinstance(post, Posterior) and post.beta_draws.shape == (400, 10)
    x = np.random.default_rng(0).normal(size=(7, 10))
    pred = post.predict(x)
    assert pred.shape == (7,)
    np.testing.assert_allclose(pred, x @ post.beta_draws.mean(0))
    assert post.predict(x[0]).shape == (1,)
    lo, hi = post.predict_interval(x, level=0.8)
    assert lo.shape == hi.shape == (7,) and np.all(lo < pred) and np.all(pred < hi)
    ci = post.credible_interval(0.9)
    assert ci.shape == (10, 2) and np.all(ci[:, 0] < ci[:, 1])
    with pytest.raises(ValueError):
        post.credible_interval(1.5)
    with pytest.raises(ValueError):
        post.predict(np.ones((2, 3)))
    with pytest.raises(ValueError):
        post.beta_draws[0, 0] = 1.0  # read-only
    d = post.to_dict()
    text = json.dumps(d)
    assert "beta_draws" not in d and len(text) < 20_000
    assert d["diagnostics"]["method"] == "advi" and d["diagnostics"]["converged"]
    for key in ("iterations", "final_loss", "fit_seconds", "repair"):
        assert key in d["diagnostics"]
    assert len(post.to_dict(include_draws=True)["beta_draws"]) == 400
    assert {"mean", "sd", "q05", "q95"} <= set(post.lam)


def test_invalid_arguments(large_exact):
    stats, _ = large_exact
    with pytest.raises(ValueError):
        fit_posterior(stats, plug_in=True, method="gibbs")
    with pytest.raises(ValueError):
        fit_posterior(stats, plug_in=True, method="fixed", lam=0.0)
    with pytest.raises(ValueError):
        fit_posterior(stats, plug_in=True, method="fixed", draws=0)
    with pytest.raises(ValueError):
        fit_posterior(stats, plug_in=True, method="fixed", seed=-1)
    with pytest.raises(TypeError):
        fit_posterior((stats.xtx, stats.xty), plug_in=True, method="fixed")
