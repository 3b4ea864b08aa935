import math

import numpy as np
import pytest
from scipy.optimize import minimize

import dpfed_apps.evaluation.methods.output_perturbation as op
from dpfed_apps.evaluation.methods.output_perturbation import OutputPerturbation, constrained_ridge

from .conftest import Recorder

METHOD = OutputPerturbation()


def test_noise_scale_is_the_documented_sensitivity(problem, monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(op, "add_laplace_noise", rec.laplace)
    setting = problem.setting(epsilon=2.0)
    METHOD.fit(problem.small(300), setting, seed=0)
    n, d = 310, 5
    lam = math.sqrt(d / (n * 2.0))
    (call,) = rec.calls
    assert call["size"] == d and call["epsilon"] == 2.0
    assert call["sensitivity"] == pytest.approx(math.sqrt(d) * 4 * (1 + 1) / (n * lam))


def test_constrained_ridge_is_the_exact_minimiser():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, 4))
    y = x @ np.array([3.0, -2.0, 1.0, 0.5]) + rng.standard_normal(50)
    sxx, sxy, c0 = x.T @ x, x.T @ y, 2.0
    for radius in (0.5, 100.0):  # constraint active, inactive
        w = constrained_ridge(sxx, sxy, c0, radius)
        obj = lambda v: v @ sxx @ v - 2 * v @ sxy + c0 * v @ v
        ref = minimize(obj, np.zeros(4), method="SLSQP", options={"ftol": 1e-14},
                       constraints=[{"type": "ineq", "fun": lambda v: radius ** 2 - v @ v}]).x
        assert np.linalg.norm(w) <= radius * (1 + 1e-12)
        assert obj(w) <= obj(ref) + 1e-8
        np.testing.assert_allclose(w, ref, atol=1e-5)


def test_sensitivity_bounds_the_minimiser_on_neighbours():
    # Replace one record by a worst-case-ish one; the minimiser moves by at most Delta_2.
    rng = np.random.default_rng(2)
    n, d, eps = 40, 3, 1.0
    lam = op.regularisation(d, n, eps)
    bound = op.l2_sensitivity(n, lam)
    worst = 0.0
    for _ in range(300):
        x, y = op.unit_ball_data(rng.uniform(-1, 1, (n, d)), rng.uniform(-1, 1, n), 1.0, 1.0)
        w = constrained_ridge(x.T @ x, x.T @ y, n * lam / 2, 1.0)
        x2, y2 = x.copy(), y.copy()
        v = rng.standard_normal(d)
        x2[0], y2[0] = v / np.linalg.norm(v), rng.choice([-1.0, 1.0])
        w2 = constrained_ridge(x2.T @ x2, x2.T @ y2, n * lam / 2, 1.0)
        worst = max(worst, np.linalg.norm(w - w2))
    assert 0 < worst <= bound


def test_bad_settings_raise(problem):
    with pytest.raises(ValueError, match="n_sites"):
        METHOD.fit(problem.small(100), problem.setting(n_sites=2), seed=0)
    with pytest.raises(ValueError, match="y_range"):
        METHOD.fit(problem.small(100), problem.setting(y_range=None), seed=0)
    with pytest.raises(ValueError):
        OutputPerturbation(radius=0.0)
