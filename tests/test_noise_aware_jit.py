"""The compiled fast path of the Laplace fit (posterior.noise_aware_jit, posterior.laplace).

What is checked, each able to fail:
- the Numba densities, gradients and batch densities equal the numpy reference functions of
  posterior.noise_aware (which tests/test_noise_aware.py ties to the PyMC model) to ~1e-10
  relative, for d in {1, 3, 10, 40}, on random inputs, and agree on where C is not PD;
- the compiled difference Hessian equals laplace.hessian of the numpy gradient;
- Newton finds the mode and Laplace covariance that BFGS on the numpy density finds;
- a Newton failure falls back to BFGS;
- the proposal count (2 per draw, 1000-4000) and the top-up to 4000 when the ESS is low;
- fit_posterior with the compiled backend matches the numpy backend.
"""

import numpy as np
import pytest

from dpfed.statistics import exact_statistics
from posterior import fit_posterior, targets
from posterior import noise_aware as na
from posterior.laplace import (MAX_PROPOSALS, default_proposals, hessian,
                               laplace_approximation, laplace_importance)
from posterior.noise_aware_jit import target_for
from posterior.targets import start as _start

from tests.test_noise_aware import _problem

DIMS = (1, 3, 10, 40)


def _inputs(d, seed):
    rng = np.random.default_rng(seed)
    _, release, public = _problem(rng, d, 20 * d + 100, 1.0, 1)
    stats = release + public
    inp = na.noise_aware_inputs(stats, public)
    exact = exact_statistics(rng.standard_normal((3 * d + 5, d)), rng.standard_normal(3 * d + 5))
    return rng, stats, inp, exact


def _points(rng, d, m=25, top=3.0):
    """Random u = (beta, log lambda), beta at scales 0.05 to ``top``, log lambda in
    [-top, top]."""
    scale = np.exp(rng.uniform(np.log(0.05), np.log(top), size=(m, 1)))
    return np.c_[rng.standard_normal((m, d)) * scale, rng.uniform(-top, top, size=m)]


def newton_against_bfgs(f, target, u0):
    """(BFGS on the numpy density ``f``, the compiled target's Newton) from ``u0``, checked to
    find the same mode and Laplace covariance."""
    ref = laplace_approximation(f, u0)
    new = laplace_approximation(target.logp_grad, u0, newton=target.newton,
                                neg_hessian=target.neg_hessian)
    assert ref.converged and new.converged
    assert new.optimiser == "newton" and new.iterations <= 30
    sd = np.sqrt(np.diag(ref.cov))
    # BFGS stops at |g|_inf <= 1e-6 max(1, |g0|); the modes agree far inside a posterior sd.
    assert np.all(np.abs(new.mode - ref.mode) <= 1e-3 * sd)
    assert _rel(new.cov, ref.cov) <= 1e-3
    return ref, new


def _rel(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.mark.parametrize("d", DIMS)
def test_numba_densities_equal_the_numpy_reference(d):
    rng, stats, inp, exact = _inputs(d, 100 + d)
    t_na = target_for("noise-aware", stats, inp)
    t_ex = target_for("exact", exact)
    us = _points(rng, d)
    for u in us:
        v, g = na.log_posterior_noise_aware(u, inp)
        v2, g2 = t_na.logp_grad(u)
        assert np.isfinite(v)
        assert _rel(v2, v) <= 1e-10 and _rel(g2, g) <= 1e-10, (u, v, v2, g, g2)
        v, g = na.log_posterior_exact(u, exact)
        v2, g2 = t_ex.logp_grad(u)
        assert _rel(v2, v) <= 1e-10 and _rel(g2, g) <= 1e-10
    for fb, t in ((lambda x: na.log_posterior_noise_aware_batch(x, inp), t_na),
                  (lambda x: na.log_posterior_exact_batch(x, exact), t_ex)):
        ref, mine = fb(us), t.logp_batch(us)
        assert np.all(np.abs(mine - ref) <= 1e-10 * np.abs(ref)), np.max(np.abs(mine - ref))
        # and each row equals the scalar density
        assert np.allclose(mine, [t.logp_grad(u)[0] for u in us], rtol=1e-12, atol=0)


def test_covariance_not_positive_definite_is_minus_infinity_in_both():
    d = 3
    rng = np.random.default_rng(0)
    abar = np.diag([1.0, -1.0, 2.0])  # indefinite, and no release variance to rescue it
    inp = na.NoiseAwareInputs(abar, rng.standard_normal(d), 5.0, 50.0, abar, 0.0, 0.0, 0.0, 0.0)
    stats = exact_statistics(rng.standard_normal((20, d)), rng.standard_normal(20))
    t = target_for("noise-aware", stats, inp)
    us = _points(rng, d, 5)
    for u in us:
        assert na.log_posterior_noise_aware(u, inp)[0] == -np.inf
        v, g = t.logp_grad(u)
        assert v == -np.inf and np.all(g == 0)
    assert np.all(na.log_posterior_noise_aware_batch(us, inp) == -np.inf)
    assert np.all(t.logp_batch(us) == -np.inf)


@pytest.mark.parametrize("d", (3, 10))
def test_compiled_hessian_equals_differences_of_the_numpy_gradient(d):
    rng, stats, inp, exact = _inputs(d, 200 + d)
    t = target_for("noise-aware", stats, inp)
    for u in _points(rng, d, 3):
        ref = -hessian(lambda z: na.log_posterior_noise_aware(z, inp), u)
        assert _rel(t.neg_hessian(u), ref) <= 1e-7


@pytest.mark.parametrize("d", (1, 3, 10, 40))
@pytest.mark.parametrize("model", ("noise-aware", "exact"))
def test_newton_finds_the_mode_and_covariance_of_bfgs(d, model):
    rng, stats, inp, _ = _inputs(d, 300 + d)
    if model == "noise-aware":
        f = lambda u: na.log_posterior_noise_aware(u, inp)  # noqa: E731
        u0 = _start(stats, inp.abar, 3.0 * float(np.sqrt(inp.v_xx)) + 1.0)
    else:
        stats = exact_statistics(rng.standard_normal((10 * d + 20, d)),
                                 rng.standard_normal(10 * d + 20))
        f = lambda u: na.log_posterior_exact(u, stats)  # noqa: E731
        u0 = _start(stats, stats.xtx, 1.0)
    ref, new = newton_against_bfgs(f, target_for(model, stats, inp), u0)
    assert new.log_density >= ref.log_density - 1e-8 * abs(ref.log_density)


def test_failed_newton_falls_back_to_bfgs():
    rng, stats, inp, _ = _inputs(3, 7)
    t = target_for("noise-aware", stats, inp)
    u0 = _start(stats, inp.abar, 3.0 * float(np.sqrt(inp.v_xx)) + 1.0)

    def broken(u, tol, max_iterations):
        k = u.size
        return 4, u.copy(), float("nan"), np.full(k, np.nan), np.full((k, k), np.nan), 2

    res = laplace_approximation(t.logp_grad, u0, newton=broken, neg_hessian=t.neg_hessian)
    good = laplace_approximation(t.logp_grad, u0, newton=t.newton, neg_hessian=t.neg_hessian)
    assert res.converged and res.optimiser == "bfgs" and res.newton_iterations == 2
    assert "Newton failed" in res.message
    assert np.allclose(res.mode, good.mode, atol=1e-4)


def test_proposal_count_and_top_up():
    assert [default_proposals(n) for n in (1, 500, 1000, 1500, 5000)] == [1000, 1000, 2000,
                                                                          3000, 4000]
    rng, stats, inp, _ = _inputs(3, 11)
    t = target_for("noise-aware", stats, inp)
    u0 = _start(stats, inp.abar, 3.0 * float(np.sqrt(inp.v_xx)) + 1.0)
    kw = dict(draws=1000, newton=t.newton, neg_hessian=t.neg_hessian)
    plain = laplace_importance(t.logp_grad, t.logp_batch, u0, rng=np.random.default_rng(0),
                               top_up_ess=0.0, **kw)
    topped = laplace_importance(t.logp_grad, t.logp_batch, u0, rng=np.random.default_rng(0),
                                top_up_ess=np.inf, **kw)
    assert plain.proposals == 2000 and topped.proposals == MAX_PROPOSALS
    assert plain.draws.shape == topped.draws.shape == (1000, 4)
    assert topped.ess > plain.ess


@pytest.mark.parametrize("d", (3, 10))
def test_fit_posterior_compiled_matches_numpy_backend(d, monkeypatch):
    rng = np.random.default_rng(40 + d)
    _, release, public = _problem(rng, d, 400, 1.0, 1)
    exact = exact_statistics(rng.standard_normal((200, d)), rng.standard_normal(200))
    for stats, pub in ((release + public, public), (exact, None)):
        monkeypatch.setattr(targets, "LAPLACE_BACKEND", "numba")
        fast = fit_posterior(stats, public=pub, seed=3, draws=2000)
        monkeypatch.setattr(targets, "LAPLACE_BACKEND", "numpy")
        ref = fit_posterior(stats, public=pub, seed=3, draws=2000)
        monkeypatch.setattr(targets, "LAPLACE_BACKEND", "numba")
        assert fast.diagnostics["optimiser"] == "newton"
        assert ref.diagnostics["optimiser"] == "newton"   # numpy: newton_batched
        assert fast.diagnostics["importance_proposals"] == ref.diagnostics["importance_proposals"]
        sd = ref.beta_draws.std(axis=0)
        # Same random numbers, modes equal to optimiser tolerance: (nearly) the same draws.
        assert np.all(np.abs(fast.beta_mean - ref.beta_mean) <= 0.05 * sd)
        assert np.all(np.abs(fast.beta_draws.std(axis=0) / sd - 1) <= 0.05)


_REFIT = """
import numpy as np
from posterior import fit_posterior
from tests.test_noise_aware import _problem
_, release, public = _problem(np.random.default_rng(5), 10, 300, 1.0, 1)
post = fit_posterior(release + public, public=public, method="laplace", draws=400, seed=3)
print(" ".join(float(v).hex() for v in post.beta_mean))
"""


@pytest.mark.slow
def test_fit_is_bit_identical_whether_compiled_here_or_loaded_from_cache(tmp_path):
    # A refit must reproduce the aggregator's fit bit for bit. The first process compiles the
    # densities (empty NUMBA_CACHE_DIR), the second loads its machine code from the cache:
    # with fastmath reassociation the two disagreed in the 12th digit.
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               DPFED_POSTERIOR_BACKEND="numba")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outputs = [subprocess.run([sys.executable, "-c", _REFIT], env=env, cwd=root, check=True,
                              capture_output=True, text=True).stdout.split()
               for _ in range(2)]
    assert os.listdir(tmp_path / "numba")          # the second process had a cache to load
    assert len(outputs[0]) == 10 and outputs[0] == outputs[1]
