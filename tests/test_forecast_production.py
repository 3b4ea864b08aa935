"""The forecast's production-fit path (issue 21 item 3, "Forecasts"): ``posterior_fit`` gives
``fit_posterior`` exactly what a round's FITTING phase gives it (aggregator.rounds.fitting:
release + public statistics, ``public=``, ``x_bound``, ``y_unit`` = By), the auxiliary
populations learned from the public rows, and the band's coverage in a small simulated
setting."""

from __future__ import annotations

import numpy as np
import pytest

from dpfed.auxiliary import AuxiliarySource
from dpfed.preprocess import Preprocessing


def _rows(rng, n, d=4, r2=0.5):
    cov = 0.5 * np.eye(d) + 0.5            # correlated columns
    x = rng.multivariate_normal(np.zeros(d), cov, size=n) * np.arange(1, d + 1)
    beta = np.array([1.0, -0.5, 0.25, 0.0][:d])
    s = x @ beta
    y = 3.0 + s + np.sqrt((1 - r2) / r2) * np.std(s) * rng.standard_normal(n)
    return x, y


def test_production_forecast_fit_equals_a_direct_fit_posterior_call():
    """score_cell with ``posterior_fit()`` fits every simulated release with the same
    ``fit_posterior`` call a round makes; rebuilt here by hand, the betas must be equal. And
    the inputs matter: dropping ``public=`` or ``y_unit`` changes the fit (so the test would
    see an adapter that dropped them)."""
    from dpfed.noise import NoiseDescription
    from dpfed.statistics import Statistics, clipped_exact_statistics
    from dpfed_apps.forecast import Mechanism, posterior_fit, score_cell, simulate_release
    from posterior import fit_posterior

    rng = np.random.default_rng(0)
    x, y = _rows(rng, 330)
    pre = Preprocessing.from_public_data(x[:10], y[:10], scale_columns=True)
    zp, yp = pre.apply(x[:10], y[:10])
    zq, yq = pre.apply(x[10:310], y[10:310])
    zt = pre.transform_x(x[310:])
    mech = Mechanism(2.0, 1.0, 1.5, (0.35, 0.60, 0.03, 0.02), "add_remove", "exact", 1.0)
    fit = posterior_fit(draws=400, seed=3)
    captured = {}

    def spy(sxx, sxy, syy, n, noise, **kw):
        captured["beta"] = fit(sxx, sxy, syy, n, noise, **kw)
        return captured["beta"]

    spy.production = True
    spy.public_only = fit.public_only
    score_cell(np.random.default_rng(7), [(zq, yq)], zp, yp, zt, y[310:], mech, spy, 2)
    sxx, sxy, syy, n, sc = simulate_release(np.random.default_rng(7), [(zq, yq)], mech, 2)
    public = clipped_exact_statistics(zp, yp, 1.0, 1.5, 1.0)
    desc = NoiseDescription.single("laplace", xtx=sc.xtx, xty=sc.xty, yty=sc.yty, n=sc.n,
                                   draws=sc.draws)
    for b in range(2):
        release = Statistics(sxx[b], sxy[b], float(syy[b]), int(round(float(n[b]))), desc)
        direct = fit_posterior(release + public, public=public, x_bound=1.0, y_unit=1.5,
                               draws=400, seed=3)
        np.testing.assert_allclose(captured["beta"][b], direct.beta_mean, rtol=1e-9, atol=1e-12)
    release = Statistics(sxx[0], sxy[0], float(syy[0]), int(round(float(n[0]))), desc)
    without = fit_posterior(release + public, draws=400, seed=3)
    assert not np.allclose(without.beta_mean, captured["beta"][0], rtol=1e-3)


def test_r2_posterior_reads_the_public_signal():
    """The R^2 posterior given the public rows is higher for a strong public signal than for
    pure noise; the defaults (r2_from_public False) keep the Beta(2, 20) prior."""
    rng = np.random.default_rng(1)
    x, y = _rows(rng, 12, r2=0.9)
    pre = Preprocessing.from_public_data(x, y, scale_columns=True)
    strong = AuxiliarySource(x, y, pre, r2_prior=(1, 1), r2_from_public=True)
    noise = AuxiliarySource(x, rng.standard_normal(12), pre, r2_prior=(1, 1),
                            r2_from_public=True)
    g, w = strong.r2_posterior()
    g2, w2 = noise.r2_posterior()
    assert abs(w.sum() - 1) < 1e-9 and float(g @ w) > float(g2 @ w2) + 0.2
    default = AuxiliarySource(x, y, pre)
    assert not default.r2_from_public and default.r2_prior == (2.0, 20.0)
    data = AuxiliarySource(x, y, pre, r2_from_public=True, condition_on_public=True,
                           row_bootstrap=1.0, row_jitter=True).sample(rng, 50, 20)
    xp, yp = pre.apply(x, y)          # the real public rows are the population's
    np.testing.assert_array_equal(data.x_public, xp)
    np.testing.assert_array_equal(data.y_public, yp)


def _forecast_check():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "forecast_check.py"
    spec = importlib.util.spec_from_file_location("forecast_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_band_covers_realised_gain_on_simulated_rounds():
    """The default forecast (closed form, default populations, the band widened by the
    calibrated margins of dpfed_apps.forecast_calibration) against 40 simulated rounds
    (benchmarks/forecast_check.py ``--data synth --seed 1``: a new data set per round,
    correlated columns, a linear signal of R^2 ~ U(0.1, 0.7), skewed noise, 10 public rows,
    n = 1000 one site, 300 test rows, eps 2), each realised as a round realises it (round_choice
    bounds, OpenDP release, fit_posterior with public= and y_unit = By), the populations scored
    on the same 300 test rows. Split seed 1: none of these rounds is among the margin's
    calibration rounds (seed 0). Target: the one-round 10-90 % band holds the realised gain in
    70-90 % of rounds. 40 rounds, k of them in the band: 24 <= k <= 38 (0.6-0.95) is asserted,
    which a true coverage of 0.8 fails with probability 0.0025 (binomial), 0.7 or 0.9 with
    0.06-0.08, and a band too narrow (coverage 0.55) or too wide (0.97) with probability
    0.66-0.68. The data sets are seeded; the OpenDP release's noise is not.
    In forecast_check's 100-round run (seed 1) the first 40 of these rounds gave 29 (the
    populations' band without the margin 25). docs/evaluation.md, issue 21 'The forecast band,
    calibrated'."""
    from dpfed_apps.forecast_calibration import GAIN_BAND_MARGINS

    fc = _forecast_check()
    v = "closed_form/default"          # populations scored on the realised gain's 300 test rows
    rows = list(fc.uci_rounds("synth", 40, 2.0, [v], 20, 5, seed=1))
    inside = [r[v][1] <= r["realised"] <= r[v][2] for r in rows]
    assert len(rows) == 40
    assert all(r[v + ":populations"][0] - r[v][1] == pytest.approx(GAIN_BAND_MARGINS[0])
               for r in rows)
    assert 24 <= sum(inside) <= 38, (np.mean(inside), fc.coverage_interval(
        int(sum(inside)), len(inside)))


def test_refused_production_fits_are_left_out_and_counted(monkeypatch):
    """posterior_fit(on_refusal="skip"): a ConvergenceError gives a NaN beta that score_cell
    turns into a NaN Spearman (left out of the quantiles), counted in the forecast's
    gain["refused"]; on_refusal="fallback" (a round's behaviour) lets the error through."""
    import posterior
    from dpfed_apps.forecast import forecast_round, posterior_fit

    real = posterior.fit_posterior
    calls = {"n": 0}

    def flaky(stats, **kw):
        if not stats.noise.is_exact:
            calls["n"] += 1
            if calls["n"] % 3 == 0:
                raise posterior.ConvergenceError("refused (test)")
        return real(stats, **kw)

    monkeypatch.setattr(posterior, "fit_posterior", flaky)
    rng = np.random.default_rng(2)
    x, y = _rows(rng, 10)
    common = dict(x_public=x, y_public=y, n_per_site=[200], epsilons=[2.0], bounds=(1.0, 2.0),
                  n_datasets=3, n_noise=3, seed=0)
    g = forecast_round(**common, fit=posterior_fit(draws=200, on_refusal="skip"))
    g = g["per_epsilon"][0]["gain"]
    assert g["refused"] == 3 and np.isfinite(g["mean"]) and np.isfinite(g["sd"])
    with pytest.raises(posterior.ConvergenceError):
        forecast_round(**common, fit=posterior_fit(draws=200))


def test_population_mixture_draws_each_population_from_one_component():
    """``forecast_round(population=((w, opts), ...))``: each auxiliary population comes from
    one component with its weight. A mixture's mean R^2 is the weighted mean of its
    components'; its gains are neither component's alone (both kinds of population are drawn);
    a one-component mixture is that component; bad weights are refused."""
    from dpfed_apps.forecast import MIXED_POPULATION, PUBLIC_FIT_POPULATION, forecast_round

    rng = np.random.default_rng(4)
    x, y = _rows(rng, 10, r2=0.8)
    common = dict(x_public=x, y_public=y, n_per_site=[300], epsilons=[2.0], bounds=(1.0, 2.0),
                  n_datasets=12, n_noise=2, seed=5)
    runs = {name: forecast_round(**common, population=pop) for name, pop in
            [("default", None), ("public", PUBLIC_FIT_POPULATION), ("mix", MIXED_POPULATION),
             ("one", ((1.0, PUBLIC_FIT_POPULATION),))]}
    r2 = {k: v["auxiliary"]["r2_mean"] for k, v in runs.items()}
    assert r2["public"] > r2["default"] + 0.1
    assert r2["mix"] == pytest.approx(0.5 * r2["default"] + 0.5 * r2["public"])
    assert runs["mix"]["auxiliary"]["mixture_weights"] == [0.5, 0.5]
    gains = {k: v["per_epsilon"][0]["gain"]["mean"] for k, v in runs.items()}
    assert gains["mix"] not in (gains["default"], gains["public"])
    assert gains["one"] == pytest.approx(gains["public"])
    for bad in (((0.5, None),), ((0.0, None), (1.0, None)), ((1.5, None), (-0.5, None))):
        with pytest.raises(ValueError, match="mixture"):
            forecast_round(**common, population=bad)
