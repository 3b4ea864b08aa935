"""The forecast gain band's conformal calibration (dpfed_apps.forecast_calibration; issue 21
item 3): the CQR margin, its finite-sample guarantee, the margin the product uses as it follows
from the calibration rounds kept in the repository, and forecast_round applying it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from dpfed_apps.forecast_calibration import (GAIN_BAND_MARGINS, TAIL, band_coverage,
                                             band_margins, conformal_quantile, tail_scores,
                                             widen_band)

ROOT = Path(__file__).resolve().parent.parent
CALIBRATION = ROOT / "benchmarks" / "results" / "forecast_band_calibration.csv"


def test_scores_are_the_distances_below_and_above_the_band():
    below, above = tail_scores([0.0, 2.0, -3.0, 1.0], [-1.0, -1.0, -1.0, 1.0],
                               [1.0, 1.0, 1.0, 1.0])
    assert below.tolist() == [-1.0, -3.0, 2.0, 0.0] and above.tolist() == [-1.0, 1.0, -4.0, 0.0]
    with pytest.raises(ValueError):
        tail_scores([0.0, 1.0], [0.0], [1.0])
    with pytest.raises(ValueError):
        tail_scores([np.nan], [0.0], [1.0])


def test_quantile_is_the_finite_sample_order_statistic():
    """ceil((n + 1) level)-th smallest: n = 9, level 0.8 -> the 8th; n = 3 is too few for 0.8
    (ceil(3.2) = 4 > 3), which no finite margin can promise."""
    scores = np.arange(9.0)[::-1]                      # 8, 7, ..., 0
    assert conformal_quantile(scores, 0.8) == 7.0      # sorted: 0..8, the 8th is 7
    assert conformal_quantile(np.arange(4.0), 0.8) == 3.0
    with pytest.raises(ValueError):
        conformal_quantile(np.arange(3.0), 0.8)
    with pytest.raises(ValueError):
        conformal_quantile([0.0, np.inf, 1.0, 2.0, 3.0], 0.5)
    with pytest.raises(ValueError):
        conformal_quantile(np.arange(10.0), 1.0)


def test_calibrated_band_holds_new_draws_in_each_tail_when_the_band_is_off():
    """The split-conformal guarantee, per tail (Romano et al. 2019): a band too narrow and off
    centre (it holds 0.38 of exchangeable draws, misses 0.54 above), widened by the margins
    fitted on 200 calibration draws, misses fresh draws at most 0.1 below and 0.1 above on
    average over calibrations (up to Monte Carlo error), and not far less (the margins are not
    the over-cautious max).
    400 calibrations x 2000 fresh draws."""
    rng = np.random.default_rng(11)
    lo, hi = -1.2, -0.1
    n = 200
    miss = []
    for _ in range(400):
        m = band_margins(rng.standard_normal(n), np.full(n, lo), np.full(n, hi))
        fresh = rng.standard_normal(2000)
        miss.append((np.mean(fresh < lo - m[0]), np.mean(fresh > hi + m[1])))
    big = rng.standard_normal(100_000)
    assert band_coverage(big, np.full(big.size, lo), np.full(big.size, hi), (0.0, 0.0)) < 0.4
    below, above = np.mean(miss, axis=0)
    # Exchangeable draws miss 1 - 181/201 = 0.0995 per tail in expectation; the mean over
    # 400 calibrations has sd ~0.001.
    assert 0.085 <= below <= 0.103 and 0.085 <= above <= 0.103, (below, above)


def _calibration_rounds():
    rows = [ln.split(",") for ln in CALIBRATION.read_text().splitlines()
            if ln and not ln.startswith("#")]
    assert rows[0] == ["data", "run", "realised", "lower", "upper"]
    data = np.array([[float(v) for v in r[2:]] for r in rows[1:]])
    return [r[0] for r in rows[1:]], data


def test_product_margins_follow_from_the_calibration_rounds_kept_in_the_repository():
    """GAIN_BAND_MARGINS are the pooled per-tail CQR margins of the 1500 rounds of
    benchmarks/results/forecast_band_calibration.csv (rounded up to 3 decimals); the
    populations' own band misses the target on some data set (the margins are needed), and
    every data set left out of the fit is held at 0.70-0.90 by the margins fitted on the
    others (the issue's target, on the calibration runs; fresh splits: docs/evaluation.md)."""
    names, d = _calibration_rounds()
    assert len(d) == 1500 and set(names) == {"synth", "airfoil_self_noise", "concrete_strength",
                                             "wine_quality_red", "GDSC"}
    m = band_margins(d[:, 0], d[:, 1], d[:, 2], TAIL)
    assert GAIN_BAND_MARGINS == tuple(math.ceil(v * 1000) / 1000 for v in m)
    names = np.array(names)
    raw = []
    for held in sorted(set(names)):
        out = names == held
        m_other = band_margins(d[~out, 0], d[~out, 1], d[~out, 2])
        c = band_coverage(d[out, 0], d[out, 1], d[out, 2], m_other)
        assert 0.70 <= c <= 0.90, (held, c)
        raw.append(band_coverage(d[out, 0], d[out, 1], d[out, 2], (0.0, 0.0)))
    assert min(raw) < 0.70


def test_widen_band_keeps_the_populations_band_and_refuses_bad_margins():
    g = widen_band({"mean": 0.1, "q10": -0.05, "q90": 0.3}, (0.01, 0.04))
    assert g["q10"] == pytest.approx(-0.06) and g["q90"] == pytest.approx(0.34)
    assert (g["q10_populations"], g["q90_populations"]) == (-0.05, 0.3)
    assert g["band_margins"] == [0.01, 0.04] and g["mean"] == 0.1
    assert widen_band({"mean": None, "q10": None, "q90": None}, (0.01, 0.02))["q10"] is None
    for bad in ((-0.05, 0.01), (float("nan"), 0.0), (0.0, float("inf"))):
        with pytest.raises(ValueError):
            widen_band({"q10": 0.0, "q90": 1.0}, bad)


def test_forecast_round_reports_the_calibrated_band():
    """The default band is the populations' widened by GAIN_BAND_MARGINS; (0, 0) gives the
    populations' own; the same populations either way (same seed); margins that would narrow
    the band are refused before anything is simulated."""
    from dpfed_apps.forecast import forecast_round

    rng = np.random.default_rng(3)
    x = rng.standard_normal((10, 3))
    y = x @ np.array([1.0, -0.5, 0.2]) + rng.standard_normal(10)
    common = dict(x_public=x, y_public=y, n_per_site=[300], epsilons=[2.0], bounds=(1.0, 2.0),
                  n_datasets=4, n_noise=3, seed=0)
    g = forecast_round(**common)["per_epsilon"][0]["gain"]
    g0 = forecast_round(**common, band_margins=(0.0, 0.0))["per_epsilon"][0]["gain"]
    assert tuple(g["band_margins"]) == GAIN_BAND_MARGINS and g0["band_margins"] == [0.0, 0.0]
    assert g0["q10"] == g0["q10_populations"] == g["q10_populations"]
    assert g["q10"] == pytest.approx(g0["q10"] - GAIN_BAND_MARGINS[0])
    assert g["q90"] == pytest.approx(g0["q90"] + GAIN_BAND_MARGINS[1])
    assert g["mean"] == g0["mean"]
    with pytest.raises(ValueError, match="margins"):
        forecast_round(**common, band_margins=(-0.1, 0.0))
