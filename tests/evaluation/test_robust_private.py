import numpy as np
import pytest

import site_node.release
from dpfed.statistics import exact_statistics
from dpfed_apps.evaluation.methods import get_method
from dpfed_apps.evaluation.methods.robust_private import RobustPrivate
from site_node.release import clipped_statistics

from .conftest import Recorder

FIXED = RobustPrivate(posterior="plug-in-fixed", draws=200)


def test_recovers_beta_at_generous_epsilon(problem):
    beta = FIXED.fit(problem.data, problem.setting(epsilon=50.0), seed=0)
    assert problem.spearman(beta) > 0.9
    assert np.corrcoef(beta, problem.beta)[0, 1] > 0.95


def test_noise_is_there_at_small_epsilon(problem):
    data, setting = problem.small(200), problem.setting(epsilon=1.0)
    a = FIXED.statistics(data, setting)
    b = FIXED.statistics(data, setting)
    assert not np.array_equal(a.xty, b.xty) and not np.array_equal(a.xtx, b.xtx)
    assert a.yty != b.yty
    assert not np.allclose(FIXED.fit(data, setting, seed=0), FIXED.fit(data, setting, seed=0))


@pytest.mark.parametrize("n_sites", [1, 3])
@pytest.mark.parametrize("relation", ["replace_one", "add_remove"])
def test_statistics_are_site_releases_plus_exact_public(problem, monkeypatch, n_sites, relation):
    rec = Recorder()
    counts = []
    monkeypatch.setattr(site_node.release, "add_laplace_noise", rec.laplace)
    monkeypatch.setattr(site_node.release, "add_count_noise",
                        lambda c, eps: (counts.append((list(c), eps)), (list(c), eps))[1])
    data = problem.small(301)
    d = 5
    if relation == "replace_one":  # the paper's mechanism: bounded DP, its Sxx rule, n exact
        setting = problem.setting(epsilon=2.0, n_sites=n_sites, budget_split=(0.3, 0.65, 0.05),
                                  neighbouring="replace_one", xtx_sensitivity="paper")
        bx, by = setting.x_bound, setting.y_bound
        expected = [(d * (d + 1) * bx ** 2, 0.3 * 2.0), (2 * d * bx * by, 0.65 * 2.0),
                    (by ** 2, 0.05 * 2.0)]
    else:  # the default: add/remove, exact Sxx rule, noisy n
        setting = problem.setting(epsilon=2.0, n_sites=n_sites,
                                  budget_split=(0.3, 0.6, 0.05, 0.05))
        bx, by = setting.x_bound, setting.y_bound
        expected = [(d * (d + 1) / 2 * bx ** 2, 0.3 * 2.0), (d * bx * by, 0.6 * 2.0),
                    (by ** 2, 0.05 * 2.0)]
    stats = FIXED.statistics(data, setting)
    # One OpenDP call per part for all K sites (site_node.release.release_many), each with a
    # SINGLE site's sensitivity and epsilon share, on the K sites' values concatenated.
    assert [c["sensitivity"] for c in rec.calls] == pytest.approx([e[0] for e in expected])
    assert [c["epsilon"] for c in rec.calls] == pytest.approx([e[1] for e in expected])
    assert [c["size"] for c in rec.calls] == [n_sites * d * (d + 1) // 2, n_sites * d, n_sites]
    if relation == "add_remove":  # the K counts in one call, with the n share
        assert len(counts) == 1 and len(counts[0][0]) == n_sites
        assert counts[0][1] == pytest.approx(0.05 * 2.0)
        assert stats.noise.draws("n") == n_sites
    else:
        assert counts == [] and stats.noise.n == ()
    assert stats.noise.draws("xty") == n_sites  # K site releases; the public part adds none
    # With the noise removed: clipped private + exact public statistics, the public rows
    # clipped with the same bounds (both parts then describe the same clipped regression).
    sxx, sxy, syy = clipped_statistics(data.x_private, data.y_private, bx, by)
    pub = exact_statistics(np.clip(data.x_public, -bx, bx), np.clip(data.y_public, -by, by))
    assert stats.n == 311
    np.testing.assert_allclose(stats.xtx, sxx + pub.xtx, rtol=1e-12)
    np.testing.assert_allclose(stats.xty, sxy + pub.xty, rtol=1e-12)
    assert stats.yty == pytest.approx(syy + pub.yty, rel=1e-12)


def test_bad_settings_raise(problem):
    with pytest.raises(ValueError):
        RobustPrivate(posterior="advi")  # only "plug-in-advi" exists
    with pytest.raises(ValueError):
        get_method("robust_private", draws=-1)


@pytest.mark.slow
def test_advi_fit_recovers_beta(problem):
    # The default path of the evaluation: ADVI as in the paper (first call compiles the graph).
    method = RobustPrivate(posterior="plug-in-advi", draws=1000)
    beta = method.fit(problem.data, problem.setting(epsilon=50.0), seed=3)
    assert problem.spearman(beta) > 0.9
    fixed = FIXED.fit(problem.data, problem.setting(epsilon=50.0), seed=3)
    assert np.corrcoef(beta, fixed)[0, 1] > 0.99


def test_row_norm_bound_lowers_the_release_sensitivities(problem, monkeypatch):
    """With x_norm_bound (rows of unit norm) the release projects rows into the ball and uses
    the smaller sensitivities of dpfed.sensitivity; public rows are clipped the same way."""
    rec = Recorder()
    monkeypatch.setattr(site_node.release, "add_laplace_noise", rec.laplace)
    monkeypatch.setattr(site_node.release, "add_count_noise", lambda c, eps: (list(c), eps))
    data = problem.small(300)
    d = data.dim
    setting = problem.setting(epsilon=2.0, x_bound=1.0, y_bound=0.7, x_norm_bound=1.0,
                              budget_split=(0.3, 0.6, 0.05, 0.05))
    stats = FIXED.statistics(data, setting)
    t = 1.0 / np.sqrt(d)
    assert [c["sensitivity"] for c in rec.calls] == pytest.approx(
        [d * (d + 1) / 2 * t * t, d * t * 0.7, 0.7 ** 2])
    z = data.x_private / np.maximum(1.0, np.linalg.norm(data.x_private, axis=1))[:, None]
    zp = data.x_public / np.maximum(1.0, np.linalg.norm(data.x_public, axis=1))[:, None]
    expected = z.T @ z + zp.T @ zp
    np.testing.assert_allclose(stats.xtx, expected, rtol=1e-9)
