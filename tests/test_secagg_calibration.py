"""dpfed.secagg.calibration: the grid calibration reproduces the release's noise law on the sum
of T sites (K sites pay the noise of one release), n stays on the integer grid, and the decoded
secure sum is the true sum plus that noise."""

import math

import numpy as np
import pytest

from dpfed.secagg import calibration as cal_mod
from dpfed.secagg import fixedpoint as fp
from dpfed.secagg.errors import ParameterError, TooFewSurvivors
from dpfed.secagg.protocol import RoundConfig
from dpfed.secagg.simulate import run_round
from dpfed.sensitivity import expected_noise, noise_calibration
from dpfed.wire.signing import SigningKey

Z = 4.9          # two-sided 1e-6


def _grid(d=4, K=8, T=8, neighbouring="add_remove", eps=1.0):
    nc = noise_calibration(d, eps, 1.0, 1.0, neighbouring=neighbouring)
    return nc, cal_mod.calibrate(d=d, n_max=200, n_sites=K, x_bound=1.0, y_bound=1.0,
                                 calibration=nc, noise_threshold=T)


def test_grid_noise_is_the_nominal_noise_plus_a_negligible_rounding_margin():
    nc, g = _grid()
    nominal = {"xtx": nc.xtx_scale, "xty": nc.xty_scale, "yty": nc.yty_scale, "n": nc.n_scale}
    real = g.real_noise_scales()
    for p in fp.PARTS:
        assert real[p] >= nominal[p]                       # never less noise than nominal
        assert real[p] <= nominal[p] * (1 + 1e-4), p       # and only a hair more
    assert g.scales["n"] == 1.0 and g.grid_noise["n"] == pytest.approx(1 / nc.n_epsilon)


def test_secure_sum_of_T_sites_carries_the_noise_of_one_release():
    nc, g = _grid(K=10, T=10)
    one_release = expected_noise(4, 1.0, 1.0, 1.0)
    desc = g.noise_description(10)
    for p in fp.PARTS:
        assert desc.variance(p) == pytest.approx(one_release.variance(p), rel=1e-3), p
        assert desc.draws(p) == 1
    ten_independent = sum([one_release] * 9, one_release)
    assert desc.variance("xty") < ten_independent.variance("xty") / 9
    with pytest.raises(TooFewSurvivors):
        g.noise_description(9)


def _one_by_one(g, upper, n, sites):
    return [g.release(upper, n) for _ in range(sites)]


def _batched(g, upper, n, sites):
    return g.release_many([(upper, n)] * sites)


@pytest.mark.parametrize("releases", [_one_by_one, _batched])
def test_empirical_noise_of_the_sum_matches_the_description(releases):
    """Per site (``release``) or with the K shares drawn in one call (``release_many``, the
    evaluation's simulated rounds): the same law."""
    d, T, R = 12, 5, 120
    _, g = _grid(d=d, K=T, T=T, eps=3.0)
    zeros_upper = np.zeros(g.layout.length - 1)
    sums = np.stack([fp.decode(fp.wrap_sum(releases(g, zeros_upper, 0, T)),
                               g.scale_vector) for _ in range(R)])
    desc = g.noise_description(T)
    for p, sl in g.layout.slices().items():
        x = sums[:, sl].ravel()
        v = np.mean(x ** 2)
        se = np.std(x ** 2) / math.sqrt(x.size)
        assert abs(v - desc.variance(p)) < Z * se, (p, v, desc.variance(p))
    assert np.all(sums[:, -1] == np.round(sums[:, -1]))     # n: integer noise


def test_release_many_gives_each_site_its_own_share():
    """Each batched release is the site's encoded statistics plus a share of its own: no two
    sites get the same share, and a single share has the variance of a 1/T share."""
    d, T, R = 6, 4, 400
    _, g = _grid(d=d, K=T, T=T, eps=2.0)
    upper = np.linspace(-0.5, 0.5, g.layout.length - 1)
    encoded = g.encode(upper, 50)
    shares = np.stack([np.stack([(r.astype(np.uint64) - encoded.astype(np.uint64)).view(np.int64)
                                 for r in g.release_many([(upper, 50)] * T)])
                       for _ in range(R)])                     # R x T x length, grid units
    assert not np.any(np.all(shares[:, 0] == shares[:, 1], axis=1))
    b = g.noise_vector
    xty = g.layout.slices()["xty"]
    assert np.ptp(b[xty]) == 0                               # one noise scale for the part
    one_share_var = 2 * np.exp(-1 / b[xty][0]) / (1 - np.exp(-1 / b[xty][0])) ** 2 / T
    # Pooled over the part's d entries: a 1/T share is heavy-tailed (excess kurtosis ~6T), so
    # one entry's 1600 squares missed rtol 0.35 about once in 130 runs; pooled, 9600 squares
    # put 0.35 at ~7 standard errors.
    v = np.mean(shares[:, :, xty].astype(float) ** 2)
    assert v == pytest.approx(one_share_var, rel=0.35)
    # the sum of the T shares carries one full draw
    total = shares[:, :, xty].astype(float).sum(axis=1)
    assert np.mean(total ** 2) == pytest.approx(T * one_share_var, rel=0.35)


def test_replace_one_releases_n_exactly():
    _, g = _grid(neighbouring="replace_one")
    assert g.grid_noise["n"] is None
    x = fp.wrap_sum(g.release(np.zeros(g.layout.length - 1), 30) for _ in range(3))
    assert g.decode(x)[1] == 90.0
    assert g.noise_description(8).n == ()


def test_end_to_end_release_through_the_protocol():
    d, K = 3, 6
    _, g = _grid(d=d, K=K, T=K)
    ids = tuple(f"h{i}" for i in range(K))
    cfg = RoundConfig.create("calibrated", ids, g.layout.length, min_contributors=K)
    rng = np.random.default_rng(9)
    truth_upper, truth_n, x = 0.0, 0, {}
    for s in ids:
        X = np.clip(rng.normal(size=(150, d)), -1, 1)
        y = np.clip(rng.normal(size=150), -1, 1)
        upper = np.concatenate([(X.T @ X)[np.triu_indices(d)], X.T @ y, [y @ y]])
        truth_upper, truth_n = truth_upper + upper, truth_n + 150
        x[s] = g.release(upper, 150)
    sim = run_round(cfg, x, {s: SigningKey.generate() for s in ids})
    upper, n = g.decode(sim.result.vector)
    b_real = g.layout.per_entry(g.real_noise_scales())
    assert np.all(np.abs(np.append(upper, n) - np.append(truth_upper, truth_n)) < 40 * b_real)
    assert n == round(n)


def test_exact_statistics_are_a_named_option_without_the_float_error_term():
    """``statistics="exact"`` (sites encode exact integer statistics, dpfed.secagg.exact): the
    grid sensitivity is ceil(s Delta) + m with no float-error term, whatever n_max; the
    default ``"float"`` keeps E, which grows with n_max. A calibration without E refuses
    float sums; an unknown option is refused."""
    d = 4
    nc = noise_calibration(d, 1.0, 1.0, 1.0)
    sizes = fp.StatisticsLayout(d).sizes
    exact_grids = [cal_mod.calibrate(d=d, n_max=m, n_sites=8, x_bound=1.0, y_bound=1.0,
                                     calibration=nc, noise_threshold=8, statistics="exact")
                   for m in (200, 10 ** 9)]
    float_grids = [cal_mod.calibrate(d=d, n_max=m, n_sites=8, x_bound=1.0, y_bound=1.0,
                                     calibration=nc, noise_threshold=8)
                   for m in (200, 10 ** 9)]
    for g in exact_grids:
        assert g.statistics == "exact"
        for p in ("xtx", "xty", "yty"):
            assert g.grid_sensitivities[p] == \
                math.ceil(getattr(nc, f"{p}_sensitivity") * g.scales[p]) + sizes[p]
    assert exact_grids[0].grid_noise == exact_grids[1].grid_noise
    assert float_grids[0].statistics == "float"
    assert float_grids[1].grid_sensitivities["xtx"] > float_grids[0].grid_sensitivities["xtx"] \
        >= exact_grids[0].grid_sensitivities["xtx"]
    with pytest.raises(ParameterError, match="no floating-point error term"):
        exact_grids[0].encode(np.zeros(exact_grids[0].layout.length - 1), 3)
    with pytest.raises(ParameterError, match="statistics must be one of"):
        cal_mod.calibrate(d=d, n_max=200, n_sites=8, x_bound=1.0, y_bound=1.0,
                          calibration=nc, noise_threshold=8, statistics="approximate")


def test_release_exact_is_the_exact_encoding_plus_a_share():
    from site_node.release import exact_clipped_statistics

    d, T = 3, 4
    nc = noise_calibration(d, 2.0, 1.0, 1.0)
    g = cal_mod.calibrate(d=d, n_max=100, n_sites=T, x_bound=1.0, y_bound=1.0,
                          calibration=nc, noise_threshold=T, statistics="exact")
    rng = np.random.default_rng(11)
    stats = [exact_clipped_statistics(rng.normal(size=(30, d)), rng.normal(size=30), 1.0, 1.0)
             for _ in range(T)]
    total = fp.wrap_sum(g.release_exact_many(stats))
    clean = fp.wrap_sum(g.encode_exact(s) for s in stats)
    noise = fp.to_signed(total - clean)
    assert np.any(noise != 0) and np.all(np.abs(noise) < 60 * g.noise_vector + 1)
    one = g.release_exact(stats[0])
    assert not np.array_equal(one, g.encode_exact(stats[0]))
    upper, n = g.decode(total)
    g.check_sum(upper, n)                                       # an honest sum passes
    assert g.row_capacity() >= T * 100
