"""dpfed_apps.evaluation.protocol: the Monte Carlo CV splits and the public-only pre-processing."""

import numpy as np
import pytest

from dpfed_apps.simulation import gdsc_problem
from dpfed_apps.evaluation.protocol import (ProtocolConfig, bounds_table, eligible_drugs,
                                            prepare_repeat, private_rows, repeat_split, site_size)


def test_split_sizes_are_the_papers_and_disjoint():
    cfg = ProtocolConfig()
    s = repeat_split(900, cfg, drug=1047, repeat=3)
    assert (s.test.size, s.candidates.size, s.public.size) == (100, 30, 10)
    assert s.private_pool.size == 900 - 130
    everything = np.concatenate([s.test, s.candidates, s.private_pool])
    assert np.array_equal(np.sort(everything), np.arange(900))
    assert set(s.public) <= set(s.candidates)


def test_split_is_deterministic_and_differs_between_repeats_and_drugs():
    cfg = ProtocolConfig()
    a = repeat_split(500, cfg, 1, 0)
    assert np.array_equal(a.private_pool, repeat_split(500, cfg, 1, 0).private_pool)
    assert not np.array_equal(a.test, repeat_split(500, cfg, 1, 1).test)
    assert not np.array_equal(a.test, repeat_split(500, cfg, 2, 0).test)


def test_private_sets_are_nested_and_too_large_sizes_refused():
    s = repeat_split(500, ProtocolConfig(), 1, 0)
    small, large = private_rows(s, 100), private_rows(s, 300)
    assert np.array_equal(large[:100], small)
    with pytest.raises(ValueError):
        private_rows(s, 371)


def test_too_few_lines_is_an_error():
    with pytest.raises(ValueError):
        repeat_split(130, ProtocolConfig(), 1, 0)


def test_preprocessing_uses_public_lines_only():
    problem = gdsc_problem(1047)
    cfg = ProtocolConfig()
    data = prepare_repeat(problem, cfg, 1047, 0)
    split = repeat_split(problem.n, cfg, 1047, 0)
    # Change every private and test response: the public parameters must not move.
    y = problem.y.copy()
    y[split.private_pool] += 100.0
    y[split.test] -= 50.0
    other = prepare_repeat(type(problem)(problem.ids, problem.x, y, problem.feature_names,
                                         problem.target, problem.label), cfg, 1047, 0)
    assert other.preprocessing == data.preprocessing
    assert (other.sigma_x, other.sigma_y) == (data.sigma_x, data.sigma_y)
    assert np.allclose(data.y_public.mean(), 0.0)
    assert data.pool_size == problem.n - 130
    assert np.allclose(np.linalg.norm(data.x_pool, axis=1)[np.linalg.norm(data.x_pool, axis=1) > 0], 1.0)


def test_site_size_is_the_smallest_site():
    assert site_size(100, 3) == 33 and site_size(800, 10) == 80 and site_size(100, 1) == 100
    assert min(len(a) for a in np.array_split(np.arange(100), 3)) == site_size(100, 3)


def test_config_validation():
    for bad in (dict(sizes=(-1,)), dict(epsilons=(0.0,)), dict(sites=(0,)), dict(repeats=0),
                dict(n_public=40)):
        with pytest.raises(ValueError):
            ProtocolConfig(**bad)
    assert ProtocolConfig(sizes=(400, 0, 100, 100)).sizes == (0, 100, 400)


def test_eligible_drugs_are_the_262_of_the_data_readme():
    drugs = eligible_drugs(400)
    assert len(drugs) == 262 and 1047 in drugs


def test_bounds_table_covers_every_site_size(tmp_path):
    cfg = ProtocolConfig(sizes=(0, 100), epsilons=(1.0,), sites=(1, 3))
    table = bounds_table(cfg, 10, cache_dir=tmp_path)
    assert set(table) == {(100, 1.0), (33, 1.0)}
    for om_x, om_y in table.values():
        assert 0 < om_x <= 2.0 and 0 < om_y <= 2.0


def test_repeat_bounds_read_only_the_public_lines(tmp_path):
    """robust_private's per-repeat table (protocol.repeat_bounds) is a function of the public
    lines, the pre-processing and public numbers only: replacing every private and test line
    of the repeat leaves it unchanged; changing one public line changes it."""
    import dataclasses

    from dpfed_apps.evaluation.protocol import repeat_bounds

    cfg = ProtocolConfig(sizes=(0, 100, 300), epsilons=(1.0, 2.0), sites=(1, 3), repeats=1)
    problem = gdsc_problem(1047, cfg.features)
    data = prepare_repeat(problem, cfg, 1047, 0)
    table = repeat_bounds(data, cfg)
    assert set(table) == {(n, k, e) for n in (100, 300) for k in (1, 3) for e in (1.0, 2.0)}
    rng = np.random.default_rng(0)
    scrambled = dataclasses.replace(
        data, x_pool=rng.permutation(data.x_pool) * 0 + rng.random(data.x_pool.shape),
        y_pool=rng.normal(size=data.y_pool.shape) * 100,
        x_test=rng.random(data.x_test.shape), y_test=rng.normal(size=data.y_test.shape))
    assert repeat_bounds(scrambled, cfg) == table
    for key, choice in table.items():
        assert choice.sites == key[1] and choice.x_norm_bound == 1.0
        assert choice.omega_y in (0.7, 1.0, 1.4, 2.0)
    moved = data.x_public_raw.copy()
    moved[0] = 1 - moved[0]
    other = dataclasses.replace(data, x_public_raw=moved)
    assert repeat_bounds(other, cfg) != table
    # cached in the folder it is given: the same table comes back from the file
    first = repeat_bounds(data, cfg, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("table-*.json"))) == 1
    assert repeat_bounds(data, cfg, cache_dir=tmp_path) == first == table
