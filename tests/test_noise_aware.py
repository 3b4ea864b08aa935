"""The noise-aware posterior (posterior.noise_aware, posterior.laplace; method.md section 8).

What is checked, each able to fail:
- the numpy density (the fast path) is the PyMC model's density with lambda0 integrated out,
  and its gradient is right (so the fast path fits the model PyMC defines);
- the fast path agrees with NUTS on that PyMC model on a small problem;
- 90 % intervals cover the generating coefficients 0.85-0.95 of the time on data drawn from
  the model's prior, where the plug-in fit (today's default before issue 9) covers far less;
- statistics of unknown noise are refused unless the caller says plug_in=True.
"""

import numpy as np
import pytest

from dpfed.noise import NoiseDescription
from dpfed.statistics import Statistics, exact_statistics
from dpfed_apps.evaluation.coverage import coverage, prior_problem
from posterior import UnknownNoiseError, fit_posterior
from posterior.noise_aware import (log_posterior_exact, log_posterior_exact_batch,
                                   log_posterior_noise_aware, log_posterior_noise_aware_batch,
                                   noise_aware_inputs)
from tests.conftest import fd_grad, lam0_marginal


def _problem(rng, d, n, eps, k):
    p = prior_problem(rng, d, n, eps, k)
    return p.beta, p.release, p.public


def test_gradients_and_batch_agree_with_the_density():
    rng = np.random.default_rng(1)
    _, release, public = _problem(rng, 4, 200, 2.0, 1)
    inp = noise_aware_inputs(release + public, public)
    exact = exact_statistics(rng.standard_normal((50, 4)), rng.standard_normal(50))
    us = rng.standard_normal((5, 5)) * 0.5
    for u in us:
        val, g = log_posterior_noise_aware(u, inp)
        assert np.allclose(g, fd_grad(lambda z: log_posterior_noise_aware(z, inp), u),
                           rtol=1e-5, atol=1e-5)
        ve, ge = log_posterior_exact(u, exact)
        assert np.allclose(ge, fd_grad(lambda z: log_posterior_exact(z, exact), u),
                           rtol=1e-5, atol=1e-5)
    assert np.allclose(log_posterior_noise_aware_batch(us, inp),
                       [log_posterior_noise_aware(u, inp)[0] for u in us])
    assert np.allclose(log_posterior_exact_batch(us, exact),
                       [log_posterior_exact(u, exact)[0] for u in us])


@pytest.mark.slow
def test_numpy_density_is_the_pymc_model_marginalised_over_lambda0():
    from posterior.model import build_model, build_noise_aware_model

    rng = np.random.default_rng(3)
    _, release, public = _problem(rng, 3, 150, 2.0, 1)
    inp = noise_aware_inputs(release + public, public)
    exact = exact_statistics(rng.standard_normal((40, 3)), rng.standard_normal(40))
    lp_na = build_noise_aware_model(inp).compile_logp()
    model, data = build_model(3)
    with model:
        import pymc as pm
        pm.set_data({"xtx": exact.xtx, "xty": exact.xty, "yty": exact.yty, "n": float(exact.n)})
    lp_ex = model.compile_logp()
    for _ in range(3):
        beta, a = rng.standard_normal(3) * 0.5, rng.standard_normal() * 0.3
        for lp, mine in ((lp_na, log_posterior_noise_aware(np.r_[beta, a], inp)[0]),
                         (lp_ex, log_posterior_exact(np.r_[beta, a], exact)[0])):
            assert lam0_marginal(lp, beta, a) == pytest.approx(mine, abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("path", [None, "nested-envelope", "envelope-hmc"])
def test_fast_path_agrees_with_nuts_on_the_pymc_model(path, monkeypatch):
    """The Laplace/importance fit, the nested envelope proposal of large d, and attempt 0b
    (HMC guided by the envelope, exact Metropolis step; its warm-up on the envelope alone),
    each forced at d = 3, against NUTS on the PyMC definition of the model."""
    import posterior.fit as fit_mod

    if path is not None:
        monkeypatch.setattr(fit_mod, "_ENVELOPE_MIN_DIM", 1)
    if path == "envelope-hmc":
        monkeypatch.setattr(fit_mod, "_ENVELOPE_MIN_ESS", 10 ** 9)
    rng = np.random.default_rng(7)
    _, release, public = _problem(rng, 3, 300, 1.0, 1)
    stats = release + public
    # Attempt 0b keeps 100-370 effective draws of 4000 here (its envelope is built for
    # d >= 32): its 5 % quantiles would carry a Monte Carlo sd of ~0.15 posterior sd, near the
    # tolerance below; three times the draws bring that to ~0.09.
    draws = 12000 if path == "envelope-hmc" else 4000
    fast = fit_posterior(stats, public=public, seed=1, draws=draws)
    assert fast.diagnostics.get("proposal") == path
    ref = fit_posterior(stats, public=public, method="nuts", seed=1, draws=4000, tune=1000)
    assert fast.model == ref.model == "noise-aware"
    sd = ref.beta_draws.std(axis=0)
    # Means within 0.15 posterior sd, sds within 15 %, 90 % interval ends within 0.2 sd.
    assert np.all(np.abs(fast.beta_mean - ref.beta_mean) <= 0.15 * sd)
    assert np.all(np.abs(fast.beta_draws.std(axis=0) / sd - 1) <= 0.15)
    assert np.all(np.abs(fast.credible_interval(0.9) - ref.credible_interval(0.9))
                  <= 0.2 * sd[:, None])


def _coverage(d, n, eps, k, reps, *, plug_in, seed=0):
    return coverage(d, n, eps, k, reps, plug_in=plug_in, seed=seed)["coverage"]


@pytest.mark.slow
def test_envelope_proposal_keeps_the_coverage(monkeypatch):
    """The nested envelope proposal (the large-d attempt 0), forced at d = 5: its 90 %
    intervals cover as the noise-aware fit's must (same bounds as below)."""
    import posterior.fit as fit_mod

    monkeypatch.setattr(fit_mod, "_ENVELOPE_MIN_DIM", 1)
    aware = _coverage(5, 500, 1.0, 1, 120, plug_in=False)
    assert 0.825 <= aware <= 0.975, aware


@pytest.mark.slow
@pytest.mark.parametrize("d,n,eps,k", [(5, 500, 1.0, 1), (5, 100, 1.0, 10), (5, 2000, 2.0, 1)])
def test_noise_aware_intervals_cover_where_the_plug_in_does_not(d, n, eps, k):
    aware = _coverage(d, n, eps, k, 120, plug_in=False)
    # Target 0.85-0.95 (issue 9); 600 interval checks give a Monte Carlo sd of about 0.012,
    # so the estimate must lie within two of them of the target range.
    assert 0.825 <= aware <= 0.975, aware
    if (n, k) != (2000, 1):  # with little noise both are right; elsewhere plug-in fails
        plug = _coverage(d, n, eps, k, 120, plug_in=True)
        assert plug < 0.75, plug


def test_unknown_noise_is_never_fitted_silently():
    rng = np.random.default_rng(0)
    s = exact_statistics(rng.standard_normal((30, 3)), rng.standard_normal(30))
    unknown = Statistics(s.xtx, s.xty, s.yty, s.n)
    with pytest.raises(UnknownNoiseError):
        fit_posterior(unknown)
    assert fit_posterior(unknown, plug_in=True, seed=0).model == "plug-in"
    assert fit_posterior(s, seed=0).model == "exact"
    noisy = s.with_noise(NoiseDescription.single("laplace", xtx=1.0, xty=1.0, yty=1.0))
    for method in ("advi", "fixed"):  # no noise-aware form: refused, not silently plug-in
        with pytest.raises(ValueError):
            fit_posterior(noisy, method=method)


def test_noisier_release_gives_wider_intervals_and_public_only_is_the_limit():
    rng = np.random.default_rng(5)
    beta, release, public = _problem(rng, 4, 800, 2.0, 1)
    narrow = fit_posterior(release + public, public=public, seed=0)
    very_noisy = (release + public).with_noise(release.noise + NoiseDescription.single(
        "laplace", xtx=1e4, xty=1e4, yty=1e5, n=1e3))
    wide = fit_posterior(very_noisy, public=public, seed=0)
    assert np.all(wide.beta_draws.std(axis=0) > narrow.beta_draws.std(axis=0))


def test_fit_methods_spelled_out_for_the_cli_match_the_aggregator():
    from posterior import FIT_METHODS
    from dpfed_apps.commands.simulate import FIT_METHODS as CLI

    assert tuple(CLI) == tuple(FIT_METHODS)


def test_posterior_tends_to_the_public_only_one_when_the_release_says_nothing():
    """The public statistics have their own exact likelihood (posterior.noise_aware): with a
    release drowned in noise the posterior is the public rows' own posterior, not one pulled
    towards zero by the release's errors-in-variables term (what the summed form gave)."""
    rng = np.random.default_rng(11)
    _, release, public = _problem(rng, 4, 300, 1.0, 1)
    drowned = (release + public).with_noise(release.noise + NoiseDescription.single(
        "laplace", xtx=1e6, xty=1e6, yty=1e7, n=1e4, draws=10))
    post = fit_posterior(drowned, public=public, seed=0, draws=4000)
    ref = fit_posterior(public, seed=0, draws=4000)
    sd = ref.beta_draws.std(axis=0)
    assert np.all(np.abs(post.beta_mean - ref.beta_mean) <= 0.1 * sd)
    assert np.all(np.abs(post.beta_draws.std(axis=0) / sd - 1) <= 0.1)


def test_unsettled_first_attempt_looks_for_modes_and_moves_the_proposal(monkeypatch):
    """When the first mode's proposal keeps too few effective draws, more starting points are
    tried and the proposal is a mixture over the modes or moved to the target's moments
    (posterior.fit._fit_laplace); forced here by making the first attempt fail. The
    answer agrees with the one the first attempt gives on its own."""
    import posterior.fit as post_mod
    from posterior import laplace as lap_mod

    rng = np.random.default_rng(2)
    _, release, public = _problem(rng, 3, 300, 1.0, 1)
    real = lap_mod.laplace_importance

    def first_fails(*args, **kw):
        res = real(*args, **kw)
        return lap_mod.ImportanceResult(res.draws, 1.0, res.proposals, res.laplace,
                                        khat=res.khat)

    monkeypatch.setattr(lap_mod, "laplace_importance", first_fails)
    post = post_mod.fit_posterior(release + public, public=public, seed=0, draws=2000)
    # one mode here: the adaptive proposal (attempt 3); several would give the mixture (2)
    assert post.diagnostics["importance_attempts"] == (3 if post.diagnostics["modes"] == 1
                                                       else 2)
    assert post.diagnostics["importance_ess"] >= 50
    monkeypatch.undo()
    ref = post_mod.fit_posterior(release + public, public=public, seed=0, draws=2000)
    sd = ref.beta_draws.std(axis=0)
    assert np.all(np.abs(post.beta_mean - ref.beta_mean) <= 0.15 * sd)


def test_fallback_is_recorded_and_only_for_auto(monkeypatch):
    """method="auto": a refused Laplace fit falls back to the reference sampler, and the
    Posterior says so; an explicit method="laplace" raises instead (fast: the NUTS fit is
    replaced by a stub that records its call)."""
    import posterior.fit as post_mod
    from posterior import nuts as nuts_mod

    rng = np.random.default_rng(4)
    _, release, public = _problem(rng, 3, 200, 1.0, 1)
    monkeypatch.setattr(post_mod, "_MIN_ESS", 10 ** 9)   # every Laplace fit refuses
    calls = []

    def fake_nuts(stats, public, rep, diag, ss, draws, **kw):
        calls.append(diag)
        b = np.zeros((draws, stats.dim))
        return post_mod.Posterior("nuts", b.mean(axis=0), b, {}, {}, diag, rep, stats)

    monkeypatch.setattr(nuts_mod, "fit_noise_aware", fake_nuts)
    with pytest.raises(post_mod.ConvergenceError):
        post_mod.fit_posterior(release + public, public=public, method="laplace", seed=0)
    post = post_mod.fit_posterior(release + public, public=public, seed=0, draws=10)
    assert post.method == "nuts" and post.diagnostics["fallback_from"] == "laplace"
    assert "effective draws" in post.diagnostics["laplace_refusal"] and len(calls) == 1
    from dpfed_apps.evaluation.methods.posterior_fit import FIT_LOG, posterior_beta
    log = []
    token = FIT_LOG.set(log)
    try:
        posterior_beta(release + public, posterior="laplace", draws=10, seed=0, public=public,
                       fallback="nuts")
        with pytest.raises(post_mod.ConvergenceError):   # comparison methods: no fallback
            posterior_beta(release + public, posterior="laplace", draws=10, seed=0,
                           public=public)
    finally:
        FIT_LOG.reset(token)
    assert log == ["nuts (after laplace refused)"]


@pytest.mark.slow
def test_fallback_runs_the_reference_sampler(monkeypatch):
    import posterior.fit as post_mod

    rng = np.random.default_rng(4)
    _, release, public = _problem(rng, 3, 200, 1.0, 1)
    monkeypatch.setattr(post_mod, "_MIN_ESS", 10 ** 9)
    post = post_mod.fit_posterior(release + public, public=public, seed=0, draws=1000,
                                  tune=500)
    assert post.method == "nuts" and post.model == "noise-aware"
    assert post.diagnostics["fallback_from"] == "laplace" and post.diagnostics["converged"]


def test_adaptive_importance_recovers_a_skewed_target():
    """posterior.laplace.adaptive_importance: on a banana-shaped target (u2 | u1 ~
    N(b u1^2, 0.3^2), u1 ~ N(0, 1); E[u2] = b) importance sampling from the Laplace
    approximation at the mode misses the arms (its mean of u2 is far below b, although its
    ESS looks fine); after moving the proposal to the weighted moments it is right."""
    from posterior.laplace import adaptive_importance, laplace_approximation, laplace_importance

    b, s = 1.0, 0.3

    def f(u):
        r = u[1] - b * u[0] ** 2
        return (-0.5 * u[0] ** 2 - 0.5 * (r / s) ** 2,
                np.array([-u[0] + (r / s ** 2) * 2 * b * u[0], -r / s ** 2]))

    def fb(us):
        r = us[:, 1] - b * us[:, 0] ** 2
        return -0.5 * us[:, 0] ** 2 - 0.5 * (r / s) ** 2

    lap = laplace_approximation(f, np.array([0.3, 0.1]))
    rng = np.random.default_rng(0)
    first = laplace_importance(f, fb, lap.mode, draws=4000, rng=rng, laplace=lap)
    assert first.ess >= 200 and first.draws[:, 1].mean() < 0.6 * b
    res = adaptive_importance(fb, lap, draws=4000, rng=rng)
    assert res.ess >= 200
    assert res.draws[:, 1].mean() == pytest.approx(b, abs=0.1)
    assert res.draws[:, 0].std() == pytest.approx(1.0, abs=0.08)
