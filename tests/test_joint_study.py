"""The GDSC study of joint rounds (benchmarks/joint_gdsc_study.py; issue 23 targets,
docs/evaluation.md "Every drug in one round"): its public pieces, and a quick run on a few drugs
that checks the study's ordering, not its figures (release noise is OpenDP's CSPRNG: the
numbers vary run to run; the full study's table is in the docs)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location(
        "joint_gdsc_study", ROOT / "benchmarks" / "joint_gdsc_study.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_public_centre_scale_uses_public_rows_and_falls_back(study):
    y = np.array([[1.0, np.nan, np.nan, 2.0],
                  [3.0, 5.0, np.nan, 2.0],
                  [5.0, np.nan, np.nan, 2.0]])
    mean, scale, fallback = study.public_centre_scale(y)
    assert mean[0] == pytest.approx(3.0) and scale[0] == pytest.approx(2.0)
    # One public response: its own centre, the other drugs' median sd (only drug 0 has one).
    assert mean[1] == pytest.approx(5.0) and scale[1] == pytest.approx(2.0)
    # No public response: the mean of every public response, the median sd.
    assert mean[2] == pytest.approx(np.nanmean(y)) and scale[2] == pytest.approx(2.0)
    # sd 0 is not a scale.
    assert scale[3] == pytest.approx(2.0)
    assert fallback == 3


def test_per_drug_gaussian_rounds_compose_to_the_joint_budget(study):
    from dpfed.gaussian import compose_mu, mu_for_epsilon_delta

    eps1 = study.per_round_epsilon(262)
    mu1 = mu_for_epsilon_delta(eps1, study.DELTA)
    assert compose_mu([mu1] * 262) == pytest.approx(mu_for_epsilon_delta(10.0, 1e-6), rel=1e-9)
    cal = study.joint_calibration(1, "gaussian", eps1, 0.5, 10)
    assert cal.mu == pytest.approx(mu1, rel=1e-12)
    assert study.joint_calibration(262, "gaussian", 10.0, 0.5, 10).mu == \
        pytest.approx(mu_for_epsilon_delta(10.0, 1e-6))


def test_heldout_least_squares(study):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3))
    y = x @ np.array([0.1, -0.2, 0.0]) + 0.05 * rng.normal(size=400)
    b, v = study.heldout_ls(x, y, 10.0)
    assert np.all(np.abs(b - [0.1, -0.2, 0.0]) < 4 * np.sqrt(v))
    # Clipping is applied to the response (the clipped-data estimand of a release).
    b_clip, _ = study.heldout_ls(x, y, 0.01)
    assert np.max(np.abs(b_clip)) < np.max(np.abs(b))
    x[:, 2] = x[:, 1]                      # rank deficient: no estimate, no coverage cell
    assert study.heldout_ls(x, y, 10.0) is None


def test_repeat_split_shares_public_lines_and_nests(study):
    panel = study.load_panel()
    assert panel.m == 262 and panel.x_raw.shape == (988, 10)
    cell = study.repeat_cell(panel, 0, 0, 700)
    assert cell.public.size == 10 and cell.pool.size == 700 and cell.test.size == 278
    assert not set(cell.public) & set(cell.test) and not set(cell.pool) & set(cell.test)
    # The response's centre and scale are the public lines' (a drug with >= 2 public values).
    j = int(np.argmax(np.isfinite(panel.y_raw[cell.public]).sum(axis=0)))
    zq = cell.z[cell.public, j]
    assert np.nanmean(zq) == pytest.approx(0.0, abs=1e-12)
    assert np.nanstd(zq, ddof=1) == pytest.approx(1.0)


@pytest.mark.slow
def test_quick_run_orders_the_rows(study, monkeypatch):
    """10 drugs, 1 repeat, n = 700: one joint Gaussian release of all 262 drugs at (10, 1e-6)
    beats one Laplace round per drug at eps 10/262 (each drug's share of the same per-patient
    budget), and the non-private fit beats the 10 public lines. No NUTS fallback, as the
    aggregator's joint fit (a refused fit is counted and scored; a NUTS fallback of the
    Laplace row's near-public-only fits took > 20 min in a fresh-clone CI run)."""
    monkeypatch.setitem(study.FIT, "fallback", None)
    panel = study.load_panel()
    cell = study.repeat_cell(panel, 0, 0, 700)
    fit_idx = list(range(0, 262, 26))[:10]
    s = study.evaluate(cell, 700, ("joint_gauss", "per_drug_laplace", "public", "nonprivate"),
                       fit_idx, study.DEFAULT_Y_BOUND, seed=0)
    mean = {r: float(np.mean(v)) for r, v in s.spearman.items()}
    assert all(len(v) == 10 for v in s.spearman.values())
    assert s.errors.get("joint_gauss", 0) == 0
    assert mean["joint_gauss"] > mean["per_drug_laplace"] + 0.03
    assert mean["nonprivate"] >= mean["public"]
    cov = s.covered["joint_gauss"]
    assert cov[1] >= 50 and 0.6 <= cov[0] / cov[1] <= 1.0
    summary = study.summarise({(700, 0): s}, [panel.drugs[i] for i in fit_idx])
    rows = {r["row"]: r for r in summary}
    assert rows["nonprivate"]["ratio"] == pytest.approx(1.0)
    assert math.isfinite(rows["joint_gauss"]["ratio"])
