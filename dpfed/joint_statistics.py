"""Sufficient statistics of m regressions that share their features (issue 23; method.md 13).

A joint round fits m responses (drugs) on the same d features. X^T X does not depend on the
response, so it is computed, released and summed once (Neel 2023, PRIMO); per target j the
round carries Sxy_j = X_j^T y_j, Syy_j = y_j^T y_j and n_j over the rows that *have* response j
(GDSC fills 82 % of the line x drug matrix). ``JointStatistics`` holds

    Sxx (d x d, over the n_x rows whose features enter) | n_x | Sxy_1..m | Syy_1..m | n_1..m

which is the vector of ``dpfed.joint_sensitivity`` (``JointLayout(d, m, include_n=True)``):
``to_vector`` / ``from_vector`` use exactly that order, so the sensitivities proved there are
the sensitivities of what is released and summed. The counts are released too (add/remove
neighbours: a count is a private fact, method.md section 9).

``noise`` follows ``dpfed.statistics.Statistics``: EXACT for public statistics, a description
for a release, None when unknown. Its parts cover every target at once: ``xtx`` each upper
entry of Sxx, ``xty`` each entry of every Sxy_j, ``yty`` every Syy_j, ``n`` n_x and every n_j
(every response is standardised by its public ``TargetSpec`` before clipping, so one bound and
one law per part serve all targets). What one target's fit sees is ``dpfed.joint_targets``.

``PublicTargets``: the exact statistics of the public rows, one ``Statistics`` per target over
the public rows that have that response (public rows are exact, so each target gets its own
exact Sxx; nothing needs the missing-response model there).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from dpfed.joint_sensitivity import JointLayout
from dpfed.noise import EXACT, NoiseDescription
from dpfed.statistics import (MAX_DIMENSION, Statistics, StatisticsError, clipped_features,
                              radd_from_zero, summed_noise, symmetric_gram)

__all__ = ["JointStatistics", "JointStatisticsError", "joint_exact_statistics",
           "PublicTargets", "public_targets", "MAX_TARGETS"]

_MAGIC = b"DPJT"
_VERSION = 1
# magic, version, d, m, n_x; then m uint64 counts, then float64 values (little-endian).
_HEADER = struct.Struct("<4sHIIQ")
#: At most this many targets in one round (GDSC has 262; the bound keeps a hostile header from
#: asking for an absurd allocation before the length check).
MAX_TARGETS = 100_000


class JointStatisticsError(StatisticsError):
    """Malformed joint statistics or an encoding that cannot be decoded."""


def _readonly(a, dtype=np.float64) -> np.ndarray:
    out = np.array(a, dtype=dtype, copy=True)
    out.setflags(write=False)
    return out


def _count(value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise JointStatisticsError(f"{name} must be a non-negative integer")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise JointStatisticsError(f"{name} must be a non-negative integer") from None
    if not (math.isfinite(f) and f.is_integer() and 0 <= f < 2 ** 63):
        raise JointStatisticsError(f"{name} must be a non-negative integer")
    return int(f)


@dataclass(frozen=True, eq=False)
class JointStatistics:
    """Immutable statistics of m targets sharing one Sxx (module docstring)."""

    xtx: np.ndarray
    n_x: int
    xty: np.ndarray
    yty: np.ndarray
    n: np.ndarray
    noise: NoiseDescription | None = None

    def __post_init__(self) -> None:
        try:
            xtx = _readonly(self.xtx)
            xty = _readonly(self.xty)
            yty = _readonly(self.yty)
        except (TypeError, ValueError) as exc:
            raise JointStatisticsError(f"joint statistics must be numeric: {exc}") from None
        if xtx.ndim != 2 or xtx.shape[0] != xtx.shape[1]:
            raise JointStatisticsError(f"xtx must be a square matrix, got shape {xtx.shape}")
        d = xtx.shape[0]
        if not 1 <= d <= MAX_DIMENSION:
            raise JointStatisticsError(f"dimension must be in [1, {MAX_DIMENSION}], got {d}")
        if xty.ndim != 2 or xty.shape[1] != d or not 1 <= xty.shape[0] <= MAX_TARGETS:
            raise JointStatisticsError(f"xty must have shape (m, {d}) with 1 <= m <= "
                                       f"{MAX_TARGETS}, got {xty.shape}")
        m = xty.shape[0]
        if yty.shape != (m,):
            raise JointStatisticsError(f"yty must have shape ({m},), got {yty.shape}")
        counts = np.asarray(self.n)
        if counts.shape != (m,):
            raise JointStatisticsError(f"n must have shape ({m},), got {counts.shape}")
        n = np.array([_count(c, "every n_j") for c in counts.tolist()], dtype=np.int64)
        n.setflags(write=False)
        if not (np.all(np.isfinite(xtx)) and np.all(np.isfinite(xty))
                and np.all(np.isfinite(yty))):
            raise JointStatisticsError("joint statistics contain NaN or infinite values")
        if not np.array_equal(xtx, xtx.T):
            raise JointStatisticsError("xtx must be exactly symmetric")
        if self.noise is not None and not isinstance(self.noise, NoiseDescription):
            raise JointStatisticsError("noise must be a dpfed.noise.NoiseDescription or None")
        for name, value in (("xtx", xtx), ("xty", xty), ("yty", yty), ("n", n)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "n_x", _count(self.n_x, "n_x"))

    @property
    def dim(self) -> int:
        return self.xtx.shape[0]

    @property
    def targets(self) -> int:
        return self.xty.shape[0]

    @property
    def layout(self) -> JointLayout:
        return JointLayout(self.dim, self.targets, include_n=True)

    @property
    def is_exact(self) -> bool:
        return self.noise is not None and self.noise.is_exact

    def with_noise(self, noise: NoiseDescription | None) -> "JointStatistics":
        return JointStatistics(self.xtx, self.n_x, self.xty, self.yty, self.n, noise)

    @classmethod
    def zeros(cls, d: int, m: int) -> "JointStatistics":
        """Exact statistics of no rows."""
        return cls(np.zeros((d, d)), 0, np.zeros((m, d)), np.zeros(m),
                   np.zeros(m, dtype=np.int64), EXACT)

    def __add__(self, other: "JointStatistics") -> "JointStatistics":
        if not isinstance(other, JointStatistics):
            return NotImplemented
        if (other.dim, other.targets) != (self.dim, self.targets):
            raise JointStatisticsError(
                f"cannot add joint statistics of (d, m) = ({self.dim}, {self.targets}) and "
                f"({other.dim}, {other.targets})")
        noise = summed_noise(self.noise, other.noise)
        return JointStatistics(self.xtx + other.xtx, self.n_x + other.n_x,
                               self.xty + other.xty, self.yty + other.yty,
                               self.n + other.n, noise)

    __radd__ = radd_from_zero

    def __eq__(self, other) -> bool:
        if not isinstance(other, JointStatistics):
            return NotImplemented
        return ((self.dim, self.targets, self.n_x) == (other.dim, other.targets, other.n_x)
                and np.array_equal(self.n, other.n) and np.array_equal(self.xtx, other.xtx)
                and np.array_equal(self.xty, other.xty) and np.array_equal(self.yty, other.yty))

    __hash__ = None  # mutable-looking arrays inside; compare with ==

    def __repr__(self) -> str:
        noise = "unknown" if self.noise is None else self.noise.summary()
        return (f"JointStatistics(dim={self.dim}, targets={self.targets}, n_x={self.n_x}, "
                f"noise={noise})")

    # -- the vector of dpfed.joint_sensitivity (what is released, masked and summed) --------
    def to_vector(self) -> np.ndarray:
        """[Sxx upper triangle (row-major) | n_x | Sxy_1 .. Sxy_m | Syy_1 .. Syy_m | n_1 .. n_m]
        as float64 (``JointLayout(d, m, include_n=True)``)."""
        iu = np.triu_indices(self.dim)
        return np.concatenate([self.xtx[iu], [float(self.n_x)], self.xty.ravel(), self.yty,
                               self.n.astype(np.float64)])

    @classmethod
    def from_vector(cls, d: int, m: int, vector, noise: NoiseDescription | None = None
                    ) -> "JointStatistics":
        """Inverse of ``to_vector``; the counts must be non-negative integers (round and clamp
        a noisy count before, as post-processing)."""
        layout = JointLayout(int(d), int(m), include_n=True)
        v = np.asarray(vector, dtype=np.float64)
        if v.shape != (layout.size,):
            raise JointStatisticsError(f"a joint vector of (d, m) = ({d}, {m}) has "
                                       f"{layout.size} values, got shape {v.shape}")
        s = layout.slices()
        xtx = np.empty((d, d))
        iu = np.triu_indices(d)
        xtx[iu] = v[s["xtx"]]
        xtx.T[iu] = v[s["xtx"]]
        return cls(xtx, v[s["n_x"]][0], v[s["xty"]].reshape(m, d), v[s["yty"]], v[s["n"]],
                   noise)

    # -- wire encoding: signed by the site, independent of protobuf -------------------------
    def to_bytes(self) -> bytes:
        iu = np.triu_indices(self.dim)
        body = np.concatenate([self.xtx[iu], self.xty.ravel(), self.yty]).astype("<f8")
        return (_HEADER.pack(_MAGIC, _VERSION, self.dim, self.targets, self.n_x)
                + self.n.astype("<u8").tobytes() + body.tobytes())

    @staticmethod
    def encoded_length(d: int, m: int) -> int:
        return _HEADER.size + 8 * m + 8 * (d * (d + 1) // 2 + m * d + m)

    @classmethod
    def decode_header(cls, data: bytes) -> tuple[int, int]:
        """(d, m) of an encoding after checking magic, version, ranges and the exact length."""
        if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < _HEADER.size:
            raise JointStatisticsError("encoded joint statistics are too short")
        magic, version, d, m, _ = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise JointStatisticsError("not an encoded JointStatistics value (bad magic)")
        if version != _VERSION:
            raise JointStatisticsError(f"unsupported JointStatistics encoding version {version}")
        if not 1 <= d <= MAX_DIMENSION or not 1 <= m <= MAX_TARGETS:
            raise JointStatisticsError("dimension or number of targets out of range")
        if len(data) != cls.encoded_length(d, m):
            raise JointStatisticsError(f"encoded joint statistics of (d, m) = ({d}, {m}) must "
                                       f"be {cls.encoded_length(d, m)} bytes, got {len(data)}")
        return int(d), int(m)

    @classmethod
    def from_bytes(cls, data: bytes, noise: NoiseDescription | None = None
                   ) -> "JointStatistics":
        """Decode; the encoding carries no noise description (it travels beside it)."""
        d, m = cls.decode_header(data)
        n_x = _HEADER.unpack_from(data)[4]
        counts = np.frombuffer(data, dtype="<u8", count=m, offset=_HEADER.size)
        if np.any(counts >= 2 ** 63):
            raise JointStatisticsError("a count is out of range")
        values = np.frombuffer(data, dtype="<f8", offset=_HEADER.size + 8 * m)
        k = d * (d + 1) // 2
        xtx = np.empty((d, d))
        iu = np.triu_indices(d)
        xtx[iu] = values[:k]
        xtx.T[iu] = values[:k]
        return cls(xtx, n_x, values[k:k + m * d].reshape(m, d), values[k + m * d:],
                   counts.astype(np.int64), noise)


def _responses(x, y) -> tuple[np.ndarray, np.ndarray]:
    """x (n, d) finite, y (n, m) finite or NaN (missing). ValueError naming no value."""
    try:
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"x and y must be arrays of numbers: {exc}") from None
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"x must be a 2-D array (n rows x d >= 1 features), got shape {x.shape}")
    if y.ndim != 2 or y.shape[1] < 1:
        raise ValueError(f"y must be a 2-D array (n rows x m >= 1 targets), got shape {y.shape}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows but y has {y.shape[0]}")
    if not np.all(np.isfinite(x)):
        bad = np.argwhere(~np.isfinite(x))[0]
        raise ValueError(f"x contains NaN or infinite values (first at row {bad[0]}, "
                         f"column {bad[1]})")
    if np.any(np.isinf(y)):
        bad = np.argwhere(np.isinf(y))[0]
        raise ValueError(f"y contains infinite values (first at row {bad[0]}, target {bad[1]}); "
                         f"a missing response is NaN")
    return x, y


def joint_exact_statistics(x, y, x_bound: float, y_bound: float,
                           x_norm_bound: float | None = None) -> JointStatistics:
    """Exact (noise-free, ``EXACT``) joint statistics of rows clipped as a release clips them:
    features to [-x_bound, x_bound] then into the ball of radius ``x_norm_bound`` (if given),
    every present response to [-y_bound, y_bound]; ``y`` (n, m) has NaN for a missing response,
    which contributes nothing to its target (eq. J1 of ``dpfed.joint_sensitivity``). Sxy of
    all targets is one matrix product (missing responses zeroed)."""
    x, y = _responses(x, y)
    z = clipped_features(x, float(x_bound), x_norm_bound)
    present = ~np.isnan(y)
    w = np.where(present, np.clip(y, -float(y_bound), float(y_bound)), 0.0)
    return JointStatistics(symmetric_gram(z), z.shape[0], (z.T @ w).T,
                           np.einsum("ij,ij->j", w, w), present.sum(axis=0), EXACT)


_PUBLIC_MAGIC = b"DPPT"
_PUBLIC_HEADER = struct.Struct("<4sHI")


@dataclass(frozen=True)
class PublicTargets:
    """Exact statistics of the public rows, one per target (module docstring)."""

    targets: tuple[Statistics, ...]

    def __post_init__(self):
        items = tuple(self.targets)
        if not items or len(items) > MAX_TARGETS:
            raise JointStatisticsError("public statistics need 1 .. MAX_TARGETS targets")
        if not all(isinstance(s, Statistics) and s.is_exact for s in items):
            raise JointStatisticsError("public statistics must be exact Statistics values")
        if len({s.dim for s in items}) != 1:
            raise JointStatisticsError("every target's public statistics must have one dimension")
        object.__setattr__(self, "targets", items)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, j: int) -> Statistics:
        return self.targets[j]

    @property
    def dim(self) -> int:
        return self.targets[0].dim

    def to_bytes(self) -> bytes:
        parts = [_PUBLIC_HEADER.pack(_PUBLIC_MAGIC, _VERSION, len(self.targets))]
        parts += [s.to_bytes() for s in self.targets]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> "PublicTargets":
        from dpfed.statistics import encoded_length
        if len(data) < _PUBLIC_HEADER.size:
            raise JointStatisticsError("encoded public targets are too short")
        magic, version, m = _PUBLIC_HEADER.unpack_from(data)
        if magic != _PUBLIC_MAGIC or version != _VERSION:
            raise JointStatisticsError("not an encoded PublicTargets value")
        if not 1 <= m <= MAX_TARGETS:
            raise JointStatisticsError("number of public targets out of range")
        offset, items = _PUBLIC_HEADER.size, []
        first = Statistics.from_bytes
        for _ in range(m):
            if len(data) < offset + 18:
                raise JointStatisticsError("encoded public targets are truncated")
            d = struct.unpack_from("<I", data, offset + 6)[0]
            if not 1 <= d <= MAX_DIMENSION:
                raise JointStatisticsError("public target dimension out of range")
            size = encoded_length(d)
            try:
                items.append(first(bytes(data[offset:offset + size]), EXACT))
            except StatisticsError as exc:
                raise JointStatisticsError(f"public target {len(items)}: {exc}") from None
            offset += size
        if offset != len(data):
            raise JointStatisticsError("encoded public targets have trailing bytes")
        return cls(tuple(items))


def public_targets(x, y, x_bound: float, y_bound: float,
                   x_norm_bound: float | None = None) -> PublicTargets:
    """Exact per-target statistics of *public* rows (never private ones), clipped like a
    release: target j over the rows that have response j (NaN = missing)."""
    x, y = _responses(x, y)
    z = clipped_features(x, float(x_bound), x_norm_bound)
    out = []
    for j in range(y.shape[1]):
        rows = ~np.isnan(y[:, j])
        zj = z[rows]
        wj = np.clip(y[rows, j], -float(y_bound), float(y_bound))
        out.append(Statistics(symmetric_gram(zj), zj.T @ wj, float(wj @ wj), int(rows.sum()),
                              EXACT))
    return PublicTargets(tuple(out))
