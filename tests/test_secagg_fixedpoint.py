"""dpfed.secagg.fixedpoint: encoding mod 2^64, scale choice, overflow refusal, grid sensitivity."""

import math

import numpy as np
import pytest

from dpfed.secagg import fixedpoint as fp
from dpfed.secagg.errors import ParameterError
from dpfed.sensitivity import (noise_calibration, xtx_sensitivity, xty_sensitivity,
                               yty_sensitivity)


def test_round_trip_error_is_at_most_half_a_grid_unit():
    rng = np.random.default_rng(1)
    v = rng.normal(scale=1e3, size=10_000)
    for s in (2.0 ** -3, 1.0, 2.0 ** 20):
        back = fp.decode(fp.encode(v, s), s)
        assert np.max(np.abs(back - v)) <= 0.5 / s


def test_sums_wrap_modulo_2_64_and_decode_as_signed():
    rng = np.random.default_rng(2)
    s = 2.0 ** 30
    vs = [rng.uniform(-1e6, 1e6, size=100) for _ in range(7)]
    enc = [fp.encode(v, s) for v in vs]
    total = fp.wrap_sum(enc)
    exact = sum(np.rint(v * s).astype(np.int64) for v in vs)
    assert np.array_equal(fp.to_signed(total), exact)
    assert np.allclose(fp.decode(total, s), sum(vs), atol=7 * 0.5 / s)
    # adding a signed noise share wraps too
    noise = rng.integers(-2 ** 40, 2 ** 40, size=100)
    assert np.array_equal(fp.to_signed(fp.add_signed(total, noise)), exact + noise)


def test_encoding_refuses_overflow_nonfinite_and_non_power_of_two_scales():
    with pytest.raises(ParameterError):
        fp.encode([2.0 ** 63], 1.0)
    with pytest.raises(ParameterError):
        fp.encode([1.0, math.inf], 1.0)
    with pytest.raises(ParameterError):
        fp.encode([1.0], 3.0)


def test_choose_scale_meets_rounding_and_overflow_conditions():
    s = fp.choose_scale(max_abs_sum=1e6, noise_scale=0.5, n_sites=100, noise_draws=4)
    assert fp.is_power_of_two(s)
    assert 100 / (2 * s) <= fp.ROUNDING_RATIO * 0.5 < 100 / s      # smallest such power
    assert s * 1e6 + 50 + 40 * 4 * s * 0.5 < 2 ** 63


def test_choose_scale_refuses_what_cannot_fit():
    with pytest.raises(ParameterError, match="2\\^63"):
        fp.choose_scale(max_abs_sum=1e15, noise_scale=1.0, n_sites=1000)
    with pytest.raises(ParameterError, match="noise scale on the grid"):
        fp.choose_scale(max_abs_sum=1.0, noise_scale=1.0, n_sites=10 ** 6,
                        rounding_ratio=2.0 ** -40)


def test_choose_scales_for_a_realistic_round():
    d, n_max, K, T = 64, 10_000, 100, 90
    cal = noise_calibration(d, 1.0, 1.0, 1.0)
    b = {"xtx": cal.xtx_scale, "xty": cal.xty_scale, "yty": cal.yty_scale, "n": cal.n_scale}
    scales = fp.choose_scales(d=d, n_max=n_max, n_sites=K, x_bound=1.0, y_bound=1.0,
                              noise_scales=b, noise_threshold=T)
    bounds = fp.part_bounds(d=d, n_max=n_max, n_sites=K, x_bound=1.0, y_bound=1.0)
    assert scales["n"] == 1.0
    for part in ("xtx", "xty", "yty"):
        s = scales[part]
        assert K / (2 * s) <= fp.ROUNDING_RATIO * b[part]
        assert s * bounds[part] + 40 * 2 * s * b[part] < 2 ** 63
    layout = fp.StatisticsLayout(d)
    assert layout.length == d * (d + 1) // 2 + d + 2


# ---------------------------------------------------------------- grid sensitivity

def _rounded_parts(x, y, s):
    d = x.shape[1]
    iu = np.triu_indices(d)
    parts = {"xtx": (x.T @ x)[iu], "xty": x.T @ y, "yty": np.array([y @ y])}
    return {p: np.rint(v * s) for p, v in parts.items()}


def _real_sensitivity(part, d, bx, by, neighbouring):
    if part == "xtx":
        return xtx_sensitivity(d, bx)
    if part == "xty":
        return xty_sensitivity(d, bx, by, neighbouring=neighbouring)
    return yty_sensitivity(by, neighbouring=neighbouring)


@pytest.mark.parametrize("neighbouring", ["add_remove", "replace_one"])
def test_grid_sensitivity_bounds_brute_force_differences(neighbouring):
    rng = np.random.default_rng(3)
    worst_ratio = 0.0
    for trial in range(400):
        d = int(rng.integers(1, 4))
        n = int(rng.integers(1, 6))
        bx, by = float(rng.uniform(0.05, 1.5)), float(rng.uniform(0.05, 1.5))
        s = 2.0 ** int(rng.integers(-1, 5))
        # rows on a fine grid near half-integers of s * value: rounding boundaries get hit
        x = rng.uniform(-bx, bx, size=(n, d))
        y = rng.uniform(-by, by, size=n)
        if trial % 2:
            x = np.clip(np.round(x * 8) / 8, -bx, bx)
            y = np.clip(np.round(y * 8) / 8, -by, by)
        new_x, new_y = rng.uniform(-bx, bx, size=d), rng.uniform(-by, by)
        if neighbouring == "add_remove":
            x2, y2 = np.vstack([x, new_x]), np.append(y, new_y)
        else:
            x2, y2 = x.copy(), y.copy()
            x2[0], y2[0] = new_x, new_y
        a, b = _rounded_parts(x, y, s), _rounded_parts(x2, y2, s)
        for part in ("xtx", "xty", "yty"):
            m = a[part].size
            delta = _real_sensitivity(part, d, bx, by, neighbouring)
            err = m * fp.float_sum_error_bound(n + 1, max(bx, by) ** 2)
            g = fp.grid_sensitivity(delta, s, m, float_error=err)
            diff = float(np.sum(np.abs(a[part] - b[part])))
            assert diff <= g, (part, d, n, s, diff, g)
            worst_ratio = max(worst_ratio, diff / g)
    assert worst_ratio > 0.3      # the check is not vacuous


def test_the_per_entry_term_is_needed():
    # d = 4 entries of Sxy each move by 0.1 * s < 1 grid unit, but each crosses a rounding
    # boundary: the rounded L1 difference is 4 although ceil(s * Delta) = 1.
    s, bx, by, d = 1.0, 0.1, 1.0, 4
    delta = xty_sensitivity(d, bx, by, neighbouring="add_remove")          # 0.4
    before = np.full(d, 0.45)
    after = before + bx * by
    diff = np.sum(np.abs(np.rint(after * s) - np.rint(before * s)))
    assert diff == 4 > math.ceil(s * delta)
    assert fp.grid_sensitivity(delta, s, d) >= diff


def test_integer_valued_n_needs_no_per_entry_term():
    assert fp.grid_sensitivity(1.0, 1.0, 1, integer_valued=True) == 1
    assert fp.grid_sensitivity(1.0, 4.0, 1, integer_valued=True) == 4
    with pytest.raises(ParameterError):
        fp.grid_sensitivity(1.0, 0.5, 1, integer_valued=True)


def test_layout_pack_and_unpack():
    lay = fp.StatisticsLayout(3)
    v = lay.pack(np.arange(10.0), 7)
    parts = lay.unpack(v)
    assert [parts[p].size for p in fp.PARTS] == [6, 3, 1, 1]
    assert parts["n"][0] == 7 and parts["yty"][0] == 9.0
    per = lay.per_entry({"xtx": 1.0, "xty": 2.0, "yty": 3.0, "n": 4.0})
    assert list(per) == [1.0] * 6 + [2.0] * 3 + [3.0, 4.0]


def test_sum_error_bound_is_named_and_zero_for_exact_statistics():
    assert fp.STATISTICS == ("float", "exact")
    assert fp.sum_error_bound("exact", 10 ** 9, 4.0) == 0.0
    assert fp.sum_error_bound("float", 1000, 4.0) == fp.float_sum_error_bound(1000, 4.0) > 0
    with pytest.raises(ParameterError):
        fp.sum_error_bound("approximate", 10, 1.0)


def test_encode_integers_wraps_modulo_2_64_without_refusing():
    ints = [0, 5, -5, 2 ** 63, 2 ** 64 + 7, -(2 ** 70) - 1]
    enc = fp.encode_integers(ints)
    assert enc.dtype == np.uint64
    assert [int(v) for v in enc] == [v % 2 ** 64 for v in ints]
    assert fp.to_signed(enc).tolist()[:3] == [0, 5, -5]


def test_row_capacity_is_the_largest_row_count_that_cannot_wrap():
    s, bound, k, draws, b = 2.0 ** 20, 0.25, 10, 2, 1e6
    cap = fp.row_capacity(scale=s, row_bound=bound, n_sites=k, noise_draws=draws, grid_noise=b)
    worst = lambda rows: s * rows * bound + k / 2 + fp.TAIL_SCALES * draws * b  # noqa: E731
    assert worst(cap) < 2 ** 63 <= worst(cap * (1 + 1e-9) + 10)
    assert fp.row_capacity(scale=s, row_bound=bound, n_sites=k, noise_draws=draws,
                           grid_noise=None) >= cap
    assert fp.row_bounds(x_bound=0.5, y_bound=2.0) == {"xtx": 0.25, "xty": 1.0, "yty": 4.0,
                                                       "n": 1.0}
