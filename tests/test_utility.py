"""The paper's qualitative result on synthetic data (Honkela et al. 2018, Fig. 2; method.md 5):
with n_private = 800, d = 10, eps = 2 and 10 public points, the robust private model beats the
baseline learned from the 10 public points alone, on average over repeats.

Everything the mechanism uses is public: pre-processing means and sigmas come from the public
points, the thresholds from ``choose_bounds`` on synthetic data of the same n, d, eps.
"""

import numpy as np
import pytest

from dpfed.bounds import choose_bounds
from dpfed.metrics import spearman
from dpfed.preprocess import Preprocessing
from dpfed.preprocess import public_sigmas
from posterior import ConvergenceError, fit_posterior
from site_node import exact_statistics, release_statistics

D, N_PRIVATE, N_PUBLIC, N_TEST, EPSILON = 10, 800, 10, 500, 2.0
REPEATS = 100


def _problem(rng):
    """The generative model of the paper's auxiliary data (method.md section 4): rows of
    x ~ N(0, I_d) scaled to unit norm, beta ~ N(0, I), y ~ N(x^T beta, 1)."""
    beta = rng.normal(size=D)
    x = rng.normal(size=(N_PRIVATE + N_PUBLIC + N_TEST, D))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = x @ beta + rng.normal(size=x.shape[0])
    return (x[:N_PRIVATE], y[:N_PRIVATE]), (x[N_PRIVATE:N_PRIVATE + N_PUBLIC],
                                              y[N_PRIVATE:N_PRIVATE + N_PUBLIC]), (x[-N_TEST:], y[-N_TEST:])


@pytest.mark.slow
def test_private_model_beats_the_public_only_baseline_on_average():
    rng = np.random.default_rng(2018)
    omegas = choose_bounds(N_PRIVATE, D, EPSILON, seed=0)
    private_scores, public_scores = [], []
    refused = 0
    for r in range(REPEATS):
        (xp, yp), (xq, yq), (xt, yt) = _problem(rng)
        pre = Preprocessing.from_public_data(xq, yq)
        sigma_x, sigma_y = public_sigmas(xq, yq, pre)
        x_bound, y_bound = omegas.bounds(sigma_x, sigma_y)
        public = exact_statistics(*pre.apply(xq, yq))
        release = release_statistics(*pre.apply(xp, yp), epsilon=EPSILON, x_bound=x_bound,
                                     y_bound=y_bound)
        # The default fit: noise-aware on the release, exact on the public rows alone.
        try:
            private = fit_posterior(release + public, public=public, draws=500, seed=r)
        except ConvergenceError:
            # Every sampler failed to mix on this release (CI: HMC r-hat 1.11, NUTS 1.17, one
            # of 100): the product refuses the fit, saying so; counted, and bounded below.
            refused += 1
            continue
        baseline = fit_posterior(public, draws=500, seed=r)
        zt = pre.transform_x(xt)
        private_scores.append(spearman(private.predict(zt), yt))
        public_scores.append(spearman(baseline.predict(zt), yt))
    private_scores, public_scores = np.array(private_scores), np.array(public_scores)
    gain = private_scores - public_scores
    # On average, and not by luck: the paired mean gain exceeds 3 standard errors. (Measured:
    # a gain of about 0.1 with a per-repeat sd of about 0.2, i.e. about 5 standard errors at
    # 100 repeats; OpenDP's noise cannot be seeded, so the margin must absorb its randomness.)
    z = gain.mean() / (gain.std(ddof=1) / np.sqrt(gain.size))
    print(f"private {private_scores.mean():.3f} vs public-only {public_scores.mean():.3f} "
          f"over {gain.size} repeats ({refused} refused): paired gain {gain.mean():.3f} = "
          f"{z:.1f} standard errors")
    assert refused <= 2, refused
    assert private_scores.mean() > public_scores.mean()
    assert z > 3, (private_scores, public_scores)


@pytest.mark.slow
def test_many_small_sites_never_lose_to_the_public_rows_on_average():
    """Issue 9: with K = 10 independent releases of 30 rows each at eps 1 (the sum carries ten
    noise draws), the noise-aware posterior is not worse than the public rows alone on
    average over 60 splits. It can fail: fitting the public statistics as part of the noisy
    sum (public=None, the form before issue 9's second part) loses to them by far here."""
    from dpfed.statistics import clipped_exact_statistics
    from site_node.release import release_many

    k, n_site, eps, repeats = 10, 30, 1.0, 60
    rng = np.random.default_rng(9)
    gain, gain_summed = [], []
    for r in range(repeats):
        beta = rng.normal(size=D)
        n = k * n_site
        x = rng.normal(size=(n + N_PUBLIC + N_TEST, D))
        y = x @ beta + 2 * rng.normal(size=x.shape[0])
        xq, yq = x[n:n + N_PUBLIC], y[n:n + N_PUBLIC]
        pre = Preprocessing.from_public_data(xq, yq)
        _, sigma_y = public_sigmas(xq, yq, pre)
        bx, by = 1.0, sigma_y
        zp, tp = pre.apply(x[:n], y[:n])
        zq, tq = pre.apply(xq, yq)
        sites = release_many([(zp[i::k], tp[i::k]) for i in range(k)], epsilon=eps,
                             x_bound=bx, y_bound=by, x_norm_bound=1.0)
        public = clipped_exact_statistics(zq, tq, bx, by, 1.0)
        total = sum(sites[1:], sites[0]) + public
        zt, yt = pre.transform_x(x[-N_TEST:]), y[-N_TEST:]
        base = spearman(fit_posterior(exact_statistics(zq, tq), draws=500, seed=r).predict(zt),
                        yt)
        ours = fit_posterior(total, public=public, draws=500, seed=r)
        summed = fit_posterior(total, public=None, draws=500, seed=r, method="laplace")
        gain.append(spearman(ours.predict(zt), yt) - base)
        gain_summed.append(spearman(summed.predict(zt), yt) - base)
    gain, gain_summed = np.array(gain), np.array(gain_summed)
    se = gain.std(ddof=1) / np.sqrt(repeats)
    diff = gain - gain_summed
    print(f"gain over public-only {gain.mean():+.3f} +- {se:.3f}; summed form "
          f"{gain_summed.mean():+.3f}")
    assert gain.mean() >= -2 * se
    assert diff.mean() > 3 * diff.std(ddof=1) / np.sqrt(repeats)
