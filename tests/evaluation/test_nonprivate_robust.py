import numpy as np
import pytest

import site_node.release
from dpfed_apps.evaluation.methods import TrainingData
from dpfed_apps.evaluation.methods.nonprivate import NonPrivate
from dpfed_apps.evaluation.methods.nonprivate_robust import NonPrivateRobust
from dpfed_apps.evaluation.methods.robust_private import RobustPrivate

from .conftest import Recorder


def test_recovers_beta(problem):
    beta = NonPrivateRobust(posterior="plug-in-fixed").fit(problem.data, problem.setting(), seed=0)
    assert problem.spearman(beta) > 0.9


def test_is_robust_private_without_the_noise(problem, monkeypatch):
    setting = problem.setting(epsilon=1.0, x_bound=0.3)
    data = problem.small(500)
    ours = NonPrivateRobust(posterior="plug-in-fixed").statistics(data, setting)
    monkeypatch.setattr(site_node.release, "add_laplace_noise", Recorder().laplace)
    # ... and without the noise on n (add/remove, the default relation).
    monkeypatch.setattr(site_node.release, "add_count_noise", lambda c, eps: (list(c), eps))
    theirs = RobustPrivate(posterior="plug-in-fixed").statistics(data, setting)
    assert ours.n == theirs.n
    np.testing.assert_allclose(ours.xtx, theirs.xtx, rtol=1e-12)
    np.testing.assert_allclose(ours.xty, theirs.xty, rtol=1e-12)
    assert ours.yty == pytest.approx(theirs.yty, rel=1e-12)


def test_clipping_tames_an_outlier(problem):
    d = problem.small(400)
    y = d.y_private.copy()
    y[0] = 1e4  # one wild response
    data = TrainingData(d.x_private, y, d.x_public, d.y_public)
    setting = problem.setting()
    robust = NonPrivateRobust(posterior="plug-in-fixed", draws=100).fit(data, setting, seed=0)
    plain = NonPrivate(posterior="plug-in-fixed", draws=100).fit(data, setting, seed=0)
    assert problem.spearman(robust) > problem.spearman(plain) + 0.1
