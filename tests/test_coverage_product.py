"""Coverage of 90 % intervals in the product's own setting (issue 21 item 2;
benchmarks/coverage_product.py): bounds, split and ridge from the round's bound search on the
public rows, the y bound as the priors' unit, as a round fits. The estimand is what the
posterior is about under clipping: the clipped-data model's population coefficients (least
squares of clip(y, By) on x over 200,000 fresh rows of the same generator), not one sample's
least squares. Two cells of the grid, 100 problems each, seed 0 and 1000 draws as the grid in
docs/evaluation.md (Monte Carlo sd of a cell about 0.015-0.02): the noise-aware intervals cover
within the issue's target 0.85-0.95, the plug-in ones less, and they are wider than the
noise-free posterior's (the privacy noise is counted). The d = 10, n = 100 cell is a strict
xfail: it over-covers (0.956 in the grid; the Gamma(2, 2) priors in units of By are about 2x
too wide in sd for the clipped data's coefficients, docs/evaluation.md), and the test starts
passing, and must be turned back into a plain test, when that is fixed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location(
        "coverage_product", ROOT / "benchmarks" / "coverage_product.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_OVER_COVERS = pytest.mark.xfail(
    strict=True, reason="d = 10, n = 100 over-covers (0.956): the priors' scale in units of By "
    "(issue 21 item 2, docs/evaluation.md 'Coverage in the product's own setting')")


@pytest.mark.slow
@pytest.mark.parametrize("d, n, eps, k", [
    (5, 500, 2.0, 1),
    pytest.param(10, 100, 1.0, 1, marks=_OVER_COVERS),
])
def test_intervals_cover_near_nominal_in_the_products_setting(d, n, eps, k):
    res, failed = _bench().run_cell(d, n, eps, k, 100, ["bound"], seed=0, draws=1000)
    aware, plug = res[("bound", "aware")], res[("bound", "plugin")]
    assert failed == 0
    assert 0.85 <= aware["cov_pop"] <= 0.95, aware
    assert plug["cov_pop"] <= aware["cov_pop"] - 0.1, plug
    assert aware["ratio"] > 1.0   # wider than the noise-free posterior: the noise is counted
