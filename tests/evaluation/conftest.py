"""Synthetic problems for the comparison methods: unit-norm rows, centred target (the
pre-processing of paper section 4.4), so the methods see what the evaluation gives them."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from dpfed_apps.evaluation.methods import PrivacySetting, TrainingData


class Problem:
    def __init__(self, n=20_000, d=5, n_public=10, n_test=2000, noise=0.3, seed=0):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((n + n_public + n_test, d))
        x -= x.mean(axis=0)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        self.beta = rng.standard_normal(d)
        y = x @ self.beta + noise * rng.standard_normal(len(x))
        y -= y.mean()
        self.data = TrainingData(x[:n], y[:n], x[n:n + n_public], y[n:n + n_public])
        self.x_test, self.y_test = x[n + n_public:], y[n + n_public:]
        self.sigma_x, self.sigma_y = float(np.std(x)), float(np.std(y))
        self.y_max = float(np.max(np.abs(y)))

    def setting(self, epsilon=50.0, **kw) -> PrivacySetting:
        # Bounds as dpfed.bounds would give them (omega around 1-2 sigma); the y range is a
        # generous public bound on |y| (test data, so taking it from all rows is fine here).
        kw.setdefault("x_bound", 1.5 * self.sigma_x)
        kw.setdefault("y_bound", 1.5 * self.sigma_y)
        kw.setdefault("y_range", 1.2 * self.y_max)
        return PrivacySetting(epsilon=epsilon, **kw)

    def spearman(self, beta) -> float:
        return float(spearmanr(self.x_test @ beta, self.y_test)[0])

    def small(self, n):
        """The same population, only the first n private rows."""
        d = self.data
        return TrainingData(d.x_private[:n], d.y_private[:n], d.x_public, d.y_public)


@pytest.fixture(scope="session")
def problem() -> Problem:
    return Problem()


class Recorder:
    """Stands in for a noise sampler: records its arguments and adds no noise."""

    def __init__(self):
        self.calls = []

    def laplace(self, values, sensitivity, epsilon, **kw):
        self.calls.append({"size": len(values), "sensitivity": sensitivity, "epsilon": epsilon})
        return np.asarray(values, dtype=np.float64), epsilon
