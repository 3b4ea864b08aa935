"""Joint statistics of many targets, their calibration and the per-target view (issue 23).

dpfed.joint_statistics (value, encodings, exact statistics with missing responses),
dpfed.joint_noise (Laplace and Gaussian calibration of the joint vector) and
dpfed.joint_targets (the MCAR view one target's fit sees)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpfed.joint_noise import (JOINT_DEFAULT_SPLIT, calibration_from_spec, joint_calibration,
                               l1_total)
from dpfed.joint_sensitivity import joint_l2_sensitivity, row_contribution
from dpfed.joint_statistics import (JointStatistics, JointStatisticsError, PublicTargets,
                                    joint_exact_statistics, public_targets)
from dpfed.joint_targets import subset_variance_bound, target_statistics
from dpfed.noise import EXACT
from dpfed.statistics import clipped_exact_statistics
from dpfed.v1 import dpfed_pb2 as pb


def _data(n=60, d=4, m=5, missing=0.2, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * 1.5
    y = rng.normal(size=(n, m)) * 2.0
    y[rng.random((n, m)) < missing] = np.nan
    return x, y


def test_exact_statistics_are_the_sum_of_the_rows_contributions():
    """to_vector is the vector of dpfed.joint_sensitivity (whose sensitivities are proved
    there): the exact statistics equal the sum of g(v, w, a) over the clipped rows."""
    x, y = _data()
    j = joint_exact_statistics(x, y, 1.0, 1.5, x_norm_bound=1.2)
    z = clipped_exact_statistics(x, np.zeros(len(x)), 1.0, 1.0, 1.2)  # clipped features
    assert j.n_x == len(x) and j.is_exact
    rows = np.clip(x, -1, 1)
    norms = np.linalg.norm(rows, axis=1)
    rows[norms > 1.2] *= (1.2 * (1 - 1e-12) / norms[norms > 1.2])[:, None]
    w = np.where(np.isnan(y), np.nan, np.clip(y, -1.5, 1.5))
    total = sum(row_contribution(v, wi, include_n=True) for v, wi in zip(rows, w))
    np.testing.assert_allclose(j.to_vector(), total, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(j.xtx, z.xtx, rtol=1e-12)
    np.testing.assert_array_equal(j.n, (~np.isnan(y)).sum(axis=0))


def test_each_target_with_all_rows_present_is_the_single_target_statistics():
    x, y = _data(missing=0.0)
    j = joint_exact_statistics(x, y, 1.0, 1.5)
    for t in range(y.shape[1]):
        single = clipped_exact_statistics(x, y[:, t], 1.0, 1.5)
        np.testing.assert_allclose(j.xty[t], single.xty, rtol=1e-12)
        assert j.yty[t] == pytest.approx(single.yty, rel=1e-12) and j.n[t] == single.n


def test_encoding_round_trips_and_rejects_malformed_bytes():
    x, y = _data()
    j = joint_exact_statistics(x, y, 1.0, 1.5)
    data = j.to_bytes()
    assert len(data) == JointStatistics.encoded_length(j.dim, j.targets)
    back = JointStatistics.from_bytes(data, EXACT)
    assert back == j and back.n_x == j.n_x
    assert JointStatistics.from_vector(j.dim, j.targets, j.to_vector(), EXACT) == j
    for bad in (data[:-1], data + b"\0", b"XXXX" + data[4:], data[:10], b""):
        with pytest.raises(JointStatisticsError):
            JointStatistics.from_bytes(bad)
    nan = bytearray(data)
    nan[-8:] = np.array([np.nan]).astype("<f8").tobytes()
    with pytest.raises(JointStatisticsError, match="NaN"):
        JointStatistics.from_bytes(bytes(nan))
    with pytest.raises(JointStatisticsError, match="integer"):
        JointStatistics.from_vector(j.dim, j.targets, j.to_vector() + 0.5)


def test_sum_adds_fields_and_noise_and_refuses_other_shapes():
    x, y = _data()
    a = joint_exact_statistics(x[:30], y[:30], 1.0, 1.5)
    b = joint_exact_statistics(x[30:], y[30:], 1.0, 1.5)
    both = joint_exact_statistics(x, y, 1.0, 1.5)
    s = sum([a, b])
    assert s.n_x == both.n_x and np.array_equal(s.n, both.n) and s.is_exact
    np.testing.assert_allclose(s.to_vector(), both.to_vector(), rtol=1e-12, atol=1e-12)
    with pytest.raises(JointStatisticsError):
        a + joint_exact_statistics(x[:, :3], y, 1.0, 1.5)
    with pytest.raises(ValueError, match="infinite"):
        joint_exact_statistics(x, np.where(np.isnan(y), np.inf, y), 1.0, 1.5)


def test_public_targets_are_each_targets_exact_statistics():
    x, y = _data(n=12)
    pub = public_targets(x, y, 1.0, 1.5)
    assert len(PublicTargets.from_bytes(pub.to_bytes())) == y.shape[1]
    for t in range(y.shape[1]):
        rows = ~np.isnan(y[:, t])
        assert pub[t] == clipped_exact_statistics(x[rows], y[rows, t], 1.0, 1.5)
    with pytest.raises(JointStatisticsError):
        PublicTargets.from_bytes(pub.to_bytes()[:-3])


def test_laplace_parts_sum_to_the_joint_l1_sensitivity():
    cal = joint_calibration(10, 262, mechanism="laplace", epsilon=10, x_bound=1.0,
                            y_bound=0.5, x_norm_bound=1.0)
    assert sum(cal.sensitivities.values()) == pytest.approx(l1_total(cal), rel=1e-12)
    assert sum(cal.losses.values()) == pytest.approx(10.0)
    for p, share in zip(("xtx", "xty", "yty", "n"), JOINT_DEFAULT_SPLIT):
        assert cal.scales[p] == pytest.approx(cal.sensitivities[p] / (share * 10))
    assert cal.noise().n[0].law == "discrete_laplace" and cal.event().epsilon == 10
    with pytest.raises(ValueError, match="delta"):
        joint_calibration(10, 3, mechanism="laplace", epsilon=1, delta=1e-6, x_bound=1,
                          y_bound=1)


@pytest.mark.parametrize("norm", [None, 1.0])
def test_gaussian_release_is_mu_gdp_at_its_worst_row(norm):
    """The per-part sigmas make the weighted L2 sensitivity of the whole joint vector exactly
    mu; no row (random ones, and the extreme ones) moves the noise-scaled vector further."""
    d, m = 6, 9
    cal = joint_calibration(d, m, mechanism="gaussian", epsilon=2.0, delta=1e-6, x_bound=0.7,
                            y_bound=0.5, x_norm_bound=norm, budget_split=(0.2, 0.5, 0.2, 0.1))
    w = {"xtx": cal.scales["xtx"] ** -2, "xty": cal.scales["xty"] ** -2,
         "yty": cal.scales["yty"] ** -2, "n_x": cal.scales["n"] ** -2, "n": cal.scales["n"] ** -2}
    assert joint_l2_sensitivity(d, m, 0.7, 0.5, x_norm_bound=norm, include_n=True,
                                weights=w) == pytest.approx(cal.mu, rel=1e-12)
    assert sum(cal.losses.values()) == pytest.approx(cal.mu ** 2 / 2)
    scale = np.concatenate([np.full(d * (d + 1) // 2, cal.scales["xtx"]), [cal.scales["n"]],
                            np.full(m * d, cal.scales["xty"]), np.full(m, cal.scales["yty"]),
                            np.full(m, cal.scales["n"])])
    rng = np.random.default_rng(1)
    worst = 0.0
    for _ in range(2000):
        v = np.clip(rng.normal(size=d) * rng.choice([0.1, 1, 5]), -0.7, 0.7)
        if norm is not None and np.linalg.norm(v) > norm:
            v *= norm / np.linalg.norm(v)
        wv = rng.uniform(-0.5, 0.5, size=m)
        wv[rng.random(m) < 0.3] = np.nan
        worst = max(worst, float(np.linalg.norm(row_contribution(v, wv, include_n=True) / scale)))
    assert worst <= cal.mu * (1 + 1e-12)
    assert cal.noise().xty[0].law == "gaussian" and cal.event().mu == cal.mu


def test_calibration_from_a_joint_spec_and_its_refusals():
    spec = pb.RoundSpec(feature_names=["a", "b", "c"], epsilon=10, x_bound=1.0, y_bound=0.5,
                        mechanism="gaussian", delta=1e-6, neighbouring="add_remove")
    spec.preprocessing.normalize_rows = True
    with pytest.raises(ValueError, match="no targets"):
        calibration_from_spec(spec)
    spec.targets.add(name="D1", y_mean=0.0, y_scale=1.0)
    spec.targets.add(name="D2", y_mean=1.0, y_scale=2.0)
    cal = calibration_from_spec(spec)
    assert (cal.d, cal.m, cal.x_norm_bound) == (3, 2, 1.0)
    spec.neighbouring = "replace_one"
    with pytest.raises(ValueError, match="add_remove"):
        calibration_from_spec(spec)
    spec.neighbouring, spec.mechanism = "add_remove", "cauchy"
    with pytest.raises(ValueError, match="mechanism"):
        calibration_from_spec(spec)


def test_mcar_view_is_unbiased_and_its_stated_variance_covers_the_subsets():
    """The missing-response model: over random subsets of n_j of the n_x rows, r Sxx is the
    mean of the subset's Sxx_j, and the stated subset variance (a public bound) is at least
    the observed per-entry variance, averaged over the upper triangle."""
    rng = np.random.default_rng(3)
    n_x, d, n_j = 400, 5, 300
    x = rng.normal(size=(n_x, d)) + rng.normal(size=d)
    z = np.clip(x, -1, 1)
    z /= np.maximum(1.0, np.linalg.norm(z, axis=1) / (1 - 1e-12))[:, None]
    full = z.T @ z
    iu = np.triu_indices(d)
    diffs = []
    for _ in range(400):
        rows = rng.choice(n_x, n_j, replace=False)
        diffs.append((z[rows].T @ z[rows] - n_j / n_x * full)[iu])
    diffs = np.array(diffs)
    assert np.all(np.abs(diffs.mean(axis=0)) < 4 * diffs.std(axis=0) / math.sqrt(len(diffs)) + 1e-9)
    observed = float(np.mean(diffs.var(axis=0)))
    moments = full / n_x
    stated = n_j * (1 - n_j / n_x) * subset_variance_bound(d, 1.0, 1.0, moments)
    assert observed <= stated
    # The bound is not vacuous: within 20x of what the subsets show on this design.
    assert stated <= 20 * observed


def test_target_view_scales_the_design_and_adds_the_missing_response_terms():
    x, y = _data(n=200, m=3, missing=0.0)
    y[:50, 1] = np.nan
    cal = joint_calibration(4, 3, mechanism="gaussian", epsilon=5, delta=1e-6, x_bound=1.0,
                            y_bound=1.5)
    j = joint_exact_statistics(x, y, 1.0, 1.5).with_noise(cal.noise())
    full = target_statistics(j, 0, x_bound=1.0)
    assert full.xtx.tolist() == j.xtx.tolist() and full.n == 200
    # r = 1: no subset term; only the counts' ratio term is added to the release noise.
    assert full.noise.variance("xtx") >= cal.scales["xtx"] ** 2
    part = target_statistics(j, 1, x_bound=1.0)
    np.testing.assert_allclose(part.xtx, 0.75 * j.xtx)
    assert part.n == 150 and part.xty.tolist() == j.xty[1].tolist()
    assert part.noise.variance("xtx") > (0.75 * cal.scales["xtx"]) ** 2
    assert part.noise.variance("xty") == pytest.approx(cal.scales["xty"] ** 2)
    exact = target_statistics(joint_exact_statistics(x, y, 1.0, 1.5), 1, x_bound=1.0)
    assert not exact.is_exact and exact.noise.variance("xty") == 0
    with pytest.raises(IndexError):
        target_statistics(j, 3, x_bound=1.0)
