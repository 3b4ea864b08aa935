import numpy as np
import pytest

import site_node.release
from dpfed_apps.evaluation.methods.nonprivate import NonPrivate
from dpfed_apps.evaluation.methods.private_unclipped import PrivateUnclipped

from .conftest import Recorder

FIXED = PrivateUnclipped(posterior="plug-in-fixed", draws=200)


def test_release_uses_the_bounds_on_linearly_rescaled_data(problem, monkeypatch):
    rec = Recorder()
    seen = []
    real = site_node.release.clipped_statistics

    def spy(x, y, bx, by, *rest):
        seen.append((np.max(np.abs(x)), np.max(np.abs(y)), bx, by))
        return real(x, y, bx, by, *rest)

    monkeypatch.setattr(site_node.release, "add_laplace_noise", rec.laplace)
    monkeypatch.setattr(site_node.release, "clipped_statistics", spy)
    setting = problem.setting(epsilon=2.0, x_bound=0.2, y_bound=0.7)
    FIXED.statistics(problem.small(300), setting)
    d = 5
    # The default mechanism: add/remove, exact Sxx rule, split (0.35, 0.60, 0.03, 0.02).
    assert [c["sensitivity"] for c in rec.calls] == pytest.approx(
        [d * (d + 1) / 2 * 0.2 ** 2, d * 0.2 * 0.7, 0.7 ** 2])
    assert [c["epsilon"] for c in rec.calls] == pytest.approx([0.35 * 2, 0.6 * 2, 0.03 * 2])
    (mx, my, bx, by), = seen
    # Linear rescaling, not projection: the whole public range lands inside the bounds.
    assert (bx, by) == (0.2, 0.7) and mx <= 0.2 and my <= 0.7
    assert my == pytest.approx(np.max(np.abs(problem.small(300).y_private)) * 0.7 / setting.y_range)


def test_beta_is_in_original_units(problem, monkeypatch):
    # Without noise and with n = 20000 the prior shrinks by ~2.5% only: the same beta as
    # nonprivate. (In the rescaled units lambda = 1 makes the posterior wide, sd ~1.1 in
    # original units; 20000 draws bring the Monte Carlo error of the mean to ~0.01.)
    monkeypatch.setattr(site_node.release, "add_laplace_noise", Recorder().laplace)
    setting = problem.setting(x_bound=0.1, y_bound=0.05)
    ours = PrivateUnclipped(posterior="plug-in-fixed", draws=20_000).fit(problem.data, setting, seed=0)
    plain = NonPrivate(posterior="plug-in-fixed", draws=200).fit(problem.data, setting, seed=0)
    np.testing.assert_allclose(ours, plain, rtol=0.05, atol=0.05)


def test_needs_a_public_y_range(problem):
    with pytest.raises(ValueError, match="y_range"):
        FIXED.fit(problem.small(10), problem.setting(y_range=None), seed=0)
