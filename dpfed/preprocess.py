"""The public pre-processing step applied before a release (method.md section 2, step 1).

GDSC recipe of Honkela et al. (2018), section 4.4: keep the chosen features, centre each
feature, scale each row to unit L2 norm, centre y. Every parameter that depends on data
(the feature means, the target mean) is a *public input* here: it comes from public data
(``Preprocessing.from_public_data``) or from a differentially private estimate whose epsilon
is charged to the site. Row normalisation uses one row at a time and so is part of the
per-record mechanism; it needs no parameter.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)


class NonFiniteRow(ValueError):
    """Pre-processing a row gave a non-finite number (an overflow such as a feature value of
    1e300 whose row norm is inf, or a NaN/inf input). ``row`` is its 0-based index in the
    array; the message names the row, never a value. Nothing may be released from such data:
    before this error the row silently became zeros (issue 11, finding 6)."""

    def __init__(self, row: int, what: str):
        super().__init__(f"row {row + 1}: pre-processing the {what} gives a non-finite number "
                         "(overflow, or a NaN/inf value)")
        self.row = row
        self.what = what


def _first_bad_row(a: np.ndarray) -> int | None:
    bad = ~np.isfinite(a)
    if a.ndim == 2:
        bad = bad.any(axis=1)
    rows = np.flatnonzero(bad)
    return int(rows[0]) if rows.size else None


@dataclass(frozen=True)
class Preprocessing:
    """Public parameters of the pre-processing: feature means, target mean, row scaling."""

    x_mean: tuple[float, ...]
    y_mean: float = 0.0
    normalize_rows: bool = True
    source: str = field(default="public", compare=False)

    def __post_init__(self):
        x_mean = tuple(float(v) for v in self.x_mean)
        if not all(np.isfinite(x_mean)) or not np.isfinite(self.y_mean):
            raise ValueError("pre-processing means must be finite")
        object.__setattr__(self, "x_mean", x_mean)
        object.__setattr__(self, "y_mean", float(self.y_mean))

    @property
    def dim(self) -> int:
        return len(self.x_mean)

    @classmethod
    def identity(cls, d: int) -> "Preprocessing":
        return cls(x_mean=(0.0,) * d, y_mean=0.0, normalize_rows=False, source="identity")

    @classmethod
    def from_public_data(cls, x, y, *, normalize_rows: bool = True) -> "Preprocessing":
        """Means from public (non-private) rows only. Never call this on private data."""
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] == 0 or y.shape != (x.shape[0],):
            raise ValueError("public data must be n x d features and n targets with n >= 1")
        return cls(tuple(x.mean(axis=0)), float(y.mean()), normalize_rows, source="public")

    def transform_x(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"expected {self.dim} feature columns, got shape {x.shape}")
        with np.errstate(over="ignore", invalid="ignore"):
            z = x - np.asarray(self.x_mean)
            bad = _first_bad_row(z)
            if bad is not None:
                raise NonFiniteRow(bad, "features")
            if self.normalize_rows:
                norms = np.sqrt(np.einsum("ij,ij->i", z, z))
                bad = _first_bad_row(norms)
                if bad is not None:   # the squared norm overflowed: the row would become 0
                    raise NonFiniteRow(bad, "features (row norm)")
                # A row equal to the public mean has no direction: leave it at zero.
                z = np.divide(z, norms[:, None], out=np.zeros_like(z), where=norms[:, None] > 0)
        return z

    def transform_y(self, y) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            v = np.asarray(y, dtype=np.float64) - self.y_mean
        bad = _first_bad_row(v)
        if bad is not None:
            raise NonFiniteRow(bad, "target")
        return v

    def apply(self, x, y) -> tuple[np.ndarray, np.ndarray]:
        return self.transform_x(x), self.transform_y(y)

    def to_json(self) -> str:
        return json.dumps({"x_mean": list(self.x_mean), "y_mean": self.y_mean,
                           "normalize_rows": self.normalize_rows, "source": self.source},
                          sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Preprocessing":
        obj = json.loads(text)
        return cls(tuple(obj["x_mean"]), obj["y_mean"], bool(obj["normalize_rows"]),
                   obj.get("source", "public"))


def public_sigmas(x_public, y_public, preprocessing: Preprocessing) -> tuple[float, float]:
    """``(sigma_x, sigma_y)``: the scales of the clipping thresholds (B_x = omega_x sigma_x,
    B_y = omega_y sigma_y; dpfed.bounds) from *public* rows after ``preprocessing``.

    sigma_x is the pooled standard deviation of all pre-processed features; sigma_y the sample
    standard deviation (ddof 1) of the centred target. Never pass private rows: the result
    scales the thresholds and is not protected.

    Malformed public data (shapes, NaN or infinite values) raise ValueError. Public data that
    cannot say fall back, with a warning: sigma_x to 1/sqrt(d) (exact for row-normalised rows,
    whose pooled root mean square is 1/sqrt(d)) when there are no rows or all sit at the mean;
    sigma_y to 1 with fewer than two rows or a constant target. ``x_public`` may have zero rows
    (a round without public data).
    """
    if not isinstance(preprocessing, Preprocessing):
        raise TypeError("public_sigmas(x_public, y_public, preprocessing): the third argument "
                        f"must be a Preprocessing, got {type(preprocessing).__name__}")
    d = preprocessing.dim
    x = np.asarray(x_public, dtype=np.float64)
    y = np.asarray(y_public, dtype=np.float64)
    if x.size == 0 and y.size == 0:          # no public rows, in whatever shape
        x, y = x.reshape(0, d), y.reshape(0)
    if x.ndim != 2 or x.shape[1] != d or y.shape != (x.shape[0],):
        raise ValueError(f"public data must be n x {d} features and n targets, got "
                         f"{x.shape} and {y.shape}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("public data contain NaN or infinite values")
    z, yc = preprocessing.apply(x, y)
    sigma_x = float(np.std(z)) if z.size else 0.0
    if not (math.isfinite(sigma_x) and sigma_x > 0):
        sigma_x = 1.0 / math.sqrt(d)
        log.warning("public data give no feature scale (%d rows); sigma_x = 1/sqrt(d) = %.4g",
                    x.shape[0], sigma_x)
    sigma_y = float(np.std(yc, ddof=1)) if yc.size >= 2 else 0.0
    if not (math.isfinite(sigma_y) and sigma_y > 0):
        sigma_y = 1.0
        log.warning("public data give no target scale (%d rows, or a constant target); "
                    "sigma_y = 1", y.size)
    return sigma_x, sigma_y
