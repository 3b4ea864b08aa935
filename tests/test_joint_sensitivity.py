"""Brute-force checks of ``dpfed.joint_sensitivity`` (issue 23): the joint vector
[Sxx triangle | n_x | Sxy_1..m | Syy_1..m | n_1..m] under add/remove of one patient, responses
possibly missing.

For every data set D and patient p we compute the joint statistics of D and D + p *from the
rows* (the site's own clip and row projection, sums over the rows that have each response) and
assert (a) ||f(D + p) - f(D)|| never exceeds the formula and (b) the formula equals the
largest distance over the extreme records, so a formula too small *or* too large fails."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpfed import joint_sensitivity as js
from dpfed.sensitivity import xtx_sensitivity, xty_sensitivity, yty_sensitivity
from site_node.release import clip, project_rows

REL = 1e-9


def joint_statistics(x, y, bx, by, norm=None, include_n=False):
    """f(D) from the rows: x (n, d) raw features, y (n, m) raw responses with NaN = missing."""
    x = clip(np.asarray(x, float), bx)
    if norm is not None:
        x = project_rows(x.copy(), norm)
    y = np.asarray(y, float)
    present = ~np.isnan(y)
    by = np.broadcast_to(np.asarray(by, float), (y.shape[1],))
    yc = np.where(present, np.clip(np.nan_to_num(y), -by, by), 0.0)
    iu = np.triu_indices(x.shape[1])
    return np.concatenate([(x.T @ x)[iu], [float(len(x))] if include_n else [],
                           (yc.T @ x).ravel(), (yc * yc).sum(axis=0), present.sum(axis=0)])


def batch_contributions(x, y, bx, by, norm=None, include_n=False):
    """f({p}) for many single patients p at once (rows of x, y), by the same clip, projection
    and masks as ``joint_statistics``."""
    x = clip(np.asarray(x, float), bx)
    if norm is not None:
        x = project_rows(x.copy(), norm)
    y = np.asarray(y, float)
    present = ~np.isnan(y)
    byv = np.broadcast_to(np.asarray(by, float), (y.shape[1],))
    yc = np.where(present, np.clip(np.nan_to_num(y), -byv, byv), 0.0)
    iu = np.triu_indices(x.shape[1])
    k = len(x)
    return np.hstack([(x[:, :, None] * x[:, None, :])[:, iu[0], iu[1]],
                      np.ones((k, 1)) if include_n else np.zeros((k, 0)),
                      (yc[:, :, None] * x[:, None, :]).reshape(k, -1), yc * yc,
                      present.astype(float)])


def _rows(d, m, bx, by, rng, k):
    """k random patients: features up to 2 Bx (clipped by the release), responses up to 2 By,
    each missing with probability 0.3."""
    x = rng.uniform(-2 * bx, 2 * bx, (k, d))
    y = rng.uniform(-2, 2, (k, m)) * np.asarray(by)
    y[rng.random((k, m)) < 0.3] = np.nan
    return x, y


CASES = [  # d, m, Bx, By, R, include_n
    (3, 2, 1.0, 1.0, None, False),
    (3, 2, 0.4, [0.5, 2.0], 1.0, True),       # ball binds: t = min(0.4, 1/sqrt(3))= 0.4; c ...
    (4, 3, 1.0, 0.7, 1.0, False),            # c = R^2: L2 extreme is one coordinate at 1
    (4, 1, 0.6, 1.3, 1.0, True),             # R^2 / c = 2.78: two at c, one at the remainder
    (5, 2, 0.1, 1.0, 1.0, False),            # ball never binds (d Bx^2 < R^2)
]


@pytest.mark.parametrize("d,m,bx,by,norm,include_n", CASES)
def test_joint_sensitivity_bounds_every_neighbour_and_is_attained(d, m, bx, by, norm, include_n):
    rng = np.random.default_rng(0)   # the data, not noise: a seeded generator is fine here
    l1 = js.joint_l1_sensitivity(d, m, bx, by, x_norm_bound=norm, include_n=include_n)
    l2 = js.joint_l2_sensitivity(d, m, bx, by, x_norm_bound=norm, include_n=include_n)
    x0, y0 = _rows(d, m, bx, by, rng, 20)
    base = joint_statistics(x0, y0, bx, by, norm, include_n)
    # candidates: random patients, the grid of corner values (incl. beyond the bounds and
    # missing responses), the two extreme records and their sign flips
    xr, yr = _rows(d, m, bx, by, rng, 3000)
    vals = np.array([-3, -1, -0.5, 0, 0.5, 1, 3]) * bx
    xg = np.array(list(itertools.product(vals, repeat=d)))
    byv = np.broadcast_to(np.asarray(by, float), (m,))
    resp = [np.array(r) * byv for r in itertools.product([np.nan, -1.0, 0.0, 1.0, 3.0], repeat=m)]
    pick = rng.integers(0, len(resp), len(xg))
    yg = np.array([resp[i] for i in pick])
    e1 = js.extreme_rows_l1(d, m, bx, by, x_norm_bound=norm)
    e2 = js.extreme_rows_l2(d, m, bx, by, x_norm_bound=norm)
    ext_x = np.array([e1[0], -e1[0], e2[0], -e2[0]])
    ext_y = np.array([e1[1], -e1[1], e2[1], e2[1]])
    # adding a patient adds its own statistics: check that on some, from the rows of D + p
    for v, w in zip(xr[:100], yr[:100]):
        diff = joint_statistics(np.vstack([x0, v]), np.vstack([y0, w]), bx, by, norm,
                                include_n) - base
        single = joint_statistics(v[None, :], w[None, :], bx, by, norm, include_n)
        np.testing.assert_allclose(diff, single, rtol=1e-9, atol=1e-9)
    best1 = best2 = 0.0
    for xs, ys in ((xr, yr), (xg, yg), (ext_x, ext_y)):
        g = batch_contributions(xs, ys, bx, by, norm, include_n)
        n1, n2 = np.abs(g).sum(axis=1), np.sqrt((g ** 2).sum(axis=1))
        assert np.all(n1 <= l1 * (1 + REL) + 1e-12), (n1.max(), l1)
        assert np.all(n2 <= l2 * (1 + REL) + 1e-12), (n2.max(), l2)
        best1, best2 = max(best1, n1.max()), max(best2, n2.max())
    # attained: the extreme records reach the formulas (the release's projection shrinks a
    # row on the sphere by 1e-12, hence the relative slack)
    assert best1 == pytest.approx(l1, rel=1e-9)
    assert best2 == pytest.approx(l2, rel=1e-9)
    # and the extreme records are what the row contribution says
    g1 = js.row_contribution(*e1, include_n=include_n)
    g2 = js.row_contribution(*e2, include_n=include_n)
    assert np.abs(g1).sum() == pytest.approx(l1, rel=1e-12)
    assert math.sqrt((g2 ** 2).sum()) == pytest.approx(l2, rel=1e-12)
    assert js.JointLayout(d, m, include_n).size == g1.size == base.size


def test_a_formula_too_small_or_too_large_fails():
    # the power of the test above: 1 % less than the attained maximum is exceeded by a record,
    # and the formula of the wrong norm is not attained
    d, m, bx, by, norm = 4, 2, 1.0, 1.0, 1.0
    l1 = js.joint_l1_sensitivity(d, m, bx, by, x_norm_bound=norm)
    l2 = js.joint_l2_sensitivity(d, m, bx, by, x_norm_bound=norm)
    g1 = js.row_contribution(*js.extreme_rows_l1(d, m, bx, by, x_norm_bound=norm))
    g2 = js.row_contribution(*js.extreme_rows_l2(d, m, bx, by, x_norm_bound=norm))
    assert np.abs(g1).sum() > 0.99 * l1 and math.sqrt((g2 ** 2).sum()) > 0.99 * l2
    # the spread row is not the L2 extreme and the concentrated one not the L1 extreme
    assert math.sqrt((g1 ** 2).sum()) < 0.99 * l2
    assert np.abs(g2).sum() < 0.9 * l1


def test_one_target_reduces_to_the_per_part_sensitivities():
    d, bx, by = 10, 1.0, 0.8
    for norm in (None, 1.0):
        parts = (xtx_sensitivity(d, bx, x_norm_bound=norm) + xty_sensitivity(d, bx, by, x_norm_bound=norm)
                 + yty_sensitivity(by) + 1.0)
        assert js.joint_l1_sensitivity(d, 1, bx, by, x_norm_bound=norm) == pytest.approx(parts)


def test_the_targets_block_grows_like_m_in_l1_and_sqrt_m_in_l2():
    d, bx, by, norm = 10, 1.0, 1.0, 1.0
    base1 = js.joint_l1_sensitivity(d, 1, bx, by, x_norm_bound=norm)
    xx1 = 0.5 * d * (d + 1) * 0.1
    for m in (4, 16, 64):
        assert js.joint_l1_sensitivity(d, m, bx, by, x_norm_bound=norm) - xx1 == \
            pytest.approx(m * (base1 - xx1))
        # Sxx part 1 (v = e_1), per target By^2 + By^4 + 1 = 3
        assert js.joint_l2_sensitivity(d, m, bx, by, x_norm_bound=norm) == \
            pytest.approx(math.sqrt(1 + 3 * m))


def test_weighted_l2_is_the_sup_of_the_whitened_contribution():
    d, m, bx, by, norm = 4, 2, 0.6, [1.0, 0.5], 1.0
    w = {"xtx": 4.0, "xty": [1.0, 9.0], "yty": 0.25, "n": [0.01, 0.02], "n_x": 0.0}
    got = js.joint_l2_sensitivity(d, m, bx, by, x_norm_bound=norm, weights=w)
    lay = js.JointLayout(d, m)
    sl = lay.slices()
    wv = np.empty(lay.size)
    wv[sl["xtx"]] = 4.0
    wv[sl["xty"]] = np.repeat([1.0, 9.0], d)
    wv[sl["yty"]] = 0.25
    wv[sl["n"]] = [0.01, 0.02]
    rng = np.random.default_rng(1)
    x, y = _rows(d, m, bx, by, rng, 5000)
    x = project_rows(clip(x, bx), norm)
    y = np.clip(y, -np.asarray(by), np.asarray(by))
    best = 0.0
    for v, yy in zip(np.vstack([x, js.extreme_rows_l2(d, m, bx, by, x_norm_bound=norm)[0]]),
                     np.vstack([y, np.asarray(by)])):
        g = js.row_contribution(v, yy)
        best = max(best, math.sqrt((wv * g * g).sum()))
    assert best <= got * (1 + REL)
    assert best == pytest.approx(got, rel=1e-9)


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError):
        js.joint_l1_sensitivity(3, 0, 1.0, 1.0)
    with pytest.raises(ValueError):
        js.joint_l2_sensitivity(3, 2, 1.0, [1.0])
    with pytest.raises(ValueError):
        js.joint_l2_sensitivity(3, 2, 1.0, 1.0, weights={"xtx": -1.0})
    with pytest.raises(ValueError):
        js.joint_l1_sensitivity(3, 2, float("nan"), 1.0)
