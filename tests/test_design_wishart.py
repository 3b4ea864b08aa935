"""The Wishart-shaped design prior (``posterior.noise_aware.DESIGN_PRIOR_WISHART``, issue 21
item 2). What is checked, each able to fail:
- the design error's covariance terms for independent symmetric entries of per-entry
  variances p (``design_error_terms``) are the covariance of (E beta, beta^T E beta) that a
  simulation of such E gives, and reduce to the scalar v_xx terms for p = v;
- with the Wishart-shaped inputs the density's gradient is right (finite differences) and
  the one-point, stacked and batched numpy densities and the PyMC model agree;
- the inputs are the per-entry conjugate update in M's eigenbasis, and the original-basis
  fields are the same design rotated back;
- the Wishart shape is the one of second moments estimated from few rows: simulated errors
  of n_priv M_hat are independent in M's eigenbasis with variance proportional to
  l_i l_j (1 + delta_ij).
"""

import dataclasses

import numpy as np
import pytest

import posterior.batched as batched
import posterior.noise_aware as na
from dpfed_apps.evaluation.coverage import prior_problem
from tests.conftest import fd_grad, lam0_marginal


def _symmetric_errors(rng, p, size):
    """Symmetric matrices whose upper-triangle entries are independent N(0, p_ij)."""
    d = p.shape[0]
    e = rng.standard_normal((size, d, d)) * np.sqrt(p)
    up = np.triu(e)
    return up + np.transpose(np.triu(e, 1), (0, 2, 1))


def test_design_error_terms_are_the_covariance_of_the_error():
    rng = np.random.default_rng(0)
    d = 4
    p = np.abs(rng.standard_normal((d, d))) + 0.2
    p = p + p.T
    beta = rng.standard_normal(d)
    e = _symmetric_errors(rng, p, 400_000)
    eb = e @ beta
    q = np.einsum("i,mij,j->m", beta, e, beta)
    cov = np.cov(np.column_stack([eb, q]).T)
    diag_add, c12, c22 = na.design_error_terms(beta, p)
    c11 = p * np.outer(beta, beta)
    c11[np.diag_indices(d)] += diag_add
    scale = np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    assert np.allclose(cov[:d, :d], c11, atol=0.02 * scale[:d, :d].max())
    assert np.allclose(cov[:d, d], c12, atol=0.02 * np.sqrt(cov[d, d] * cov[:d, :d].max()))
    assert c22 == pytest.approx(cov[d, d], rel=0.02)
    # p = v everywhere: the scalar terms of the module docstring.
    v = 0.7
    s, b2 = beta @ beta, beta * beta
    dg, c12v, c22v = na.design_error_terms(beta, np.full((d, d), v))
    assert np.allclose(dg, v * (s - b2))
    assert np.allclose(c12v, v * beta * (2 * s - b2))
    assert c22v == pytest.approx(v * (2 * s * s - b2 @ b2))


def _wishart_inputs(monkeypatch, d=5, n=300, count=True, seed=1):
    monkeypatch.setattr(na, "DESIGN_PRIOR_WISHART", True)
    monkeypatch.setattr(na, "COUNT_IN_LIKELIHOOD", count)
    p = prior_problem(np.random.default_rng(seed), d, n, 1.0, 1)
    stats = p.release + p.public
    return na.noise_aware_inputs(stats, p.public, 2.0), stats, p.public


@pytest.mark.parametrize("count", [False, True])
def test_gradient_and_the_numpy_densities_agree(monkeypatch, count):
    inp, _, _ = _wishart_inputs(monkeypatch, count=count)
    assert inp.wishart is not None and (inp.wishart[1].mc is not None) == count
    rng = np.random.default_rng(2)
    us = rng.standard_normal((5, inp.dim + 1)) * 0.4
    ref = [na.log_posterior_noise_aware(u, inp) for u in us]
    for u, (_, g) in zip(us, ref):
        assert np.allclose(g, fd_grad(lambda z: na.log_posterior_noise_aware(z, inp), u),
                           rtol=1e-5, atol=1e-5)
    bv, bg = batched.noise_aware_logp_grad(us, inp)
    assert np.allclose(bv, [v for v, _ in ref]) and np.allclose(bg, [g for _, g in ref])
    assert np.allclose(batched.noise_aware_logp(us, inp), bv)
    assert np.allclose(na.log_posterior_noise_aware_batch(us, inp), bv)


def test_matrix_variances_equal_to_one_value_are_the_scalar_model():
    rng = np.random.default_rng(3)
    for d in (4, batched._LARGE + 1):   # the bordered value path from _LARGE on
        a = rng.standard_normal((d, d))
        a = a @ a.T + d * np.eye(d)
        inp = na.NoiseAwareInputs(a, rng.standard_normal(d), 30.0, 50.0, a, 0.3, 0.5, 0.7, 4.0)
        mat = dataclasses.replace(inp, v_xx=np.full((d, d), 0.3))
        us = rng.standard_normal((3, d + 1)) * 0.2
        assert np.allclose(batched.noise_aware_logp(us, mat), batched.noise_aware_logp(us, inp))
        if d < batched._LARGE:
            v1, g1 = batched.noise_aware_logp_grad(us, mat)
            v0, g0 = batched.noise_aware_logp_grad(us, inp)
            assert np.allclose(v1, v0) and np.allclose(g1, g0)


def test_the_inputs_are_the_conjugate_update_in_the_eigenbasis(monkeypatch):
    inp, stats, public = _wishart_inputs(monkeypatch, count=False)
    u, inner = inp.wishart
    d = inp.dim
    m, _, _, n_priv = na.design_moments(stats, public, 2.0)
    lam = np.linalg.eigvalsh(m)
    assert np.allclose(u.T @ m @ u, np.diag(lam), atol=1e-10)
    vxx = stats.noise.variances()["xtx"]
    c = na.DESIGN_PRIOR_WISHART_SHARE / public.n * n_priv ** 2 + n_priv
    pv = c * np.outer(lam, lam) * (1 + np.eye(d))
    rot = u.T @ (np.array(stats.xtx) - public.xtx) @ u
    w = pv / (pv + vxx)
    assert np.allclose(inner.rxx, w * rot + (1 - w) * np.diag(n_priv * lam))
    assert np.allclose(inner.v_xx, pv * vxx / (pv + vxx))
    # The original-basis fields hold the same design; the response side is rotated.
    assert np.allclose(inp.rxx, u @ inner.rxx @ u.T)
    assert np.allclose(inner.rxy, u.T @ inp.rxy)
    assert np.allclose(inner.pxx, u.T @ public.xtx @ u)
    # Off: the rule by entry, no rotation.
    monkeypatch.setattr(na, "DESIGN_PRIOR_WISHART", False)
    assert na.noise_aware_inputs(stats, public, 2.0).wishart is None


def test_second_moments_from_few_rows_err_with_the_wishart_shape():
    # n_priv (M_hat - M) from n_pub normal rows, in M's eigenbasis: entries uncorrelated,
    # variance (n_priv^2 / n_pub) l_i l_j (1 + delta_ij). That is the shape the prior states.
    rng = np.random.default_rng(5)
    d, n_pub, n_priv, reps = 3, 10, 100, 40_000
    a = rng.standard_normal((d, d))
    m = a @ a.T + 0.5 * np.eye(d)
    lam, u = np.linalg.eigh(m)
    x = rng.standard_normal((reps, n_pub, d)) @ np.linalg.cholesky(m).T
    err = n_priv * (np.einsum("rni,rnj->rij", x, x) / n_pub - m)
    rot = np.einsum("ia,rij,jb->rab", u, err, u)
    iu = np.triu_indices(d)
    flat = rot[:, iu[0], iu[1]]
    cov = np.cov(flat.T)
    expect = n_priv ** 2 / n_pub * (np.outer(lam, lam) * (1 + np.eye(d)))[iu]
    assert np.allclose(np.diag(cov), expect, rtol=0.05)
    corr = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    assert np.max(np.abs(corr - np.eye(len(expect)))) < 0.05


@pytest.mark.slow
def test_pymc_model_is_the_same_density(monkeypatch):
    from posterior.model import build_noise_aware_model

    inp, _, _ = _wishart_inputs(monkeypatch, d=3, n=200)
    lp = build_noise_aware_model(inp).compile_logp()
    rng = np.random.default_rng(6)
    for _ in range(2):
        beta, a = rng.standard_normal(3) * 0.5, rng.standard_normal() * 0.3
        assert lam0_marginal(lp, beta, a) == pytest.approx(
            na.log_posterior_noise_aware(np.r_[beta, a], inp)[0], abs=1e-4)
