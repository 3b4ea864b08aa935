"""Brute-force checks of the L1 sensitivities in ``dpfed.sensitivity``.

Two neighbouring relations (method.md section 9). Replace-one: neighbours are of equal size and
differ in one *replaced* record (bounded DP). Add/remove: one data set has one more record
(the tests at the end of this file, including n). For each statistic we compute the exact clipped statistics of D and D' with the
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
from dpfed.sensitivity import (DEFAULT_SPLIT_ADD_REMOVE, expected_noise, noise_calibration,
                               xtx_sensitivity, xtx_sensitivity_tight, xty_sensitivity,
                               yty_sensitivity)
from dpfed.noise import NoiseTerm

RO = dict(neighbouring="replace_one")

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
    # The paper's conservative bound is exactly twice the attainable maximum; the default
    # ("exact") is the maximum.
    assert xtx_sensitivity(d, bx, rule="paper") == pytest.approx(2 * worst, rel=REL)
    assert xtx_sensitivity(d, bx) == pytest.approx(worst, rel=REL)
    assert noise_calibration(d, 1.0, bx, 1.0, **RO).xtx_sensitivity == xtx_sensitivity(d, bx)
    assert noise_calibration(d, 1.0, bx, 1.0, **RO, xtx_sensitivity="paper"
                             ).xtx_sensitivity == xtx_sensitivity(d, bx, rule="paper")


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("bx,by", [(1.0, 1.0), (0.4, 2.0), (3.0, 0.7)])
def test_xty_and_yty_sensitivity_brute_force_is_bounded_and_tight(d, bx, by):
    xs = grid_rows(d, bx)
    ys = np.array([-3, -1, -0.5, 0, 0.5, 1, 3]) * by
    v = np.repeat(xs, len(ys), axis=0)
    w = np.tile(ys, len(xs))
    _, xty, yty = row_parts(v, w, bx, by)
    worst_xy = pairwise_max_l1(xty)
    assert worst_xy <= xty_sensitivity(d, bx, by, **RO) * (1 + REL)
    assert worst_xy == pytest.approx(xty_sensitivity(d, bx, by, **RO), rel=REL)
    worst_yy = pairwise_max_l1(yty[:, None])
    assert worst_yy <= yty_sensitivity(by, **RO) * (1 + REL)
    assert worst_yy == pytest.approx(yty_sensitivity(by, **RO), rel=REL)
    cal = noise_calibration(d, 2.0, bx, by, **RO)
    assert (cal.xty_sensitivity, cal.yty_sensitivity) == (xty_sensitivity(d, bx, by, **RO),
                                                          yty_sensitivity(by, **RO))
    assert cal.n_sensitivity is None and cal.n_scale is None  # n public under replace-one


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
    limits = [(xx, xtx_sensitivity_tight(d, bx)), (xy, xty_sensitivity(d, bx, by, **RO)),
              (yy, yty_sensitivity(by, **RO))]
    for values, bound in limits:
        worst = pairwise_max_l1(values)
        assert worst <= bound * (1 + REL)
        assert worst == pytest.approx(bound, rel=1e-9)  # attained by the extreme rows
    assert xtx_sensitivity(d, bx, rule="paper") == pytest.approx(2 * xtx_sensitivity_tight(d, bx))


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
    assert np.abs(a[1] - b[1]).sum() <= xty_sensitivity(d, bx, by, **RO) * (1 + REL) + scale
    assert np.abs(a[2] - b[2]).sum() <= yty_sensitivity(by, **RO) * (1 + REL) + scale


@pytest.mark.parametrize("split", [(0.35, 0.60, 0.05), (0.2, 0.3, 0.5)])
def test_noise_calibration_scales_replace_one(split):
    d, eps, bx, by = 4, 1.5, 0.5, 2.0
    cal = noise_calibration(d, eps, bx, by, split, **RO, xtx_sensitivity="paper")
    assert cal.xtx_scale == pytest.approx(d * (d + 1) * bx**2 / (split[0] * eps))
    assert noise_calibration(d, eps, bx, by, split, **RO).xtx_scale == pytest.approx(
        d * (d + 1) / 2 * bx**2 / (split[0] * eps))
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


# ---- add/remove neighbours (the default): one data set has one more record -----------------

def add_remove_max(rows_upper, rows_xy, rows_yy):
    """max over single rows of the L1 change of each part when that row is added or removed:
    the change is the row's own contribution, whatever the other rows are."""
    return (float(np.abs(rows_upper).sum(axis=1).max()), float(np.abs(rows_xy).sum(axis=1).max()),
            float(np.abs(rows_yy).max()))


@pytest.mark.parametrize("d", [1, 2, 3, 4])
@pytest.mark.parametrize("bx,by", [(1.0, 1.0), (0.4, 2.0), (3.0, 0.7)])
def test_add_remove_sensitivity_brute_force_is_bounded_and_tight(d, bx, by):
    xs = grid_rows(d, bx)
    ys = np.array([-3, -1, -0.5, 0, 0.5, 1, 3]) * by
    v = np.repeat(xs, len(ys), axis=0)
    w = np.tile(ys, len(xs))
    worst_xx, worst_xy, worst_yy = add_remove_max(*row_parts(v, w, bx, by))
    cal = noise_calibration(d, 1.0, bx, by)  # the default relation
    assert cal.neighbouring == "add_remove" and cal.xtx_rule == "exact"
    for worst, bound in ((worst_xx, cal.xtx_sensitivity), (worst_xy, cal.xty_sensitivity),
                         (worst_yy, cal.yty_sensitivity)):
        assert worst <= bound * (1 + REL)
        assert worst == pytest.approx(bound, rel=REL)  # attained
    assert cal.xtx_sensitivity == pytest.approx(d * (d + 1) / 2 * bx**2)
    assert cal.xty_sensitivity == pytest.approx(d * bx * by)  # half the replace-one value
    assert cal.yty_sensitivity == pytest.approx(by**2)
    assert cal.n_sensitivity == 1.0


@pytest.mark.parametrize("d", [2, 3, 5])
def test_add_remove_on_whole_data_sets_including_n(d):
    """Whole data sets: a random base set, then every candidate row added (and so removed);
    Sxx, Sxy, Syy and n each move by at most their add/remove sensitivity, and the bound is
    attained by an extreme row."""
    rng = np.random.default_rng(10 + d)
    bx, by = 0.7, 1.3
    base_x = rng.normal(size=(5, d)) * bx * 2
    base_y = rng.normal(size=5) * by * 2
    signs = np.array(list(itertools.product([-1.0, 1.0], repeat=d)))
    cand_x = np.vstack([signs * bx, signs * bx * 5, np.zeros((1, d)),
                        rng.normal(size=(20, d)) * bx * 3])
    cand_y = np.array([by, -by, 0.0, 4 * by, -4 * by, 0.3 * by])
    cal = noise_calibration(d, 1.0, bx, by)
    s0 = exact_statistics(clip(base_x, bx), clip(base_y, by))
    iu = np.triu_indices(d)
    worst = np.zeros(4)
    for cx in cand_x:
        for cy in cand_y:
            s1 = exact_statistics(clip(np.vstack([base_x, cx]), bx),
                                  clip(np.append(base_y, cy), by))
            change = np.array([np.abs(s1.xtx[iu] - s0.xtx[iu]).sum(),
                               np.abs(s1.xty - s0.xty).sum(), abs(s1.yty - s0.yty),
                               abs(s1.n - s0.n)])
            worst = np.maximum(worst, change)
    bounds = np.array([cal.xtx_sensitivity, cal.xty_sensitivity, cal.yty_sensitivity,
                       cal.n_sensitivity])
    assert np.all(worst <= bounds * (1 + REL) + 1e-12)
    np.testing.assert_allclose(worst, bounds, rtol=1e-9)  # attained


def test_add_remove_wrong_formulas_would_fail():
    """The replace-one Sxy value is too large under add/remove, the paper's Sxx too large,
    and anything smaller than d Bx By too small."""
    d, bx, by = 3, 1.0, 1.0
    v = grid_rows(d, bx)
    xx, xy, yy = add_remove_max(*row_parts(v, np.full(len(v), by), bx, by))
    assert xy < xty_sensitivity(d, bx, by, **RO) and xy > (d - 1) * bx * by
    assert xx < xtx_sensitivity(d, bx, rule="paper")


@settings(max_examples=200, deadline=None)
@given(d=st.integers(1, 5), bx=st.floats(0.01, 10), by=st.floats(0.01, 10), data=st.data())
def test_property_add_remove_never_exceeds_sensitivity(d, bx, by, data):
    n = data.draw(st.integers(1, 4))
    x = np.array(data.draw(st.lists(st.lists(finite, min_size=d, max_size=d), min_size=n, max_size=n)))
    y = np.array(data.draw(st.lists(finite, min_size=n, max_size=n)))
    i = data.draw(st.integers(0, n - 1))
    a = clipped_parts(x, y, bx, by)
    if n == 1:
        b = (np.zeros_like(a[0]), np.zeros_like(a[1]), np.zeros(1))
    else:
        b = clipped_parts(np.delete(x, i, axis=0), np.delete(y, i), bx, by)
    cal = noise_calibration(d, 1.0, bx, by)
    scale = max(bx, by) ** 2 * n * 1e-12
    assert np.abs(a[0] - b[0]).sum() <= cal.xtx_sensitivity * (1 + REL) + scale
    assert np.abs(a[1] - b[1]).sum() <= cal.xty_sensitivity * (1 + REL) + scale
    assert np.abs(a[2] - b[2]).sum() <= cal.yty_sensitivity * (1 + REL) + scale


def test_noise_calibration_add_remove_scales_and_default_split():
    d, eps, bx, by = 4, 1.5, 0.5, 2.0
    cal = noise_calibration(d, eps, bx, by)
    p = DEFAULT_SPLIT_ADD_REMOVE
    assert cal.xtx_scale == pytest.approx(d * (d + 1) / 2 * bx**2 / (p[0] * eps))
    assert cal.xty_scale == pytest.approx(d * bx * by / (p[1] * eps))
    assert cal.yty_scale == pytest.approx(by**2 / (p[2] * eps))
    assert cal.n_scale == pytest.approx(1 / (p[3] * eps))
    assert cal.epsilon == pytest.approx(eps, rel=1e-12)
    paper = noise_calibration(d, eps, bx, by, xtx_sensitivity="paper")
    assert paper.xtx_scale == pytest.approx(2 * cal.xtx_scale)


@pytest.mark.parametrize("kwargs,message", [
    (dict(budget_split=(0.35, 0.60, 0.05)), "4 numbers"),                       # 3 under add/remove
    (dict(budget_split=(0.3, 0.6, 0.05, 0.05), neighbouring="replace_one"), "3 numbers"),
    (dict(neighbouring="bounded"), "unknown neighbouring"),
    (dict(neighbouring=""), "unknown neighbouring"),
    (dict(xtx_sensitivity="tight"), "unknown xtx_sensitivity"),
])
def test_wrong_relation_rule_or_split_length_fails_closed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        noise_calibration(3, 1.0, 1.0, 1.0, **kwargs)
    with pytest.raises(ValueError, match=message):
        expected_noise(3, 1.0, 1.0, 1.0, **kwargs)


def test_expected_noise_describes_one_release():
    d, eps, bx, by = 3, 2.0, 0.5, 1.5
    cal = noise_calibration(d, eps, bx, by)
    noise = expected_noise(d, eps, bx, by)
    assert noise.xtx == (NoiseTerm("laplace", cal.xtx_scale),)
    assert noise.xty == (NoiseTerm("laplace", cal.xty_scale),)
    assert noise.yty == (NoiseTerm("laplace", cal.yty_scale),)
    assert noise.n == (NoiseTerm("discrete_laplace", cal.n_scale, 1, 1.0),)
    ro = expected_noise(d, eps, bx, by, neighbouring="replace_one", xtx_sensitivity="paper")
    cal_ro = noise_calibration(d, eps, bx, by, neighbouring="replace_one",
                               xtx_sensitivity="paper")
    assert ro.n == () and ro.xtx == (NoiseTerm("laplace", cal_ro.xtx_scale),)
    assert ro.xty == (NoiseTerm("laplace", cal_ro.xty_scale),)


def test_site_node_sensitivity_re_exports_the_core_module():
    import dpfed.sensitivity as core
    import site_node.sensitivity as old
    for name in ("DEFAULT_BUDGET_SPLIT", "validate_privacy_parameters", "xtx_sensitivity",
                 "xty_sensitivity", "noise_calibration", "expected_noise", "NEIGHBOURING",
                 "XTX_SENSITIVITIES", "DEFAULT_SPLIT_ADD_REMOVE"):
        assert getattr(old, name) is getattr(core, name)


# -------------------------------------------------------------- row-norm bound (L2 ball)

def ball_rows(d, bx, r, extra=400, seed=0):
    """Grid rows (coordinates in {-3B..3B}), rows at and beyond the ball, and random rows, each
    clipped to the box and projected into the ball of radius r by the release's own code."""
    from site_node.release import project_rows

    rng = np.random.default_rng(seed)
    t = min(bx, r / np.sqrt(d))
    rows = [grid_rows(d, bx), grid_rows(d, t), np.full((1, d), t), -np.full((1, d), t),
            rng.standard_normal((extra, d)) * 2 * bx, np.eye(d) * 5 * r]
    v = clip(np.vstack(rows), bx)
    return project_rows(v, r)


@pytest.mark.parametrize("d", [2, 3, 4])
@pytest.mark.parametrize("bx,r", [(0.3, 1.0), (1.0, 1.0), (2.0, 1.0), (0.5, 0.6)])
def test_row_norm_bound_add_remove_brute_force_is_bounded_and_tight(d, bx, r):
    v = ball_rows(d, bx, r)
    assert np.all(np.sqrt((v * v).sum(axis=1)) <= r) and np.all(np.abs(v) <= bx)
    by = 1.3
    upper, xy, _ = row_parts(v, np.full(len(v), by), bx, by)
    cal = noise_calibration(d, 1.0, bx, by, x_norm_bound=r)
    worst_xx = float(np.abs(upper).sum(axis=1).max())   # add/remove: one row's own products
    worst_xy = float(np.abs(xy).sum(axis=1).max())
    assert worst_xx <= cal.xtx_sensitivity * (1 + REL)
    assert worst_xy <= cal.xty_sensitivity * (1 + REL)
    # attained (by t (1, ..., 1), up to the projection's 1e-12 shrink)
    assert worst_xx == pytest.approx(cal.xtx_sensitivity, rel=1e-9)
    assert worst_xy == pytest.approx(cal.xty_sensitivity, rel=1e-9)
    t = min(bx, r / np.sqrt(d))
    assert cal.xtx_sensitivity == pytest.approx(d * (d + 1) / 2 * t * t)
    # never above the box-only value; strictly below once Bx > R / sqrt(d)
    box = noise_calibration(d, 1.0, bx, by)
    assert cal.xtx_sensitivity <= box.xtx_sensitivity * (1 + REL)
    if bx > r / np.sqrt(d) * 1.01:
        assert cal.xtx_sensitivity < box.xtx_sensitivity
        assert cal.xty_sensitivity < box.xty_sensitivity


@pytest.mark.parametrize("d", [2, 3, 4])
@pytest.mark.parametrize("bx,r", [(0.3, 1.0), (1.0, 1.0), (2.0, 1.0), (0.5, 0.6)])
def test_row_norm_bound_replace_one_brute_force_is_bounded(d, bx, r):
    v = ball_rows(d, bx, r, extra=300)
    by = 0.7
    w = np.concatenate([np.full(len(v) // 2, by), np.full(len(v) - len(v) // 2, -by)])
    upper, xy, yy = row_parts(v, w, bx, by)
    cal = noise_calibration(d, 1.0, bx, by, x_norm_bound=r, **RO)
    assert pairwise_max_l1(upper) <= cal.xtx_sensitivity * (1 + REL)
    assert pairwise_max_l1(xy) <= cal.xty_sensitivity * (1 + REL)
    # Sxy under replace-one: attained by (t,...,t, By) against (-t,...,-t, By)
    t = min(bx, r / np.sqrt(d))
    assert cal.xty_sensitivity == pytest.approx(2 * d * t * by)
    assert pairwise_max_l1(xy) == pytest.approx(cal.xty_sensitivity, rel=1e-9)
    assert cal.xtx_sensitivity == pytest.approx(min(d * (d + 1) / 2 * bx * bx,
                                                    d * (d + 1) * t * t))


@settings(max_examples=60, deadline=None)
@given(d=st.integers(1, 5), bx=st.floats(0.05, 3.0), r=st.floats(0.1, 3.0),
       data=st.data())
def test_property_row_norm_bound_never_exceeded_on_data_sets(d, bx, r, data):
    """Whole data sets through the release's own clip + projection (clipped_statistics)."""
    from site_node.release import clipped_statistics

    by = 1.0
    vals = st.floats(-5, 5, allow_nan=False)
    n = data.draw(st.integers(1, 6))
    x = np.array(data.draw(st.lists(st.lists(vals, min_size=d, max_size=d), min_size=n + 1,
                                    max_size=n + 1)))
    y = np.array(data.draw(st.lists(vals, min_size=n + 1, max_size=n + 1)))
    x2 = x.copy()
    x2[-1] = np.array(data.draw(st.lists(vals, min_size=d, max_size=d)))
    for rel in ("add_remove", "replace_one"):
        cal = noise_calibration(d, 1.0, bx, by, x_norm_bound=r, neighbouring=rel)
        a = clipped_statistics(x, y, bx, by, r)
        b = clipped_statistics(x[:-1], y[:-1], bx, by, r) if rel == "add_remove" else \
            clipped_statistics(x2, y, bx, by, r)
        iu = np.triu_indices(d)
        slack = 1e-9 * (1 + n)
        assert np.abs(a[0][iu] - b[0][iu]).sum() <= cal.xtx_sensitivity * (1 + REL) + slack
        assert np.abs(a[1] - b[1]).sum() <= cal.xty_sensitivity * (1 + REL) + slack


def test_row_norm_bound_is_one_for_normalised_rows_and_validated():
    from dpfed.sensitivity import row_norm_bound

    assert row_norm_bound(True) == 1.0 and row_norm_bound(False) is None
    for bad in (0.0, -1.0, float("inf"), float("nan"), True, "1"):
        with pytest.raises(ValueError):
            noise_calibration(3, 1.0, 0.5, 1.0, x_norm_bound=bad)
    # the paper rule keeps the paper's Sxx value; Sxy still uses the row bound
    cal = noise_calibration(10, 1.0, 0.9, 1.0, x_norm_bound=1.0, xtx_sensitivity="paper")
    assert cal.xtx_sensitivity == pytest.approx(10 * 11 * 0.81)
    assert cal.xty_sensitivity == pytest.approx(10 * (1 / np.sqrt(10)) * 1.0)
    noise = expected_noise(10, 1.0, 0.9, 1.0, x_norm_bound=1.0)
    assert noise.xtx[0].scale == pytest.approx(55 * 0.1 / (DEFAULT_SPLIT_ADD_REMOVE[0]))
