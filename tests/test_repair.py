"""Unit tests of posterior.repair (method.md section 6: noisy Sxx is often not PSD)."""

import numpy as np
import pytest

from posterior.repair import Repair, implied_rss, project_psd, repair_statistics
from dpfed.statistics import Statistics, exact_statistics
from site_node.release import release_statistics


def _sym(a):
    return np.triu(a) + np.triu(a, 1).T


def _indefinite_stats(rng, d=8, n=50, noise=10.0):
    x = rng.normal(size=(n, d)) / np.sqrt(d)
    y = x @ rng.normal(size=d) + 0.5 * rng.normal(size=n)
    s = exact_statistics(x, y)
    xtx = _sym(s.xtx + noise * rng.normal(size=(d, d)))
    return Statistics(xtx, s.xty + noise * rng.normal(size=d), s.yty - 5 * noise, n)


def _quad(s, b):
    return b @ s.xtx @ b - 2 * b @ s.xty + s.yty


@pytest.fixture(params=range(10))
def noisy(request):
    rng = np.random.default_rng(request.param)
    s = _indefinite_stats(rng)
    assert np.linalg.eigvalsh(s.xtx)[0] < 0  # the fixture really is indefinite
    return s


def test_result_is_psd_with_floor(noisy):
    rep_stats, rep = repair_statistics(noisy)
    w = np.linalg.eigvalsh(rep_stats.xtx)
    assert w[0] >= rep.eigen_floor * (1 - 1e-8)
    assert rep.changed and rep.negative_eigenvalues > 0 and rep.min_eigenvalue < 0
    assert rep.clipped_eigenvalues >= rep.negative_eigenvalues
    assert np.array_equal(rep_stats.xtx, rep_stats.xtx.T)
    assert rep_stats.n == noisy.n


def test_explicit_eigen_floor_respected(noisy):
    rep_stats, rep = repair_statistics(noisy, eigen_floor=2.5)
    assert rep.eigen_floor == 2.5
    w = np.linalg.eigvalsh(rep_stats.xtx)
    assert w[0] == pytest.approx(2.5, rel=1e-9)
    # Eigenvalues above the floor are untouched.
    w0 = np.linalg.eigvalsh(noisy.xtx)
    np.testing.assert_allclose(w[np.sum(w0 < 2.5):], w0[w0 >= 2.5], rtol=1e-9, atol=1e-9)


def test_quadratic_form_floor_holds_for_random_beta(noisy):
    rng = np.random.default_rng(1)
    before = [_quad(noisy, b) for b in rng.normal(scale=10, size=(200, noisy.dim))]
    rep_stats, rep = repair_statistics(noisy)
    scale = max(abs(rep_stats.yty), 1.0)
    # The naive form goes negative; the repaired one never below the floor.
    assert min(before) < 0
    for b in rng.normal(scale=10, size=(2000, noisy.dim)):
        assert _quad(rep_stats, b) >= rep.rss_floor - 1e-9 * scale
    # The minimiser attains the floor (or more), and the implied RSS matches the record.
    b_star = np.linalg.solve(rep_stats.xtx, rep_stats.xty)
    assert _quad(rep_stats, b_star) >= rep.rss_floor - 1e-9 * scale
    assert implied_rss(rep_stats.xtx, rep_stats.xty, rep_stats.yty) == pytest.approx(
        max(rep.rss_floor, rep.rss_before), rel=1e-6, abs=1e-6 * scale)


def test_yty_raise_is_recorded(noisy):
    rep_stats, rep = repair_statistics(noisy)
    assert rep_stats.yty - noisy.yty == pytest.approx(rep.yty_raised_by, abs=1e-9 * abs(noisy.yty))
    assert rep.yty_raised_by >= 0


def test_xty_dropped_only_along_clipped_directions(noisy):
    rep_stats, rep = repair_statistics(noisy)
    w, v = np.linalg.eigh(noisy.xtx)
    clipped = w < rep.eigen_floor
    coef_new = v.T @ rep_stats.xty
    np.testing.assert_allclose(coef_new[clipped], 0, atol=1e-9 * np.abs(noisy.xty).max())
    np.testing.assert_allclose(coef_new[~clipped], (v.T @ noisy.xty)[~clipped], rtol=1e-9, atol=1e-9)
    assert rep.xty_change_norm == pytest.approx(np.linalg.norm(rep_stats.xty - noisy.xty))
    # Without the projection Sxy is kept exactly and the form is still bounded.
    kept, rep2 = repair_statistics(noisy, project_xty=False)
    assert np.array_equal(kept.xty, noisy.xty) and rep2.xty_change_norm == 0
    b_star = np.linalg.solve(kept.xtx, kept.xty)
    assert _quad(kept, b_star) >= rep2.rss_floor * (1 - 1e-6)


def test_exact_psd_statistics_unchanged():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 6))
    y = x @ rng.normal(size=6) + rng.normal(size=500)
    s = exact_statistics(x, y)
    out, rep = repair_statistics(s)
    assert out is s
    assert not rep.changed and rep.clipped_eigenvalues == 0 and rep.yty_raised_by == 0
    assert rep.negative_eigenvalues == 0 and rep.xtx_change_frobenius == 0


def test_near_nearest_psd():
    # With a tiny floor the projection is (close to) the Frobenius-nearest PSD matrix, whose
    # distance is the norm of the negative eigenvalues (Higham 1988).
    rng = np.random.default_rng(3)
    a = _sym(rng.normal(size=(7, 7)))
    w = np.linalg.eigvalsh(a)
    m, w0 = project_psd(a, 0.0)
    np.testing.assert_allclose(w0, w)
    assert np.linalg.norm(m - a) == pytest.approx(np.linalg.norm(w[w < 0]), rel=1e-9)
    assert np.linalg.eigvalsh(m)[0] >= -1e-12
    with pytest.raises(ValueError):
        project_psd(a, -1.0)


def test_input_not_modified(noisy):
    before = (noisy.xtx.copy(), noisy.xty.copy(), noisy.yty)
    repair_statistics(noisy)
    assert np.array_equal(noisy.xtx, before[0]) and np.array_equal(noisy.xty, before[1])
    assert noisy.yty == before[2]


def test_negative_syy_is_raised():
    s = Statistics(np.eye(3) * 10, np.ones(3), -50.0, 20)
    out, rep = repair_statistics(s)
    assert rep.changed and rep.clipped_eigenvalues == 0 and rep.yty_raised_by > 50
    assert implied_rss(out.xtx, out.xty, out.yty) == pytest.approx(rep.rss_floor, rel=1e-6)


def test_all_zero_statistics():
    out, rep = repair_statistics(Statistics.zeros(4))
    assert np.all(np.isfinite(out.xtx)) and np.linalg.eigvalsh(out.xtx)[0] > 0
    assert out.yty > 0


def test_invalid_arguments():
    s = Statistics(np.eye(2), np.ones(2), 5.0, 3)
    with pytest.raises(ValueError):
        repair_statistics(s, eigen_floor=0.0)
    with pytest.raises(ValueError):
        repair_statistics(s, rss_floor=-1.0)
    with pytest.raises(TypeError):
        repair_statistics((np.eye(2), np.ones(2), 5.0, 3))


def test_real_release_is_repaired():
    # The case of the issue: n=800, d=10, eps=2; Sxx indefinite with good probability.
    rng = np.random.default_rng(5)
    d, n = 10, 800
    x = rng.normal(size=(n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = x @ rng.normal(size=d) + 0.3 * rng.normal(size=n)
    y -= y.mean()
    negatives = 0
    for _ in range(5):
        s = release_statistics(x, y, epsilon=2.0, x_bound=0.3, y_bound=1.0)
        out, rep = repair_statistics(s)
        negatives += rep.negative_eigenvalues
        assert np.linalg.eigvalsh(out.xtx)[0] > 0
        assert implied_rss(out.xtx, out.xty, out.yty) >= rep.rss_floor * (1 - 1e-6)
        assert isinstance(rep.to_dict(), dict) and isinstance(rep, Repair)
    assert negatives > 0


def test_noise_aware_abar_is_the_one_psd_projection():
    """posterior.noise_aware.psd_estimate is posterior.repair.project_psd with its floor."""
    from posterior.noise_aware import psd_estimate

    rng = np.random.default_rng(3)
    a = rng.normal(size=(5, 5))
    a = a + a.T
    w = np.linalg.eigvalsh(a)
    floor = max(1e-3 * np.max(np.abs(w)), np.sqrt(0.04))
    got = psd_estimate(a, 0.04)
    np.testing.assert_allclose(got, project_psd(a, floor)[0])
    np.testing.assert_array_equal(got, got.T)
    assert np.linalg.eigvalsh(got).min() >= floor * (1 - 1e-9)
    np.testing.assert_allclose(project_psd(a, lambda ev: floor)[0], project_psd(a, floor)[0])
