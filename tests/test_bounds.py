"""Tests of the threshold selection on synthetic data (Nieminen 2017, section 3.4; method.md 4)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dpfed.bounds as bounds_mod
from dpfed.bounds import (BoundsChoice, choose_bounds, public_sigmas, row_normalised_sigma_x,
                          split_grid)
from dpfed.preprocess import Preprocessing

SMALL = dict(n_datasets=3, n_noise=4)


def test_deterministic_for_a_seed_and_different_across_seeds():
    a = choose_bounds(300, 5, 1.0, seed=7, **SMALL)
    choose_bounds.cache_clear()
    b = choose_bounds(300, 5, 1.0, seed=7, **SMALL)
    assert a == b and a is not b
    c = choose_bounds(300, 5, 1.0, seed=8, **SMALL)
    assert c.scores != a.scores


def test_in_memory_cache_hit(monkeypatch):
    choose_bounds.cache_clear()
    first = choose_bounds(200, 4, 2.0, seed=1, **SMALL)
    calls = []
    monkeypatch.setattr(bounds_mod, "_simulate", lambda *a, **k: calls.append(a))
    again = choose_bounds(200, 4, 2.0, seed=1, **SMALL)
    assert again is first and calls == []
    assert choose_bounds.cache_info().hits >= 1


def test_disk_cache_round_trip(tmp_path, monkeypatch):
    choose_bounds.cache_clear()
    first = choose_bounds(200, 4, 2.0, seed=3, cache_dir=tmp_path, **SMALL)
    files = list(tmp_path.glob("bounds-*.json"))
    assert len(files) == 1
    choose_bounds.cache_clear()
    monkeypatch.setattr(bounds_mod, "_simulate",
                        lambda *a, **k: pytest.fail("recomputed despite a disk cache entry"))
    assert choose_bounds(200, 4, 2.0, seed=3, cache_dir=tmp_path, **SMALL) == first
    # Another parameter is another key.
    monkeypatch.undo()
    choose_bounds(200, 4, 2.0, seed=4, cache_dir=tmp_path, **SMALL)
    assert len(list(tmp_path.glob("bounds-*.json"))) == 2
    # A corrupt file is recomputed, not trusted.
    files[0].write_text("{not json")
    choose_bounds.cache_clear()
    assert choose_bounds(200, 4, 2.0, seed=3, cache_dir=tmp_path, **SMALL) == first


def test_result_is_in_the_grid_and_consistent():
    r = choose_bounds(400, 6, 1.0, seed=0, **SMALL)
    om = np.round(np.arange(0.1, 2.01, 0.1), 10)
    assert r.omega_x in om and r.omega_y in om
    s = r.scores_array()
    assert s.shape == (20, 20)
    i, j = np.unravel_index(np.argmax(s), s.shape)
    assert (r.omegas[i], r.omegas[j]) == (r.omega_x, r.omega_y)
    assert r.best_score == s.max() and -1 <= s.min() <= s.max() <= 1
    assert r.budget_split == (0.35, 0.60, 0.05)
    assert r.aux_sigma_x == pytest.approx(1 / np.sqrt(6), rel=0.02)
    bx, by = r.bounds(0.5, 2.0)
    assert (bx, by) == (r.omega_x * 0.5, r.omega_y * 2.0)
    with pytest.raises(ValueError):
        r.bounds(0.0, 1.0)
    assert BoundsChoice.from_json(r.to_json()) == r


def test_best_pair_beats_the_extreme_pairs():
    r = choose_bounds(800, 10, 1.0, seed=0, n_datasets=5, n_noise=5)
    s = r.scores_array()
    for corner in (s[0, 0], s[0, -1], s[-1, 0], s[-1, -1]):
        assert r.best_score >= corner
    assert r.best_score > s[-1, -1] + 0.05  # no clipping at all is clearly worse at eps = 1


def test_thresholds_grow_when_privacy_is_cheap():
    """With (almost) no noise, clipping only loses information: the chosen thresholds at
    eps = 1e6 are at least those at eps = 1, and the best score is higher."""
    strict = choose_bounds(500, 5, 1.0, seed=0, n_datasets=4, n_noise=4)
    loose = choose_bounds(500, 5, 1e6, seed=0, n_datasets=4, n_noise=4)
    assert loose.omega_x >= strict.omega_x and loose.omega_y >= strict.omega_y
    assert loose.omega_x * loose.omega_y > strict.omega_x * strict.omega_y
    assert loose.best_score > strict.best_score


def test_score_improves_with_n():
    small = choose_bounds(100, 5, 1.0, seed=0, n_datasets=4, n_noise=4)
    large = choose_bounds(2000, 5, 1.0, seed=0, n_datasets=4, n_noise=4)
    assert large.best_score > small.best_score


def test_split_search_on_the_5_percent_grid(monkeypatch):
    grid = split_grid()
    assert len(grid) == 171 and all(abs(sum(p) - 1) < 1e-12 for p in grid)
    assert all(min(p) >= 0.05 - 1e-12 and max(p) <= 0.90 + 1e-12 for p in grid)
    monkeypatch.setattr(bounds_mod, "split_grid", lambda step=0.05: [(0.35, 0.6, 0.05), (0.8, 0.1, 0.1)])
    r = choose_bounds(200, 3, 1.0, seed=0, search_split=True, omegas=[0.1, 0.5, 1.0], **SMALL)
    assert len(r.split_scores) == 2
    assert r.budget_split in [(0.35, 0.6, 0.05), (0.8, 0.1, 0.1)]
    assert r.best_score == max(v for _, v in r.split_scores)


@pytest.mark.parametrize("kwargs", [
    dict(n=0), dict(n=1), dict(d=0), dict(epsilon=0.0), dict(epsilon=float("nan")),
    dict(budget_split=(0.5, 0.5, 0.0)), dict(omegas=[]), dict(omegas=[-0.1, 0.2]),
    dict(n_datasets=0), dict(seed=-1), dict(n=2.5),
])
def test_invalid_arguments(kwargs):
    args = dict(n=100, d=3, epsilon=1.0) | kwargs
    with pytest.raises(ValueError):
        choose_bounds(args.pop("n"), args.pop("d"), args.pop("epsilon"), **args)


def test_public_sigmas_and_row_normalised_sigma_x():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 8)) * 5 + 2
    y = rng.normal(size=30) * 3 + 1
    pre = Preprocessing.from_public_data(x, y)
    sx, sy = public_sigmas(x, y, pre)
    assert sx == pytest.approx(row_normalised_sigma_x(8), rel=0.05)
    assert sy == pytest.approx(np.std(y, ddof=1))
    # One row cannot give a target scale: the documented fallback sigma_y = 1.
    assert public_sigmas(x[:1], y[:1], pre)[1] == 1.0
    with pytest.raises(ValueError):
        public_sigmas(np.full((3, 8), np.nan), y[:3], pre)
    with pytest.raises(TypeError):                 # the argument order of dpfed.preprocess
        public_sigmas(pre, x, y)
