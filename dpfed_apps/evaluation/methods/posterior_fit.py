"""Beta from sufficient statistics under the Gamma-prior model (method.md sections 1 and 8).

Shared by the methods that end in a Bayesian fit of (possibly noisy) statistics: robust_private,
nonprivate, nonprivate_robust, private_unclipped. The fit is ``posterior.fit_posterior``, the
same code the production aggregator runs: noise-aware on releases (their ``Statistics.noise``),
the exact model on exact statistics, so the comparison between those methods differs only in
the statistics.
"""

from __future__ import annotations

from contextvars import ContextVar

import numpy as np

from dpfed.statistics import Statistics
from posterior import fit_method_options, fit_posterior
from posterior.closed_form import closed_form_mean


#: The fit actually used by the last ``posterior_beta`` calls of this process, when a caller
#: (dpfed_apps.evaluation.runner) sets a list here: one entry per fit ("laplace", or "nuts"
#: after the Laplace fit refused and the reference sampler took over).
FIT_LOG: ContextVar[list | None] = ContextVar("FIT_LOG", default=None)


def posterior_beta(stats: Statistics, *, posterior: str, draws: int, seed: int,
                   public: Statistics | None = None, x_bound: float | None = None,
                   fallback: str | None = None, check_first_attempt: bool = True,
                   y_unit: float | None = None) -> np.ndarray:
    """The paper's predictor (eq. (8)): the posterior mean of ``beta``, so ``x @ beta`` is the
    average of x^T beta over the posterior. ``posterior`` is one of
    ``dpfed_apps.evaluation.methods.base.POSTERIORS``; ``public`` the exact public statistics
    included in ``stats`` and ``x_bound`` the private rows' clipping bound (the noise-aware model's
    design prior). ``fallback="nuts"``: if the Laplace fit refuses, the reference NUTS fit
    (what a round's default method "auto" does; robust_private uses it); None: the refusal
    is raised (the comparison methods: a refused cell is counted, not rescued).
    ``check_first_attempt``, ``y_unit``: see ``posterior.fit_posterior`` (a round's fit
    passes its y bound as ``y_unit``)."""
    post = fit_posterior(stats, **fit_method_options(posterior), draws=draws, seed=seed,
                         public=public, x_bound=x_bound,
                         fallback=fallback if posterior == "laplace" else None,
                         check_first_attempt=check_first_attempt, y_unit=y_unit)
    log = FIT_LOG.get()
    if log is not None:
        log.append(post.method if "fallback_from" not in post.diagnostics
                   else f"{post.method} (after {post.diagnostics['fallback_from']} refused)")
    return np.array(post.beta_draws.mean(axis=0))


def public_only_beta(x_public: np.ndarray, y_public: np.ndarray) -> np.ndarray:
    """Fallback of the optimisation-based methods when there are no private rows: the
    fixed-precision posterior mean (lambda = lambda0 = 1, paper eqs. (3)-(4)) of the public
    rows, which needs no noise. (The reference implementation does the same.)"""
    return closed_form_mean(x_public.T @ x_public, x_public.T @ y_public, 1.0, 1.0)
