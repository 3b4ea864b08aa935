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
from dataclasses import dataclass, field

import numpy as np


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
