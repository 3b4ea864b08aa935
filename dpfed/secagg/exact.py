"""Exact sufficient statistics for secure rounds: quantised rows, integer sums (issue 19).

A site of a secure round encodes its statistics on the round's fixed-point grid
(``dpfed.secagg.fixedpoint``) with one rounding. If it summed its rows in float64 first, the
computed X^T X would differ from the exact one by a summation error that grows with the number
of rows (Higham's bound, ``fixedpoint.float_sum_error_bound``), and the grid sensitivity would
have to carry that error for the largest site a round allows (``max_site_rows``). Here the
statistics are computed *exactly*, so the grid sensitivity needs no error term and nothing
about a site's row count enters the calibration:

1. **Quantise** every clipped value (after the box clipping and, when the round has one, the
   projection into the row-norm ball) to a power-of-two grid, *truncating toward zero*:

       x_q = trunc(x * 2^qx) / 2^qx,     y_q = trunc(y * 2^qy) / 2^qy,

   with qx = P - ceil(log2 bx) for the public coordinate bound bx (Bx, or min(Bx, R) with a
   row-norm bound R) and qy = P - ceil(log2 By), P = ``QUANT_BITS`` = 20: every quantised
   value is an integer of magnitude <= 2^P in grid units, and the grid step is at most
   2^-P = 9.5e-7 of the bound (the truncation moves a value by less than one step, toward 0).
2. **Sum exactly** in integers: each product of two quantised values is at most 2^(2P) = 2^40
   in magnitude, so a sum over ``CHUNK_ROWS`` = 2^22 rows is at most 2^62 < 2^63 and numpy's
   int64 arithmetic (``np.einsum``; integer matmul never rounds) is exact; larger sites are
   summed in chunks of 2^22 rows whose totals are added as Python integers (unbounded). No
   limit on n, and nothing is refused on it.

The result (``ExactStatistics``) is X_q^T X_q, X_q^T y_q, y_q^T y_q *exactly*, as integers with
a known power-of-two unit; ``on_grid`` then rounds s times each value to the nearest integer
(ties to even) in exact integer arithmetic: the one rounding of the fixed-point encoding.

**Why the sensitivity is unchanged.** The quantised value of a row is a deterministic function
of that row alone (and of public bounds), so the map from rows to quantised rows turns an
added, removed or replaced row into an added, removed or replaced quantised row: neighbours
stay neighbours under either relation. Truncation toward zero never increases a magnitude, so
|x_q,j| <= |x_j| <= Bx, |y_q| <= |y| <= By and ||x_q||_2 <= ||x||_2 <= R: every quantised row
lies in the same domain (box, and ball) as the clipped rows, over which the sensitivities of
``dpfed.sensitivity`` are maxima. So the exact statistics of the quantised rows have the same
L1 sensitivities, and the grid sensitivity is ceil(s Delta) + m with the floating-point term
E = 0 (``fixedpoint.grid_sensitivity``, ``calibrate(statistics="exact")``). (Rounding to the
nearest instead of truncating could push a value at the bound past it, and a row on the ball's
surface out of the ball.)

Pure numpy and the standard library; the clipping and projection are the site's
(``site_node.release.exact_clipped_statistics``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping

import numpy as np

from dpfed.secagg.errors import ParameterError

__all__ = ["QUANT_BITS", "CHUNK_ROWS", "quantum_exponent", "quantum_exponents", "quantize",
           "ExactStatistics", "JointExactStatistics", "joint_exact_statistics",
           "ExactAccumulator", "round_scaled"]

#: Bits of magnitude of a quantised value: |value| <= 2^QUANT_BITS grid units.
QUANT_BITS = 20
#: Rows per exact int64 partial sum: CHUNK_ROWS * 2^(2 QUANT_BITS) = 2^62 < 2^63.
CHUNK_ROWS = 1 << (62 - 2 * QUANT_BITS)


def quantum_exponent(bound: float) -> int:
    """q such that values in [-bound, bound] are quantised to multiples of 2^-q with at most
    ``QUANT_BITS`` bits: q = QUANT_BITS - ceil(log2 bound) (exact, via frexp)."""
    bound = float(bound)
    if not (math.isfinite(bound) and bound > 0):
        raise ParameterError(f"a quantisation bound must be finite and > 0, got {bound!r}")
    m, e = math.frexp(bound)              # bound = m 2^e, 0.5 <= m < 1
    ceil_log2 = e - 1 if m == 0.5 else e  # 2^(ceil_log2 - 1) < bound <= 2^ceil_log2
    return QUANT_BITS - ceil_log2


def quantum_exponents(x_bound: float, y_bound: float, x_norm_bound: float | None = None
                      ) -> tuple[int, int]:
    """(qx, qy) of a round: qx for the coordinate bound Bx, or min(Bx, R) with a row-norm
    bound R (every coordinate of a projected row is within both), qy for By. Public."""
    bx = float(x_bound) if x_norm_bound is None else min(float(x_bound), float(x_norm_bound))
    return quantum_exponent(bx), quantum_exponent(y_bound)


def quantize(values: np.ndarray, q: int) -> np.ndarray:
    """trunc(values * 2^q) as int64 (toward zero: never larger in magnitude). ``values`` must
    already be clipped to a bound whose ``quantum_exponent`` is q; a value beyond 2^QUANT_BITS
    grid units raises ParameterError (a caller that did not clip)."""
    g = np.trunc(np.ldexp(np.asarray(values, dtype=np.float64), q))
    if g.size and not float(np.max(np.abs(g))) <= float(1 << QUANT_BITS):
        raise ParameterError("a value exceeds its quantisation bound (not clipped?)")
    return g.astype(np.int64)


def round_scaled(value: int, shift: int) -> int:
    """round(value * 2^shift) to the nearest integer, ties to even, in exact integer
    arithmetic (``value`` a Python int, ``shift`` any integer)."""
    if shift >= 0:
        return value << shift
    k = -shift
    q, r = divmod(value, 1 << k)          # floor division: r in [0, 2^k)
    half = 1 << (k - 1)
    if r > half or (r == half and q & 1):
        q += 1
    return q


def _exponent_of_scale(scale: float) -> int:
    m, e = math.frexp(float(scale))
    if not (math.isfinite(scale) and scale > 0 and m == 0.5):
        raise ParameterError(f"fixed-point scales must be powers of two, got {scale!r}")
    return e - 1


@dataclass(frozen=True)
class ExactStatistics:
    """X_q^T X_q (upper triangle, row-major: ``Statistics.upper_values`` order), X_q^T y_q and
    y_q^T y_q of one site's quantised rows, exactly: integers in units of 2^-(2 qx),
    2^-(qx + qy) and 2^-(2 qy); n its number of rows."""

    d: int
    n: int
    qx: int
    qy: int
    xtx: tuple
    xty: tuple
    yty: int

    def exponents(self) -> dict[str, int]:
        """The unit of each part: value = integer * 2^-exponent."""
        return {"xtx": 2 * self.qx, "xty": self.qx + self.qy, "yty": 2 * self.qy}

    def integers(self) -> dict[str, tuple]:
        return {"xtx": self.xtx, "xty": self.xty, "yty": (self.yty,)}

    def upper_values(self) -> np.ndarray:
        """The values as float64 (nearest), in ``Statistics.upper_values`` order: for
        comparisons and tests, never for encoding (``on_grid`` is exact)."""
        e = self.exponents()
        return np.array([float(Fraction(int(v), 1) / (Fraction(2) ** e[p]))
                         for p, vals in self.integers().items() for v in vals])

    def on_grid(self, scales: Mapping[str, float]) -> dict[str, list[int]]:
        """round(s_p * value) per entry of each part p (exact; ties to even), and n as is
        (its scale must be 1): the one rounding of the fixed-point encoding. Python ints of
        any size (the caller reduces them modulo 2^64)."""
        e = self.exponents()
        out = {p: [round_scaled(int(v), _exponent_of_scale(scales[p]) - e[p]) for v in vals]
               for p, vals in self.integers().items()}
        if float(scales["n"]) != 1.0:
            raise ParameterError("n is encoded on the integer grid (scale 1)")
        out["n"] = [int(self.n)]
        return out

    @classmethod
    def zeros(cls, d: int, qx: int, qy: int) -> "ExactStatistics":
        return cls(d, 0, qx, qy, (0,) * (d * (d + 1) // 2), (0,) * d, 0)


class ExactAccumulator:
    """Adds quantised blocks of rows (int64, from ``quantize``) into exact totals: int64
    partial sums over at most ``CHUNK_ROWS`` rows (exact: module docstring), each flushed into
    Python integers before it could exceed 2^62."""

    def __init__(self, d: int, qx: int, qy: int):
        self.d, self.qx, self.qy = int(d), int(qx), int(qy)
        self.n = 0
        self._rows = 0                                  # rows in the int64 partial sums
        self._xtx = np.zeros((d, d), dtype=np.int64)
        self._xty = np.zeros(d, dtype=np.int64)
        self._yty = np.zeros((), dtype=np.int64)
        self._total_xtx = np.zeros((d, d), dtype=object) + 0   # Python ints
        self._total_xty = np.zeros(d, dtype=object) + 0
        self._total_yty = 0

    def _flush(self) -> None:
        self._total_xtx = self._total_xtx + self._xtx.astype(object)
        self._total_xty = self._total_xty + self._xty.astype(object)
        self._total_yty += int(self._yty)
        self._xtx[...] = 0
        self._xty[...] = 0
        self._yty[...] = 0
        self._rows = 0

    def add(self, xq: np.ndarray, yq: np.ndarray) -> None:
        """Add the rows of ``xq`` (k x d int64) and ``yq`` (k int64), |values| <= 2^QUANT_BITS."""
        k = int(xq.shape[0])
        if xq.dtype != np.int64 or yq.dtype != np.int64 or xq.shape != (k, self.d) \
                or yq.shape != (k,):
            raise ParameterError("quantised blocks must be int64 of shape (k, d) and (k,)")
        for start in range(0, k, CHUNK_ROWS):
            a, b = xq[start:start + CHUNK_ROWS], yq[start:start + CHUNK_ROWS]
            if self._rows + a.shape[0] > CHUNK_ROWS:
                self._flush()
            # int64 einsum: exact (no rounding; no overflow below 2^63 by the chunk bound)
            self._xtx += np.einsum("ij,ik->jk", a, a)
            self._xty += np.einsum("ij,i->j", a, b)
            self._yty += np.einsum("i,i->", b, b)
            self._rows += a.shape[0]
        self.n += k

    def result(self) -> ExactStatistics:
        self._flush()
        iu = np.triu_indices(self.d)
        return ExactStatistics(self.d, self.n, self.qx, self.qy,
                               tuple(int(v) for v in self._total_xtx[iu]),
                               tuple(int(v) for v in self._total_xty), int(self._total_yty))


@dataclass(frozen=True)
class JointExactStatistics:
    """The exact integer statistics of a JOINT round's quantised rows (issue 23): X_q^T X_q
    (upper triangle, row-major) over the n_x rows, and per target j over the rows with a
    response j: X_q^T y_q,j (``xty``, m blocks of d, target-major), y_q,j^T y_q,j (``yty``)
    and n_j (``n``). Units as ``ExactStatistics``: 2^-(2 qx), 2^-(qx + qy), 2^-(2 qy).
    The same argument (module docstring) keeps the joint sensitivities of
    ``dpfed.joint_sensitivity``: a missing response stays missing, a present one is clipped
    and truncated toward zero, so a quantised row is an admissible row of eq. J1."""

    d: int
    m: int
    qx: int
    qy: int
    xtx: tuple
    n_x: int
    xty: tuple
    yty: tuple
    n: tuple

    def on_grid(self, scales: Mapping[str, float]) -> list[int]:
        """round(s_p * value) per entry (exact, ties to even) in the joint layout order
        [Sxx upper | n_x | Sxy_1..m | Syy_1..m | n_1..m] (``JointStatistics.to_vector``);
        the counts as they are (their scale must be 1)."""
        if float(scales["n"]) != 1.0:
            raise ParameterError("counts are encoded on the integer grid (scale 1)")
        sx, sy = _exponent_of_scale(scales["xtx"]), _exponent_of_scale(scales["xty"])
        sq = _exponent_of_scale(scales["yty"])
        return ([round_scaled(int(v), sx - 2 * self.qx) for v in self.xtx] + [int(self.n_x)]
                + [round_scaled(int(v), sy - self.qx - self.qy) for v in self.xty]
                + [round_scaled(int(v), sq - 2 * self.qy) for v in self.yty]
                + [int(v) for v in self.n])

    def values(self) -> np.ndarray:
        """The statistics as float64 (nearest) in the joint layout order: for comparisons
        and tests, never for encoding (``on_grid`` is exact)."""
        def real(ints, e):
            return [float(Fraction(int(v), 1) / Fraction(2) ** e) for v in ints]
        return np.array(real(self.xtx, 2 * self.qx) + [float(self.n_x)]
                        + real(self.xty, self.qx + self.qy) + real(self.yty, 2 * self.qy)
                        + [float(v) for v in self.n])


def joint_exact_statistics(xq: np.ndarray, yq: np.ndarray, present: np.ndarray, *, qx: int,
                           qy: int) -> JointExactStatistics:
    """``JointExactStatistics`` of quantised rows: ``xq`` (n x d) and ``yq`` (n x m) int64 from
    ``quantize`` (missing responses already 0) and ``present`` (n x m bool, the responses
    that are there). Exact: int64 partial sums over at most ``CHUNK_ROWS`` rows (every product
    <= 2^40), totals in Python integers."""
    n = int(xq.shape[0])
    if xq.dtype != np.int64 or yq.dtype != np.int64 or xq.ndim != 2 or yq.ndim != 2 \
            or yq.shape[0] != n or present.shape != yq.shape:
        raise ParameterError("quantised joint blocks must be int64 (n, d), (n, m) and a "
                             "(n, m) mask")
    d, m = int(xq.shape[1]), int(yq.shape[1])
    if np.any(yq[~present]):
        raise ParameterError("a missing response must be quantised to 0")
    xtx = np.zeros((d, d), dtype=object) + 0
    xty = np.zeros((m, d), dtype=object) + 0
    yty = np.zeros(m, dtype=object) + 0
    for start in range(0, n, CHUNK_ROWS):
        a, b = xq[start:start + CHUNK_ROWS], yq[start:start + CHUNK_ROWS]
        xtx = xtx + (a.T @ a).astype(object)          # int64 matmul: exact below 2^63
        xty = xty + (b.T @ a).astype(object)
        yty = yty + np.einsum("ij,ij->j", b, b).astype(object)
    iu = np.triu_indices(d)
    counts = np.asarray(present, dtype=bool).sum(axis=0)
    return JointExactStatistics(d, m, int(qx), int(qy), tuple(int(v) for v in xtx[iu]), n,
                                tuple(int(v) for v in xty.ravel()),
                                tuple(int(v) for v in yty), tuple(int(v) for v in counts))
