"""Non-private linear regression (paper section 4.5, "LR"; method.md section 5).

The Gamma-prior model fitted to the exact statistics of all training rows, private and public,
without clipping or noise. Same fit as ``robust_private`` so that the two differ only in the
statistics. Not private: an upper reference, never a release.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dpfed.statistics import exact_statistics
from dpfed_apps.evaluation.methods.base import PrivacySetting, TrainingData, validate_posterior
from dpfed_apps.evaluation.methods.posterior_fit import posterior_beta


@dataclass(frozen=True)
class NonPrivate:
    posterior: str = "laplace"
    draws: int = 1000        # the predictor is the posterior mean; 1000 draws estimate it
    name: ClassVar[str] = "nonprivate"
    private: ClassVar[bool] = False

    def __post_init__(self):
        validate_posterior(self.posterior, self.draws)

    def fit(self, data: TrainingData, setting: PrivacySetting, *, seed: int) -> np.ndarray:
        # ``setting`` is accepted for a uniform interface; nothing in it applies.
        x = np.vstack([data.x_private, data.x_public])
        y = np.concatenate([data.y_private, data.y_public])
        return posterior_beta(exact_statistics(x, y), posterior=self.posterior,
                              draws=self.draws, seed=seed)
