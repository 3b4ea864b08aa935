import itertools

import numpy as np
import pytest

import dpfed_apps.evaluation.methods.functional_mechanism as fm
from dpfed_apps.evaluation.methods.functional_mechanism import FunctionalMechanism

from .conftest import Recorder

METHOD = FunctionalMechanism()


@pytest.mark.parametrize("n_sites", [1, 4])
def test_noise_scale_is_zhangs_sensitivity(problem, monkeypatch, n_sites):
    rec = Recorder()
    monkeypatch.setattr(fm, "add_laplace_noise", rec.laplace)
    METHOD.fit(problem.small(300), problem.setting(epsilon=2.0, n_sites=n_sites), seed=0)
    d = 5
    assert [(c["size"], c["sensitivity"], c["epsilon"]) for c in rec.calls] == \
        [(d * (d + 1) // 2 + d, 2 * (d + 1) ** 2, 2.0)] * n_sites


def test_coefficient_l1_norm_per_record_is_at_most_half_the_sensitivity():
    # Zhang et al.: Delta = 2 max_r sum |coefficients of r| (+ the constant y^2, not released).
    d = 3
    worst = 0.0
    for signs in itertools.product([-1.0, 1.0], repeat=d + 1):
        x, y = np.array([signs[:d]]), np.array([signs[d]])
        worst = max(worst, np.abs(fm.coefficients(x, y)).sum() + y[0] ** 2)
    assert worst == fm.sensitivity(d) / 2


def test_noise_free_minimiser_is_least_squares():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (100, 4))
    y = np.clip(x @ np.array([0.3, -0.2, 0.1, 0.0]) + 0.05 * rng.standard_normal(100), -1, 1)
    w = fm.minimise(fm.coefficients(x, y), 4, reg=0.0)
    np.testing.assert_allclose(w, np.linalg.lstsq(x, y, rcond=None)[0], rtol=1e-8)


def test_indefinite_noisy_objective_is_trimmed():
    # A quadratic form with a negative direction even after regularisation: minimised on the
    # positive eigen-directions only, finite.
    coef = np.concatenate([[1.0, 0.0, -3.0], [1.0, 1.0]])  # M = diag(1, -3), d = 2
    w = fm.minimise(coef, 2, reg=0.5)
    np.testing.assert_allclose(w, [-0.5 * 1.0 / 1.5, 0.0])


def test_needs_a_public_y_range(problem):
    with pytest.raises(ValueError, match="y_range"):
        METHOD.fit(problem.small(10), problem.setting(y_range=None), seed=0)
