"""Tests of the Statistics value, its lossless encoding and exact_statistics (method.md 1, 3)."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfed.statistics import (Statistics, StatisticsError, exact_statistics, symmetric_gram,
                              validate_data)

floats = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def statistics_values(draw, max_dim=6):
    d = draw(st.integers(1, max_dim))
    upper = draw(st.lists(floats, min_size=d * (d + 1) // 2, max_size=d * (d + 1) // 2))
    xtx = np.zeros((d, d))
    xtx[np.triu_indices(d)] = upper
    xtx = np.triu(xtx) + np.triu(xtx, 1).T
    xty = np.array(draw(st.lists(floats, min_size=d, max_size=d)))
    return Statistics(xtx, xty, draw(floats), draw(st.integers(0, 2**63 - 1)))


@settings(max_examples=300, deadline=None)
@given(statistics_values())
def test_encoding_round_trip_is_lossless(s):
    b = s.to_bytes()
    t = Statistics.from_bytes(b)
    assert t == s
    # Bit for bit, including the sign of zeros.
    assert t.xtx.tobytes() == s.xtx.tobytes() and t.xty.tobytes() == s.xty.tobytes()
    assert struct.pack("<d", t.yty) == struct.pack("<d", s.yty)
    assert t.n == s.n and hash(t) == hash(s)
    assert t.to_bytes() == b


def test_encoding_size_is_upper_triangle_only():
    d = 5
    s = Statistics.zeros(d)
    assert len(s.to_bytes()) == struct.calcsize("<4sHIQ") + 8 * (d * (d + 1) // 2 + d + 1)


def _valid_bytes():
    return Statistics(np.eye(3), np.ones(3), 2.0, 10).to_bytes()


@pytest.mark.parametrize("mutate", [
    lambda b: b[:10],                                   # shorter than the header
    lambda b: b[:-8],                                   # body truncated
    lambda b: b + b"\x00" * 8,                          # trailing bytes
    lambda b: b"XXXX" + b[4:],                          # bad magic
    lambda b: b[:4] + struct.pack("<H", 99) + b[6:],    # unknown version
    lambda b: b[:6] + struct.pack("<I", 0) + b[10:],    # d = 0
    lambda b: b[:6] + struct.pack("<I", 4) + b[10:],    # d disagrees with the length
    lambda b: b[:6] + struct.pack("<I", 2**32 - 1) + b[10:],  # absurd d
    lambda b: b[:10] + struct.pack("<Q", 2**64 - 1) + b[18:],  # n out of range
    lambda b: b[:-8] + struct.pack("<d", float("nan")),  # NaN payload
    lambda b: b[:-8] + struct.pack("<d", float("inf")),  # inf payload
    lambda b: b"",
], ids=["short", "truncated", "trailing", "magic", "version", "d0", "dlen", "dhuge", "nhuge",
        "nan", "inf", "empty"])
def test_malformed_bytes_are_rejected(mutate):
    with pytest.raises(StatisticsError):
        Statistics.from_bytes(mutate(_valid_bytes()))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash_otherwise(data):
    try:
        Statistics.from_bytes(data)
    except StatisticsError:
        pass


def test_statistics_error_is_a_value_error():
    assert issubclass(StatisticsError, ValueError)


def test_immutability():
    xtx = np.eye(2)
    xty = np.array([1.0, 2.0])
    s = Statistics(xtx, xty, 3.0, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.n = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.xtx = np.zeros((2, 2))
    with pytest.raises(ValueError):
        s.xtx[0, 0] = 9.0
    with pytest.raises(ValueError):
        s.xty[0] = 9.0
    # The value owns copies: mutating the inputs afterwards changes nothing.
    xtx[0, 0] = 7.0
    xty[1] = 7.0
    assert s.xtx[0, 0] == 1.0 and s.xty[1] == 2.0


@pytest.mark.parametrize("kwargs", [
    dict(xtx=np.ones((2, 3))), dict(xtx=np.array([[1.0, 2.0], [2.0000001, 1.0]])),
    dict(xty=np.ones(3)), dict(xty=np.ones((2, 1))), dict(yty=float("nan")),
    dict(xtx=np.array([[np.inf, 0], [0, 1.0]])), dict(n=-1), dict(n=2.5), dict(n=True),
    dict(n="3"), dict(n=2**63), dict(yty="x"), dict(yty=np.array([1.0, 2.0])),
    dict(xtx=np.zeros((0, 0)), xty=np.zeros(0)), dict(xtx=[["a", "b"], ["b", "a"]]),
])
def test_invalid_values_are_rejected(kwargs):
    args = dict(xtx=np.eye(2), xty=np.zeros(2), yty=1.0, n=3) | kwargs
    with pytest.raises(StatisticsError):
        Statistics(**args)


def test_integral_float_n_is_accepted():
    assert Statistics(np.eye(1), np.zeros(1), 0.0, 4.0).n == 4


def test_addition_sums_every_field_and_requires_equal_dims():
    a = Statistics(np.eye(2), np.array([1.0, 2.0]), 3.0, 4)
    b = Statistics(2 * np.eye(2), np.array([-1.0, 0.5]), 1.5, 6)
    c = a + b
    assert np.array_equal(c.xtx, 3 * np.eye(2)) and np.array_equal(c.xty, [0.0, 2.5])
    assert c.yty == 4.5 and c.n == 10
    assert sum([a, b]) == c
    with pytest.raises(StatisticsError):
        a + Statistics.zeros(3)
    with pytest.raises(TypeError):
        a + 1.0


def test_sum_of_exact_statistics_is_statistics_of_pooled_data():
    """Nieminen (2017) section 3.3.1: statistics of concatenated data sets add."""
    rng = np.random.default_rng(0)
    xa, ya = rng.normal(size=(7, 3)), rng.normal(size=7)
    xb, yb = rng.normal(size=(5, 3)), rng.normal(size=5)
    pooled = exact_statistics(np.vstack([xa, xb]), np.concatenate([ya, yb]))
    summed = exact_statistics(xa, ya) + exact_statistics(xb, yb)
    np.testing.assert_allclose(summed.xtx, pooled.xtx, rtol=1e-12)
    np.testing.assert_allclose(summed.xty, pooled.xty, rtol=1e-12)
    assert summed.yty == pytest.approx(pooled.yty) and summed.n == 12


def test_equality_and_hash_agree_on_signed_zeros():
    a = Statistics(np.zeros((2, 2)), np.zeros(2), 0.0, 1)
    b = Statistics(-np.zeros((2, 2)), -np.zeros(2), -0.0, 1)
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 30), d=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_exact_statistics_match_numpy(n, d, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * rng.uniform(0.1, 100)
    y = rng.normal(size=n)
    s = exact_statistics(x, y)
    np.testing.assert_allclose(s.xtx, x.T @ x, rtol=1e-12, atol=1e-12 * np.abs(x).max() ** 2 * n)
    np.testing.assert_allclose(s.xty, x.T @ y, rtol=1e-12, atol=1e-12)
    assert s.yty == pytest.approx(np.sum(y**2), rel=1e-12)
    assert s.n == n and np.array_equal(s.xtx, s.xtx.T)


def test_symmetric_gram_is_exactly_symmetric():
    x = np.random.default_rng(1).normal(size=(101, 17))
    g = symmetric_gram(x)
    assert np.array_equal(g, g.T)


@pytest.mark.parametrize("x,y", [
    (np.ones(3), np.ones(3)), (np.ones((3, 2)), np.ones((3, 1))), (np.ones((3, 2)), np.ones(2)),
    (np.ones((0, 2)), np.ones(0)), (np.ones((3, 0)), np.ones(3)),
    (np.array([[1.0, np.nan]]), np.ones(1)), (np.ones((1, 1)), np.array([np.inf])),
    ([[{}]], [1.0]),
])
def test_validate_data_rejects(x, y):
    with pytest.raises(ValueError):
        validate_data(x, y)
