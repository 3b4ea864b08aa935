"""Tests of the public pre-processing (method.md section 2 step 1; Honkela et al. 2018, 4.4)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfed.preprocess import Preprocessing


def test_from_public_data_centres_then_normalises_rows():
    rng = np.random.default_rng(0)
    x = rng.normal(loc=3.0, size=(50, 4))
    y = rng.normal(loc=-2.0, size=50)
    p = Preprocessing.from_public_data(x, y)
    np.testing.assert_allclose(p.x_mean, x.mean(axis=0))
    assert p.y_mean == pytest.approx(y.mean())
    z, t = p.apply(x, y)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0)
    # Row normalisation of the centred rows (centre first, then scale; thesis 3.5).
    c = x - x.mean(axis=0)
    np.testing.assert_allclose(z, c / np.linalg.norm(c, axis=1, keepdims=True))
    np.testing.assert_allclose(t, y - y.mean())


def test_row_equal_to_mean_stays_zero():
    p = Preprocessing(x_mean=(1.0, 2.0))
    z = p.transform_x(np.array([[1.0, 2.0], [2.0, 2.0]]))
    assert np.array_equal(z[0], [0.0, 0.0]) and np.allclose(z[1], [1.0, 0.0])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=8), st.floats(-1e6, 1e6),
       st.booleans())
def test_json_round_trip(x_mean, y_mean, normalize):
    p = Preprocessing(tuple(x_mean), y_mean, normalize, source="public")
    q = Preprocessing.from_json(p.to_json())
    assert q == p and q.source == p.source


def test_identity_changes_nothing():
    x = np.arange(6.0).reshape(3, 2)
    y = np.array([1.0, -1.0, 2.0])
    z, t = Preprocessing.identity(2).apply(x, y)
    assert np.array_equal(z, x) and np.array_equal(t, y)


def test_row_normalised_values_lie_in_unit_interval():
    x = np.random.default_rng(1).standard_cauchy(size=(200, 10))
    z = Preprocessing(x_mean=(0.0,) * 10).transform_x(x)
    assert np.all(np.abs(z) <= 1.0)
    # The pooled RMS is exactly 1/sqrt(d): after row normalisation sigma_x is public.
    assert np.sqrt(np.mean(z**2)) == pytest.approx(1 / np.sqrt(10))


@pytest.mark.parametrize("bad", [
    lambda: Preprocessing(x_mean=(float("nan"),)),
    lambda: Preprocessing(x_mean=(0.0,), y_mean=float("inf")),
    lambda: Preprocessing(x_mean=(0.0, 0.0)).transform_x(np.ones((2, 3))),
    lambda: Preprocessing(x_mean=(0.0, 0.0)).transform_x(np.ones(2)),
    lambda: Preprocessing.from_public_data(np.ones((0, 2)), np.ones(0)),
    lambda: Preprocessing.from_public_data(np.ones((3, 2)), np.ones(2)),
])
def test_invalid_input_raises(bad):
    with pytest.raises(ValueError):
        bad()


def test_is_immutable():
    p = Preprocessing(x_mean=(0.0,))
    with pytest.raises(Exception):
        p.y_mean = 1.0


def test_public_sigmas_one_rule_with_documented_fallbacks():
    """dpfed.preprocess.public_sigmas, the one implementation (bounds, auxiliary data,
    simulation, evaluation and the coordinator's round spec all use it)."""
    from dpfed.preprocess import public_sigmas

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20, 4)), rng.normal(size=20)
    pre = Preprocessing.from_public_data(x, y)
    z, yc = pre.apply(x, y)
    assert public_sigmas(x, y, pre) == (pytest.approx(np.std(z)), pytest.approx(np.std(yc, ddof=1)))
    # No public rows (a round without public data): 1/sqrt(d) and 1.
    assert public_sigmas(np.zeros((0, 4)), np.zeros(0), pre) == (0.5, 1.0)
    assert public_sigmas([], [], pre) == (0.5, 1.0)
    with pytest.raises(ValueError):
        public_sigmas(x[:, :3], y, pre)
    with pytest.raises(ValueError):
        public_sigmas(x, y[:5], pre)
