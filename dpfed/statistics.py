"""Sufficient statistics of linear regression and their lossless byte encoding.

The model of Honkela et al. (2018), eq. (4.1), depends on the data only through
``Sxx = X^T X``, ``Sxy = X^T y``, ``Syy = y^T y`` and ``n`` (method.md section 1). A
``Statistics`` value carries exactly these four quantities, from a private release, from
public data, or from a sum of both (``+``).
"""

from __future__ import annotations

import math
import numbers
import struct
from dataclasses import dataclass

import numpy as np

from dpfed.noise import EXACT, NoiseDescription

_MAGIC = b"DPST"
_VERSION = 1
# magic, version, d, n, then (d(d+1)/2 + d + 1) float64 little-endian.
_HEADER = struct.Struct("<4sHIQ")
MAX_DIMENSION = 4096


def encoded_length(d: int) -> int:
    """Bytes of the encoding of dimension ``d``: header, upper triangle of xtx, xty, yty."""
    return _HEADER.size + 8 * (d * (d + 1) // 2 + d + 1)


class StatisticsError(ValueError):
    """Raised for malformed statistics or an encoding that cannot be decoded."""


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float64, copy=True)
    a.setflags(write=False)
    return a


def summed_noise(a: NoiseDescription | None,
                 b: NoiseDescription | None) -> NoiseDescription | None:
    """The noise description of a sum of two statistics (``Statistics`` and
    ``dpfed.joint_statistics.JointStatistics``): unknown (None) when either part's is unknown,
    else the two added (``NoiseDescription.__add__``)."""
    return None if a is None or b is None else a + b


def radd_from_zero(self, other):
    """``__radd__`` of ``Statistics`` and ``dpfed.joint_statistics.JointStatistics``: lets
    sum() start from 0; any other left operand is NotImplemented."""
    if isinstance(other, int) and other == 0:
        return self
    return NotImplemented


@dataclass(frozen=True, eq=False)
class Statistics:
    """Immutable sufficient statistics ``(xtx, xty, yty, n)`` of one or more data sets.

    ``xtx`` must be symmetric bit for bit (the release mirrors its upper triangle), every
    value finite and ``n`` a non-negative integer. Adding two values sums every field, which
    is how the aggregator combines sites and public data (method.md section 3).

    ``noise`` is the public description of the privacy noise in the values
    (``dpfed.noise``): ``EXACT`` for exact statistics, a description with terms for a
    release, ``None`` when unknown (the default, so that nothing is taken for exact by
    accident). ``+`` adds descriptions; unknown plus anything is unknown. Equality and the
    hash compare the values and n only; the encoding (``to_bytes``) carries no description
    (it travels beside the signed statistics, in the Contribution).
    """

    xtx: np.ndarray
    xty: np.ndarray
    yty: float
    n: int
    noise: NoiseDescription | None = None

    def __post_init__(self) -> None:
        try:
            xtx = _readonly(self.xtx)
            xty = _readonly(self.xty)
            yty = float(self.yty)
        except (TypeError, ValueError) as exc:
            raise StatisticsError(f"statistics must be numeric: {exc}") from exc
        if isinstance(self.yty, (bool, np.bool_)) or np.ndim(self.yty) != 0:
            raise StatisticsError(f"yty must be a scalar number, got {self.yty!r}")
        if xtx.ndim != 2 or xtx.shape[0] != xtx.shape[1]:
            raise StatisticsError(f"xtx must be a square matrix, got shape {xtx.shape}")
        d = xtx.shape[0]
        if d < 1 or d > MAX_DIMENSION:
            raise StatisticsError(f"dimension must be in [1, {MAX_DIMENSION}], got {d}")
        if xty.shape != (d,):
            raise StatisticsError(f"xty must have shape ({d},), got {xty.shape}")
        if not (np.all(np.isfinite(xtx)) and np.all(np.isfinite(xty)) and np.isfinite(yty)):
            raise StatisticsError("statistics contain NaN or infinite values")
        if not np.array_equal(xtx, xtx.T):
            raise StatisticsError("xtx must be exactly symmetric")
        n = self.n
        integral = isinstance(n, numbers.Integral) or (
            isinstance(n, (float, np.floating)) and math.isfinite(n) and float(n).is_integer())
        if isinstance(n, (bool, np.bool_)) or not integral or not 0 <= n < 2**63:
            raise StatisticsError(f"n must be a non-negative integer, got {self.n!r}")
        object.__setattr__(self, "xtx", xtx)
        object.__setattr__(self, "xty", xty)
        object.__setattr__(self, "yty", yty)
        object.__setattr__(self, "n", int(self.n))
        if self.noise is not None and not isinstance(self.noise, NoiseDescription):
            raise StatisticsError("noise must be a dpfed.noise.NoiseDescription or None")

    def with_noise(self, noise: NoiseDescription | None) -> "Statistics":
        """The same values with another noise description."""
        return Statistics(self.xtx, self.xty, self.yty, self.n, noise)

    def in_y_units(self, unit: float) -> "Statistics":
        """The statistics of the same rows with the response measured in ``unit`` (y / unit):
        Sxy / unit, Syy / unit^2, Sxx and n unchanged, the noise description scaled alike."""
        unit = float(unit)
        if not (math.isfinite(unit) and unit > 0):
            raise StatisticsError(f"the response unit must be finite and > 0, got {unit!r}")
        noise = None if self.noise is None else self.noise.scaled(xty=1 / unit,
                                                                 yty=1 / unit ** 2)
        return Statistics(self.xtx, self.xty / unit, self.yty / unit ** 2, self.n, noise)

    @property
    def is_exact(self) -> bool:
        """True only when the statistics are *known* to be exact (``noise`` is ``EXACT``)."""
        return self.noise is not None and self.noise.is_exact

    @property
    def dim(self) -> int:
        return self.xtx.shape[0]

    @classmethod
    def zeros(cls, d: int) -> "Statistics":
        """Exact statistics of no rows."""
        return cls(np.zeros((d, d)), np.zeros(d), 0.0, 0, EXACT)

    def __add__(self, other: "Statistics") -> "Statistics":
        if not isinstance(other, Statistics):
            return NotImplemented
        if other.dim != self.dim:
            raise StatisticsError(f"cannot add statistics of dimension {self.dim} and {other.dim}")
        noise = summed_noise(self.noise, other.noise)
        return Statistics(self.xtx + other.xtx, self.xty + other.xty, self.yty + other.yty,
                          self.n + other.n, noise)

    __radd__ = radd_from_zero

    def __eq__(self, other) -> bool:
        if not isinstance(other, Statistics):
            return NotImplemented
        return (self.n == other.n and self.dim == other.dim
                and np.array_equal(self.xtx, other.xtx) and np.array_equal(self.xty, other.xty)
                and self.yty == other.yty)

    def __hash__(self) -> int:
        # Consistent with __eq__: 0.0 == -0.0 but their bytes differ, so normalise (x + 0.0
        # maps -0.0 to 0.0 and leaves every other value unchanged).
        return hash((self.n, (self.xtx + 0.0).tobytes(), (self.xty + 0.0).tobytes(),
                     self.yty + 0.0))

    def __repr__(self) -> str:
        noise = "unknown" if self.noise is None else self.noise.summary()
        return f"Statistics(dim={self.dim}, n={self.n}, yty={self.yty:.6g}, noise={noise})"

    # Wire encoding: the upper triangle of xtx (row-major), xty, yty as little-endian
    # float64. Lossless because xtx is exactly symmetric; about half the bytes of the full
    # matrix, and independent of protobuf's serialisation so it can be signed.
    def to_bytes(self) -> bytes:
        body = self.upper_values().astype("<f8")
        return _HEADER.pack(_MAGIC, _VERSION, self.dim, self.n) + body.tobytes()

    def upper_values(self) -> np.ndarray:
        """The d(d+1)/2 + d + 1 numbers that determine the value besides n: the upper
        triangle of xtx (row-major), xty, yty. The body of the encoding, and the vector the
        aggregator sums."""
        return np.concatenate([self.xtx[np.triu_indices(self.dim)], self.xty, [self.yty]])

    @classmethod
    def from_upper(cls, d: int, n: int, values, noise: NoiseDescription | None = None
                   ) -> "Statistics":
        """Inverse of ``upper_values``: xtx is rebuilt by mirroring the upper triangle
        (assigned, not added, so every value including a signed zero is kept bit for bit)."""
        values = np.asarray(values, dtype=np.float64)
        m = d * (d + 1) // 2
        if values.shape != (m + d + 1,):
            raise StatisticsError(f"statistics of dimension {d} have {m + d + 1} values, "
                                  f"got shape {values.shape}")
        xtx = np.empty((d, d))
        iu = np.triu_indices(d)
        xtx[iu] = values[:m]
        xtx.T[iu] = values[:m]
        return cls(xtx, values[m:m + d], float(values[-1]), n, noise)

    @classmethod
    def from_bytes(cls, data: bytes, noise: NoiseDescription | None = None) -> "Statistics":
        """Decode; the encoding carries no noise description, so pass it (default unknown)."""
        d, n = decode_header(data)
        return cls.from_upper(d, n, encoded_values(data), noise)


def decode_header(data: bytes) -> tuple[int, int]:
    """``(d, n)`` of an encoding, after checking magic, version, dimension range and that the
    length matches d. Cheap: the values are not read (``encoded_values`` does that)."""
    if len(data) < _HEADER.size:
        raise StatisticsError("encoded statistics are too short")
    magic, version, d, n = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise StatisticsError("not an encoded Statistics value (bad magic)")
    if version != _VERSION:
        raise StatisticsError(f"unsupported Statistics encoding version {version}")
    if d < 1 or d > MAX_DIMENSION:
        raise StatisticsError(f"dimension {d} out of range")
    if len(data) != encoded_length(d):
        raise StatisticsError(f"encoded statistics of dimension {d} must be "
                              f"{encoded_length(d)} bytes, got {len(data)}")
    return int(d), int(n)


def encoded_values(data: bytes) -> np.ndarray:
    """The ``upper_values`` of an encoding whose header ``decode_header`` accepted, as a
    read-only float64 view of ``data`` (no copy; finiteness is the caller's to check)."""
    return np.frombuffer(data, dtype="<f8", offset=_HEADER.size)


def validate_shapes(x, y) -> tuple[np.ndarray, np.ndarray]:
    """``validate_data`` without the finiteness scan: types and shapes only. For callers that
    check finiteness themselves while streaming over the rows (``site_node.release``)."""
    try:
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"x and y must be arrays of numbers: {exc}") from exc
    if x.ndim != 2:
        raise ValueError(f"x must be a 2-D array (n rows x d features), got {x.ndim} dimension(s)")
    if y.ndim != 1:
        raise ValueError(f"y must be a 1-D array, got {y.ndim} dimension(s)")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows but y has {y.shape[0]} values")
    if x.shape[0] == 0:
        raise ValueError("no data: n = 0 rows")
    if x.shape[1] == 0:
        raise ValueError("x has no feature columns (d = 0)")
    return x, y


def non_finite_error(x: np.ndarray, y: np.ndarray, row_offset: int = 0) -> ValueError | None:
    """The ValueError for the first NaN/inf in ``x`` or ``y`` (rows numbered from
    ``row_offset``), or None if every value is finite."""
    if not np.all(np.isfinite(x)):
        bad = np.argwhere(~np.isfinite(x))[0]
        return ValueError(f"x contains NaN or infinite values (first at row {bad[0] + row_offset}, "
                          f"column {bad[1]})")
    if not np.all(np.isfinite(y)):
        bad = int(np.flatnonzero(~np.isfinite(y))[0])
        return ValueError(f"y contains NaN or infinite values (first at row {bad + row_offset})")
    return None


def validate_data(x, y) -> tuple[np.ndarray, np.ndarray]:
    """Return ``x`` (n x d) and ``y`` (n,) as float64 arrays, or raise a clear ValueError."""
    x, y = validate_shapes(x, y)
    error = non_finite_error(x, y)
    if error is not None:
        raise error
    return x, y


def symmetric_gram(x: np.ndarray) -> np.ndarray:
    """``x^T x`` with its lower triangle mirrored from the upper one (exactly symmetric)."""
    g = x.T @ x
    return np.triu(g) + np.triu(g, 1).T


def exact_statistics(x, y) -> Statistics:
    """Exact (noise-free) statistics of *public* data. Never use on private data."""
    x, y = validate_data(x, y)
    return Statistics(symmetric_gram(x), x.T @ y, float(y @ y), x.shape[0], EXACT)


def clipped_exact_statistics(x, y, x_bound: float, y_bound: float,
                             x_norm_bound: float | None = None) -> Statistics:
    """Exact statistics of rows clipped like a release clips them (every feature to
    [-x_bound, x_bound], then, with ``x_norm_bound`` R, each row scaled into the L2 ball of
    radius R; the target to [-y_bound, y_bound]), with no noise (``EXACT``). For *public*
    rows that are to be fitted together with a release of the same bounds."""
    x, y = validate_data(x, y)
    return exact_statistics(clipped_features(x, x_bound, x_norm_bound),
                            np.clip(y, -y_bound, y_bound))


def clipped_features(x: np.ndarray, x_bound: float, x_norm_bound: float | None = None
                     ) -> np.ndarray:
    """A clipped copy of finite features ``x`` (n x d): every value to [-x_bound, x_bound],
    then with ``x_norm_bound`` R every row longer than R scaled to R (1 - 1e-12), so it is
    inside the ball in floating point too (what ``site_node.release`` does block by block)."""
    z = np.clip(x, -x_bound, x_bound)
    if x_norm_bound is not None:
        norms = np.sqrt(np.einsum("ij,ij->i", z, z))
        over = norms > x_norm_bound
        z[over] *= (x_norm_bound * (1.0 - 1e-12) / norms[over])[:, None]
    return z


def realisable(stats: Statistics, rel_tol: float = 1e-9) -> bool:
    """Whether ``stats`` can be the exact statistics of some rows: the augmented Gram matrix
    [[Sxx, Sxy], [Sxy^T, Syy]] = sum of z z^T over rows z = (x, y) is positive semidefinite
    (up to ``rel_tol`` of its largest entry). A noisy release usually is not."""
    d = stats.dim
    g = np.empty((d + 1, d + 1))
    g[:d, :d] = stats.xtx
    g[:d, d] = g[d, :d] = stats.xty
    g[d, d] = stats.yty
    scale = max(1.0, float(np.max(np.abs(g))))
    return bool(np.linalg.eigvalsh(g)[0] >= -rel_tol * scale)
