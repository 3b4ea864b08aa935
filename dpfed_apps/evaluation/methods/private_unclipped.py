"""Private linear regression without projection (paper section 4.5, model (iii): "the proposed
method without projection of the outliers"; method.md section 7).

Instead of projecting outliers, the data are *linearly rescaled* so that their whole public
range fits the bounds, the "current standard practice" the paper argues against (section 2,
citing Zhang et al. 2012): x <- x * Bx / Rx and y <- y * By / Ry, where Rx = ``x_range``
(every |x_ij| <= Rx; 1 for unit-norm rows) and Ry = ``y_range`` are public ranges of the
pre-processed data (``PrivacySetting``). The rescaled private rows are released with the same
mechanism and budget split as ``robust_private`` (``site_node.release.release_statistics``:
Laplace scales d(d+1)Bx^2/(p1 eps), 2dBxBy/(p2 eps), By^2/(p3 eps); eps-DP per site, bounded DP),
the rescaled public rows are added exactly, and the Gamma-prior model is fitted. The release's
projection onto the bounds is then only a guard: it changes nothing when the ranges are honest.

Equivalently, this is ``robust_private`` with bounds (Rx, Ry) in the original units; the
rescaling only sets the units in which the priors act. Returned beta is in the original units
(beta = beta' * (Bx/Rx) / (By/Ry)), so ``x @ beta`` predicts y.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dpfed.statistics import Statistics, exact_statistics
from dpfed_apps.evaluation.methods.base import (PrivacySetting, TrainingData, split_rows,
                                                validate_posterior)
from dpfed_apps.evaluation.methods.posterior_fit import posterior_beta
from site_node.release import release_many


def rescale_factors(setting: PrivacySetting, method: str = "private_unclipped") -> tuple[float, float]:
    """(s_x, s_y) = (Bx / Rx, By / Ry): the linear maps of the public ranges onto the bounds."""
    return setting.x_bound / setting.x_range, setting.y_bound / setting.require_y_range(method)


@dataclass(frozen=True)
class PrivateUnclipped:
    posterior: str = "laplace"
    draws: int = 1000        # the predictor is the posterior mean; 1000 draws estimate it
    name: ClassVar[str] = "private_unclipped"
    private: ClassVar[bool] = True

    def __post_init__(self):
        validate_posterior(self.posterior, self.draws)

    def statistics(self, data: TrainingData, setting: PrivacySetting) -> Statistics:
        """Statistics of the rescaled data: K site releases plus exact public statistics."""
        sx, sy = rescale_factors(setting, self.name)
        total = Statistics.zeros(data.dim)
        if data.n_public:
            total = exact_statistics(data.x_public * sx, data.y_public * sy)
        blocks = [(data.x_private[rows] * sx, data.y_private[rows] * sy)
                  for rows in split_rows(data.n_private, setting.n_sites)]
        if blocks:  # K site releases, noise in 3 OpenDP calls (site_node.release.release_many)
            for site in release_many(blocks, epsilon=setting.epsilon, x_bound=setting.x_bound,
                                     y_bound=setting.y_bound, budget_split=setting.budget_split,
                                     neighbouring=setting.neighbouring,
                                     xtx_sensitivity=setting.xtx_sensitivity):
                total = total + site
        return total

    def fit(self, data: TrainingData, setting: PrivacySetting, *, seed: int) -> np.ndarray:
        sx, sy = rescale_factors(setting, self.name)
        public = (exact_statistics(data.x_public * sx, data.y_public * sy)
                  if data.n_public else None)
        # A baseline whose releases are nearly all noise: the fast fit's first attempt is
        # trusted down to 50 effective draws (the extra attempts made this method's fits
        # 4-5x slower, a third of the whole protocol's time).
        beta_scaled = posterior_beta(self.statistics(data, setting), posterior=self.posterior,
                                     draws=self.draws, seed=seed, public=public,
                                     x_bound=setting.x_bound, check_first_attempt=False)
        return beta_scaled * (sx / sy)
