"""The concepts with one implementation in the core (issue 12): credible intervals
(dpfed.intervals), JSON (dpfed.jsonsafe) and TOML (dpfed.tomlwriter). Spearman is in
test_metrics.py, public_sigmas in test_preprocess.py, the PSD projection in test_repair.py."""

from __future__ import annotations

import numpy as np
import pytest


def test_credible_interval_one_implementation_one_default_level():
    """dpfed.intervals: the central interval every report uses, 0.9 unless a caller says."""
    from dpfed.intervals import CREDIBLE_LEVEL, credible_interval, interval_quantiles

    assert CREDIBLE_LEVEL == 0.9        # the round summary's key is "beta_ci90"
    draws = np.random.default_rng(0).normal(size=(4000, 3))
    ci = credible_interval(draws)
    assert ci.shape == (3, 2)
    np.testing.assert_allclose(ci, np.percentile(draws, [5, 95], axis=0).T)
    np.testing.assert_allclose(credible_interval(draws, 0.5), np.quantile(draws, [0.25, 0.75], axis=0).T)
    assert credible_interval(np.zeros((0, 3))).shape == (0, 2)
    with pytest.raises(ValueError):
        interval_quantiles(1.0)


def test_json_rule_nan_and_infinities_are_null():
    """dpfed.jsonsafe: the one JSON sanitiser (round summaries, every --json)."""
    import json

    from dpfed import jsonsafe

    obj = {"a": float("nan"), 1: [np.float32(1.5), np.inf, -np.inf], "b": (np.int64(3), True),
           "c": np.array([[1.0, np.nan]]), "d": np.bool_(False), "e": None, "f": "nan"}
    assert jsonsafe.jsonable(obj) == {"a": None, "1": [1.5, None, None], "b": [3, True],
                                      "c": [[1.0, None]], "d": False, "e": None, "f": "nan"}
    text = jsonsafe.dumps(obj, sort_keys=True)
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["a"] is None


def test_toml_writer_round_trips_what_dpfed_writes():
    """dpfed.tomlwriter: the one TOML writer (kits of dpfed provision, dpfed simulate)."""
    import tomllib
    from pathlib import Path

    from dpfed.tomlwriter import to_toml, toml_value

    cfg = {"site_id": "a", "n": np.int64(3), "eps": 0.1 + 0.2, "on": True, "path": Path("x/y.csv"),
           "odd": 'quote " back \\ tab \t nl \n bell \x07 del \x7f é', "xs": [1.5, 2, "z"],
           "tls": {"cert": "c.pem", "big": 1e300},
           "sites": [{"site_id": "s1"}, {"site_id": "s2", "weird key": 1}]}
    back = tomllib.loads(to_toml(cfg))
    assert back["odd"] == cfg["odd"] and back["path"] == "x/y.csv" and back["n"] == 3
    assert back["eps"] == cfg["eps"] and back["tls"]["big"] == 1e300
    assert back["sites"][1]["weird key"] == 1
    assert toml_value(float("inf")) == "inf" and toml_value(float("nan")) == "nan"
    with pytest.raises(TypeError):
        toml_value(object())
