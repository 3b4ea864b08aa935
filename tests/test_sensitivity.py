"""Brute-force checks of the L1 sensitivities in ``site_node.sensitivity``.

Neighbours are of equal size and differ in one *replaced* record (bounded DP, method.md
section 2). For each statistic we compute the exact clipped statistics of D and D' with the
release's own ``clip`` and assert (a) the L1 distance never exceeds the sensitivity and (b) the
bound is attained for some neighbour, so a formula that is too small *or* too large fails.

Sxx: the paper's d(d+1)Bx^2 (Nieminen 2017, Theorem 3.9 (i)) is a valid bound but exactly twice
the attainable maximum d(d+1)/2 Bx^2 (proof in ``xtx_sensitivity_tight``). The tests pin both:
the brute-force maximum equals the tight value and the release's value is exactly twice it.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfed.statistics import exact_statistics
from site_node.release import clip
from site_node.sensitivity import (noise_calibration, xtx_sensitivity, xtx_sensitivity_tight,
                                   xty_sensitivity, yty_sensitivity)

REL = 1e-9  # floating-point slack on "never exceeds" and "attained"


def clipped_parts(x, y, bx, by):
    """(upper triangle of Sxx, Sxy, Syy) of the clipped data, via the public exact path."""
    s = exact_statistics(clip(np.asarray(x, float), bx), clip(np.asarray(y, float), by))
    return s.xtx[np.triu_indices(s.dim)], s.xty, np.array([s.yty])


def row_parts(v, w, bx, by):
    """Per-row statistics of many rows at once: v (m, d), w (m,) -> (m, d(d+1)/2), (m, d), (m,)."""
    v = clip(v, bx)
    w = clip(w, by)
    iu = np.triu_indices(v.shape[1])
    return (v[:, :, None] * v[:, None, :])[:, iu[0], iu[1]], v * w[:, None], w * w


def grid_rows(d, b):
    """Every row with coordinates in {-3B, -B, -B/2, 0, B/2, B, 3B} (+-3B exercise clipping)."""
    vals = np.array([-3, -1, -0.5, 0, 0.5, 1, 3]) * b
    return np.array(list(itertools.product(vals, repeat=d)))


def pairwise_max_l1(a, b=None):
    """max over i, j of ||a_i - b_j||_1, in blocks to bound memory."""
    b = a if b is None else b
    best = 0.0
    for start in range(0, len(a), 256):
        diff = np.abs(a[start:start + 256, None, :] - b[None, :, :]).sum(axis=-1)
        best = max(best, float(diff.max()))
    return best


@pytest.mark.parametrize("d", [1, 2, 3, 4])
@pytest.mark.parametrize("bx", [0.3, 1.0, 2.5])
def test_xtx_sensitivity_brute_force_is_bounded_and_tight(d, bx):
    rows = grid_rows(d, bx)
    upper, _, _ = row_parts(rows, np.zeros(len(rows)), bx, 1.0)
    worst = pairwise_max_l1(upper)
    assert worst <= xtx_sensitivity_tight(d, bx) * (1 + REL)
    assert worst == pytest.approx(xtx_sensitivity_tight(d, bx), rel=REL)  # attained
    # The release uses the paper's conservative bound: exactly twice the attainable maximum.
    assert xtx_sensitivity(d, bx) == pytest.approx(2 * worst, rel=REL)
    assert noise_calibration(d, 1.0, bx, 1.0).xtx_sensitivity == xtx_sensitivity(d, bx)


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("bx,by", [(1.0, 1.0), (0.4, 2.0), (3.0, 0.7)])
def test_xty_and_yty_sensitivity_brute_force_is_bounded_and_tight(d, bx, by):
    xs = grid_rows(d, bx)
    ys = np.array([-3, -1, -0.5, 0, 0.5, 1, 3]) * by
    v = np.repeat(xs, len(ys), axis=0)
    w = np.tile(ys, len(xs))
    _, xty, yty = row_parts(v, w, bx, by)
    worst_xy = pairwise_max_l1(xty)
    assert worst_xy <= xty_sensitivity(d, bx, by) * (1 + REL)
    assert worst_xy == pytest.approx(xty_sensitivity(d, bx, by), rel=REL)
    worst_yy = pairwise_max_l1(yty[:, None])
    assert worst_yy <= yty_sensitivity(by) * (1 + REL)
    assert worst_yy == pytest.approx(yty_sensitivity(by), rel=REL)
    cal = noise_calibration(d, 2.0, bx, by)
    assert (cal.xty_sensitivity, cal.yty_sensitivity) == (xty_sensitivity(d, bx, by), yty_sensitivity(by))


@pytest.mark.parametrize("d", [2, 3, 5])
def test_sensitivity_on_whole_data_sets_with_extreme_and_random_rows(d):
    """Neighbouring *data sets* (not just rows): random base rows, one row replaced by
    random rows, rows at +-B with every sign pattern, zero rows and rows far beyond the bounds."""
    rng = np.random.default_rng(d)
    bx, by = 0.7, 1.3
    n = 6
    base_x = rng.normal(size=(n - 1, d)) * bx * 2
    base_y = rng.normal(size=n - 1) * by * 2
    signs = np.array(list(itertools.product([-1.0, 1.0], repeat=d)))
    cand_x = np.vstack([signs * bx, signs * bx * 5, np.zeros((1, d)),
                        rng.normal(size=(20, d)) * bx * 3])
    cand_y = np.array([by, -by, 0.0, 4 * by, -4 * by, 0.3 * by])
    parts = []
    for cx in cand_x:
        for cy in cand_y:
            parts.append(clipped_parts(np.vstack([base_x, cx]), np.append(base_y, cy), bx, by))
    xx = np.array([p[0] for p in parts])
    xy = np.array([p[1] for p in parts])
    yy = np.array([p[2] for p in parts])
    limits = [(xx, xtx_sensitivity_tight(d, bx)), (xy, xty_sensitivity(d, bx, by)),
              (yy, yty_sensitivity(by))]
    for values, bound in limits:
        worst = pairwise_max_l1(values)
        assert worst <= bound * (1 + REL)
        assert worst == pytest.approx(bound, rel=1e-9)  # attained by the extreme rows
    assert xtx_sensitivity(d, bx) == pytest.approx(2 * xtx_sensitivity_tight(d, bx))


def test_too_small_or_too_large_formulas_would_fail():
    """The brute-force maxima distinguish the right formulas from plausible wrong ones."""
    d, bx, by = 3, 1.0, 1.0
    rows = grid_rows(d, bx)
    upper, _, _ = row_parts(rows, np.zeros(len(rows)), bx, by)
    worst = pairwise_max_l1(upper)
    for wrong in (d * bx**2, d * d * bx**2 / 2, d * (d - 1) * bx**2 / 2):  # too small
        assert worst > wrong * (1 + REL)
    assert worst < d * d * bx**2  # the "d^2 B^2" formula is too large
    # Sxy: add/remove style "d Bx By" is too small under replace-one.
    v = np.array([[bx] * d, [-bx] * d])
    _, xty, _ = row_parts(v, np.array([by, by]), bx, by)
    assert np.abs(xty[0] - xty[1]).sum() > d * bx * by


finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(d=st.integers(1, 5), bx=st.floats(0.01, 10), by=st.floats(0.01, 10), data=st.data())
def test_property_replace_one_never_exceeds_sensitivity(d, bx, by, data):
    n = data.draw(st.integers(1, 4))
    x = np.array(data.draw(st.lists(st.lists(finite, min_size=d, max_size=d), min_size=n, max_size=n)))
    y = np.array(data.draw(st.lists(finite, min_size=n, max_size=n)))
    i = data.draw(st.integers(0, n - 1))
    x2, y2 = x.copy(), y.copy()
    x2[i] = data.draw(st.lists(finite, min_size=d, max_size=d))
    y2[i] = data.draw(finite)
    a = clipped_parts(x, y, bx, by)
    b = clipped_parts(x2, y2, bx, by)
    # Absolute slack: the sums of the other rows cancel only up to rounding.
    scale = max(bx, by) ** 2 * n * 1e-12
    assert np.abs(a[0] - b[0]).sum() <= xtx_sensitivity_tight(d, bx) * (1 + REL) + scale
    assert np.abs(a[1] - b[1]).sum() <= xty_sensitivity(d, bx, by) * (1 + REL) + scale
    assert np.abs(a[2] - b[2]).sum() <= yty_sensitivity(by) * (1 + REL) + scale


@pytest.mark.parametrize("split", [(0.35, 0.60, 0.05), (0.2, 0.3, 0.5)])
def test_noise_calibration_scales(split):
    d, eps, bx, by = 4, 1.5, 0.5, 2.0
    cal = noise_calibration(d, eps, bx, by, split)
    assert cal.xtx_scale == pytest.approx(d * (d + 1) * bx**2 / (split[0] * eps))
    assert cal.xty_scale == pytest.approx(2 * d * bx * by / (split[1] * eps))
    assert cal.yty_scale == pytest.approx(by**2 / (split[2] * eps))
    assert cal.xtx_epsilon + cal.xty_epsilon + cal.yty_epsilon == pytest.approx(eps, rel=1e-12)


@pytest.mark.parametrize("kwargs", [
    dict(d=0), dict(d=2.5), dict(d=True), dict(x_bound=1e200), dict(y_bound=1e-200),
    dict(epsilon=1e-320),
])
def test_noise_calibration_rejects_degenerate_scales(kwargs):
    args = dict(d=3, epsilon=1.0, x_bound=1.0, y_bound=1.0) | kwargs
    with pytest.raises(ValueError):
        noise_calibration(args["d"], args["epsilon"], args["x_bound"], args["y_bound"])
