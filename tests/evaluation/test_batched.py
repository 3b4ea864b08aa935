"""evaluation.batched: the batched Gamma-prior ADVI is the model and algorithm of aggregator."""

import numpy as np
import pytest

from aggregator.posterior import fit_posterior, variational_init
from aggregator.repair import repair_statistics
from dpfed.statistics import Statistics, exact_statistics
from evaluation.batched import batched_logp, batched_variational_init, fit_batch, run_steps


def _noisy_problems(count, d=4, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(20, 400))
        x = rng.normal(size=(n, d))
        x /= np.linalg.norm(x, axis=1)[:, None]
        y = x @ rng.normal(size=d) + rng.normal(size=n)
        s = exact_statistics(x, y)
        xtx = s.xtx + np.diag(rng.laplace(size=d))
        xtx = np.triu(xtx) + np.triu(xtx, 1).T
        out.append(Statistics(xtx, s.xty + rng.laplace(size=d), s.yty + rng.laplace(), s.n))
    return out


@pytest.mark.slow  # imports PyMC
def test_logp_matches_the_pymc_model():
    import pymc as pm
    import pytensor
    import pytensor.tensor as pt

    from aggregator.model import build_model

    d = 3
    s = _noisy_problems(1, d)[0]
    model, _ = build_model(d)
    with model:
        pm.set_data({"xtx": s.xtx, "xty": s.xty, "yty": np.float64(s.yty), "n": np.float64(s.n)})
    logp = model.compile_logp(jacobian=True)
    z = np.random.default_rng(1).normal(size=(5, d + 2))
    Z, X, XY, YY, N = pt.dmatrix(), pt.tensor3(), pt.dmatrix(), pt.dvector(), pt.dvector()
    f = pytensor.function([Z, X, XY, YY, N], batched_logp(Z, X, XY, YY, N, pt))
    ours = f(z, np.stack([s.xtx] * 5), np.stack([s.xty] * 5), np.full(5, s.yty), np.full(5, s.n))
    ref = [float(logp({"lam_log__": r[0], "lam0_log__": r[1], "beta": r[2:]})) for r in z]
    np.testing.assert_allclose(ours, ref, rtol=1e-10)


def test_kernel_gradient_matches_autodiff():
    import pytensor
    import pytensor.tensor as pt

    d, B = 3, 4
    stats = [repair_statistics(s)[0] for s in _noisy_problems(B, d, seed=2)]
    xtx = np.stack([s.xtx for s in stats]); xty = np.stack([s.xty for s in stats])
    yty = np.array([s.yty for s in stats]); n = np.array([float(s.n) for s in stats])
    rng = np.random.default_rng(3)
    mu, rho, eps = rng.normal(size=(B, d + 2)), rng.normal(size=(B, d + 2)), rng.normal(size=(1, B, d + 2))
    # One step: the window averages of the gradients are the gradients at the start state.
    zeros = [np.zeros((B, d + 2)) for _ in range(4)]
    avg = run_steps(eps, 0.0, mu.copy(), rho.copy(), *zeros, 1e-3, xtx, xty, yty, n)
    M, R, E = pt.dmatrix(), pt.dmatrix(), pt.dmatrix()
    sd = pt.softplus(R)
    loss = -(batched_logp(M + sd * E, xtx, xty, yty, n, pt) + pt.sum(pt.log(sd), axis=1))
    grads = pytensor.function([M, R, E], pytensor.grad(pt.sum(loss), [M, R]))(mu, rho, eps[0])
    np.testing.assert_allclose(avg[:, 2, :], grads[0], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(avg[:, 3, :], grads[1], rtol=1e-9, atol=1e-9)


def test_batched_init_equals_the_aggregators():
    stats = [repair_statistics(s)[0] for s in _noisy_problems(6, 5, seed=4)]
    mu, sd = batched_variational_init(np.stack([s.xtx for s in stats]),
                                      np.stack([s.xty for s in stats]),
                                      np.array([s.yty for s in stats]),
                                      np.array([s.n for s in stats]))
    for i, s in enumerate(stats):
        ref_mu, ref_sd = variational_init(s)
        np.testing.assert_allclose(mu[i], ref_mu, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(sd[i], ref_sd, rtol=1e-10, atol=1e-12)


@pytest.mark.slow  # compiles the aggregator's ADVI engine
def test_fit_batch_agrees_with_fit_posterior_within_monte_carlo_error():
    stats = _noisy_problems(8, 4, seed=5)
    res = fit_batch(stats, seed=1)
    assert res.converged.all()
    assert res.beta_mean.shape == (8, 4)
    for i, s in enumerate(stats):
        post = fit_posterior(s, method="advi", seed=7)
        sd = np.asarray(post.diagnostics["beta_sd"])
        # Two independent stochastic optimisations of the same ELBO: both are within the
        # 0.1-sd stationarity tolerance of the optimum, so they differ by well under 1 sd.
        assert np.all(np.abs(res.beta_mean[i] - post.beta_mean) < 0.5 * sd)


def test_fit_batch_is_deterministic_and_independent_of_batch_companions():
    stats = _noisy_problems(3, 4, seed=6)
    a = fit_batch(stats, seed=11)
    b = fit_batch(stats, seed=11)
    np.testing.assert_array_equal(a.beta_mean, b.beta_mean)


def test_fit_batch_rejects_mixed_dimensions_and_empty_input():
    with pytest.raises(ValueError):
        fit_batch([])
    with pytest.raises(ValueError):
        fit_batch(_noisy_problems(1, 3) + _noisy_problems(1, 4))
    with pytest.raises(TypeError):
        fit_batch([np.eye(3)])


def test_unconverged_problem_is_flagged_not_dropped():
    stats = _noisy_problems(2, 3, seed=8)
    res = fit_batch(stats, seed=0, max_iterations=10, window=5, min_windows=5)
    assert not res.converged.any()
    assert np.all(np.isfinite(res.beta_mean))
    assert list(res.iterations) == [10, 10]
