"""Forecast populations with a misspecified response (dpfed_apps.forecast_response; issue 21
item 3, docs/evaluation.md "Forecast populations with a misspecified signal (27 Nov, fifth
session)")."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import kurtosis

from dpfed.auxiliary import AuxiliarySource
from dpfed.preprocess import Preprocessing
from dpfed_apps.forecast_response import (CrossValidatedMisspecifiedSource,
                                          MisspecifiedSignalSource)


def _public(rng, m=10, d=4):
    x = rng.standard_normal((m, d)) * np.arange(1, d + 1)
    y = 3.0 + x @ np.array([1.0, -0.5, 0.25, 0.1][:d]) + rng.standard_normal(m)
    return x, y


def _linear_r2(x, y):
    """Share of y's variance the least-squares line in x (with intercept) explains."""
    a = np.column_stack([np.ones(len(y)), x])
    res = y - a @ np.linalg.lstsq(a, y, rcond=None)[0]
    return 1.0 - res.var() / y.var()


def test_without_options_the_populations_are_the_parents_draw_for_draw():
    rng = np.random.default_rng(0)
    x, y = _public(rng)
    pre = Preprocessing.from_public_data(x, y, scale_columns=True)
    a = AuxiliarySource(x, y, pre).sample(np.random.default_rng(3), 200, 50)
    b = MisspecifiedSignalSource(x, y, pre).sample(np.random.default_rng(3), 200, 50)
    for part in ("x", "y", "x_public", "y_public", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, part), getattr(b, part))


def test_the_options_replace_only_the_signal_and_the_residual():
    """The options act only through ``AuxiliarySource.sample``'s two steps for the signal
    and the residual (``_unscaled_signal``, ``_residual_row_scale``), whose draws come after
    the features, R^2 and sigma_y: on the same seed those are the parent's draw for draw,
    and the target is not."""
    rng = np.random.default_rng(5)
    x, y = _public(rng)
    pre = Preprocessing.from_public_data(x, y, scale_columns=True)
    a = AuxiliarySource(x, y, pre).sample(np.random.default_rng(7), 300, 40)
    for opts in ({"nonlinear_share": (0.3, 0.9)}, {"residual_df": (3.0, 8.0)},
                 {"nonlinear_share": (1.0, 1.0), "residual_df": (2.5, 2.5)}):
        b = MisspecifiedSignalSource(x, y, pre, **opts).sample(np.random.default_rng(7), 300, 40)
        for part in ("x", "x_public", "x_test", "r2", "sigma_y"):
            np.testing.assert_array_equal(getattr(a, part), getattr(b, part))
        assert not np.allclose(a.y, b.y)


def test_a_nonlinear_share_is_signal_a_line_cannot_fit():
    """Without row normalisation the linear populations' y is linear in the pre-processed
    columns: a least-squares line explains about R^2 of it. With the whole signal from the
    random smooth part (share 1) at the same R^2, the line explains clearly less, and the
    total signal is still there (a flexible fit, here the line plus squares and pairwise
    products, explains more than the line)."""
    rng = np.random.default_rng(1)
    x, y = _public(rng)
    pre = Preprocessing.from_public_data(x, y, normalize_rows=False, scale_columns=True)
    r2 = (0.9 * 4000, 0.1 * 4000)            # R^2 ~ 0.9, nearly fixed
    lin, nonlin, flexible = [], [], []
    for seed in range(12):
        d0 = MisspecifiedSignalSource(x, y, pre, r2_prior=r2, row_bootstrap=0.0).sample(
            np.random.default_rng(seed), 4000, 10)
        d1 = MisspecifiedSignalSource(x, y, pre, r2_prior=r2, row_bootstrap=0.0,
                                      nonlinear_share=(1.0, 1.0)).sample(
            np.random.default_rng(seed), 4000, 10)
        lin.append(_linear_r2(d0.x, d0.y))
        nonlin.append(_linear_r2(d1.x, d1.y))
        i, j = np.triu_indices(d1.x.shape[1])
        flexible.append(_linear_r2(np.column_stack([d1.x, d1.x[:, i] * d1.x[:, j]]), d1.y))
    assert np.mean(lin) == pytest.approx(0.9, abs=0.03)
    assert np.mean(nonlin) < 0.6
    assert np.mean(flexible) > np.mean(nonlin) + 0.1


def test_student_t_residuals_have_heavy_tails_and_the_same_variance():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((10, 3))
    y = rng.standard_normal(10)
    pre = Preprocessing.from_public_data(x, y, scale_columns=True)
    small = (0.001 * 1000, 0.999 * 1000)    # R^2 ~ 0.001: y is the residual
    base = MisspecifiedSignalSource(x, y, pre, r2_prior=small)
    heavy = MisspecifiedSignalSource(x, y, pre, r2_prior=small, residual_df=(3.0, 3.0))
    kb, kh, vb, vh = [], [], [], []
    for seed in range(20):
        b = base.sample(np.random.default_rng(seed), 5000, 10)
        h = heavy.sample(np.random.default_rng(seed), 5000, 10)
        kb.append(kurtosis(b.y))
        kh.append(kurtosis(h.y))
        vb.append(b.y.var() / b.sigma_y ** 2)
        vh.append(h.y.var() / h.sigma_y ** 2)
    assert np.median(kb) < 1.0
    assert np.median(kh) > 3.0                 # t_3: infinite kurtosis; samples show it large
    assert np.mean(vh) == pytest.approx(np.mean(vb), rel=0.15)


def test_bad_options_are_refused():
    rng = np.random.default_rng(3)
    x, y = _public(rng)
    pre = Preprocessing.from_public_data(x, y, scale_columns=True)
    for bad in ({"nonlinear_share": (0.5, 0.2)}, {"nonlinear_share": (0.0, 1.5)},
                {"residual_df": (2.0, 5.0)}, {"residual_df": (6.0, 3.0)},
                {"nonlinear_share": (0.0, 0.5), "r2_from_public": True,
                 "condition_on_public": True}):
        with pytest.raises(ValueError):
            MisspecifiedSignalSource(x, y, pre, **bad)


def test_forecast_round_simulates_on_the_misspecified_populations():
    """``forecast_round(population=...)`` with the options builds this module's sources (with
    ``r2_from_cv``: the leave-one-out R^2 posterior too) and their forecast differs from the
    linear populations' on the same seeds."""
    from dpfed_apps.forecast import _simulation_sources, forecast_round

    rng = np.random.default_rng(4)
    x, y = _public(rng)
    pre = Preprocessing.from_public_data(x, y, scale_columns=True)
    src = AuxiliarySource(x, y, pre)
    (one,), _ = _simulation_sources(src, {"nonlinear_share": (0.0, 0.6)}, x, y, pre, None)
    assert type(one) is MisspecifiedSignalSource and one.nonlinear_share == (0.0, 0.6)
    (two,), _ = _simulation_sources(src, {"r2_from_cv": True, "r2_prior": (1.0, 1.0),
                                          "residual_df": (2.5, 10.0)}, x, y, pre, None)
    assert type(two) is CrossValidatedMisspecifiedSource and two.r2_from_public
    (three,), _ = _simulation_sources(src, {"nonlinear_share": None}, x, y, pre, None)
    assert type(three) is AuxiliarySource
    common = dict(x_public=x, y_public=y, n_per_site=[300], epsilons=[2.0], bounds=(1.0, 2.0),
                  n_datasets=8, n_noise=2, seed=5)
    g0 = forecast_round(**common)["per_epsilon"][0]["gain"]
    g1 = forecast_round(**common, population={"nonlinear_share": (0.0, 0.6)})[
        "per_epsilon"][0]["gain"]
    assert g1["mean"] != g0["mean"]
