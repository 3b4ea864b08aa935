"""What every comparison method of the evaluation takes and returns (method.md sections 5 and 7).

A method is fitted on one *training problem*: private rows (which it may only touch through its
DP mechanism) and public rows (used exactly), both already pre-processed with public parameters
(genes centred, rows scaled to unit L2 norm, target centred; paper section 4.4). It returns the
coefficient vector ``beta`` (d,) and predictions are ``x @ beta`` (no intercept: data are
centred).

Privacy model: ``PrivacySetting.neighbouring`` (method.md section 9). The sufficient-statistics
methods built on ``site_node.release`` (robust_private, private_unclipped) follow it: under
add/remove (the default) each site's n is released with noise, under replace-one (bounded DP,
Honkela et al. 2018, section 4.2) n is public. The other comparison methods (ADASSP, output
perturbation, functional mechanism) are derived for replace-one neighbours only and ignore
the field; compare them with the paper's figures, not with an add/remove run.

Randomness: DP noise comes only from OpenDP (``site_node.laplace`` for Laplace, OpenDP's
Gaussian for ADASSP), which draws from the operating system's CSPRNG and cannot be seeded, so
private methods are *not* bit-reproducible for a given ``seed``. ``seed`` seeds everything else
(ADVI, posterior draws), which is Monte Carlo error of the computation, not privacy noise.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from dpfed.sensitivity import (check_neighbouring, check_norm_bound, check_xtx_rule,
                               default_budget_split, validate_privacy_parameters)
from dpfed_apps.evaluation.protocol import AGGREGATIONS
from posterior import FIT_METHODS

__all__ = ["TrainingData", "PrivacySetting", "Method", "DEFAULT_DELTA", "POSTERIORS",
           "split_rows", "validate_posterior"]

# Used by the (eps, delta)-DP method (ADASSP) when the setting leaves delta unset. 1e-5 is below
# 1/n for every private size of the paper's protocol (n <= 800), the usual requirement on delta.
DEFAULT_DELTA = 1e-5

# Posterior fits offered by the methods built on the Gamma-prior model (posterior.fit_posterior;
# the same names as a round spec's fit_method, posterior.FIT_METHODS): "laplace" is
# the default fast fit (noise-aware on releases, exact on exact statistics), "nuts" its
# reference; "plug-in-*" fit releases as if exact (the paper's fit, for comparison).
POSTERIORS = tuple(m for m in FIT_METHODS if m != "auto")


def _as_matrix(name: str, a, d: int | None = None) -> np.ndarray:
    try:
        a = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be an array of numbers: {exc}") from exc
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D (rows x features), got {a.ndim} dimension(s)")
    if d is not None and a.shape[1] != d:
        raise ValueError(f"{name} has {a.shape[1]} columns, expected {d}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return a


def _as_vector(name: str, a, n: int) -> np.ndarray:
    try:
        a = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be an array of numbers: {exc}") from exc
    if a.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return a


@dataclass(frozen=True)
class TrainingData:
    """One training problem, already pre-processed with PUBLIC parameters.

    ``x_private`` (n_priv, d) may have 0 rows; ``x_public`` (n_pub, d) are the non-private rows
    (10 in the paper) and may also be empty, but not both. Arrays are validated (finite, shapes)
    and stored as float64.
    """

    x_private: np.ndarray
    y_private: np.ndarray
    x_public: np.ndarray
    y_public: np.ndarray

    def __post_init__(self):
        xp = _as_matrix("x_private", self.x_private)
        d = xp.shape[1]
        if d < 1:
            raise ValueError("x_private has no feature columns (d = 0)")
        xq = _as_matrix("x_public", self.x_public, d)
        yp = _as_vector("y_private", self.y_private, xp.shape[0])
        yq = _as_vector("y_public", self.y_public, xq.shape[0])
        if xp.shape[0] + xq.shape[0] == 0:
            raise ValueError("no training rows: both the private and the public part are empty")
        object.__setattr__(self, "x_private", xp)
        object.__setattr__(self, "y_private", yp)
        object.__setattr__(self, "x_public", xq)
        object.__setattr__(self, "y_public", yq)

    @property
    def dim(self) -> int:
        return self.x_private.shape[1]

    @property
    def n_private(self) -> int:
        return self.x_private.shape[0]

    @property
    def n_public(self) -> int:
        return self.x_public.shape[0]


def _positive(name: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class PrivacySetting:
    """Public parameters of one private fit.

    ``epsilon``: the privacy budget of each site's release (every method is eps-DP per site,
    ADASSP is (eps, delta)-DP). ``x_bound``/``y_bound``: the public projection thresholds Bx, By
    (``dpfed.bounds.choose_bounds`` x public sigmas). ``budget_split``: shares of the
    sufficient-statistics methods, (Sxx, Sxy, Syy, n) under add/remove, (Sxx, Sxy, Syy) under
    replace-one; None takes the relation's default (``dpfed.sensitivity``).
    ``neighbouring``: "add_remove" (default) or "replace_one"; ``xtx_sensitivity``: "exact"
    (default) or "paper" (method.md sections 2 and 9). ``x_norm_bound``: the row-norm bound R
    of the sufficient-statistics release (rows projected into the L2 ball of radius R; R = 1
    for rows normalised to unit norm, ``dpfed.sensitivity.row_norm_bound``), None for
    coordinate clipping only. ``delta``: only ADASSP uses it; None means
    ``DEFAULT_DELTA`` (1e-5). ``n_sites``: the private rows are split into K contiguous,
    near-equal parts (``split_rows``), each released by its own site with the same epsilon, and
    the releases are summed (method.md section 3); methods that cannot be federated raise
    ValueError for K > 1. ``aggregation``: how K >= 2 releases are combined,
    "independent" (default: K noise draws on the sum) or "secure" (secure aggregation with
    distributed noise, issue 10: one draw on the sum; robust_private only).

    ``x_range``/``y_range``: the public *range* of the pre-processed data, used by the methods
    that bound the data by linear rescaling instead of projection (private_unclipped,
    output_perturbation, functional_mechanism; paper section 2: "linearly transform the data to
    desired bounds"). ``x_range`` bounds every row's L2 norm (hence every |x_ij|); the default 1
    is exact for rows scaled to unit norm. ``y_range`` bounds |y_i|; there is no data-independent
    default for a drug response, so those three methods raise ValueError while it is None. It
    must come from public knowledge (e.g. the assay's concentration range), never from the
    private rows. Values outside a range are projected onto it by a guard that is a no-op when
    the range is honest; it is what keeps the mechanisms DP when it is not.
    """

    epsilon: float
    x_bound: float
    y_bound: float
    budget_split: tuple | None = None
    delta: float | None = None
    n_sites: int = 1
    x_range: float = 1.0
    y_range: float | None = None
    neighbouring: str = "add_remove"
    xtx_sensitivity: str = "exact"
    aggregation: str = "independent"
    x_norm_bound: float | None = None

    def __post_init__(self):
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got "
                             f"{self.aggregation!r}")
        check_neighbouring(self.neighbouring)
        check_xtx_rule(self.xtx_sensitivity)
        object.__setattr__(self, "x_norm_bound", check_norm_bound(self.x_norm_bound))
        split = self.budget_split
        if split is None:
            split = default_budget_split(self.neighbouring)
        eps, bx, by, split = validate_privacy_parameters(self.epsilon, self.x_bound, self.y_bound,
                                                         split, neighbouring=self.neighbouring)
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "x_bound", bx)
        object.__setattr__(self, "y_bound", by)
        object.__setattr__(self, "budget_split", split)
        if self.delta is not None:
            delta = _positive("delta", self.delta)
            if delta >= 1:
                raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")
            object.__setattr__(self, "delta", delta)
        k = self.n_sites
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"n_sites must be an integer >= 1, got {k!r}")
        object.__setattr__(self, "n_sites", int(k))
        object.__setattr__(self, "x_range", _positive("x_range", self.x_range))
        if self.y_range is not None:
            object.__setattr__(self, "y_range", _positive("y_range", self.y_range))

    @property
    def delta_or_default(self) -> float:
        return DEFAULT_DELTA if self.delta is None else self.delta

    def require_y_range(self, method: str) -> float:
        if self.y_range is None:
            raise ValueError(f"{method} rescales y linearly into its bound and needs a public "
                             "y_range (bound on |y|); PrivacySetting.y_range is None")
        return self.y_range


@runtime_checkable
class Method(Protocol):
    """A comparison method. ``fit`` returns beta (d,) for predictions ``x @ beta``."""

    name: str
    private: bool

    def fit(self, data: TrainingData, setting: PrivacySetting, *, seed: int) -> np.ndarray:
        ...


def split_rows(n: int, n_sites: int) -> list[slice]:
    """The K contiguous, near-equal row blocks of the federated variant (``np.array_split``
    sizes); blocks that would be empty are left out (a site without rows releases nothing)."""
    sizes = [len(a) for a in np.array_split(np.arange(n), n_sites)]
    out, start = [], 0
    for s in sizes:
        if s:
            out.append(slice(start, start + s))
        start += s
    return out


def validate_posterior(posterior: str, draws: int) -> tuple[str, int]:
    if posterior not in POSTERIORS:
        raise ValueError(f"posterior must be one of {POSTERIORS}, got {posterior!r}")
    if isinstance(draws, bool) or not isinstance(draws, numbers.Integral) or draws < 1:
        raise ValueError(f"draws must be an integer >= 1, got {draws!r}")
    return posterior, int(draws)
