"""dpfed.secagg.exact and site_node.release.exact_clipped_statistics: a secure round's exact
statistics (quantised rows, integer sums). The quantised rows stay in the clipping domain, the
statistics are an exact function of the rows (any order, any chunking, beyond int64), they
equal the float ones to within the quantisation, one rounding puts them on the grid, and the
grid sensitivity ceil(s Delta) + m with no float-error term bounds them by brute force under
both relations."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from dpfed.secagg import exact
from dpfed.secagg import fixedpoint as fp
from dpfed.secagg.calibration import calibrate
from dpfed.secagg.errors import ParameterError
from dpfed.sensitivity import noise_calibration
from site_node.release import clipped_statistics, exact_clipped_statistics

RO_SPLIT = (0.35, 0.60, 0.05)


def _float_upper(x, y, bx, by, r):
    d = x.shape[1]
    sxx, sxy, syy = clipped_statistics(x, y, bx, by, r)
    return np.concatenate([sxx[np.triu_indices(d)], sxy, [syy]])


# ------------------------------------------------------------------------ quantisation

def test_quantum_exponent_gives_at_most_quant_bits():
    for bound in (1.0, 0.5, 0.3, 2.0, 3.0, 1e-3, 1e6, 2.0 ** -30, 0.999999):
        q = exact.quantum_exponent(bound)
        assert bound * 2.0 ** q <= 2.0 ** exact.QUANT_BITS       # fits in P bits
        assert bound * 2.0 ** (q + 1) > 2.0 ** exact.QUANT_BITS  # the finest grid that fits
    assert exact.CHUNK_ROWS * 2 ** (2 * exact.QUANT_BITS) <= 2 ** 62
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ParameterError):
            exact.quantum_exponent(bad)


def test_quantised_rows_stay_in_the_box_and_the_ball_and_depend_on_the_row_alone():
    """Truncation toward zero: |x_q| <= |x| per coordinate, so a clipped row stays in the box
    and in the row-norm ball (also rows exactly on the bound and on the sphere); rounding to
    the nearest would leave both. A row's quantised value does not depend on the others."""
    rng = np.random.default_rng(0)
    d, bx, by, r = 4, 0.3, 1.7, 1.0
    x = np.vstack([rng.normal(size=(200, d)),
                   np.full((1, d), bx), -np.full((1, d), bx),
                   np.full((1, d), bx * (1 - 1e-16)),
                   np.eye(d)[:2]])                                   # on the unit sphere
    y = np.concatenate([rng.normal(size=200) * 3, [by, -by, by * (1 - 1e-16), 1.0, -1.0]])
    z = np.clip(x, -bx, bx)
    z /= np.maximum(1.0, np.linalg.norm(z, axis=1) / r)[:, None] * (1 + 1e-12)
    u = np.clip(y, -by, by)
    qx, qy = exact.quantum_exponents(bx, by, r)
    zq = exact.quantize(z, qx) * 2.0 ** -qx
    uq = exact.quantize(u, qy) * 2.0 ** -qy
    assert np.all(np.abs(zq) <= np.abs(z)) and np.all(np.abs(uq) <= np.abs(u))
    assert np.all(np.abs(zq) <= bx) and np.all(np.abs(uq) <= by)
    assert np.all(np.linalg.norm(zq, axis=1) <= r)
    assert np.all(np.abs(z - zq) < 2.0 ** -qx) and np.all(np.abs(u - uq) < 2.0 ** -qy)
    # the nearest would step outside: 0.3 is not on the 2^-qx grid and rounds up
    assert np.rint(bx * 2.0 ** qx) * 2.0 ** -qx > bx
    # row by row: quantising a row alone gives its row of the block
    assert np.array_equal(exact.quantize(z[3:4], qx)[0], exact.quantize(z, qx)[3])
    with pytest.raises(ParameterError):
        exact.quantize(np.array([3 * bx]), qx)                      # not clipped


# ----------------------------------------------------------------------- exactness

def test_exact_statistics_are_an_exact_function_of_the_rows():
    """The same integers for any row order and any chunking (the int64 partial sums flushed
    every CHUNK_ROWS rows), equal to Python-integer arithmetic on the quantised rows."""
    rng = np.random.default_rng(1)
    n, d, bx, by = 300, 3, 0.8, 1.5
    x, y = rng.normal(size=(n, d)), rng.normal(size=n) * 2
    a = exact_clipped_statistics(x, y, bx, by, 1.0)
    perm = rng.permutation(n)
    assert exact_clipped_statistics(x[perm], y[perm], bx, by, 1.0) == a
    qx, qy = exact.quantum_exponents(bx, by, 1.0)
    z = np.clip(x, -bx, bx)
    norms = np.linalg.norm(z, axis=1)
    z[norms > 1] *= (1.0 * (1 - 1e-12) / norms[norms > 1])[:, None]
    xq = [[int(v) for v in row] for row in exact.quantize(z, qx)]
    yq = [int(v) for v in exact.quantize(np.clip(y, -by, by), qy)]
    iu = list(zip(*np.triu_indices(d)))
    assert a.xtx == tuple(sum(r[j] * r[k] for r in xq) for j, k in iu)
    assert a.xty == tuple(sum(r[j] * w for r, w in zip(xq, yq)) for j in range(d))
    assert a.yty == sum(w * w for w in yq) and a.n == n
    acc = exact.ExactAccumulator(d, qx, qy)
    old = exact.CHUNK_ROWS
    try:
        exact.CHUNK_ROWS = 7                                    # flush every 7 rows
        for start in range(0, n, 50):
            acc.add(exact.quantize(z[start:start + 50], qx),
                    exact.quantize(np.clip(y[start:start + 50], -by, by), qy))
    finally:
        exact.CHUNK_ROWS = old
    assert acc.result() == a


def test_more_rows_than_int64_holds_are_summed_exactly():
    """2^23 + 5 rows at the bound: X^T X = n 2^40 grid units > 2^63 - 1, which an int64 sum
    would wrap; the chunked sum is exact, and nothing is refused on n."""
    n = 2 ** 23 + 5
    x = np.ones((n, 1))
    y = -np.ones(n)
    stats = exact_clipped_statistics(x, y, 1.0, 1.0)
    q = exact.quantum_exponent(1.0)
    assert q == exact.QUANT_BITS
    assert stats.n == n and stats.xtx == (n * 2 ** 40,) and stats.xty == (-n * 2 ** 40,)
    assert stats.xtx[0] > 2 ** 63 - 1
    assert stats.upper_values().tolist() == [float(n), -float(n), float(n)]


@pytest.mark.parametrize("r", [None, 1.0])
def test_exact_statistics_equal_the_float_ones_to_within_the_quantisation(r):
    """|exact - float| per entry <= n (|x_j| dx + |x_k| dx) for Sxx (each value moves by less
    than one grid step toward 0), n (Bx dy + By dx) for Sxy, 2 n By dy for Syy, plus the float
    sum's own error; and the difference is not zero (the values were quantised)."""
    rng = np.random.default_rng(2)
    for n, d, bx, by in ((1, 1, 1.0, 1.0), (50, 3, 0.3, 2.5), (2000, 8, 0.7, 1.2)):
        x, y = rng.normal(size=(n, d)), rng.normal(size=n) * by
        e = exact_clipped_statistics(x, y, bx, by, r)
        f = _float_upper(x, y, bx, by, r)
        qx, qy = exact.quantum_exponents(bx, by, r)
        dx, dy = 2.0 ** -qx, 2.0 ** -qy
        tx = bx if r is None else min(bx, r)
        m = d * (d + 1) // 2
        tol = np.concatenate([np.full(m, 2 * n * tx * dx), np.full(d, n * (tx * dy + by * dx)),
                              [2 * n * by * dy]])
        tol += 1e-12 * (1 + n)            # the float side's summation error
        diff = np.abs(e.upper_values() - f)
        assert np.all(diff <= tol), (n, d)
        assert np.any(diff > 0)
        assert np.max(diff / (n * max(tx, by) ** 2)) < 2.0 ** -(exact.QUANT_BITS - 2)


def test_zero_rows_give_zeros():
    stats = exact_clipped_statistics(np.zeros((0, 3)), np.zeros(0), 0.5, 1.0, 1.0)
    assert stats.n == 0 and set(stats.xtx) == {0} and set(stats.xty) == {0} and stats.yty == 0


# ------------------------------------------------------------------- the one rounding

def test_round_scaled_is_round_half_to_even_exactly():
    rng = np.random.default_rng(3)
    values = [int(v) for v in rng.integers(-2 ** 62, 2 ** 62, 300)] + \
        [0, 1, -1, 2, 3, -3, 5, -5, 6, 7, 2 ** 70 + 2 ** 9, -(2 ** 70) - 3 * 2 ** 9]
    for v in values:
        for shift in (-11, -10, -3, -1, 0, 4):
            got = exact.round_scaled(v, shift)
            assert got == round(Fraction(v) * Fraction(2) ** shift)    # Python: half to even


def test_encode_exact_is_one_rounding_of_the_exact_value_and_wraps_without_refusing():
    d = 2
    nc = noise_calibration(d, 1.0, 1.0, 1.0)
    g = calibrate(d=d, n_max=100, n_sites=3, x_bound=1.0, y_bound=1.0, calibration=nc,
                  noise_threshold=3, statistics="exact")
    rng = np.random.default_rng(4)
    stats = exact_clipped_statistics(rng.normal(size=(40, d)), rng.normal(size=40), 1.0, 1.0)
    enc = g.encode_exact(stats)
    e = stats.exponents()
    ints = stats.integers()
    want = [round(Fraction(v) * Fraction(g.scales[p]) / Fraction(2) ** e[p])
            for p in ("xtx", "xty", "yty") for v in ints[p]] + [40]
    assert fp.to_signed(enc).tolist() == want
    # A site far beyond any bound is encoded modulo 2^64, not refused (the aggregator's
    # check_sum catches a sum that wrapped).
    huge = exact.ExactStatistics(d, 10 ** 15, stats.qx, stats.qy,
                                 tuple(10 ** 15 * 2 ** 40 for _ in range(3)),
                                 (10 ** 15 * 2 ** 40, 0), 10 ** 15 * 2 ** 40)
    big = g.encode_exact(huge)
    assert big.dtype == np.uint64
    assert int(big[0]) == (round(Fraction(10 ** 15) * Fraction(g.scales["xtx"]))) % 2 ** 64
    with pytest.raises(ParameterError):
        g.encode_exact(exact.ExactStatistics.zeros(3, stats.qx, stats.qy))   # wrong d


# ------------------------------------------------------- grid sensitivity, brute force

def _near_bound_rows(d, bx, r, rng):
    """Rows at and near the bounds: every corner of {-Bx, -Bx(1-1e-9), 0, Bx(1-1e-9), Bx,
    1.7 Bx} (the last clipped), unit and near-unit rows on the sphere, random ones."""
    vals = np.array([-1, -(1 - 1e-9), 0, 1 - 1e-9, 1, 1.7]) * bx
    corners = np.array(list(itertools.product(vals, repeat=d)))
    if len(corners) > 60:
        corners = corners[rng.choice(len(corners), 60, replace=False)]
    sphere = rng.normal(size=(6, d))
    sphere /= np.linalg.norm(sphere, axis=1, keepdims=True)
    rows = [corners, sphere * (r or 1.0), np.eye(d) * (r or bx), rng.uniform(-bx, bx, (6, d))]
    return np.vstack(rows)


@pytest.mark.parametrize("r", [None, 1.0])
@pytest.mark.parametrize("neighbouring", ["add_remove", "replace_one"])
def test_grid_sensitivity_of_exact_statistics_brute_force(neighbouring, r):
    """Small random data sets (rows near the bounds, clipped ones, rows on the sphere) and
    every neighbour that adds one of many extreme rows (add/remove, also removes each row) or
    replaces a row with one (replace-one): the L1 change of each part's grid integers never
    exceeds ``grid_sensitivity(Delta, s, m)`` with no float-error term, at coarse scales
    (where the + m rounding term matters) and at the scale a round calibrates."""
    rng = np.random.default_rng(5 + (r is not None) + 2 * (neighbouring == "replace_one"))
    worst_ratio, rounding_used = 0.0, False
    for trial in range(24):
        d = int(rng.integers(1, 4))
        bx, by = float(rng.choice([0.3, 0.5, 1.0, 1.3])), float(rng.choice([0.7, 1.0, 2.5]))
        split = RO_SPLIT if neighbouring == "replace_one" else None
        nc = noise_calibration(d, 1.0, bx, by, split, neighbouring=neighbouring,
                               x_norm_bound=r)
        grid = calibrate(d=d, n_max=10, n_sites=3, x_bound=bx, y_bound=by, calibration=nc,
                         noise_threshold=3, statistics="exact")
        scales = [2.0 ** int(rng.integers(-1, 6)), 2.0 ** 11]
        pool = _near_bound_rows(d, bx, r, rng)
        ys = np.array([by, -by, by * (1 - 1e-9), 0.0, 1.9 * by, -0.37 * by])
        n = int(rng.integers(1, 6))
        x = pool[rng.choice(len(pool), n)]
        y = ys[rng.choice(len(ys), n)]
        base = exact_clipped_statistics(x, y, bx, by, r)
        neighbours = []
        for v in pool[rng.choice(len(pool), min(len(pool), 25), replace=False)]:
            for w in ys[:4]:
                if neighbouring == "add_remove":
                    neighbours.append((np.vstack([x, v]), np.append(y, w)))
                else:
                    i = int(rng.integers(0, n))
                    x2, y2 = x.copy(), y.copy()
                    x2[i], y2[i] = v, w
                    neighbours.append((x2, y2))
        if neighbouring == "add_remove":
            for i in range(n):
                keep = [j for j in range(n) if j != i]
                neighbours.append((x[keep], y[keep]))
        others = [exact_clipped_statistics(a, b, bx, by, r) for a, b in neighbours]
        for s in scales + [grid.scales["xtx"]]:
            sc = {"xtx": s, "xty": s, "yty": s, "n": 1.0}
            a = base.on_grid(sc)
            for other in others:
                b = other.on_grid(sc)
                for part in ("xtx", "xty", "yty"):
                    m = len(a[part])
                    delta = getattr(nc, f"{part}_sensitivity")
                    g = fp.grid_sensitivity(delta, s, m, float_error=0.0)
                    diff = sum(abs(p - q) for p, q in zip(a[part], b[part]))
                    assert diff <= g, (part, d, n, s, diff, g)
                    worst_ratio = max(worst_ratio, diff / g)
                    rounding_used |= diff > math.ceil(s * delta)
                if neighbouring == "add_remove":
                    assert abs(a["n"][0] - b["n"][0]) == 1
    assert worst_ratio > 0.9          # the check is not vacuous: the bound is (nearly) attained
    if neighbouring == "add_remove":
        assert rounding_used          # and its + m term is needed at the coarse scales
