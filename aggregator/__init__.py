"""The aggregator: sums released statistics and fits the posterior (method.md sections 1, 3, 6).

PyMC is imported lazily, on the first ADVI or NUTS fit.
"""

from aggregator.closed_form import closed_form_mean, posterior_precision
from aggregator.posterior import (ConvergenceError, Posterior, PosteriorError, fit_posterior,
                                  variational_init)
from aggregator.repair import Repair, repair_statistics

__all__ = [
    "closed_form_mean",
    "posterior_precision",
    "fit_posterior",
    "Posterior",
    "PosteriorError",
    "ConvergenceError",
    "variational_init",
    "Repair",
    "repair_statistics",
]
