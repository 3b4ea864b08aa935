"""What a fit returns (``Posterior``) or raises (``PosteriorError`` and its kinds).

A ``Posterior`` holds draws of beta from the fitted posterior of method.md sections 1 and 8
and summaries of the precisions; its predictions are the average of x^T beta over the draws
(Honkela et al. 2018, eq. (8)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dpfed.intervals import CREDIBLE_LEVEL, credible_interval, interval_quantiles
from dpfed.jsonsafe import jsonable
from dpfed.statistics import Statistics
from posterior.repair import Repair

__all__ = ["Posterior", "PosteriorError", "ConvergenceError", "UnknownNoiseError",
           "draws_summary", "fixed_summary", "in_caller_units"]


class UnknownNoiseError(ValueError):
    """Statistics whose noise is unknown were given without ``plug_in=True``."""


class PosteriorError(RuntimeError):
    """The posterior could not be fitted (bad input, numerical failure)."""


class ConvergenceError(PosteriorError):
    """The fit did not converge; no posterior is returned. ``diagnostics`` says why."""

    def __init__(self, message: str, diagnostics: dict | None = None):
        super().__init__(message)
        self.diagnostics = dict(diagnostics or {})


def _readonly(a) -> np.ndarray:
    a = np.array(a, dtype=np.float64, copy=True)
    a.setflags(write=False)
    return a


def draws_summary(draws: np.ndarray) -> dict:
    """Mean, sd and 5 %/50 %/95 % quantiles of a precision's draws (``Posterior.lam``)."""
    q = np.quantile(draws, [0.05, 0.5, 0.95])
    return {"mean": float(np.mean(draws)), "sd": float(np.std(draws)),
            "q05": float(q[0]), "median": float(q[1]), "q95": float(q[2])}


def fixed_summary(value: float) -> dict:
    """The summary of a precision held fixed (method "fixed")."""
    v = float(value)
    return {"mean": v, "sd": 0.0, "q05": v, "median": v, "q95": v, "fixed": True}


@dataclass(frozen=True, eq=False)
class Posterior:
    """A fitted posterior of beta (and of the precisions, except for ``"fixed"``).

    ``beta_draws`` (draws x d) are draws from the fitted posterior (the variational
    approximation for ADVI, the chains for NUTS, the Gaussian for ``"fixed"``);
    ``beta_mean`` is its mean (exact for ``"fixed"`` and ADVI, the sample mean for NUTS).
    ``lam`` and ``lam0`` summarise the precisions (mean, sd, 5%/50%/95% quantiles).
    Arrays are read-only.
    """

    method: str
    beta_mean: np.ndarray
    beta_draws: np.ndarray
    lam: dict
    lam0: dict
    diagnostics: dict
    repair: Repair
    stats: Statistics = field(repr=False)  # the (repaired, for plug-in) statistics fitted
    model: str = "plug-in"                 # "noise-aware", "exact" or "plug-in" (MODELS)

    def __post_init__(self):
        object.__setattr__(self, "beta_mean", _readonly(self.beta_mean))
        object.__setattr__(self, "beta_draws", _readonly(self.beta_draws))

    @property
    def dim(self) -> int:
        return self.beta_mean.shape[0]

    def _x(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must have shape (m, {self.dim}), got {np.shape(x)}")
        return x

    def predict(self, x) -> np.ndarray:
        """Average of x^T beta over the draws (paper eq. (8), with its 1/m): shape (m,)."""
        return self._x(x) @ self.beta_draws.mean(axis=0)

    def predict_interval(self, x, level: float = CREDIBLE_LEVEL) -> tuple[np.ndarray, np.ndarray]:
        """Central credible interval of the linear predictor x^T beta (no observation noise)."""
        lo, hi = interval_quantiles(level)
        lin = self._x(x) @ self.beta_draws.T
        return np.quantile(lin, lo, axis=1), np.quantile(lin, hi, axis=1)

    def credible_interval(self, level: float = CREDIBLE_LEVEL) -> np.ndarray:
        """Central credible interval of each coefficient: array (d, 2) of (lower, upper)
        (dpfed.intervals)."""
        return credible_interval(self.beta_draws, level)

    def to_dict(self, include_draws: bool = False) -> dict:
        """JSON-ready summary (dpfed.jsonsafe: NaN and infinities as None); the draws only
        with ``include_draws=True``."""
        ci = self.credible_interval(0.9)      # the "beta_ci90" key; CREDIBLE_LEVEL is 0.9
        out = {
            "method": self.method,
            "model": self.model,
            "dim": self.dim,
            "n_draws": int(self.beta_draws.shape[0]),
            "beta_mean": self.beta_mean.tolist(),
            "beta_sd": self.beta_draws.std(axis=0).tolist(),
            "beta_ci90": ci.tolist(),
            "lam": dict(self.lam),
            "lam0": dict(self.lam0),
            "diagnostics": jsonable(self.diagnostics),
        }
        if include_draws:
            out["beta_draws"] = self.beta_draws.tolist()
        return out


# Why a response unit: the priors of method.md section 1 (lambda ~ Gamma(2, 2): residual
# sd near 1; beta | lambda0 with lambda0 ~ Gamma(2, 2)) are stated for a response of unit
# scale, so without one the posterior depends on the units y is measured in. That matters
# most for the noise-aware model: on UCI wine quality (docs/evaluation.md) a release whose
# responses were all clipped to +-0.2 got a noise-aware posterior mean with held-out
# Spearman -0.36 (NUTS agreed: the model, not the approximation), and 0.59 with the same
# rows in units of the bound (the exact clipped statistics give 0.59).
def in_caller_units(post: Posterior, unit: float) -> Posterior:
    """``post`` fitted to y / unit, in y's units: beta and its draws times unit, the noise
    and prior precisions lambda, lambda0 divided by unit^2 (every summary statistic of a
    positive multiple is that multiple of the statistic), the statistics back in y."""
    def precision(summary: dict) -> dict:
        return {k: (v / unit ** 2 if isinstance(v, float) else v)   # not the bool "fixed"
                for k, v in summary.items()}

    diagnostics = dict(post.diagnostics, y_unit=unit)
    return Posterior(post.method, post.beta_mean * unit, post.beta_draws * unit,
                     precision(post.lam), precision(post.lam0), diagnostics, post.repair,
                     post.stats.in_y_units(1.0 / unit), post.model)
