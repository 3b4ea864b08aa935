"""The across-target prior mean of a joint round (aggregator.joint_prior; docs/method.md
section 13): the shift is exact on exact statistics, the noise it adds is what the
description says, the pooled mean finds a shared coefficient vector, and on a synthetic panel
whose targets share a mean coefficient the joint fit with it is closer to the truth than
without, with calibrated 90 % intervals; fewer than MIN_TARGETS targets keep the 0 mean."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator import joint_fit, joint_prior
from aggregator.joint_prior import pooled_mean, shift
from dpfed.joint_noise import joint_calibration
from dpfed.joint_statistics import public_targets
from dpfed.noise import NoiseDescription
from dpfed.statistics import Statistics, exact_statistics
from dpfed.v1 import dpfed_pb2 as pb
from site_node.joint_release import release_joint_statistics


def test_shift_of_exact_statistics_is_the_statistics_of_the_shifted_response():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(50, 4)), rng.normal(size=50)
    m0 = np.array([0.3, -0.2, 0.0, 0.5])
    got = shift(exact_statistics(x, y), m0)
    want = exact_statistics(x, y - x @ m0)
    np.testing.assert_allclose(got.xtx, want.xtx)
    np.testing.assert_allclose(got.xty, want.xty, atol=1e-10)
    assert got.yty == pytest.approx(want.yty, rel=1e-10)
    assert got.n == want.n and got.noise.is_exact


def test_shift_noise_description_matches_the_noise_it_moves():
    """Release noise E_xx (symmetric, iid upper entries), e_xy, e_yy: the shifted values'
    noise has the variance the description gains (per xty entry and for yty), within MC error;
    without the added terms it would be under-stated."""
    d, v_xx, v_xy, v_yy = 4, 4.0, 2.0, 3.0
    noise = NoiseDescription.single("gaussian", xtx=np.sqrt(v_xx), xty=np.sqrt(v_xy),
                                    yty=np.sqrt(v_yy))
    m0 = np.array([0.6, -0.4, 0.3, 0.8])
    zero = Statistics(np.zeros((d, d)), np.zeros(d), 0.0, 0, noise)
    desc = shift(zero, m0).noise
    rng = np.random.default_rng(1)
    k = 40000
    iu = np.triu_indices(d)
    e = np.zeros((k, d, d))
    e[:, iu[0], iu[1]] = rng.normal(0, np.sqrt(v_xx), (k, iu[0].size))
    e = e + np.triu(e, 1).transpose(0, 2, 1)
    exy = rng.normal(0, np.sqrt(v_xy), (k, d))
    eyy = rng.normal(0, np.sqrt(v_yy), k)
    xy = exy - e @ m0
    yy = eyy - 2 * exy @ m0 + np.einsum("i,kij,j->k", m0, e, m0)
    assert xy.var(axis=0) == pytest.approx(np.full(d, desc.variance("xty")), rel=0.04)
    assert yy.var() == pytest.approx(desc.variance("yty"), rel=0.04)
    assert desc.variance("xty") > v_xy and desc.variance("yty") > v_yy
    assert desc.variance("xtx") == pytest.approx(v_xx)


def test_shift_refuses_a_bad_mean():
    stats = exact_statistics(np.eye(3), np.ones(3))
    with pytest.raises(ValueError):
        shift(stats, np.array([np.nan, 0.0, 0.0]))
    with pytest.raises(ValueError):
        shift(stats, np.zeros(2))


def _panel(seed, m=30, d=3, n=400, spread=0.1, missing=0.2):
    """Targets whose coefficients share a mean: beta_j = m0 + N(0, spread^2 I)."""
    rng = np.random.default_rng(seed)
    m0 = np.array([0.8, -0.6, 0.4])[:d]
    beta = m0[:, None] + spread * rng.normal(size=(d, m))
    x = rng.normal(size=(n, d)) * 0.4
    y = x @ beta + 0.5 * rng.normal(size=(n, m))
    y[rng.random(y.shape) < missing] = np.nan
    return x, y, beta, m0


def test_pooled_mean_finds_the_shared_coefficients():
    """The pooled fit of 30 targets' views of one release (eps 5) is within 0.15
    of the shared mean; the pooled design's noise is the shared release noise scaled by
    sum_j r_j (not m independent draws)."""
    x, y, _, m0 = _panel(2, n=2000)
    m, d = y.shape[1], x.shape[1]
    cal = joint_calibration(d, m, mechanism="gaussian", epsilon=5.0, delta=1e-6,
                            x_bound=1.0, y_bound=2.0, budget_split=[0.30, 0.60, 0.05, 0.05])
    release = release_joint_statistics(x, y, cal)
    spec = _spec(m, d, public_targets(*_panel(3, n=10)[:2], 1.0, 2.0), 5.0)
    inputs = joint_fit.target_inputs(spec, release)
    total, public = joint_prior.pooled_statistics(release, inputs)
    r = np.minimum(1.0, release.n / release.n_x)
    assert total.noise.variance("xtx") >= (r.sum() ** 2) * release.noise.variance("xtx")
    assert total.noise.variance("xty") == pytest.approx(m * release.noise.variance("xty"))
    assert public.n == sum(p.n for _, p in inputs)
    got = pooled_mean(release, inputs, x_bound=1.0)
    np.testing.assert_allclose(got, m0, atol=0.15)
    with pytest.raises(ValueError):
        joint_prior.pooled_statistics(release, [])


def _spec(m, d, public, epsilon):
    return pb.RoundSpec(
        round_id="prior", feature_names=[f"f{i}" for i in range(d)],
        targets=[pb.TargetSpec(name=f"t{j}", y_mean=0.0, y_scale=1.0) for j in range(m)],
        mechanism="gaussian", delta=1e-6, epsilon=epsilon, x_bound=1.0, y_bound=2.0,
        budget_split=[0.30, 0.60, 0.05, 0.05], fit_method="auto", fit_draws=1000, fit_seed=5,
        public_statistics=public.to_bytes())


def _fits(seed, monkeypatch, epsilon=3.0):
    """One release of a synthetic panel, fitted without and with the prior mean: per fit the
    mean squared error of the posterior means and which true coefficients the 90 % intervals
    cover."""
    x, y, beta, _ = _panel(seed)
    xp, yp, _, _ = _panel(seed + 100, n=10)
    m, d = y.shape[1], x.shape[1]
    spec = _spec(m, d, public_targets(xp, yp, 1.0, 2.0), epsilon)
    cal = joint_calibration(d, m, mechanism="gaussian", epsilon=epsilon, delta=1e-6,
                            x_bound=1.0, y_bound=2.0, budget_split=list(spec.budget_split))
    release = release_joint_statistics(x, y, cal)
    out = []
    for use_prior in (False, True):
        with monkeypatch.context() as mp:
            if not use_prior:
                mp.setattr(joint_prior, "MIN_TARGETS", 10 ** 9)
            entries, _, _ = joint_fit.fit_joint(spec, release, n_workers=1)
        assert all(e["status"] == "fitted" for e in entries)
        assert ("prior_mean" in entries[0]) == use_prior
        mean = np.array([e["beta_mean"] for e in entries]).T          # d x m
        ci = np.array([e["beta_ci90"] for e in entries])               # m x d x 2
        covered = (ci[..., 0] <= beta.T) & (beta.T <= ci[..., 1])
        out.append((float(np.mean((mean - beta) ** 2)), covered))
    return out


def test_prior_mean_reduces_the_error_and_keeps_coverage(monkeypatch):
    """4 synthetic panels of 30 targets sharing a mean coefficient (spread 0.1 around it),
    n = 400, Gaussian (3, 1e-6): on the same releases the across-target prior mean lowers the
    mean squared error of the posterior means (by > 7 % over the four), and its 90 %
    intervals cover at least 0.85 of the 360 true coefficients."""
    cover, errors = [], []
    for seed in (11, 12, 13, 14):
        (base, _), (with_prior, cov) = _fits(seed, monkeypatch)
        errors.append((base, with_prior))
        cover.append(cov)
    base, with_prior = np.sum(errors, axis=0)
    # Over the four panels (the release noise is a CSPRNG's, not seedable): 0.72-0.87 of the
    # error without the prior mean in 6 runs.
    assert with_prior < 0.93 * base, errors
    # Not below nominal. (It over-covers here, 0.96-0.99: the truths spread 0.1 around m0
    # while each target's prior keeps its wide lambda0 ~ Gamma(2, 2); the spread is not
    # learned across targets. GDSC's coverage: docs/evaluation.md.)
    rate = float(np.mean(cover))
    assert rate >= 0.85, rate


def test_few_targets_keep_the_zero_mean():
    inputs = [(None, None)] * (joint_prior.MIN_TARGETS - 1)
    assert joint_fit.prior_mean(pb.RoundSpec(), None, inputs) is None
