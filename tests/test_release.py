"""Tests of the eps-DP release (method.md section 2; Honkela et al. 2018, section 4.2).

Calibration is checked statistically on thousands of releases of one fixed data set: the noise
(noisy minus exact clipped statistic) must have mean 0, variance 2 b^2 and a Laplace(b) law
(Kolmogorov-Smirnov). Each check is shown to *fail* on noise at a wrong scale, so the checks
have power. Tolerances come from the sampling distribution of the sample variance of Laplace
noise: Var(s^2) ~ (mu4 - sigma^4) / N with mu4 = 24 b^4 and sigma^2 = 2 b^2, i.e. 20 b^4 / N.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

import site_node.release as release_mod
from dpfed.statistics import Statistics, exact_statistics
from site_node.laplace import laplace_scale
from site_node.release import clip, release_many, release_statistics
from dpfed.noise import NoiseTerm
from dpfed.sensitivity import DEFAULT_SPLIT_ADD_REMOVE, expected_noise
from site_node.laplace import add_count_noise
from site_node.sensitivity import noise_calibration

Z = 5.0  # sigmas of tolerance for the mean and variance checks
KS_ALPHA = 1e-4  # the correct scale must not be rejected at this level


def fixed_data(n, d, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = x @ rng.normal(size=d) + rng.normal(size=n)
    return x, y


def exact_clipped(x, y, bx, by) -> Statistics:
    return exact_statistics(clip(x, bx), clip(y, by))


def parts_of(s: Statistics):
    iu = np.triu_indices(s.dim)
    return s.xtx[iu], s.xty, np.array([s.yty])


def collect_noise(x, y, reps, **kw):
    """Noise of ``reps`` releases, per part: arrays (reps, m) for Sxx (upper), Sxy, Syy."""
    exact = parts_of(exact_clipped(x, y, kw["x_bound"], kw["y_bound"]))
    out = [np.empty((reps, len(e))) for e in exact]
    for r in range(reps):
        s = release_statistics(x, y, **kw)
        assert np.array_equal(s.xtx, s.xtx.T)  # symmetric bit for bit
        for k, (noisy, e) in enumerate(zip(parts_of(s), exact)):
            out[k][r] = noisy - e
    return out


def expected_scales(d, kw):
    cal = noise_calibration(d, kw["epsilon"], kw["x_bound"], kw["y_bound"],
                            kw.get("budget_split"),
                            neighbouring=kw.get("neighbouring", "add_remove"),
                            xtx_sensitivity=kw.get("xtx_sensitivity", "exact"))
    m = d * (d + 1) // 2
    return (laplace_scale(m, cal.xtx_sensitivity, cal.xtx_epsilon),
            laplace_scale(d, cal.xty_sensitivity, cal.xty_epsilon),
            laplace_scale(1, cal.yty_sensitivity, cal.yty_epsilon)), cal


def calibration_failures(noise: np.ndarray, b: float) -> list[str]:
    """Reasons why ``noise`` (reps x m, iid per column) is not Laplace(0, b); [] if consistent.

    Per component: mean within Z sd of 0, sample variance within Z sd of 2 b^2. Pooled over the
    components (standardised by b): the same two checks with the pooled sample size, and a KS
    test against Laplace(0, 1).
    """
    reasons = []
    reps, m = noise.shape
    var_sd = math.sqrt(20.0 / reps) * b * b  # sd of the sample variance of Laplace(b)
    for j in range(m):
        col = noise[:, j]
        if abs(col.mean()) > Z * math.sqrt(2 * b * b / reps):
            reasons.append(f"component {j}: mean {col.mean():.4g}")
        if abs(col.var() - 2 * b * b) > Z * var_sd:
            reasons.append(f"component {j}: variance {col.var():.4g} vs {2 * b * b:.4g}")
    z = (noise / b).ravel()
    big_n = z.size
    if abs(z.var() - 2.0) > Z * math.sqrt(20.0 / big_n):
        reasons.append(f"pooled variance {z.var():.4g} vs 2")
    if abs(z.mean()) > Z * math.sqrt(2.0 / big_n):
        reasons.append(f"pooled mean {z.mean():.4g}")
    p = stats.kstest(z, stats.laplace(scale=1.0).cdf).pvalue
    if p < KS_ALPHA:
        reasons.append(f"KS p-value {p:.3g}")
    return reasons


CONFIGS = [
    dict(d=3, epsilon=1.0, x_bound=0.5, y_bound=1.0, budget_split=(0.35, 0.60, 0.05),
         neighbouring="replace_one", xtx_sensitivity="paper"),
    dict(d=2, epsilon=2.0, x_bound=1.5, y_bound=0.3, budget_split=(0.2, 0.5, 0.3),
         neighbouring="replace_one"),
    dict(d=5, epsilon=0.3, x_bound=0.2, y_bound=2.0, budget_split=(0.5, 0.4, 0.05, 0.05)),
    dict(d=4, epsilon=1.0, x_bound=0.5, y_bound=1.0),  # the defaults: add/remove, exact
]


@pytest.fixture(scope="module", params=range(len(CONFIGS)), ids=lambda i: f"cfg{i}")
def noise_sample(request):
    cfg = dict(CONFIGS[request.param])
    d = cfg.pop("d")
    x, y = fixed_data(40, d, seed=request.param)
    reps = 3000
    noise = collect_noise(x, y, reps, **cfg)
    scales, cal = expected_scales(d, cfg)
    return d, cfg, noise, scales, cal


@pytest.mark.slow
def test_noise_is_laplace_at_the_calibrated_scale(noise_sample):
    d, cfg, noise, scales, cal = noise_sample
    # The OpenDP-calibrated scale is sensitivity / (p eps) up to rounding-grid slack.
    for b, nominal in zip(scales, (cal.xtx_scale, cal.xty_scale, cal.yty_scale)):
        assert b == pytest.approx(nominal, rel=1e-6)
        assert b >= nominal
    for part, b, name in zip(noise, scales, ("xtx", "xty", "yty")):
        failures = calibration_failures(part, b)
        assert not failures, f"{name}: {failures}"


@pytest.mark.slow
def test_calibration_check_rejects_wrong_scales(noise_sample):
    """Power: the same checks reject the released noise when the expected scale is wrong,
    i.e. they would catch a release at b/1.2 or with a budget-split mistake."""
    d, cfg, noise, scales, cal = noise_sample
    for part, b in zip(noise, scales):
        assert calibration_failures(part, b * 1.2), "noise at b/1.2 not detected"
        assert calibration_failures(part, b / 1.2), "noise at 1.2 b not detected"
    # A split mistake: the Sxx scale computed with p2 instead of p1 (and vice versa).
    p1, p2 = cal.xtx_epsilon, cal.xty_epsilon
    assert calibration_failures(noise[0], scales[0] * p1 / p2)
    assert calibration_failures(noise[1], scales[1] * p2 / p1)
    # Replace-one vs add/remove mistake: the Sxy scale with the other relation's factor 2.
    assert calibration_failures(noise[1], scales[1] / 2)
    assert calibration_failures(noise[1], scales[1] * 2)
    # The paper's vs the exact Sxx rule: a factor 2.
    assert calibration_failures(noise[0], scales[0] / 2)
    assert calibration_failures(noise[0], scales[0] * 2)


def test_release_is_exactly_symmetric_and_keeps_n_under_replace_one():
    x, y = fixed_data(57, 6, seed=3)
    s = release_statistics(x, y, epsilon=1.0, x_bound=0.8, y_bound=1.1,
                           neighbouring="replace_one")
    assert np.array_equal(s.xtx, s.xtx.T)
    assert s.n == 57 and s.dim == 6
    # Two releases of the same data differ (fresh noise) ...
    s2 = release_statistics(x, y, epsilon=1.0, x_bound=0.8, y_bound=1.1)
    assert not np.array_equal(s.xty, s2.xty)


def test_release_clips_before_computing():
    """Data far beyond the bounds behave exactly like data at the bounds: with a huge epsilon
    the release is close to the clipped statistic, far from the unclipped one."""
    x = np.array([[100.0, -100.0], [0.1, 0.2]])
    y = np.array([50.0, -0.1])
    s = release_statistics(x, y, epsilon=1e9, x_bound=1.0, y_bound=1.0)
    e = exact_clipped(x, y, 1.0, 1.0)
    np.testing.assert_allclose(s.xtx, e.xtx, atol=1e-6)
    np.testing.assert_allclose(s.xty, e.xty, atol=1e-6)
    assert s.yty == pytest.approx(e.yty, abs=1e-6)


CERT_CASES = [
    (1, 1.0, 1.0, 1.0, (0.35, 0.60, 0.05)),
    (10, 2.0, 0.3, 1.7, (0.35, 0.60, 0.05)),
    (64, 0.1, 0.125, 3.0, (0.30, 0.65, 0.05)),
    (7, 1e-3, 13.0, 1e-3, (1 / 3, 1 / 3, 1 / 3)),
    (3, 50.0, 1e-4, 1e4, (0.05, 0.05, 0.90)),
    (1, 1.0, 1.0, 1.0, (0.35, 0.60, 0.03, 0.02)),
    (10, 2.0, 0.3, 1.7, None),
    (7, 1e-3, 13.0, 1e-3, (0.25, 0.25, 0.25, 0.25)),
    (3, 50.0, 1e-4, 1e4, (0.05, 0.05, 0.80, 0.1)),
]


@pytest.mark.parametrize("d,eps,bx,by,split", CERT_CASES)
def test_certified_epsilon_never_exceeds_request(d, eps, bx, by, split):
    x, y = fixed_data(20, d, seed=d)
    relation = "replace_one" if split is not None and len(split) == 3 else "add_remove"
    _, info = release_statistics(x, y, epsilon=eps, x_bound=bx, y_bound=by, budget_split=split,
                                 neighbouring=relation, return_info=True)
    split = split or DEFAULT_SPLIT_ADD_REMOVE
    keys = ("epsilon_xtx", "epsilon_xty", "epsilon_yty", "epsilon_n")[:len(split)]
    total = sum(info[k] for k in keys)
    assert total <= eps * (1 + 1e-12)
    assert info["epsilon_certified"] == pytest.approx(total, rel=1e-12)
    assert info["epsilon_certified"] <= eps * (1 + 1e-12)
    for key, p in zip(keys, split):
        assert 0 < info[key] <= p * eps * (1 + 1e-12)
    assert info["neighbouring"] == relation and info["xtx_sensitivity"] == "exact"
    assert ("epsilon_n" in info) == (relation == "add_remove")
    if relation == "replace_one":
        assert info["n"] == 20
    assert info["dim"] == d


# ---------------------------------------------------------------- bad input releases nothing

@pytest.fixture
def sampler_calls(monkeypatch):
    calls = []
    real = release_mod.add_laplace_noise

    def recording(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(release_mod, "add_laplace_noise", recording)
    return calls


GOOD = dict(epsilon=1.0, x_bound=1.0, y_bound=1.0)
BAD_PARAMS = [
    dict(epsilon=0), dict(epsilon=-1.0), dict(epsilon=float("nan")), dict(epsilon=float("inf")),
    dict(epsilon="1"), dict(epsilon=None), dict(epsilon=True), dict(epsilon=[1.0]),
    dict(x_bound=0.0), dict(x_bound=-1.0), dict(x_bound=float("nan")), dict(x_bound=float("inf")),
    dict(y_bound=0), dict(y_bound=-0.5), dict(y_bound=float("-inf")), dict(y_bound="big"),
    dict(x_bound=1e200), dict(epsilon=1e-320),
    dict(budget_split=(0.5, 0.5, 0.0)), dict(budget_split=(0.6, 0.6, -0.2)),
    dict(budget_split=(0.5, 0.5)),
    dict(budget_split=(0.25, 0.25, 0.25, 0.25), neighbouring="replace_one"),
    dict(budget_split=(0.35, 0.60, 0.05)),  # 3 shares under add/remove (the default)
    dict(neighbouring="bounded"), dict(neighbouring=""), dict(neighbouring=None),
    dict(xtx_sensitivity="tight"), dict(xtx_sensitivity=None),
    dict(budget_split=(0.3, 0.3, 0.3)), dict(budget_split=(0.35, 0.6, float("nan"))),
    dict(budget_split=(0.3, 0.3, 0.3, 0.3)), dict(budget_split="abc"), dict(budget_split=(0.35, None, 0.05)),
]


@pytest.mark.parametrize("bad", BAD_PARAMS, ids=repr)
def test_bad_parameters_raise_and_release_nothing(bad, sampler_calls):
    x, y = fixed_data(10, 3)
    with pytest.raises(ValueError):
        release_statistics(x, y, **(GOOD | bad))
    assert sampler_calls == []


def _bad_data():
    x, y = fixed_data(10, 3)
    xn = x.copy(); xn[2, 1] = np.nan
    xi = x.copy(); xi[0, 0] = np.inf
    yn = y.copy(); yn[4] = np.nan
    yi = y.copy(); yi[9] = -np.inf
    return [
        ("nan in x", xn, y), ("inf in x", xi, y), ("nan in y", x, yn), ("inf in y", x, yi),
        ("shape mismatch", x, y[:-1]), ("1-D x", x[:, 0], y),
        ("2-D y", x, y[:, None]), ("d = 0", x[:, :0], y), ("strings", [["a"] * 3] * 10, y),
        ("objects", np.array([[None] * 3] * 10, dtype=object), y), ("3-D x", x[None], y),
    ]


@pytest.mark.parametrize("name,x,y", _bad_data(), ids=[c[0] for c in _bad_data()])
def test_bad_data_raises_and_releases_nothing(name, x, y, sampler_calls):
    with pytest.raises(ValueError):
        release_statistics(x, y, **GOOD)
    assert sampler_calls == []


def test_zero_rows_release_noise_alone(sampler_calls):
    """A site whose rows were all left out answers like any other (issue 19: whether it has
    rows is not a free answer): its statistics are zero plus the release's noise, and under
    add/remove its n is the noisy n of 0."""
    x, y = fixed_data(10, 3)
    s = release_statistics(x[:0], y[:0], **GOOD)
    assert s.dim == 3 and len(sampler_calls) >= 3
    assert np.all(np.isfinite(s.xtx)) and np.any(s.xty != 0) and s.n >= 0


def test_good_input_calls_the_sampler(sampler_calls):
    """Control for the two tests above: the recording hook does see a real release."""
    x, y = fixed_data(10, 3)
    release_statistics(x, y, **GOOD)
    assert len(sampler_calls) >= 3


def test_numpy_scalars_are_accepted():
    x, y = fixed_data(10, 3)
    s = release_statistics(x, y, epsilon=np.float32(1.0), x_bound=np.int64(1), y_bound=np.float64(2),
                           budget_split=np.array([0.35, 0.60, 0.03, 0.02]))
    assert s.dim == 3


# ---------------------------------------------------------------- no numpy RNG for DP noise

def test_noise_does_not_come_from_numpy(monkeypatch):
    x, y = fixed_data(30, 4)

    def forbidden(*a, **k):
        raise AssertionError("numpy random generator used during a DP release")

    np.random.seed(1234)
    state = np.random.get_state()
    for name in ("default_rng", "laplace", "normal", "uniform", "random", "exponential",
                 "RandomState", "Generator", "seed"):
        monkeypatch.setattr(np.random, name, forbidden)
    a = release_statistics(x, y, **GOOD)
    b = release_statistics(x, y, **GOOD)
    monkeypatch.undo()
    after = np.random.get_state()
    assert state[0] == after[0] and np.array_equal(state[1], after[1]) and state[2:] == after[2:]
    # Re-seeding numpy does not reproduce the noise either.
    np.random.seed(1234)
    c = release_statistics(x, y, **GOOD)
    np.random.seed(1234)
    d = release_statistics(x, y, **GOOD)
    assert not np.array_equal(c.xty, d.xty) and not np.array_equal(a.xty, b.xty)


def test_unconvertible_objects_raise_value_error(sampler_calls):
    x = np.array([[{}, 1.0], [2.0, 3.0]], dtype=object)
    with pytest.raises(ValueError):
        release_statistics(x, [1.0, 2.0], **GOOD)
    assert sampler_calls == []


@pytest.mark.parametrize("n,d,block_bytes", [(1, 1, 1 << 20), (1000, 7, 4096), (333, 64, 1 << 14)])
def test_fused_clipped_statistics_match_exact(n, d, block_bytes, monkeypatch):
    """The blocked clip+accumulate pass equals exact_statistics of the clipped data."""
    monkeypatch.setattr(release_mod, "_BLOCK_BYTES", block_bytes)
    _assert_fused_pass_matches_exact(n, d, seed=n)


def _assert_fused_pass_matches_exact(n, d, seed):
    x, y = fixed_data(n, d, seed=seed)
    x = x * 3
    xtx, xty, yty = release_mod.clipped_statistics(x, y, 0.7, 1.2)
    e = exact_clipped(x, y, 0.7, 1.2)
    np.testing.assert_allclose(xtx, e.xtx, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(xty, e.xty, rtol=1e-12, atol=1e-9)
    assert yty == pytest.approx(e.yty, rel=1e-12)
    assert np.array_equal(xtx, xtx.T)


def test_non_finite_value_in_a_late_block_raises_before_noise(monkeypatch, sampler_calls):
    monkeypatch.setattr(release_mod, "_BLOCK_BYTES", 1024)
    x, y = fixed_data(500, 4)
    x[437, 2] = np.inf
    with pytest.raises(ValueError, match="row 437, column 2"):
        release_statistics(x, y, **GOOD)
    x[437, 2] = 0.0
    y[499] = np.nan
    with pytest.raises(ValueError, match="row 499"):
        release_statistics(x, y, **GOOD)
    assert sampler_calls == []


@pytest.fixture
def row_parallel(monkeypatch):
    """Force the row-parallel pass on small data, with three 'cores' whatever the host has."""
    import os
    pytest.importorskip("threadpoolctl")
    monkeypatch.setattr(release_mod, "_PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(release_mod, "_BLOCK_BYTES", 2048)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)


def _blas_threads():
    from threadpoolctl import threadpool_info
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def test_row_parallel_pass_matches_exact_and_restores_blas_threads(row_parallel):
    before = _blas_threads()
    assert release_mod._row_parallelism(1000, 7) == 3
    _assert_fused_pass_matches_exact(1000, 7, seed=5)
    assert _blas_threads() == before


def test_row_parallel_pass_reports_the_first_bad_row(row_parallel, sampler_calls):
    before = _blas_threads()
    x, y = fixed_data(900, 4)
    x[850, 1] = np.nan          # in the last third
    x[420, 3] = -np.inf         # in the middle third: the first bad row overall
    with pytest.raises(ValueError, match="row 420, column 3"):
        release_statistics(x, y, **GOOD)
    x[420, 3] = 0.0
    with pytest.raises(ValueError, match="row 850, column 1"):
        release_statistics(x, y, **GOOD)
    assert sampler_calls == []
    assert _blas_threads() == before


# ---------------------------------------------------------------- chunked OpenDP sampling

def test_chunked_sampling_is_the_same_mechanism(monkeypatch):
    """Pieces are sampled with the whole vector's scale and grid, and certified as a whole."""
    import site_node.laplace as lap
    seen = []
    real = lap._piece_measurement

    def spy(size, scale, k):
        seen.append((size, scale, k))
        return real(size, scale, k)

    monkeypatch.setattr(lap, "_piece_measurement", spy)
    values = np.linspace(-5, 5, 3001)
    sens, eps = 40.0, 0.7
    noisy, cert = lap.add_laplace_noise(values, sens, eps, chunks=3)
    _, cert_whole = lap.add_laplace_noise(values, sens, eps)
    assert cert == cert_whole <= eps
    b = lap.laplace_scale(values.size, sens, eps)
    assert [s for s, _, _ in seen] == [1001, 1000, 1000]
    assert all(scale == b and k == math.floor(math.log2(sens)) - 40 for _, scale, k in seen)
    z = (noisy - values) / b
    assert abs(z.var() - 2) < Z * math.sqrt(20 / z.size)
    assert stats.kstest(z, stats.laplace(scale=1.0).cdf).pvalue > KS_ALPHA


@pytest.mark.parametrize("chunks", [0, -1, 1.5, True, "2"])
def test_chunks_must_be_a_positive_integer(chunks):
    import site_node.laplace as lap
    with pytest.raises(ValueError):
        lap.add_laplace_noise(np.zeros(4), 1.0, 1.0, chunks=chunks)


def test_large_release_uses_two_pieces_and_stays_within_budget(sampler_calls):
    x, y = fixed_data(50, 46)  # 1081 upper-triangle entries
    _, info = release_statistics(x, y, return_info=True, **GOOD)
    assert info["epsilon_certified"] <= 1.0 * (1 + 1e-12)
    assert len(sampler_calls) == 3
    assert sampler_calls[0][1].get("chunks") == 2 and sampler_calls[0][0][0].size == 1081


# ---------------------------------------------------------------- add/remove: noisy n, description

def discrete_laplace_pmf(k: np.ndarray, b: float) -> np.ndarray:
    """P(e = k) = (1 - q) / (1 + q) q^|k|, q = exp(-1/b): the integer discrete Laplace."""
    q = math.exp(-1.0 / b)
    return (1 - q) / (1 + q) * q ** np.abs(k)


def discrete_laplace_misfit(noise: np.ndarray, b: float) -> float:
    """Chi-square p-value of integer ``noise`` against the discrete Laplace of scale ``b``
    (bins |k| <= 3b, the two tails pooled)."""
    edge = int(3 * b)
    ks = np.arange(-edge, edge + 1)
    observed = np.array([np.sum(noise < -edge)] + [np.sum(noise == k) for k in ks]
                        + [np.sum(noise > edge)])
    inner = discrete_laplace_pmf(ks, b)
    tail = (1 - inner.sum()) / 2
    expected = np.concatenate([[tail], inner, [tail]]) * noise.size
    return stats.chisquare(observed, expected).pvalue


def test_count_noise_is_discrete_laplace_of_the_intended_scale():
    b = 5.0
    noise = np.array(add_count_noise([1000] * 20000, 1 / b)[0]) - 1000
    assert noise.dtype.kind == "i"
    assert discrete_laplace_misfit(noise, b) > KS_ALPHA
    # Power: the same test rejects a scale 15 % off either way.
    assert discrete_laplace_misfit(noise, b * 1.15) < KS_ALPHA
    assert discrete_laplace_misfit(noise, b / 1.15) < KS_ALPHA


def test_released_n_is_noisy_integer_discrete_laplace_of_the_n_share():
    """Through the release itself: 20,000 sites of 60 rows, noisy n - 60 against the discrete
    Laplace of scale 1 / (p_n eps)."""
    split = (0.3, 0.3, 0.15, 0.25)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(60, 1))
    y = rng.normal(size=60)
    out = release_many([(x, y)] * 20000, epsilon=1.0, x_bound=1.0, y_bound=1.0,
                       budget_split=split)
    ns = np.array([s.n for s in out])
    assert all(isinstance(s.n, int) for s in out[:100])
    assert np.any(ns != 60) and np.any(ns == 60)
    b = 1 / (split[3] * 1.0)
    assert discrete_laplace_misfit(ns - 60, b) > KS_ALPHA
    assert discrete_laplace_misfit(ns - 60, b * 1.15) < KS_ALPHA


def test_release_statistics_n_is_noisy_and_changes_between_draws():
    x, y = fixed_data(57, 3, seed=3)
    ns = {release_statistics(x, y, epsilon=1.0, x_bound=0.8, y_bound=1.1).n for _ in range(30)}
    assert len(ns) > 1  # fresh noise on n (scale 50: 30 equal draws have probability ~0)
    assert all(isinstance(n, int) and n >= 0 for n in ns)


def test_noisy_n_is_clamped_at_zero(monkeypatch):
    monkeypatch.setattr(release_mod, "add_count_noise", lambda counts, eps: ([-7] * len(counts),
                                                                              eps))
    x, y = fixed_data(5, 2)
    assert release_statistics(x, y, **GOOD).n == 0


@pytest.mark.parametrize("kw", [
    dict(), dict(xtx_sensitivity="paper"), dict(neighbouring="replace_one"),
    dict(neighbouring="replace_one", xtx_sensitivity="paper", budget_split=(0.3, 0.6, 0.1)),
    dict(budget_split=(0.3, 0.5, 0.1, 0.1)),
])
def test_released_noise_description_equals_expected_noise(kw):
    x, y = fixed_data(30, 4)
    s, info = release_statistics(x, y, epsilon=1.5, x_bound=0.7, y_bound=1.2, return_info=True,
                                 **kw)
    expected = expected_noise(4, 1.5, 0.7, 1.2, kw.get("budget_split"),
                              neighbouring=kw.get("neighbouring", "add_remove"),
                              xtx_sensitivity=kw.get("xtx_sensitivity", "exact"))
    assert s.noise == expected
    assert info["neighbouring"] == kw.get("neighbouring", "add_remove")
    assert info["xtx_sensitivity"] == kw.get("xtx_sensitivity", "exact")
    if info["neighbouring"] == "add_remove":
        assert s.noise.n[0].law == "discrete_laplace" and s.noise.n[0].grid == 1.0
    else:
        assert s.noise.n == () and s.n == 30
    many = release_many([(x, y), (x[:10], y[:10])], epsilon=1.5, x_bound=0.7, y_bound=1.2, **kw)
    assert [m.noise for m in many] == [expected, expected]
    # Two sites' releases sum to two draws per part.
    assert (many[0] + many[1]).noise.draws("xty") == 2


def test_add_remove_default_is_half_the_replace_one_sxy_scale():
    """The default mechanism is add/remove with the exact Sxx rule: the Sxy noise scale is half
    the replace-one one for the same Sxy share."""
    a = expected_noise(3, 1.0, 1.0, 1.0, (0.35, 0.60, 0.03, 0.02))
    b = expected_noise(3, 1.0, 1.0, 1.0, (0.35, 0.60, 0.05), neighbouring="replace_one")
    assert a.xty[0].scale == pytest.approx(b.xty[0].scale / 2)
    assert a.xtx[0].scale == pytest.approx(b.xtx[0].scale)


def test_row_norm_bound_projects_rows_into_the_ball_and_declares_its_scales(monkeypatch):
    """x_norm_bound: clipped rows are scaled into the L2 ball before the statistics, the
    blocked pass agrees with the plain computation, and the release declares the smaller
    scales of dpfed.sensitivity's row-norm bound."""
    monkeypatch.setattr(release_mod, "_BLOCK_BYTES", 2048)
    x, y = fixed_data(500, 6, seed=3)
    x = x * 2
    bx, by, r = 0.8, 1.2, 1.0
    z = clip(x, bx)
    norms = np.linalg.norm(z, axis=1)
    assert np.any(norms > r) and np.any(norms < r)
    z = z * np.minimum(1.0, r * (1 - 1e-12) / norms)[:, None]
    e = exact_statistics(z, clip(y, by))
    xtx, xty, yty = release_mod.clipped_statistics(x, y, bx, by, r)
    np.testing.assert_allclose(xtx, e.xtx, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(xty, e.xty, rtol=1e-12, atol=1e-9)
    # unit rows (what a row-normalising pre-processing gives) are left unchanged
    u = x / np.linalg.norm(x, axis=1)[:, None]
    xtx_u, _, _ = release_mod.clipped_statistics(u, y, 2.0, by, 1.0)
    np.testing.assert_allclose(xtx_u, u.T @ u, rtol=1e-10)
    for rel in ("add_remove", "replace_one"):
        stats, info = release_statistics(x, y, epsilon=1.0, x_bound=bx, y_bound=by,
                                         neighbouring=rel, x_norm_bound=r, return_info=True)
        assert stats.noise == expected_noise(6, 1.0, bx, by, neighbouring=rel, x_norm_bound=r)
        assert stats.noise != expected_noise(6, 1.0, bx, by, neighbouring=rel)
        assert info["x_norm_bound"] == r and info["epsilon_certified"] <= 1.0 + 1e-12
        many = release_many([(x, y), (x[:50], y[:50])], epsilon=1.0, x_bound=bx, y_bound=by,
                            neighbouring=rel, x_norm_bound=r)
        assert all(s.noise == stats.noise for s in many)
