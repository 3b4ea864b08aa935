"""site_node.release.release_many: K separate data sets released with the mechanism of
release_statistics, their noise drawn in one OpenDP call per part (method.md sections 2-3)."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

import site_node.release
from site_node.laplace import _calibrated_measurement, laplace_scale
from site_node.release import clipped_statistics, release_many, release_statistics
from site_node.sensitivity import noise_calibration

SPLIT = (0.35, 0.60, 0.03, 0.02)          # add/remove, the default relation
SPLIT_RO = (0.35, 0.60, 0.05)             # replace-one
RO = dict(neighbouring="replace_one", budget_split=SPLIT_RO)


class CountRecorder:
    """Stands in for add_count_noise: records its arguments, adds no noise."""

    def __init__(self):
        self.calls = []

    def __call__(self, counts, epsilon):
        self.calls.append({"size": len(counts), "epsilon": epsilon})
        return list(counts), epsilon


class Recorder:
    """Stands in for add_laplace_noise: records its arguments, adds no noise."""

    def __init__(self):
        self.calls = []

    def __call__(self, values, sensitivity, epsilon, **kw):
        self.calls.append({"size": len(values), "sensitivity": sensitivity, "epsilon": epsilon})
        return np.asarray(values, dtype=np.float64), epsilon


def _blocks(rng, sizes, d):
    return [(rng.normal(size=(n, d)), rng.normal(size=n)) for n in sizes]


@pytest.mark.parametrize("sizes", [[40], [30, 31, 30], [7] * 10])
def test_each_block_gets_the_single_release_calibration(monkeypatch, sizes):
    """Structural: one call per part, with ONE release's sensitivity and epsilon share (not
    K times either), in release_statistics' order, on the K blocks' values concatenated."""
    d, eps, bx, by = 4, 1.5, 0.4, 0.9
    single, many = Recorder(), Recorder()
    single_n, many_n = CountRecorder(), CountRecorder()
    blocks = _blocks(np.random.default_rng(0), sizes, d)
    monkeypatch.setattr(site_node.release, "add_laplace_noise", single)
    monkeypatch.setattr(site_node.release, "add_count_noise", single_n)
    for x, y in blocks:
        release_statistics(x, y, epsilon=eps, x_bound=bx, y_bound=by, budget_split=SPLIT)
    monkeypatch.setattr(site_node.release, "add_laplace_noise", many)
    monkeypatch.setattr(site_node.release, "add_count_noise", many_n)
    out = release_many(blocks, epsilon=eps, x_bound=bx, y_bound=by, budget_split=SPLIT)
    k = len(sizes)
    assert [c["size"] for c in many.calls] == [k * d * (d + 1) // 2, k * d, k]
    # n: one call for the K counts, with one release's n share.
    assert [c["size"] for c in many_n.calls] == [k]
    assert {c["epsilon"] for c in single_n.calls} == {many_n.calls[0]["epsilon"]} == {SPLIT[3] * eps}
    for part in range(3):
        per_site = single.calls[part::3]
        assert {c["sensitivity"] for c in per_site} == {many.calls[part]["sensitivity"]}
        assert {c["epsilon"] for c in per_site} == {many.calls[part]["epsilon"]}
    # With the noise removed each block is exactly its own clipped statistics, in order.
    for (x, y), s in zip(blocks, out):
        sxx, sxy, syy = clipped_statistics(x, y, bx, by)
        assert s.n == x.shape[0]
        np.testing.assert_array_equal(s.xtx, s.xtx.T)
        np.testing.assert_allclose(s.xtx, sxx, rtol=1e-13)
        np.testing.assert_allclose(s.xty, sxy, rtol=1e-13)
        assert s.yty == pytest.approx(syy, rel=1e-13)


@pytest.mark.parametrize("k", [1, 3, 10])
def test_concatenated_scale_is_a_single_release_scale_and_certificate_covers_the_vector(k):
    """The scale OpenDP calibrates for the concatenated vector (rounding slack of all k m
    coordinates charged) is the single-release scale up to (K-1) m 2^-40 relative and never
    smaller; OpenDP's own map of the whole-vector measurement certifies <= the share."""
    d, eps, bx, by = 10, 1.0, 0.3, 1.7
    cal = noise_calibration(d, eps, bx, by, SPLIT)
    m = d * (d + 1) // 2
    for size, sens, share in ((m, cal.xtx_sensitivity, cal.xtx_epsilon),
                              (d, cal.xty_sensitivity, cal.xty_epsilon),
                              (1, cal.yty_sensitivity, cal.yty_epsilon)):
        one = laplace_scale(size, sens, share)
        meas, scale, certified = _calibrated_measurement(k * size, float(sens), float(share))
        assert scale >= one
        assert scale == pytest.approx(one, rel=1e-9)
        assert scale == pytest.approx(sens / share, rel=1e-8)
        assert certified <= share
        assert meas.map(sens) <= share  # the whole vector, every coordinate's slack included
    infos = release_many(_blocks(np.random.default_rng(1), [20] * k, d), epsilon=eps,
                         x_bound=bx, y_bound=by, budget_split=SPLIT, return_info=True)
    for _, info in infos:
        assert info["epsilon_certified"] <= eps
        assert info["epsilon_xtx"] <= cal.xtx_epsilon and info["epsilon_xty"] <= cal.xty_epsilon


def test_brute_force_one_replaced_record_moves_the_vector_by_one_release_sensitivity():
    """Brute force over replacements of one record of one site by box corners / zero: the
    concatenated (K blocks) Sxx upper triangle, Sxy and Syy move in L1 by at most the
    single-release sensitivities the call is calibrated for (the other blocks do not move)."""
    d, bx, by, k = 2, 0.5, 0.8, 3
    cal = noise_calibration(d, 1.0, bx, by, SPLIT_RO, neighbouring="replace_one")
    rng = np.random.default_rng(2)
    blocks = _blocks(rng, [6, 5, 6], d)
    iu = np.triu_indices(d)

    def parts(bs):
        ex = [clipped_statistics(x, y, bx, by) for x, y in bs]
        return (np.concatenate([e[0][iu] for e in ex]), np.concatenate([e[1] for e in ex]),
                np.array([e[2] for e in ex]))

    base = parts(blocks)
    worst = np.zeros(3)
    values_x, values_y = (-bx, 0.0, bx), (-by, 0.0, by)
    for site in range(k):
        for row in itertools.product(values_x, repeat=d):
            for yv in values_y:
                for old_row in itertools.product(values_x, repeat=d):
                    for old_y in values_y:
                        old = [(x.copy(), y.copy()) for x, y in blocks]
                        old[site][0][0], old[site][1][0] = old_row, old_y
                        new = [(x.copy(), y.copy()) for x, y in old]
                        new[site][0][0], new[site][1][0] = row, yv
                        a, b = parts(old), parts(new)
                        dist = [np.sum(np.abs(p - q)) for p, q in zip(a, b)]
                        worst = np.maximum(worst, dist)
    assert worst[0] <= cal.xtx_sensitivity * (1 + 1e-12)
    assert worst[1] <= cal.xty_sensitivity * (1 + 1e-12)
    assert worst[2] <= cal.yty_sensitivity * (1 + 1e-12)
    # ... and the bounds are reached (the sensitivity is not K times smaller either).
    assert worst[1] == pytest.approx(cal.xty_sensitivity)
    assert worst[2] == pytest.approx(cal.yty_sensitivity)
    assert base[0].size == k * 3


def test_brute_force_one_added_record_moves_the_vector_by_one_release_sensitivity():
    """Add/remove: one record (a box corner, zero, or beyond the box) added to one site moves
    the concatenated Sxx triangle, Sxy, Syy and the counts by at most one release's
    sensitivities, and the bounds are reached."""
    d, bx, by, k = 2, 0.5, 0.8, 3
    cal = noise_calibration(d, 1.0, bx, by, SPLIT)
    blocks = _blocks(np.random.default_rng(2), [6, 5, 6], d)
    iu = np.triu_indices(d)

    def parts(bs):
        ex = [clipped_statistics(x, y, bx, by) for x, y in bs]
        return (np.concatenate([e[0][iu] for e in ex]), np.concatenate([e[1] for e in ex]),
                np.array([e[2] for e in ex]), np.array([x.shape[0] for x, _ in bs], float))

    base = parts(blocks)
    worst = np.zeros(4)
    for site in range(k):
        for row in itertools.product((-2 * bx, -bx, 0.0, bx), repeat=d):
            for yv in (-by, 0.0, by, 3 * by):
                new = list(blocks)
                x, y = blocks[site]
                new[site] = (np.vstack([x, row]), np.append(y, yv))
                dist = [np.sum(np.abs(p - q)) for p, q in zip(base, parts(new))]
                worst = np.maximum(worst, dist)
    bounds = np.array([cal.xtx_sensitivity, cal.xty_sensitivity, cal.yty_sensitivity,
                       cal.n_sensitivity])
    assert np.all(worst <= bounds * (1 + 1e-12))
    np.testing.assert_allclose(worst, bounds, rtol=1e-12)


def test_noise_is_calibrated_laplace_independent_between_blocks():
    """Statistical: every block's noise is Laplace with the single-release scale (mean |z| = b,
    KS test), and the blocks' noises are uncorrelated. Real OpenDP noise."""
    d, eps, bx, by, k, reps = 2, 1.0, 0.5, 1.0, 5, 300
    cal = noise_calibration(d, eps, bx, by, SPLIT)
    b_xx = laplace_scale(3, cal.xtx_sensitivity, cal.xtx_epsilon)
    b_xy = laplace_scale(d, cal.xty_sensitivity, cal.xty_epsilon)
    blocks = _blocks(np.random.default_rng(3), [8] * k, d)
    exact = [clipped_statistics(x, y, bx, by) for x, y in blocks]
    zxx = np.empty((reps, k, 3))
    zxy = np.empty((reps, k, d))
    iu = np.triu_indices(d)
    for r in range(reps):
        for j, s in enumerate(release_many(blocks, epsilon=eps, x_bound=bx, y_bound=by,
                                           budget_split=SPLIT)):
            zxx[r, j] = s.xtx[iu] - exact[j][0][iu]
            zxy[r, j] = s.xty - exact[j][1]
    for z, b in ((zxx, b_xx), (zxy, b_xy)):
        flat = z.ravel() / b
        # mean |Laplace(1)| = 1, sd 1: 4 standard errors.
        assert abs(np.mean(np.abs(flat)) - 1) < 4 / math.sqrt(flat.size)
        assert sps.kstest(flat, sps.laplace.cdf).pvalue > 1e-4
        for j in range(k):  # every block separately (wider: fewer samples)
            per = z[:, j].ravel() / b
            assert abs(np.mean(np.abs(per)) - 1) < 4.5 / math.sqrt(per.size)
    # Independence between blocks: the correlation of block 0's and block 1's first entry.
    r01 = np.corrcoef(zxx[:, 0, 0], zxx[:, 1, 0])[0, 1]
    assert abs(r01) < 4 / math.sqrt(reps)


def test_bad_input_raises_before_any_noise(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(site_node.release, "add_laplace_noise", rec)
    rng = np.random.default_rng(4)
    good = _blocks(rng, [5, 5], 3)
    bad_x = good[1][0].copy()
    bad_x[2, 1] = np.nan
    with pytest.raises(ValueError):
        release_many([good[0], (bad_x, good[1][1])], epsilon=1.0, x_bound=1, y_bound=1)
    with pytest.raises(ValueError, match="same number of columns"):
        release_many([good[0], (rng.normal(size=(5, 2)), rng.normal(size=5))], epsilon=1.0,
                     x_bound=1, y_bound=1)
    with pytest.raises(ValueError, match="at least one"):
        release_many([], epsilon=1.0, x_bound=1, y_bound=1)
    with pytest.raises(ValueError):
        release_many(good, epsilon=0.0, x_bound=1, y_bound=1)
    assert rec.calls == []
