"""Beta from sufficient statistics under the Gamma-prior model of method.md section 1.

Shared by the methods that end in a Bayesian fit of (possibly noisy) statistics: robust_private,
nonprivate, nonprivate_robust, private_unclipped. The fit is ``aggregator.fit_posterior``, the
same code the production aggregator runs (with its repair of noisy statistics, method.md
section 6), so the comparison between those methods differs only in the statistics.
"""

from __future__ import annotations

import numpy as np

from aggregator.closed_form import closed_form_mean
from aggregator.posterior import fit_posterior
from dpfed.statistics import Statistics


def posterior_beta(stats: Statistics, *, posterior: str, draws: int, seed: int) -> np.ndarray:
    """The paper's predictor (eq. (8)): the average of ``beta`` over ``draws`` posterior draws,
    so ``x @ beta`` is (1/m) sum_k x^T beta^(k)."""
    post = fit_posterior(stats, method=posterior, draws=draws, seed=seed)
    return np.array(post.beta_draws.mean(axis=0))


def public_only_beta(x_public: np.ndarray, y_public: np.ndarray) -> np.ndarray:
    """Fallback of the optimisation-based methods when there are no private rows: the
    fixed-precision posterior mean (lambda = lambda0 = 1, paper eqs. (3)-(4)) of the public
    rows, which needs no noise. (The reference implementation does the same.)"""
    return closed_form_mean(x_public.T @ x_public, x_public.T @ y_public, 1.0, 1.0)
