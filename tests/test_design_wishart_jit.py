"""The compiled twins (posterior.noise_aware_jit) with the Wishart-shaped design prior
(``posterior.noise_aware.DESIGN_PRIOR_WISHART``, issue 21 item 2): inputs whose ``wishart``
holds U and the inputs in U's basis with a (d, d) matrix of per-entry design variances.

What is checked, each able to fail, with the count's term in the likelihood off and on:
- the compiled density and gradient (one point) and batch density equal
  ``na.log_posterior_noise_aware`` (numpy reference; tests/test_design_wishart.py ties it to
  finite differences and the PyMC model) to ~1e-9 relative, in the original basis;
- the compiled minus Hessian equals central differences of the numpy gradient;
- the compiled Newton finds the mode and Laplace covariance that BFGS on the numpy density
  finds (in the original basis: the mode is rotated back);
- per-entry variances all equal to one value are the scalar model (the matrix branch of the
  compiled sums against the scalar one, no rotation);
- fit_posterior with the compiled backend gives the numpy backend's posterior mean within
  Monte Carlo error, and the compiled path is the one that ran (no numpy fallback).
"""

import dataclasses

import numpy as np
import pytest

from posterior import fit_posterior, noise_aware_jit, targets
from posterior import noise_aware as na
from posterior.laplace import hessian, laplace_approximation
from posterior.targets import start as _start
from tests.test_design_wishart import _wishart_inputs as wishart_inputs
from tests.test_noise_aware_jit import _points as jit_points, _rel, newton_against_bfgs


def _wishart_inputs(monkeypatch, d, n=300, count=True, seed=1):
    """tests/test_design_wishart.py's inputs (the switch on), checked to be what these tests
    need."""
    inp, stats, public = wishart_inputs(monkeypatch, d=d, n=n, count=count, seed=seed)
    assert inp.wishart is not None and np.ndim(inp.wishart[1].v_xx) == 2
    assert (inp.wishart[1].mc is not None) == count
    # A rotation that is not (close to) the identity, or the test would not see it.
    assert np.max(np.abs(np.abs(inp.wishart[0]) - np.eye(d))) > 0.1
    return inp, stats, public


def _points(rng, d, m=20):
    """tests/test_noise_aware_jit.py's points, beta at scales 0.05 to 2, log lambda in [-2, 2]."""
    return jit_points(rng, d, m, top=2.0)


@pytest.mark.parametrize("count", [False, True])
@pytest.mark.parametrize("d", [3, 10])
def test_compiled_density_gradient_and_batch_equal_numpy(monkeypatch, d, count):
    inp, stats, _ = _wishart_inputs(monkeypatch, d, count=count)
    t = noise_aware_jit.target_for("noise-aware", stats, inp)
    us = _points(np.random.default_rng(10 + d), d)
    ref = [na.log_posterior_noise_aware(u, inp) for u in us]
    vals = np.array([v for v, _ in ref])
    assert np.isfinite(vals).sum() >= 10   # most points have a positive definite C
    for u, (v, g) in zip(us, ref):
        tv, tg = t.logp_grad(u)
        if np.isfinite(v):
            assert tv == pytest.approx(v, rel=1e-9)
            assert _rel(tg, g) <= 1e-9
        else:
            assert tv == -np.inf and np.all(tg == 0.0)
    tb = t.logp_batch(us)
    fin = np.isfinite(vals)
    assert np.array_equal(np.isfinite(tb), fin)
    assert np.allclose(tb[fin], vals[fin], rtol=1e-9, atol=0.0)


@pytest.mark.parametrize("count", [False, True])
def test_compiled_hessian_equals_differences_of_the_numpy_gradient(monkeypatch, count):
    d = 10
    inp, stats, _ = _wishart_inputs(monkeypatch, d, count=count)
    t = noise_aware_jit.target_for("noise-aware", stats, inp)
    f = lambda z: na.log_posterior_noise_aware(z, inp)  # noqa: E731
    u0 = _start(stats, inp.abar, 3.0 * float(np.sqrt(inp.v_xx)) + 1.0)
    mode = laplace_approximation(f, u0).mode
    rng = np.random.default_rng(20)
    for u in (mode, mode + 0.05 * rng.standard_normal(d + 1)):
        ref = -hessian(f, u)
        h = t.neg_hessian(u)
        assert np.array_equal(h, h.T) and _rel(h, ref) <= 1e-6


@pytest.mark.parametrize("count", [False, True])
@pytest.mark.parametrize("d", [3, 10])
def test_newton_finds_the_mode_and_covariance_of_numpy_bfgs(monkeypatch, d, count):
    inp, stats, _ = _wishart_inputs(monkeypatch, d, count=count, seed=2)
    f = lambda u: na.log_posterior_noise_aware(u, inp)  # noqa: E731
    u0 = _start(stats, inp.abar, 3.0 * float(np.sqrt(inp.v_xx)) + 1.0)
    _, new = newton_against_bfgs(f, noise_aware_jit.target_for("noise-aware", stats, inp), u0)
    # The mode is a stationary point of the numpy density in the original basis.
    _, g = f(new.mode)
    assert np.max(np.abs(g)) <= 1e-4 * max(1.0, np.max(np.abs(f(u0)[1])))


def test_per_entry_variances_equal_to_one_value_are_the_scalar_model(monkeypatch):
    # The compiled matrix branch without rotation against its scalar branch.
    inp, stats, _ = _wishart_inputs(monkeypatch, 10, count=True)
    inner = inp.wishart[1]
    scalar = dataclasses.replace(inner, v_xx=0.3)
    mat = dataclasses.replace(inner, v_xx=np.full((10, 10), 0.3))
    t0 = noise_aware_jit.target_for("noise-aware", stats, scalar)
    t1 = noise_aware_jit.target_for("noise-aware", stats, mat)
    us = _points(np.random.default_rng(30), 10)
    b0 = t0.logp_batch(us)
    assert np.isfinite(b0).sum() >= 10
    assert np.allclose(t1.logp_batch(us), b0, rtol=1e-12, atol=0.0, equal_nan=False)
    for u in us[np.isfinite(b0)]:
        v0, g0 = t0.logp_grad(u)
        v1, g1 = t1.logp_grad(u)
        assert v1 == pytest.approx(v0, rel=1e-12) and _rel(g1, g0) <= 1e-10


def test_malformed_per_entry_variances_are_refused(monkeypatch):
    inp, stats, _ = _wishart_inputs(monkeypatch, 3, count=False)
    u, inner = inp.wishart
    p = np.array(inner.v_xx)
    p[0, 1] *= 1.5   # not symmetric: the compiled sums read rows, numpy columns
    bad = dataclasses.replace(inp, wishart=(u, dataclasses.replace(inner, v_xx=p)))
    with pytest.raises(ValueError, match="symmetric"):
        noise_aware_jit.target_for("noise-aware", stats, bad)
    short = dataclasses.replace(inp, wishart=(u, dataclasses.replace(inner, v_xx=p[:2, :2])))
    with pytest.raises(ValueError, match="shape"):
        noise_aware_jit.target_for("noise-aware", stats, short)


@pytest.mark.parametrize("count", [False, True])
def test_fit_posterior_compiled_matches_numpy_backend(monkeypatch, count):
    inp, stats, public = _wishart_inputs(monkeypatch, 10, n=400, count=count, seed=3)
    built = []
    real = noise_aware_jit.target_for

    def spy(model, s, i=None):
        built.append(i)
        return real(model, s, i)

    monkeypatch.setattr(noise_aware_jit, "target_for", spy)
    monkeypatch.setattr(targets, "LAPLACE_BACKEND", "numba")
    fast = fit_posterior(stats, public=public, x_bound=2.0, seed=3, draws=2000)
    assert built and all(i is not None and i.wishart is not None for i in built)
    monkeypatch.setattr(targets, "LAPLACE_BACKEND", "numpy")
    ref = fit_posterior(stats, public=public, x_bound=2.0, seed=3, draws=2000)
    assert fast.diagnostics["optimiser"] == "newton"
    assert ref.diagnostics["optimiser"] == "newton"
    sd = ref.beta_draws.std(axis=0)
    # Monte Carlo error of a mean of 2000 weighted draws is ~sd / sqrt(ESS); the same random
    # numbers and modes equal to optimiser tolerance make the draws nearly the same.
    assert np.all(np.abs(fast.beta_mean - ref.beta_mean) <= 0.05 * sd)
    assert np.all(np.abs(fast.beta_draws.std(axis=0) / sd - 1) <= 0.05)
