"""dpfed_apps.evaluation.coverage's unit of y: the model's own, the round's y bound, or the
released rms."""

import numpy as np
import pytest

from dpfed_apps.evaluation.coverage import _unit, coverage, prior_problem


def test_units_are_none_the_bound_or_the_released_rms_within_the_bound():
    p = prior_problem(np.random.default_rng(3), 5, 400, 2.0)
    assert p.y_bound > 0
    assert _unit(None, p) is None and _unit("bound", p) == p.y_bound
    total = p.release + p.public
    rms = np.sqrt(max(total.yty, 0.0) / total.n)
    assert _unit("rms", p) == pytest.approx(np.clip(rms, p.y_bound / 20, p.y_bound))
    assert p.y_bound / 20 <= _unit("rms", p) <= p.y_bound


def test_the_bound_unit_reaches_the_fit(y_units_seen):
    out = coverage(3, 200, 2.0, 1, 2, y_unit="bound", draws=200)
    assert out["reps"] == 2 and len(y_units_seen) == 2
    assert all(u is not None and u > 0 for u in y_units_seen)
    with pytest.raises(ValueError):
        coverage(3, 200, 2.0, 1, 1, y_unit="sd")
