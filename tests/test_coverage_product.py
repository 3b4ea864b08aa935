"""Coverage of 90 % intervals in the product's own setting (issue 21 item 2;
benchmarks/coverage_product.py): bounds, split and ridge from the round's bound search on the
public rows, the y bound as the priors' unit, as a round fits. The estimand is what the
posterior is about under clipping: the clipped-data model's population coefficients (least
squares of clip(y, By) on x over 200,000 fresh rows of the same generator), not one sample's
least squares. Four cells of the grid, 100 problems each, seed 0 and 1000 draws as the grid in
docs/evaluation.md (Monte Carlo sd of a cell about 0.015-0.02): the noise-aware intervals cover
within the issue's target 0.85-0.95, the plug-in ones less, and they are wider than the
noise-free posterior's (the privacy noise is counted). Each d = 10 cell failed before issue 21
item 2's fix: n = 100 over-covered (0.956) with the paper's Gamma(2, 2) priors in units of By;
n = 2000 over-covered at K = 10 (0.962) with a design error independent per entry, and
under-covered at K = 1 (0.83) when that error's sd was lowered to suit K = 10. The
Wishart-shaped design prior and the bound's priors set both (docs/evaluation.md "The
design's error with the Wishart shape")."""

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


@pytest.mark.slow
@pytest.mark.parametrize("d, n, eps, k", [
    (5, 500, 2.0, 1),
    (10, 100, 1.0, 1),
    (10, 2000, 1.0, 1),
    (10, 2000, 0.5, 10),
])
def test_intervals_cover_near_nominal_in_the_products_setting(d, n, eps, k):
    res, failed = _bench().run_cell(d, n, eps, k, 100, ["bound"], seed=0, draws=1000)
    aware, plug = res[("bound", "aware")], res[("bound", "plugin")]
    assert failed == 0
    assert 0.85 <= aware["cov_pop"] <= 0.95, aware
    assert plug["cov_pop"] <= aware["cov_pop"] - 0.1, plug
    assert aware["ratio"] > 1.0   # wider than the noise-free posterior: the noise is counted
