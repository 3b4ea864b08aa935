import math

import numpy as np
import pytest

from dpfed.metrics import (LinearTestRanks, TestRanks, average_ranks, concordance_index, spearman,
                           wpc_index)


def test_spearman_is_rank_correlation():
    y = np.array([1.0, 2.0, 3.0, 4.0])
    assert spearman(y, y) == pytest.approx(1.0)
    assert spearman(np.exp(y), y) == pytest.approx(1.0)  # monotone transform: same ranks
    assert spearman(-y, y) == pytest.approx(-1.0)


def test_spearman_matches_scipy():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(size=50)
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic)


def test_spearman_constant_prediction_is_nan():
    assert math.isnan(spearman(np.zeros(5), np.arange(5.0)))
    assert math.isnan(spearman([1.0], [2.0]))


def test_spearman_with_a_nan_is_nan():
    assert math.isnan(spearman([1.0, np.nan, 3.0], [1.0, 2.0, 3.0]))


def test_average_ranks_match_scipy_with_ties():
    from scipy.stats import rankdata

    rng = np.random.default_rng(0)
    for _ in range(50):
        a = rng.integers(0, 6, size=rng.integers(1, 40)).astype(float)
        np.testing.assert_array_equal(average_ranks(a), rankdata(a))
    b = rng.normal(size=100)
    np.testing.assert_array_equal(average_ranks(b), rankdata(b))


def test_scorers_match_scipy_on_tied_binary_feature_predictions():
    """The one definition (numpy, no SciPy in the core) against scipy.stats.spearmanr, for the
    single-prediction scorer (the evaluation protocol) and the batched linear one (bounds)."""
    from scipy.stats import spearmanr

    rng = np.random.default_rng(1)
    y = rng.normal(size=100)
    for measured in (y, np.round(y)):                       # without and with ties in y
        ranks = TestRanks(measured)
        x = (rng.random((100, 10)) < 0.3).astype(float)     # many tied predictions
        betas = rng.normal(size=(30, 10))
        want = [spearmanr(x @ b, measured).statistic for b in betas]
        assert [ranks.spearman(x @ b) for b in betas] == pytest.approx(want, abs=1e-12)
        assert [spearman(x @ b, measured) for b in betas] == pytest.approx(want, abs=1e-12)
        batched = LinearTestRanks(x, measured).spearman_many(betas)
        assert batched == pytest.approx(want, abs=1e-12)


def test_constant_sides_are_nan_unless_asked_and_bad_length_raises():
    y = np.arange(5.0)
    assert np.isnan(TestRanks(y).spearman(np.ones(5)))
    assert np.isnan(TestRanks(np.ones(5)).spearman(y))
    x = np.eye(5)
    assert np.isnan(LinearTestRanks(x, y).spearman_many(np.zeros((1, 5)))[0])
    assert LinearTestRanks(x, y).spearman_many(np.zeros((1, 5)), constant=0.0)[0] == 0.0
    with pytest.raises(ValueError):
        TestRanks(y).spearman(np.ones(4))


def test_spearman_rejects_mismatched_lengths():
    with pytest.raises(ValueError):
        spearman([1.0, 2.0], [1.0, 2.0, 3.0])


def test_concordance_index():
    y = np.array([1.0, 2.0, 3.0])
    assert concordance_index(y, y) == 1.0
    assert concordance_index(-y, y) == 0.0
    assert concordance_index(np.zeros(3), y) == 0.5
    assert math.isnan(concordance_index(y, np.ones(3)))


def test_wpc_index_weights_large_gaps():
    measured = np.array([0.0, 0.1, 10.0])
    # Swaps only the near-equal pair: most of the weight is still ordered right.
    assert wpc_index(np.array([0.1, 0.0, 10.0]), measured) > 0.95
    assert concordance_index(np.array([0.1, 0.0, 10.0]), measured) == pytest.approx(2 / 3)

