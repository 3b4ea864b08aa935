"""dpfed evaluate --aggregation (issue 10): robust_private's secure-aggregation variant sums what a
secure round hands the aggregator (one distributed discrete Laplace draw), skipping the masks is
exact, the noise description says one draw, and every row and summary carries ``aggregation``."""

import argparse
import csv
import math

import numpy as np
import pytest
from scipy import stats as sps

from dpfed.secagg import fixedpoint as fp
from dpfed.secagg.protocol import RoundConfig
from dpfed.secagg.simulate import run_round
from dpfed.sensitivity import expected_noise
from dpfed.wire.signing import SigningKey
from dpfed_apps.evaluation.methods import PrivacySetting
from dpfed_apps.evaluation.methods.robust_private import (RobustPrivate, decode_secure_sum,
                                                          secure_inputs, secure_sum)
from dpfed_apps.evaluation.protocol import ProtocolConfig, bounds_size, bounds_table, federations
from dpfed_apps.evaluation.report import label, markdown_table, read_csv, summarise, write_csv
from site_node.release import clipped_statistics, release_many

Z = 4.9  # two-sided ~1e-6 per check


def _blocks(k, rows, d, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        x = rng.standard_normal((rows, d))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out.append((x, x @ np.linspace(-1, 1, d) + 0.3 * rng.standard_normal(rows)))
    return out


def _setting(eps=2.0, k=10, **kw):
    return PrivacySetting(eps, 0.5, 0.8, n_sites=k, **kw)


def _exact(blocks, setting):
    """The exact sum of the sites' clipped statistics, in ``Statistics.upper_values`` order."""
    d = blocks[0][0].shape[1]
    iu = np.triu_indices(d)
    total = 0.0
    for x, y in blocks:
        sxx, sxy, syy = clipped_statistics(x, y, setting.x_bound, setting.y_bound)
        total = total + np.concatenate([sxx[iu], sxy, [syy]])
    return total, sum(x.shape[0] for x, _ in blocks)


def _parts(d):
    m = d * (d + 1) // 2
    return {"xtx": slice(0, m), "xty": slice(m, m + d), "yty": slice(m + d, m + d + 1)}


def test_secure_sum_is_the_exact_sum_plus_one_discrete_laplace_draw():
    k, d, reps = 10, 3, 300
    blocks, setting = _blocks(k, 50, d), _setting(k=k)
    exact, n = _exact(blocks, setting)
    # a single site's release: the secure rounds' calibration is the plain add/remove one
    # (every usable row is used, no cap; exact statistics, so no float-error term)
    one = expected_noise(d, 2.0, 0.5, 0.8)
    secure = [secure_sum(blocks, setting) for _ in range(reps)]
    assert all(secure[0].noise.draws(p) == 1 for p in ("xtx", "xty", "yty", "n"))
    noise = np.stack([s.upper_values() - exact for s in secure])
    n_noise = np.array([s.n - n for s in secure], dtype=float)
    z_all = []
    for part, sl in _parts(d).items():
        e = noise[:, sl].ravel()
        v, se = np.mean(e ** 2), np.std(e ** 2) / math.sqrt(e.size)
        # one draw's variance (the description's, = a single release's up to the grid margin)
        assert secure[0].noise.variance(part) == pytest.approx(one.variance(part), rel=1e-3)
        assert abs(v - one.variance(part)) < Z * se, (part, v, one.variance(part))
        assert v < k * one.variance(part) / 3, part      # far below K independent draws
        z_all.append(e / getattr(one, part)[0].scale)
    # n: integer discrete Laplace, one draw (the clamp at 0 is ~e^-20 away here)
    assert np.all(n_noise == np.round(n_noise))
    v, se = np.mean(n_noise ** 2), np.std(n_noise ** 2) / math.sqrt(reps)
    assert abs(v - one.variance("n")) < Z * se
    # The law: noise / (one draw's real scale) is Laplace(0, 1) (the grid is ~2^-19 scales).
    z = np.concatenate(z_all)
    assert sps.kstest(z, sps.laplace.cdf).pvalue > 1e-6
    assert abs(np.mean(z)) < Z * math.sqrt(2 / z.size)


def test_the_independent_sum_fails_the_same_one_draw_check():
    # Power of the check above: the K independent OpenDP releases of the same blocks carry K
    # draws, so their standardised noise is far from Laplace(0, 1).
    k, d = 10, 3
    blocks, setting = _blocks(k, 50, d), _setting(k=k)
    exact, _ = _exact(blocks, setting)
    one = expected_noise(d, 2.0, 0.5, 0.8)
    z = []
    for _ in range(40):
        total = sum(release_many(blocks, epsilon=2.0, x_bound=0.5, y_bound=0.8))
        assert total.noise.draws("xty") == k
        e = total.upper_values() - exact
        for part, sl in _parts(d).items():
            z.append(e[sl] / getattr(one, part)[0].scale)
    z = np.concatenate(z)
    assert sps.kstest(z, sps.laplace.cdf).pvalue < 1e-6
    assert np.var(z) > 3 * 2.0                      # Laplace(0, 1) has variance 2


def test_skipping_the_masks_is_exact():
    # The same site inputs through the real protocol (key agreement, pairwise and self masks,
    # unmasking; no dropouts) give the identical vector mod 2^64, hence identical statistics.
    k, d = 4, 3
    blocks, setting = _blocks(k, 30, d, seed=3), _setting(k=k)
    grid, inputs = secure_inputs(blocks, setting)
    assert grid.noise_threshold == k
    assert grid.statistics == "exact"        # what a site of a secure round encodes
    ids = tuple(f"site{i}" for i in range(k))
    config = RoundConfig.create("secevel", ids, grid.layout.length, min_contributors=k,
                                noise_threshold=k)
    sim = run_round(config, dict(zip(ids, inputs)), {s: SigningKey.generate() for s in ids})
    direct = fp.wrap_sum(inputs)
    assert sim.result.vector.dtype == np.uint64
    assert np.array_equal(sim.result.vector, direct)
    assert set(sim.result.included) == set(ids)
    a, b = decode_secure_sum(grid, direct, k), decode_secure_sum(grid, sim.result.vector, k)
    assert a == b and a.noise == b.noise
    # the masks were really there: no masked input the aggregator saw equals its input
    from dpfed.secagg.messages import parse

    for site, x in zip(ids, inputs):
        y = np.frombuffer(parse(sim.seen["MASKED_INPUT"][site]).vector, dtype="<u8")
        assert np.mean(y == x) < 0.01


def test_robust_private_secure_statistics_carry_one_draw_and_the_public_rows():
    from tests.evaluation.conftest import Problem

    p = Problem(n=600, d=4)
    data = p.small(600)
    rp = RobustPrivate()
    sec = rp.statistics(data, p.setting(epsilon=2.0, n_sites=10, aggregation="secure"))
    ind = rp.statistics(data, p.setting(epsilon=2.0, n_sites=10))
    assert sec.noise.draws("xty") == 1 and ind.noise.draws("xty") == 10
    # one draw at the row cap's Sxy scale (twice add/remove's: 4x the variance of one
    # independent release) against 10 independent draws
    assert sec.noise.variance("xty") < ind.noise.variance("xty") / 2
    assert abs(sec.n - 610) < 40 * 50          # 600 private (noisy) + 10 public rows
    # K = 1 is always independent, even when asked for secure
    one = rp.statistics(data, p.setting(epsilon=2.0, n_sites=1, aggregation="secure"))
    assert one.noise.xty[0].law == "laplace" and one.noise.draws("xty") == 1


def test_secure_needs_two_sites_and_unknown_aggregations_are_refused():
    with pytest.raises(ValueError):
        secure_sum(_blocks(1, 10, 3), _setting(k=1))
    with pytest.raises(ValueError):
        PrivacySetting(1.0, 0.5, 0.5, aggregation="magic")
    for bad in (("magic",), (), "secure", ("secure", "trusted")):
        with pytest.raises(ValueError):
            ProtocolConfig(aggregations=bad)
    assert ProtocolConfig(aggregations=("secure", "independent")).aggregations == \
        ("independent", "secure")


def test_cli_parser_rejects_unknown_aggregations():
    from dpfed_apps.commands.evaluate import _aggregations

    assert _aggregations("secure") == ("secure",)
    assert _aggregations("independent, secure") == ("independent", "secure")
    for bad in ("magic", "secure,magic", "", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            _aggregations(bad)
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    from dpfed_apps.commands import evaluate

    evaluate.register(sub)
    assert parser.parse_args(["evaluate"]).aggregation == ("independent", "secure")
    assert parser.parse_args(["evaluate", "--aggregation", "secure"]).aggregation == ("secure",)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["evaluate", "--aggregation", "independent,trusted"])
    assert exc.value.code == 2


def test_federations_and_bounds_sizes():
    cfg = ProtocolConfig(sizes=(0, 100), epsilons=(1.0,), sites=(1, 3))
    assert federations(cfg, "robust_private") == [(1, "independent"), (3, "independent"),
                                                  (3, "secure")]
    assert federations(cfg, "adassp") == [(1, "independent")]
    only = ProtocolConfig(sites=(1, 10), aggregations=("secure",))
    assert federations(only, "robust_private") == [(1, "independent"), (10, "secure")]
    # secure: one draw on the sum of n rows, so bounds for n; independent: the smallest site
    assert bounds_size(700, 10, "secure") == 700 and bounds_size(700, 10, "independent") == 70


def test_bounds_table_covers_secure_without_k1(tmp_path):
    cfg = ProtocolConfig(sizes=(0, 100), epsilons=(1.0,), sites=(3,))
    assert set(bounds_table(cfg, 10, cache_dir=tmp_path)) == {(33, 1.0), (100, 1.0)}
    cfg = ProtocolConfig(sizes=(0, 100), epsilons=(1.0,), sites=(3,),
                         aggregations=("independent",))
    assert set(bounds_table(cfg, 10, cache_dir=tmp_path)) == {(33, 1.0)}


def _rows():
    rows = []
    for rep in range(3):
        for k, agg, v in ((1, "independent", 0.20), (10, "independent", 0.05),
                          (10, "secure", 0.19)):
            rows.append(dict(drug=1, repeat=rep, method="robust_private", epsilon=2.0,
                             n_private=100, sites=k, neighbouring="add_remove",
                             spearman=v + 0.01 * rep, converged=True, error=None,
                             aggregation=agg, noise_threshold=10 if agg == "secure" else None))
    return rows


def test_summary_csv_and_labels_distinguish_aggregations(tmp_path):
    rows = _rows()
    summary = {(s["sites"], s["aggregation"]): s for s in summarise(rows)}
    assert set(summary) == {(1, "independent"), (10, "independent"), (10, "secure")}
    assert summary[(10, "secure")]["spearman_mean"] == pytest.approx(0.20)
    assert summary[(10, "independent")]["spearman_mean"] == pytest.approx(0.06)
    table = markdown_table(summarise(rows))
    assert "robust_private (K=10, secure)" in table and "robust_private (K=10) |" in table
    assert label("robust_private", 10, "secure") == "robust_private (K=10, secure)"
    write_csv(rows, tmp_path / "r.csv")
    with open(tmp_path / "r.csv") as fh:
        header = next(csv.reader(fh))
    assert header[-3:-1] == ["aggregation", "noise_threshold"]
    back = read_csv(tmp_path / "r.csv")
    assert [(r["aggregation"], r["noise_threshold"]) for r in back] == \
        [(r["aggregation"], r["noise_threshold"]) for r in rows]


def test_results_csv_without_the_column_reads_as_independent(tmp_path):
    path = tmp_path / "old.csv"
    path.write_text("drug,repeat,method,epsilon,n_private,sites,neighbouring,spearman,"
                    "converged,error\n1,0,robust_private,2.0,100,10,add_remove,0.1,True,\n")
    (row,) = read_csv(path)
    assert row["aggregation"] == "independent" and row["noise_threshold"] is None
    (s,) = summarise([row])
    assert s["aggregation"] == "independent"
