"""The forecast populations' R^2 given the public rows' leave-one-out Spearman
(dpfed_apps.forecast_signal; issue 21 item 3, docs/evaluation.md "Forecast populations with
the right level (27 Nov, fourth session)")."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from dpfed.preprocess import Preprocessing
from dpfed_apps.forecast_signal import CrossValidatedSignalSource, loo_spearman, r2_given_cv


def _rows(rng, m, d=4, r2=0.8):
    x = rng.standard_normal((m, d)) * np.arange(1, d + 1)
    s = x @ np.array([1.0, -0.5, 0.25, 0.1][:d])
    y = 2.0 + s + np.sqrt((1 - r2) / r2) * np.std(s) * rng.standard_normal(m)
    return x, y


def test_loo_spearman_is_the_refit_per_left_out_row():
    """The rank-one downdated solves equal m explicit refits on the other m - 1 rows."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((10, 6))
    y = z @ rng.standard_normal(6) + rng.standard_normal(10)
    pred = []
    for i in range(10):
        k = np.arange(10) != i
        b = np.linalg.solve(z[k].T @ z[k] + 2.0 * np.eye(6), z[k].T @ y[k])
        pred.append(z[i] @ b)
    assert loo_spearman(z, y, ridge=2.0) == pytest.approx(spearmanr(pred, y)[0], abs=1e-12)
    tied = np.repeat(z[:5], 2, axis=0)            # duplicate rows: tied predictions
    assert loo_spearman(tied, y) == pytest.approx(
        spearmanr([tied[i] @ np.linalg.solve(
            np.delete(tied, i, 0).T @ np.delete(tied, i, 0) + np.eye(6),
            np.delete(tied, i, 0).T @ np.delete(y, i)) for i in range(10)], y)[0], abs=1e-12)
    assert loo_spearman(z, np.ones(10)) == 0.0


def test_r2_posterior_moves_with_the_public_signal_and_is_reproducible():
    """With 40 public rows the statistic is informative: a strong linear signal gives a higher
    posterior mean R^2 than the same rows with a shuffled target (same marginal), and both
    differ from the flat prior's 0.5 in the right direction. The same rows give the same
    posterior (seeded from their digest); the source's populations draw R^2 from it."""
    rng = np.random.default_rng(3)
    x, y = _rows(rng, 40, r2=0.9)
    pre = Preprocessing.from_public_data(x, y, scale_columns=True)
    strong = CrossValidatedSignalSource(x, y, pre, r2_prior=(1.0, 1.0))
    y_null = rng.permutation(y)
    null = CrossValidatedSignalSource(x, y_null, Preprocessing.from_public_data(
        x, y_null, scale_columns=True), r2_prior=(1.0, 1.0))
    g, w = strong.r2_posterior()
    g0, w0 = null.r2_posterior()
    assert abs(w.sum() - 1) < 1e-9 and abs(w0.sum() - 1) < 1e-9
    assert float(g @ w) > 0.6 and float(g0 @ w0) < 0.35
    again = r2_given_cv(CrossValidatedSignalSource(x, y, pre, r2_prior=(1.0, 1.0)))
    np.testing.assert_array_equal(again[1], w)
    draws = [strong.sample(np.random.default_rng(i), 5, 2).r2 for i in range(200)]
    assert np.mean(draws) == pytest.approx(float(g @ w), abs=0.04)


def test_forecast_round_uses_the_cross_validated_signal():
    """``population={"r2_from_cv": True, ...}`` simulates on a CrossValidatedSignalSource: the
    forecast's mean R^2 is its posterior's, not the prior's."""
    from dpfed_apps.forecast import forecast_round

    rng = np.random.default_rng(5)
    x, y = _rows(rng, 10)
    pre = Preprocessing.from_public_data(x, y, scale_columns=True)
    out = forecast_round(x_public=x, y_public=y, preprocessing=pre, n_per_site=[300],
                         epsilons=[2.0], bounds=(1.0, 2.0), n_datasets=4, n_noise=2, seed=1,
                         population={"r2_prior": (1.0, 1.0), "r2_from_cv": True})
    g, w = CrossValidatedSignalSource(x, y, pre, r2_prior=(1.0, 1.0)).r2_posterior()
    assert out["auxiliary"]["r2_mean"] == pytest.approx(float(g @ w))
    assert out["auxiliary"]["r2_from_public"] is True
