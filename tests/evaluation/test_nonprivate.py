import numpy as np

from dpfed_apps.evaluation.methods.nonprivate import NonPrivate
from posterior.closed_form import closed_form_mean


def test_recovers_beta_and_is_the_exact_fit(problem):
    method = NonPrivate(posterior="plug-in-fixed", draws=20_000)
    beta = method.fit(problem.data, problem.setting(), seed=0)
    assert problem.spearman(beta) > 0.9
    d = problem.data
    x = np.vstack([d.x_private, d.x_public])
    y = np.concatenate([d.y_private, d.y_public])
    mu = closed_form_mean(x.T @ x, x.T @ y)
    # The average over draws of N(mu, L^-1): within a few Monte Carlo standard errors.
    np.testing.assert_allclose(beta, mu, atol=5 * 0.1 / np.sqrt(20_000))


def test_deterministic_given_seed_and_ignores_bounds(problem):
    method = NonPrivate(posterior="plug-in-fixed", draws=100)
    a = method.fit(problem.small(300), problem.setting(x_bound=0.01), seed=4)
    b = method.fit(problem.small(300), problem.setting(x_bound=5.0), seed=4)
    np.testing.assert_array_equal(a, b)
