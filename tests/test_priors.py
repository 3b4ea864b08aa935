"""The named priors of the precisions (posterior.noise_aware.Prior, PRIORS, PRIOR).

Checked, each able to fail: the default is the paper's (both Gamma(2, 2), section 4.5); under
the scaled normal-gamma prior (lambda0 = lambda g) the numpy density is the PyMC model's
(``build_noise_aware_model``, lambda0 sampled) with lambda0 integrated out, its gradient is
right, the compiled and batched densities agree with it, and lambda0 | beta, lambda is drawn
from its Gamma full conditional.
"""

import numpy as np
import pytest

from dpfed_apps.evaluation.coverage import prior_problem
from posterior import noise_aware as na
from posterior import batched, noise_aware_jit
from tests.conftest import lam0_marginal


@pytest.fixture
def scaled(monkeypatch):
    monkeypatch.setattr(na, "PRIOR", na.PRIORS["scaled"])
    return na.PRIORS["scaled"]


@pytest.fixture(params=["scaled", "total"])
def dependent(request, monkeypatch):
    """Each prior in which lambda0's prior depends on lambda."""
    monkeypatch.setattr(na, "PRIOR", na.PRIORS[request.param])
    return na.PRIORS[request.param]


def _inputs(seed=1, d=4):
    rng = np.random.default_rng(seed)
    p = prior_problem(rng, d, 200, 2.0, 1)
    return na.noise_aware_inputs(p.release + p.public, p.public), rng


def test_the_default_is_the_papers_prior():
    p = na.PRIOR
    assert (p.shape, p.rate, p.shape0, p.rate0, p.scaled) == (2.0, 2.0, 2.0, 2.0, False)


def test_scaled_prior_ties_the_coefficients_scale_to_the_residual_sd(scaled):
    # beta | lambda is Student-t with scale sqrt(b0 / (a0 lambda)): at 4x the precision the
    # density of 2 beta... equals that of beta at 1x, up to the Jacobian 2^-d.
    d = 3
    beta = np.array([0.3, -0.2, 0.5])
    pr = na.prior_params(d)
    def cond(b, a):   # log p(beta | lambda): the lambda prior's part removed
        return na.prior_value(b, a, pr)[0] - (pr[1] * a - pr[2] * np.exp(a))
    assert cond(beta / 2, np.log(4.0)) == pytest.approx(cond(beta, 0.0) + d * np.log(2.0))
    # not so under the paper's independent prior
    pg = na.PRIORS["gamma"].params(d)
    ind = lambda b, a: na.prior_value(b, a, pg)[0] - (pg[1] * a - pg[2] * np.exp(a))  # noqa: E731
    assert ind(beta / 2, np.log(4.0)) != pytest.approx(ind(beta, 0.0) + d * np.log(2.0))


def test_gradient_batch_and_compiled_density_agree(dependent):
    from dpfed.statistics import Statistics

    inp, rng = _inputs()
    stats = Statistics(inp.rxx, inp.rxy, inp.ryy, int(inp.n))
    target = noise_aware_jit.target_for("noise-aware", stats, inp)
    us = rng.standard_normal((4, 5)) * 0.5
    for u in us:
        val, g = na.log_posterior_noise_aware(u, inp)
        fd = np.array([(na.log_posterior_noise_aware(u + e, inp)[0]
                        - na.log_posterior_noise_aware(u - e, inp)[0]) / 2e-6
                       for e in np.eye(5) * 1e-6])
        assert np.allclose(g, fd, rtol=1e-5, atol=1e-5)
        vj, gj = target.logp_grad(u)
        assert vj == pytest.approx(val, rel=1e-10, abs=1e-9)
        assert np.allclose(gj, g, rtol=1e-8, atol=1e-8)
    vb, gb = batched.noise_aware_logp_grad(us, inp)
    assert np.allclose(vb, [na.log_posterior_noise_aware(u, inp)[0] for u in us])
    assert np.allclose(gb, [na.log_posterior_noise_aware(u, inp)[1] for u in us])


@pytest.mark.slow
def test_density_is_the_pymc_model_marginalised_over_lambda0(dependent):
    from posterior.model import build_noise_aware_model

    inp, rng = _inputs(3, 3)
    lp = build_noise_aware_model(inp).compile_logp()
    for _ in range(3):
        beta, a = rng.standard_normal(3) * 0.5, rng.standard_normal() * 0.3
        assert lam0_marginal(lp, beta, a) == pytest.approx(
            na.log_posterior_noise_aware(np.r_[beta, a], inp)[0], abs=1e-4)


def test_scaled_lambda0_draws_follow_their_full_conditional(scaled):
    rng = np.random.default_rng(5)
    beta = np.tile([[0.4, -0.1, 0.2]], (40000, 1))
    lam = np.full(40000, 3.0)
    draws = na.draw_lam0(beta, rng, lam)
    p = scaled
    rate = p.rate0 / 3.0 + 0.5 * 0.21
    assert draws.mean() == pytest.approx((p.shape0 + 1.5) / rate, rel=0.02)
    with pytest.raises(ValueError):
        na.draw_lam0(beta, rng)   # lambda is needed under the scaled prior


def test_total_prior_shares_the_variance_between_signal_and_residual(monkeypatch):
    # E[1 / lambda0 | lambda] = c / (a0 - 1) = total - 1 / lambda away from the floor; at a
    # residual variance above the total the signal's prior variance is near zero (the floor).
    p = na.PRIORS["total"]
    assert p.rate0 == p.shape0 - 1
    lam = np.array([1 / (0.2 * p.total), 1 / (0.5 * p.total), 1 / (2.0 * p.total)])
    signal = p.rate_of_lam0(lam) / (p.shape0 - 1)
    assert signal[:2] == pytest.approx([0.8 * p.total, 0.5 * p.total], rel=0.01)
    assert signal[2] < 0.01 * p.total
    monkeypatch.setattr(na, "PRIOR", p)
    rng = np.random.default_rng(2)
    draws = na.draw_lam0(np.zeros((20000, 4)), rng, np.full(20000, lam[1]))
    assert np.mean(1 / draws) == pytest.approx(
        p.rate_of_lam0(lam[1]) / (p.shape0 + 2 - 1), rel=0.05)


def test_count_noise_term_of_the_design_prior_is_off_by_default_and_adds_m2_vn(monkeypatch):
    rng = np.random.default_rng(4)
    p = prior_problem(rng, 3, 300, 1.0, 1)
    stats = p.release + p.public
    mean0, var0 = na.design_prior(stats, p.public, 1.0)
    assert na.DESIGN_PRIOR_COUNT_NOISE is False
    monkeypatch.setattr(na, "DESIGN_PRIOR_COUNT_NOISE", True)
    mean1, var1 = na.design_prior(stats, p.public, 1.0)
    assert np.array_equal(mean0, mean1)
    n_priv = float(stats.n) - p.public.n
    m = (mean0 - p.public.xtx) / n_priv
    v_n = stats.noise.variances()["n"]
    assert v_n > 0
    assert np.allclose(var1 - var0, m * m * v_n)
