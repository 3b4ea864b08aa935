"""Robust private linear regression: the proposed method (Honkela et al. 2018, sections 4.2-4.3;
method.md sections 2-3).

Each of K sites projects its private rows into [-Bx, Bx] x [-By, By] and releases Sxx, Sxy, Syy
with Laplace noise (``site_node.release.release_statistics``, the production mechanism with
OpenDP noise, under the setting's neighbouring relation and Sxx rule: by default add/remove with
noisy n, exact Sxx sensitivity; with ``neighbouring="replace_one"`` the paper's bounded DP, n
exact; here via ``release_many``, which draws the K sites' noise in one OpenDP call per part with
the same per-site mechanism; with ``setting.x_norm_bound`` the rows are also projected into
the L2 ball, ``dpfed.sensitivity``). The aggregator sums the releases and adds the exact
statistics of the public rows, clipped with the round's public bounds like the private rows
(``clipped_public_statistics``, as ``coordinator.roundspec`` does), then fits the Gamma-prior
model: by default the noise-aware posterior (method.md section 8), which knows the sum holds
K independent release noises (``Statistics.noise``) and fits the public part with its own
exact likelihood.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dpfed.statistics import Statistics, clipped_exact_statistics, exact_statistics
from evaluation.methods.base import PrivacySetting, TrainingData, split_rows, validate_posterior
from evaluation.methods.posterior_fit import posterior_beta
from site_node.release import release_many


def public_statistics(data: TrainingData) -> Statistics:
    """Exact statistics of the public rows (zero with n = 0 when there are none)."""
    if data.n_public == 0:
        return Statistics.zeros(data.dim)
    return exact_statistics(data.x_public, data.y_public)


def clipped_public_statistics(data: TrainingData, setting: PrivacySetting) -> Statistics:
    """Exact statistics of the public rows clipped like the private rows (box, then the
    row-norm ball): both parts then describe the same clipped-data regression, which the
    model fits with one beta and one lambda (``dpfed.statistics.clipped_exact_statistics``)."""
    if data.n_public == 0:
        return Statistics.zeros(data.dim)
    return clipped_exact_statistics(data.x_public, data.y_public, setting.x_bound,
                                    setting.y_bound, setting.x_norm_bound)


@dataclass(frozen=True)
class RobustPrivate:
    """``posterior``: one of ``evaluation.methods.base.POSTERIORS`` ("laplace": the
    noise-aware fit, the default; "plug-in-advi": the paper's); ``draws``: m."""

    posterior: str = "laplace"
    draws: int = 1000        # the predictor is the posterior mean; 1000 draws estimate it
    name: ClassVar[str] = "robust_private"
    private: ClassVar[bool] = True

    def __post_init__(self):
        validate_posterior(self.posterior, self.draws)

    def statistics(self, data: TrainingData, setting: PrivacySetting) -> Statistics:
        """Sum of the K site releases plus the exact public statistics: exactly what the
        production federation aggregates. Fresh OpenDP noise on every call."""
        total = clipped_public_statistics(data, setting)
        blocks = [(data.x_private[rows], data.y_private[rows])
                  for rows in split_rows(data.n_private, setting.n_sites)]
        if not blocks:
            return total
        # The K sites' releases, their noise drawn in 3 OpenDP calls (release_many: each
        # site's block gets exactly the mechanism and guarantee of release_statistics).
        for site in release_many(blocks, epsilon=setting.epsilon, x_bound=setting.x_bound,
                                 y_bound=setting.y_bound, budget_split=setting.budget_split,
                                 neighbouring=setting.neighbouring,
                                 xtx_sensitivity=setting.xtx_sensitivity,
                                 x_norm_bound=setting.x_norm_bound):
            total = total + site
        return total

    def fit(self, data: TrainingData, setting: PrivacySetting, *, seed: int) -> np.ndarray:
        return posterior_beta(self.statistics(data, setting), posterior=self.posterior,
                              draws=self.draws, seed=seed,
                              public=clipped_public_statistics(data, setting),
                              x_bound=setting.x_bound, fallback="nuts")
