"""Credible intervals from posterior draws: the one implementation and the one default level.

``CREDIBLE_LEVEL = 0.9``: every interval dpfed reports uses it unless a caller passes another
level explicitly: the round summary's ``beta_ci90`` (aggregator.aggregate.summarize),
``Posterior.credible_interval``, ``dpfed round result``, ``dpfed simulate``'s feature table and
the coverage check of docs/evaluation.md. An interval is central: the (1 - level)/2 and
(1 + level)/2 quantiles of the draws (numpy's default linear interpolation).
"""

from __future__ import annotations

import numpy as np

__all__ = ["CREDIBLE_LEVEL", "interval_quantiles", "credible_interval"]

CREDIBLE_LEVEL = 0.9


def interval_quantiles(level: float = CREDIBLE_LEVEL) -> tuple[float, float]:
    """The (lower, upper) quantiles of a central interval of ``level``, in (0, 1)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return (1 - level) / 2, (1 + level) / 2


def credible_interval(draws, level: float = CREDIBLE_LEVEL) -> np.ndarray:
    """Central credible interval of each column of ``draws`` (S draws x d): array (d, 2) of
    (lower, upper); (0, 2) when there are no draws."""
    draws = np.asarray(draws, dtype=np.float64)
    lo, hi = interval_quantiles(level)
    if draws.shape[0] == 0:
        return np.zeros((0, 2))
    return np.quantile(draws, [lo, hi], axis=0).T
