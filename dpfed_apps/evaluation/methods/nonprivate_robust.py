"""Non-private robust linear regression (paper section 4.5, "non-private robust LR").

``robust_private`` without the noise: the private rows are projected into [-Bx, Bx] x
[-By, By] (paper eq. (9); with ``setting.x_norm_bound`` also into the L2 ball) and the public
rows are clipped the same way, as robust_private uses them; the Gamma-prior model is fitted to
the exact sum. The gap to
``nonprivate`` is the cost of the projection, the gap to ``robust_private`` the cost of the noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dpfed.noise import EXACT
from dpfed.statistics import Statistics
from dpfed_apps.evaluation.methods.base import PrivacySetting, TrainingData, validate_posterior
from dpfed_apps.evaluation.methods.posterior_fit import posterior_beta
from dpfed_apps.evaluation.methods.robust_private import clipped_public_statistics
from site_node.release import clipped_statistics


@dataclass(frozen=True)
class NonPrivateRobust:
    posterior: str = "laplace"
    draws: int = 1000        # the predictor is the posterior mean; 1000 draws estimate it
    name: ClassVar[str] = "nonprivate_robust"
    private: ClassVar[bool] = False

    def __post_init__(self):
        validate_posterior(self.posterior, self.draws)

    def statistics(self, data: TrainingData, setting: PrivacySetting) -> Statistics:
        total = clipped_public_statistics(data, setting)
        if data.n_private:
            sxx, sxy, syy = clipped_statistics(data.x_private, data.y_private,
                                               setting.x_bound, setting.y_bound,
                                               setting.x_norm_bound)
            # Exact statistics of the clipped rows: no noise, and said so.
            total = total + Statistics(sxx, sxy, syy, data.n_private, EXACT)
        return total

    def fit(self, data: TrainingData, setting: PrivacySetting, *, seed: int) -> np.ndarray:
        return posterior_beta(self.statistics(data, setting), posterior=self.posterior,
                              draws=self.draws, seed=seed)
