import numpy as np
import pytest
from scipy.stats import rankdata

from dpfed.metrics import spearman
from evaluation.scoring import TestRanks, average_ranks


def test_average_ranks_match_scipy_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(50):
        a = rng.integers(0, 6, size=rng.integers(1, 40)).astype(float)
        np.testing.assert_array_equal(average_ranks(a), rankdata(a))
    b = rng.normal(size=100)
    np.testing.assert_array_equal(average_ranks(b), rankdata(b))


def test_spearman_matches_dpfed_metrics_on_binary_feature_predictions():
    rng = np.random.default_rng(1)
    y = rng.normal(size=100)
    ranks = TestRanks(y)
    for _ in range(30):
        x = (rng.random((100, 10)) < 0.3).astype(float)  # many tied predictions
        p = x @ rng.normal(size=10)
        assert ranks.spearman(p) == pytest.approx(spearman(p, y), abs=1e-12)
    tied_y = np.round(y)
    assert TestRanks(tied_y).spearman(p) == pytest.approx(spearman(p, tied_y), abs=1e-12)


def test_constant_sides_are_nan_and_bad_length_raises():
    y = np.arange(5.0)
    assert np.isnan(TestRanks(y).spearman(np.ones(5)))
    assert np.isnan(TestRanks(np.ones(5)).spearman(y))
    with pytest.raises(ValueError):
        TestRanks(y).spearman(np.ones(4))
