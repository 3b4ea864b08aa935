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


@pytest.mark.slow
def test_band_covers_realised_gain_on_simulated_rounds():
    """20 simulated rounds (correlated columns, a linear signal of R^2 0.5, 10 public rows,
    n = 400, eps 2, one site): each realised as a round realises it (round_choice bounds,
    OpenDP release, fit_posterior with public= and y_unit = By) and forecast from its public
    rows with the production fit and PUBLIC_FIT_POPULATION. The one-round 10-90 % band holds
    the realised gain in 0.55-1.0 of them (nominal 0.8; 20 rounds: sd about 0.09). ~30-60 s."""
    from dpfed.metrics import spearman
    from dpfed.statistics import clipped_exact_statistics
    from dpfed_apps.forecast import PUBLIC_FIT_POPULATION, forecast_round, posterior_fit
    from dpfed_apps.simulation.public import round_choice
    from posterior import fit_posterior
    from site_node.release import release_statistics

    inside = []
    for r in range(20):
        rng = np.random.default_rng(100 + r)
        x, y = _rows(rng, 610)
        xp, ypr, xq, yqr, xt, yt = x[:10], y[:10], x[10:410], y[10:410], x[410:], y[410:]
        pre = Preprocessing.from_public_data(xp, ypr, scale_columns=True)
        zp, yp = pre.apply(xp, ypr)
        zq, yq = pre.apply(xq, yqr)
        zt = pre.transform_x(xt)
        ch = round_choice([400], 4, 2.0, xp, ypr, pre, draws=1, seed=r)
        bx, by, norm = ch["x_bound"], ch["y_bound"], ch["x_norm_bound"]
        public = clipped_exact_statistics(zp, yp, bx, by, norm)
        rel = release_statistics(zq, yq, epsilon=2.0, x_bound=bx, y_bound=by,
                                 budget_split=ch["budget_split"], x_norm_bound=norm)
        priv = fit_posterior(rel + public, public=public, x_bound=bx, y_unit=by, draws=400,
                             seed=0)
        pub = fit_posterior(public, y_unit=by, draws=400, seed=0)
        realised = spearman(priv.predict(zt), yt) - spearman(pub.predict(zt), yt)
        g = forecast_round(x_public=xp, y_public=ypr, preprocessing=pre, n_per_site=[400],
                           epsilons=[2.0], bounds=(bx, by), budget_split=ch["budget_split"],
                           ridge_c=ch["ridge_c"], aggregation="secure", n_datasets=8,
                           n_noise=3, seed=r, fit=posterior_fit(draws=400),
                           population=PUBLIC_FIT_POPULATION)["per_epsilon"][0]["gain"]
        inside.append(g["q10"] <= realised <= g["q90"])
    assert 0.55 <= np.mean(inside) <= 1.0, np.mean(inside)


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
