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


def test_public_column_scales_divide_continuous_columns_only():
    """Issue 21: continuous columns are divided by their public sd before the row norm;
    binary (0/1) and constant columns keep 1, so the GDSC features are unchanged."""
    from dpfed.preprocess import public_column_scales

    rng = np.random.default_rng(1)
    x = np.column_stack([rng.normal(0, 30, 12), rng.normal(5, 0.002, 12),
                         rng.integers(0, 2, 12).astype(float), np.full(12, 3.0)])
    y = rng.normal(size=12)
    scale = public_column_scales(x)
    assert scale[:2] == (pytest.approx(np.std(x[:, 0], ddof=1)),
                         pytest.approx(np.std(x[:, 1], ddof=1)))
    assert scale[2:] == (1.0, 1.0)
    pre = Preprocessing.from_public_data(x, y, scale_columns=True)
    assert pre.x_scale == scale
    raw = Preprocessing.from_public_data(x, y)
    assert raw.x_scale == ()
    z = pre.transform_x(x)
    c = (x - x.mean(axis=0)) / np.array(scale)
    np.testing.assert_allclose(z, c / np.linalg.norm(c, axis=1, keepdims=True))
    # Both columns now weigh alike in a normalised row; in raw units the small one vanished.
    assert np.abs(z[:, 1]).mean() > 0.2 and np.abs(raw.transform_x(x)[:, 1]).mean() < 1e-3
    assert Preprocessing.from_json(pre.to_json()) == pre
    assert "x_scale" not in raw.to_json()                   # the JSON of before
    assert Preprocessing.from_public_data(x[:, 2:], y, scale_columns=True).x_scale == ()
    for bad in ((1.0,), (1.0, 0.0, 1.0, 1.0), (1.0, float("nan"), 1.0, 1.0)):
        with pytest.raises(ValueError):
            Preprocessing(tuple(pre.x_mean), 0.0, True, x_scale=bad)


def test_column_scales_recover_a_small_unit_column_at_large_n():
    """Issue 21 item 1: at n = 20,000 (eps 2, noise-aware fit, the round's bounds) a column
    with a strong effect measured in small units (sd 0.002 beside sd 30) is lost under the
    common box and noise in raw units; with public column scales the private model keeps
    >= 0.95 of the non-private Spearman. Fails without x_scale."""
    from dpfed.auxiliary import AuxiliarySource
    from dpfed.bounds import choose_bounds_table
    from dpfed.metrics import spearman
    from dpfed.statistics import clipped_exact_statistics, exact_statistics
    from posterior import fit_posterior
    from site_node.release import release_statistics

    rng = np.random.default_rng(3)
    n, m, t = 20_000, 10, 300
    sd = np.array([30.0, 0.002, 1.0, 5.0])
    x = rng.normal(size=(n + m + t, 4)) * sd
    y = (x / sd) @ np.array([0.3, 1.0, -0.5, 0.2]) + rng.normal(size=n + m + t)
    xp, yp, xt, yt, xq, yq = x[:m], y[:m], x[m:m + t], y[m:m + t], x[m + t:], y[m + t:]
    ratios = {}
    for scaled in (False, True):
        pre = Preprocessing.from_public_data(xp, yp, scale_columns=scaled)
        zp, ypc = pre.apply(xp, yp)
        zq, yqc = pre.apply(xq, yq)
        source = AuxiliarySource(xp, yp, pre)
        choice = choose_bounds_table(source, [(n, 1)], [2.0], x_norm_bound=1.0)[(n, 1, 2.0)]
        bx, by = choice.bounds(*source.scales())
        public = clipped_exact_statistics(zp, ypc, bx, by, 1.0)
        release = release_statistics(zq, yqc, epsilon=2.0, x_bound=bx, y_bound=by,
                                     budget_split=choice.budget_split, x_norm_bound=1.0)
        private = fit_posterior(release + public, public=public, x_bound=bx, y_unit=by,
                                draws=500, seed=0)
        nonprivate = fit_posterior(exact_statistics(np.vstack([zq, zp]), np.concatenate([yqc, ypc])),
                                   draws=500, seed=0)
        zt = pre.transform_x(xt)
        ratios[scaled] = spearman(private.predict(zt), yt) / spearman(nonprivate.predict(zt), yt)
    assert ratios[True] >= 0.95
    assert ratios[False] < 0.9
