"""The public pre-processing step applied before a release (method.md section 2, step 1).

GDSC recipe of Honkela et al. (2018), section 4.4: keep the chosen features, centre each
feature, scale each row to unit L2 norm, centre y. Every parameter that depends on data
(the feature means, the target mean, the column scales) is a *public input* here: it comes
from public data (``Preprocessing.from_public_data``) or from a differentially private estimate
whose epsilon is charged to the site. Row normalisation uses one row at a time and so is part
of the per-record mechanism; it needs no parameter.

**Column scales** (``x_scale``, issue 21). After centring, each feature is divided by a public
scale (empty: 1 for every column). The release clips every coordinate to the same box
[-Bx, Bx] (and a normalised row to the unit ball) and adds noise of the same scale to every
entry of X^T X, so a continuous column measured in small units (wine's density: sd 0.002,
beside total sulfur dioxide: sd 33) has X^T X entries far below the noise and its coefficient
cannot be learnt, however large n is; after row normalisation in raw units such a column is
nearly zero in every row. ``from_public_data(scale_columns=True)`` divides each *non-binary*
column by its public standard deviation (binary 0/1 columns, constant columns and columns with
fewer than two public rows keep 1, so the bundled GDSC features are unchanged). Measured with
``benchmarks/large_n.py`` (docs/evaluation.md, "Large n"): private / non-private at n = 15,737,
eps 2, from 0.81-0.86 to 1.00 on UCI wine and airfoil.
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
    #: public divisor of each centred feature (module docstring); () means 1 for every column
    x_scale: tuple[float, ...] = ()

    def __post_init__(self):
        x_mean = tuple(float(v) for v in self.x_mean)
        if not all(np.isfinite(x_mean)) or not np.isfinite(self.y_mean):
            raise ValueError("pre-processing means must be finite")
        x_scale = tuple(float(v) for v in self.x_scale)
        if x_scale and len(x_scale) != len(x_mean):
            raise ValueError(f"pre-processing has {len(x_scale)} column scales for "
                             f"{len(x_mean)} features")
        if not all(math.isfinite(v) and v > 0 for v in x_scale):
            raise ValueError("pre-processing column scales must be finite and > 0")
        if all(v == 1.0 for v in x_scale):
            x_scale = ()
        object.__setattr__(self, "x_mean", x_mean)
        object.__setattr__(self, "y_mean", float(self.y_mean))
        object.__setattr__(self, "x_scale", x_scale)

    @property
    def dim(self) -> int:
        return len(self.x_mean)

    @classmethod
    def identity(cls, d: int) -> "Preprocessing":
        return cls(x_mean=(0.0,) * d, y_mean=0.0, normalize_rows=False, source="identity")

    @classmethod
    def from_public_data(cls, x, y, *, normalize_rows: bool = True,
                         scale_columns: bool = False) -> "Preprocessing":
        """Means from public (non-private) rows only. Never call this on private data.
        ``scale_columns``: also divide each non-binary column by its public standard deviation
        (``public_column_scales``; module docstring)."""
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] == 0 or y.shape != (x.shape[0],):
            raise ValueError("public data must be n x d features and n targets with n >= 1")
        scale = public_column_scales(x) if scale_columns else ()
        return cls(tuple(x.mean(axis=0)), float(y.mean()), normalize_rows, source="public",
                   x_scale=scale)

    def centred(self, x) -> np.ndarray:
        """The features centred by the public means and divided by the public column scales,
        before the checks and the row normalisation of ``transform_x`` (non-finite results
        kept: site_node.rows uses them to leave such rows out)."""
        with np.errstate(over="ignore", invalid="ignore"):
            z = np.asarray(x, dtype=np.float64) - np.asarray(self.x_mean, dtype=np.float64)
            if self.x_scale:
                z = z / np.asarray(self.x_scale, dtype=np.float64)
        return z

    def transform_x(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"expected {self.dim} feature columns, got shape {x.shape}")
        z = self.centred(x)
        with np.errstate(over="ignore", invalid="ignore"):
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
        obj = {"x_mean": list(self.x_mean), "y_mean": self.y_mean,
               "normalize_rows": self.normalize_rows, "source": self.source}
        if self.x_scale:   # absent when every scale is 1 (the JSON of before issue 21)
            obj["x_scale"] = list(self.x_scale)
        return json.dumps(obj, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Preprocessing":
        obj = json.loads(text)
        return cls(tuple(obj["x_mean"]), obj["y_mean"], bool(obj["normalize_rows"]),
                   obj.get("source", "public"), x_scale=tuple(obj.get("x_scale", ())))


def public_column_scales(x_public) -> tuple[float, ...]:
    """Public divisor of each feature column (``Preprocessing.x_scale``): the sample standard
    deviation (ddof 1) of a non-binary column of the *public* rows; 1 for a column whose public
    values are all 0 or 1 (binary indicators keep their unit: the GDSC features), for a
    constant column and with fewer than two rows. Never pass private rows."""
    x = np.asarray(x_public, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError("public features must be a 2-d array")
    out = []
    for col in x.T:
        sd = float(np.std(col, ddof=1)) if col.size >= 2 else 0.0
        binary = bool(np.all((col == 0) | (col == 1)))
        out.append(sd if (not binary and math.isfinite(sd) and sd > 0) else 1.0)
    return tuple(out)


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
