"""posterior.envelope: the rotation-invariant envelope of the noise-aware density (issue 21
item 4) against a dense reference of its own formula, against the exact density where the two
coincide (no noise on Sxx), and its gradient against finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from dpfed.noise import NoiseDescription
from dpfed.statistics import Statistics, exact_statistics
from posterior import batched
from posterior import noise_aware as na
from posterior.envelope import envelope, envelope_logp, envelope_logp_grad


def _release(d, n=400, seed=0, xtx_scale=0.05, public=20):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n + public, d)) / np.sqrt(d)
    y = x @ rng.normal(size=d) + 0.3 * rng.normal(size=n + public)
    noise = NoiseDescription.single("laplace", xtx=xtx_scale, xty=0.2, yty=0.5)
    s = exact_statistics(x[:n], y[:n])
    m = d * (d + 1) // 2
    v = s.upper_values().copy()
    v[:m] += rng.laplace(size=m) * xtx_scale
    v[m:m + d] += rng.laplace(size=d) * 0.2
    v[-1] += rng.laplace() * 0.5
    pub = exact_statistics(x[n:], y[n:])
    return Statistics.from_upper(d, n, v, noise) + pub, pub


def _dense_envelope_logp(u, inp):
    """The envelope's density built densely in the original basis (module docstring, E1
    rotated back): C11 = rho Abar + (v_xy + v |b|^2) I + v b b^T, C12 = 2 rho Abar b +
    2 v |b|^2 b, C22 = 4 rho b'Abar b + (2n + v_n) rho^2 + v_yy + 2 v |b|^4."""
    d = inp.dim
    beta, a = u[:d], u[d]
    rho = np.exp(-a)
    v, s = inp.v_xx, float(beta @ beta)
    c = np.empty((d + 1, d + 1))
    c[:d, :d] = rho * inp.abar + (inp.v_xy + v * s) * np.eye(d) + v * np.outer(beta, beta)
    c12 = 2 * rho * inp.abar @ beta + 2 * v * s * beta
    c[:d, d] = c[d, :d] = c12
    c[d, d] = (4 * rho * beta @ inp.abar @ beta + (2 * inp.n + inp.v_n) * rho ** 2 + inp.v_yy
               + 2 * v * s * s)
    r = np.empty(d + 1)
    r[:d] = inp.rxy - inp.rxx @ beta
    r[d] = inp.ryy - beta @ inp.rxx @ beta - inp.n * rho
    sign, logdet = np.linalg.slogdet(c)
    assert sign > 0
    ll = -0.5 * (logdet + r @ np.linalg.solve(c, r) + (d + 1) * np.log(2 * np.pi))
    prior = na._log_prior(u, d)[0]
    pxx, pxy, pyy, pn = inp.public_parts()
    lam = np.exp(a)
    pub = 0.5 * pn * (a - np.log(2 * np.pi)) - 0.5 * lam * (beta @ pxx @ beta - 2 * beta @ pxy
                                                             + pyy)
    return ll + prior + pub


def _points(inp, count, seed):
    rng = np.random.default_rng(seed)
    d = inp.dim
    beta = np.linalg.solve(inp.abar + np.eye(d), inp.rxy)
    return np.concatenate([beta, [0.0]]) + 0.3 * rng.standard_normal((count, d + 1))


@pytest.mark.parametrize("d", [3, 10, 40])
def test_envelope_matches_its_dense_formula(d):
    stats, pub = _release(d, seed=d)
    inp = na.noise_aware_inputs(stats, pub, x_bound=1.0)
    assert inp.v_xx > 0
    env = envelope(inp)
    us = _points(inp, 12, d)
    got = envelope_logp(us, env)
    want = np.array([_dense_envelope_logp(u, inp) for u in us])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-7)


def test_envelope_is_the_exact_density_without_noise_on_sxx():
    # v_xx = 0: the -v diag(beta^2) term the envelope leaves out is zero, so the two agree
    # (without the design's per-entry variances and the count's term, which it also leaves out).
    stats, pub = _release(8, seed=3)
    inp = na.noise_aware_inputs(stats, pub, x_bound=1.0)
    from dataclasses import replace
    inp0 = replace(inp, v_xx=0.0, wishart=None, mc=None)
    us = _points(inp0, 10, 1)
    ve, ge = envelope_logp_grad(us, envelope(inp0))
    vx, gx = batched.noise_aware_logp_grad(us, inp0)
    np.testing.assert_allclose(ve, vx, rtol=1e-10, atol=1e-8)
    np.testing.assert_allclose(ge, gx, rtol=1e-7, atol=1e-6)


def test_envelope_differs_from_exact_with_noise_on_sxx_and_is_close():
    stats, pub = _release(10, seed=4, xtx_scale=0.5)
    inp = na.noise_aware_inputs(stats, pub, x_bound=1.0)
    us = _points(inp, 20, 2)
    ve = envelope_logp(us, envelope(inp))
    vx = batched.noise_aware_logp(us, inp)
    diff = ve - vx
    assert np.max(np.abs(diff)) > 1e-6          # it is not the exact density ...
    assert np.std(diff) < 1.0                   # ... but its shape is close to it


@pytest.mark.parametrize("d", [4, 20])
def test_envelope_gradient_matches_finite_differences(d):
    stats, pub = _release(d, seed=10 + d, xtx_scale=0.3)
    inp = na.noise_aware_inputs(stats, pub, x_bound=1.0)
    env = envelope(inp)
    us = _points(inp, 4, d)
    _, g = envelope_logp_grad(us, env)
    h = 1e-6
    for i, u in enumerate(us):
        fd = np.empty(d + 1)
        for j in range(d + 1):
            e = np.zeros(d + 1)
            e[j] = h
            fd[j] = (envelope_logp((u + e)[None], env)[0]
                     - envelope_logp((u - e)[None], env)[0]) / (2 * h)
        np.testing.assert_allclose(g[i], fd, rtol=1e-5, atol=1e-4 * max(1.0, np.max(np.abs(fd))))


def test_envelope_refuses_points_outside_the_range():
    stats, pub = _release(5, seed=7)
    inp = na.noise_aware_inputs(stats, pub, x_bound=1.0)
    us = _points(inp, 3, 0)
    us[0, -1] = 100.0           # |log lambda| > 60
    us[1, 0] = np.nan
    v, g = envelope_logp_grad(us, envelope(inp))
    assert v[0] == -np.inf and v[1] == -np.inf and np.isfinite(v[2])
    assert np.all(g[:2] == 0.0)


def _prepared(d=40, seed=1001):
    """The nested proposal of a bench_fit release at ``d`` and its exact density."""
    import sys
    from pathlib import Path

    from posterior import targets
    from posterior.envelope_importance import prepare_envelope

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_fit import _noise_aware_release

    stats, pub = _noise_aware_release(d, 800, seed)
    inp = na.noise_aware_inputs(stats, pub, None)
    _, fb, u0, _, _ = targets.laplace_functions(stats, pub, "noise-aware", None, inp)
    prepared = prepare_envelope(inp, u0)
    assert prepared is not None
    return prepared, fb


def test_top_up_draws_what_the_ess_says_is_needed():
    """Fewer effective draws than asked from the first 800: the top-up adds what that ESS
    says is needed (with a margin), not straight up to the maximum; and up to the maximum
    when the bar is out of reach."""
    from posterior.envelope_importance import (EXACT_PROPOSALS, MAX_PROPOSALS,
                                               envelope_importance)

    prepared, fb = _prepared()

    def run(bar):
        return envelope_importance(prepared, fb, draws=500, rng=np.random.default_rng(3),
                                   top_up_ess=bar)

    first = run(0.0)
    assert first.proposals == EXACT_PROPOSALS and first.khat <= 0.7
    bar = 1.3 * first.ess
    topped = run(bar)
    assert EXACT_PROPOSALS < topped.proposals < MAX_PROPOSALS
    assert topped.ess >= bar
    assert run(np.inf).proposals == MAX_PROPOSALS


def test_envelope_screen_skips_the_exact_density_only_when_its_weights_fail(monkeypatch):
    """From SCREEN_MIN_DIM on, first proposals whose envelope weights have a k-hat above
    SCREEN_KHAT are not weighted by the exact density: no draws, no exact evaluation; below
    the bar the exact weights are computed as before."""
    import posterior.envelope_importance as ei

    prepared, fb = _prepared()
    calls = []

    def exact(us):
        calls.append(us.shape[0])
        return fb(us)

    monkeypatch.setattr(ei, "SCREEN_MIN_DIM", 40)
    monkeypatch.setattr(ei, "SCREEN_KHAT", -np.inf)
    res = ei.envelope_importance(prepared, exact, draws=500, rng=np.random.default_rng(0))
    assert calls == [] and res.draws.shape == (0, 41) and res.proposals == 0
    assert res.proposal is not None          # attempt 0b's preconditioner ...
    assert res.starts.shape == (8, 41)       # ... and its chains' starts
    monkeypatch.setattr(ei, "SCREEN_KHAT", np.inf)
    res = ei.envelope_importance(prepared, exact, draws=500, rng=np.random.default_rng(0))
    assert calls and calls[0] == ei.EXACT_PROPOSALS and res.draws.shape == (500, 41)
