import math

import numpy as np
import pytest

from dpfed.metrics import concordance_index, spearman, wpc_index


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
