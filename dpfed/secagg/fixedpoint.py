"""Fixed-point encoding of the released statistics as integers modulo 2^64 (method.md section 10).

Secure aggregation adds vectors in the group Z_{2^64} (``np.uint64`` with wrap-around), so each
site encodes its real statistics (plus its integer noise share, ``dpfed.secagg.dlaplace``) as

    e(v) = round(s * v)  mod 2^64          (s = a power of two, round = nearest, ties to even)

and the aggregator decodes the unmasked sum as a signed (two's complement) 64-bit integer divided
by s. This is the encoding of Bonawitz et al. (CCS 2017, section 3: inputs in Z_R) and of the
distributed discrete Gaussian / Skellam papers (Kairouz et al., ICML 2021, section 4 "modular
clipping"; Agarwal et al. 2021), with two simplifications that the bounds below make safe: no
random rotation and no modular clipping, because every entry of every statistic is bounded by
public numbers times the number of rows, so a grid sized for a public row bound cannot
overflow (a grid that could is refused up front), and a federation with more rows than that
bound is detected after decoding (``row_capacity``, below).

Scale choice (``choose_scale``), per part of the statistics (Sxx triangle, Sxy, Syy, n), from
public numbers only:

1. *Rounding far below the noise.* Each site's rounding moves an entry by at most 1/(2s) (real
   units); the sum over K sites by at most K/(2s). We ask K/(2s) <= rho * b (rho =
   ``ROUNDING_RATIO`` = 2^-20, b the real-unit noise scale), i.e. s >= K / (2 rho b), and take
   the *smallest* power of two that satisfies it (a small grid keeps the integer noise scale
   b*s small, which the sampler needs, ``MAX_GRID_NOISE_SCALE``).
2. *No overflow.* The true sum of an entry is bounded by a public M (K * n_max * Bx^2 for Sxx,
   ...; ``part_bounds``) and its noise by ``TAIL_SCALES`` = 40 scales per draw (P(|DL| > 40 b)
   ~ e^-40 ~ 4e-18 per entry and draw). We require s*M + K/2 + 40 * draws * s * b < 2^63, so the
   decoded signed value is the true integer sum when every site holds at most n_max rows;
   otherwise ``ParameterError``.

A power-of-two s makes ``v * s`` exact in floating point, so the only rounding is the one
``np.rint`` performs (|error| <= 1/2 grid unit), and decoding ``int / s`` is exact below 2^53.

Sensitivity in grid units (``grid_sensitivity``): see its docstring; the noise must be calibrated
to it, not to s times the real sensitivity. How a site computes the statistics it encodes is a
named option of the calibration (``STATISTICS``): ``"float"`` (float64 sums: their summation
error, ``float_sum_error_bound`` over the public ``n_max`` rows, enters the grid sensitivity as
E) or ``"exact"`` (integer sums of quantised rows, ``dpfed.secagg.exact``: E = 0, and nothing
about a site's row count enters the calibration). Secure rounds use ``"exact"``.

``n_max`` (a secure round's ``max_site_rows``) then only sizes the grid: a federation whose
rows exceed it cannot make a site refuse (the exact encoding is reduced modulo 2^64 without a
check, ``encode_integers``: DP on the integers, then post-processing); at worst its sum wraps,
which ``row_capacity`` lets the aggregator detect from the decoded n (its scale is 1, it never
wraps): the grid holds ``row_capacity`` rows in all without any part wrapping, a multiple
("headroom") of the K * n_max it was sized for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from dpfed.secagg.errors import ParameterError

__all__ = ["MODULUS", "TAIL_SCALES", "ROUNDING_RATIO", "MAX_GRID_NOISE_SCALE", "PARTS",
           "STATISTICS", "StatisticsLayout", "encode", "encode_integers", "decode", "to_signed",
           "add_signed", "wrap_sum", "choose_scale", "choose_scales", "part_bounds",
           "row_bounds", "row_capacity", "grid_sensitivity", "float_sum_error_bound",
           "sum_error_bound", "is_power_of_two"]

MODULUS = 2 ** 64
_HALF = 2 ** 63
#: Noise tail (in noise scales per draw) that must still fit below 2^63.
TAIL_SCALES = 40.0
#: Total rounding error of a sum (K/(2s), real units) as a fraction of the noise scale.
ROUNDING_RATIO = 2.0 ** -20
#: Largest integer noise scale b*s the sampler serves (dlaplace: Poisson means up to ~40 b stay
#: far below 2^53, where float64 still represents every integer).
MAX_GRID_NOISE_SCALE = 2.0 ** 40
PARTS = ("xtx", "xty", "yty", "n")
#: How a site computes the statistics it encodes (module docstring): float64 sums, with the
#: summation-error term E in the grid sensitivity, or exact integer sums (E = 0).
STATISTICS = ("float", "exact")


@dataclass(frozen=True)
class StatisticsLayout:
    """Order of the entries of one site's vector: the d(d+1)/2 upper-triangle entries of Sxx
    (row-major, ``Statistics.upper_values`` order), the d entries of Sxy, Syy, then n. Length
    d(d+1)/2 + d + 2."""

    d: int

    def __post_init__(self):
        if isinstance(self.d, bool) or not isinstance(self.d, int) or self.d < 1:
            raise ParameterError(f"d must be a positive integer, got {self.d!r}")

    @property
    def sizes(self) -> dict[str, int]:
        d = self.d
        return {"xtx": d * (d + 1) // 2, "xty": d, "yty": 1, "n": 1}

    @property
    def length(self) -> int:
        return sum(self.sizes.values())

    def slices(self) -> dict[str, slice]:
        out, start = {}, 0
        for part, size in self.sizes.items():
            out[part] = slice(start, start + size)
            start += size
        return out

    def per_entry(self, per_part: Mapping[str, float]) -> np.ndarray:
        """A length-``length`` float vector holding ``per_part[part]`` on each part's entries."""
        out = np.empty(self.length)
        for part, sl in self.slices().items():
            out[sl] = per_part[part]
        return out

    def pack(self, upper_values, n) -> np.ndarray:
        """(``Statistics.upper_values()``, n) -> one float vector in this layout."""
        upper = np.asarray(upper_values, dtype=np.float64).ravel()
        if upper.size != self.length - 1:
            raise ParameterError(f"expected {self.length - 1} upper values, got {upper.size}")
        return np.concatenate([upper, [float(n)]])

    def unpack(self, values) -> dict[str, np.ndarray]:
        values = np.asarray(values)
        if values.shape != (self.length,):
            raise ParameterError(f"expected a vector of length {self.length}")
        return {part: values[sl] for part, sl in self.slices().items()}


def is_power_of_two(scale: float) -> bool:
    m, _ = math.frexp(float(scale))
    return math.isfinite(scale) and scale > 0 and m == 0.5


def _scales(scale, n: int) -> np.ndarray:
    s = np.broadcast_to(np.asarray(scale, dtype=np.float64), (n,))
    if not all(is_power_of_two(float(v)) for v in np.unique(s)):
        raise ParameterError("fixed-point scales must be powers of two")
    return s


def encode(values, scale) -> np.ndarray:
    """round(values * scale) as ``np.uint64`` (two's complement of negative values).

    ``scale`` is a power of two, scalar or per entry. Refuses non-finite values and values whose
    grid integer does not fit in a signed 64-bit integer (the caller's bounds are wrong)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    s = _scales(scale, v.size)
    if not np.all(np.isfinite(v)):
        raise ParameterError("cannot encode non-finite values")
    g = np.rint(v * s)
    if g.size and float(np.max(np.abs(g))) >= _HALF:
        raise ParameterError("a value overflows the 64-bit fixed-point range at this scale")
    return g.astype(np.int64).view(np.uint64)


def encode_integers(ints) -> np.ndarray:
    """Integers (Python ints of any size, already on the grid) reduced modulo 2^64, as
    ``np.uint64``. No range check, by design: used for exact statistics
    (``dpfed.secagg.exact``), whose encoding must not depend on whether the site's own rows
    fit the public bound (module docstring)."""
    return np.array([int(v) % MODULUS for v in ints], dtype=np.uint64)


def to_signed(encoded) -> np.ndarray:
    """The two's-complement reading of a uint64 vector (an int64 view)."""
    return np.asarray(encoded, dtype=np.uint64).view(np.int64)


def decode(encoded, scale) -> np.ndarray:
    """Signed integer / scale: the real values of an (unmasked) sum."""
    ints = to_signed(encoded)
    s = _scales(scale, ints.size)
    return ints.astype(np.float64) / s


def add_signed(encoded, ints) -> np.ndarray:
    """encoded + ints mod 2^64 (``ints`` signed, e.g. a noise share)."""
    a = np.asarray(encoded, dtype=np.uint64)
    b = np.asarray(ints, dtype=np.int64).view(np.uint64)
    return a + b  # uint64 arithmetic wraps modulo 2^64


def wrap_sum(vectors) -> np.ndarray:
    """Sum of uint64 vectors modulo 2^64."""
    vectors = list(vectors)
    if not vectors:
        raise ParameterError("nothing to sum")
    out = np.array(vectors[0], dtype=np.uint64, copy=True)
    for v in vectors[1:]:
        out += np.asarray(v, dtype=np.uint64)
    return out


def choose_scale(*, max_abs_sum: float, noise_scale: float, n_sites: int,
                 noise_draws: float = 1.0, tail: float = TAIL_SCALES,
                 rounding_ratio: float = ROUNDING_RATIO,
                 max_grid_noise: float = MAX_GRID_NOISE_SCALE) -> float:
    """The smallest power of two s with n_sites / (2 s) <= rounding_ratio * noise_scale, checked
    against overflow: s * max_abs_sum + n_sites / 2 + tail * noise_draws * s * noise_scale must
    stay below 2^63 (module docstring), and against the sampler's limit s * noise_scale <=
    ``max_grid_noise``. Raises ``ParameterError`` when no power of two satisfies all three.

    ``max_abs_sum``: public bound on |entry| of the true sum over all sites (``part_bounds``);
    ``noise_scale``: the real-unit noise scale b of one full draw; ``noise_draws``: how many
    full draws the sum can hold (ceil(K / T) for K sites adding 1/T shares)."""
    for name, v in (("max_abs_sum", max_abs_sum), ("noise_scale", noise_scale),
                    ("noise_draws", noise_draws), ("tail", tail),
                    ("rounding_ratio", rounding_ratio)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ParameterError(f"{name} must be a finite number >= 0, got {v!r}")
    if noise_scale <= 0 or rounding_ratio <= 0:
        raise ParameterError("noise_scale and rounding_ratio must be > 0")
    if isinstance(n_sites, bool) or not isinstance(n_sites, int) or n_sites < 1:
        raise ParameterError(f"n_sites must be a positive integer, got {n_sites!r}")
    need = n_sites / (2.0 * rounding_ratio * noise_scale)
    exponent = math.ceil(math.log2(need)) if need > 0 else 0
    scale = math.ldexp(1.0, exponent)
    while scale / 2 >= need:      # guard against log2 rounding up one step too far
        scale /= 2
    while scale < need:
        scale *= 2
    if not math.isfinite(scale) or scale == 0:
        raise ParameterError("no representable fixed-point scale for these parameters")
    grid_noise = scale * noise_scale
    if grid_noise > max_grid_noise:
        raise ParameterError(
            f"the noise scale on the grid would be {grid_noise:.3g} > {max_grid_noise:.3g}; "
            "raise rounding_ratio or lower the number of sites")
    worst = scale * max_abs_sum + n_sites / 2.0 + tail * noise_draws * grid_noise
    if not worst < _HALF * (1 - 2.0 ** -40):
        raise ParameterError(
            f"the sum can reach {worst:.3g} grid units >= 2^63 at scale 2^{int(math.log2(scale))}: "
            "bounds, rows or sites too large for 64-bit secure aggregation with this noise")
    return scale


def part_bounds(*, d: int, n_max: int, n_sites: int, x_bound: float, y_bound: float
                ) -> dict[str, float]:
    """Public bound on |entry| of the *sum over sites* of each part, for clipped rows
    (|x_ij| <= Bx, |y_i| <= By) and at most ``n_max`` rows per site: Sxx entries
    K n_max Bx^2, Sxy K n_max Bx By, Syy K n_max By^2, n K n_max."""
    rows = float(n_max) * float(n_sites)
    return {"xtx": rows * x_bound ** 2, "xty": rows * x_bound * y_bound,
            "yty": rows * y_bound ** 2, "n": rows}


def row_bounds(*, x_bound: float, y_bound: float) -> dict[str, float]:
    """Bound on |entry| that one clipped row adds to each part: Bx^2, Bx By, By^2, 1."""
    return {"xtx": x_bound ** 2, "xty": x_bound * y_bound, "yty": y_bound ** 2, "n": 1.0}


def row_capacity(*, scale: float, row_bound: float, n_sites: int, noise_draws: float,
                 grid_noise: float | None, tail: float = TAIL_SCALES) -> int:
    """How many rows in all (over every site) a part's sum holds without wrapping: the
    largest N with s N B + n_sites/2 + tail * noise_draws * b_grid < 2^63 (the condition
    ``choose_scale`` checks for N = K n_max; B = ``row_bounds``; n_sites/2: each site's
    rounding). ``choose_scale`` guarantees at least K n_max."""
    noise = 0.0 if grid_noise is None else tail * noise_draws * float(grid_noise)
    room = _HALF * (1 - 2.0 ** -40) - n_sites / 2.0 - noise
    return max(0, int(math.floor(room / (float(scale) * float(row_bound)))))


def choose_scales(*, d: int, n_max: int, n_sites: int, x_bound: float, y_bound: float,
                  noise_scales: Mapping[str, float | None], noise_threshold: int,
                  rounding_ratio: float = ROUNDING_RATIO) -> dict[str, float]:
    """One power-of-two scale per part (``choose_scale``), from public numbers only.

    ``noise_scales``: real-unit noise scale b of one full draw per part (e.g. from
    ``dpfed.sensitivity.noise_calibration``: ``xtx_scale``...); ``n`` may be None (n exact,
    replace-one). n is an integer: its scale is 1 (no rounding at all, grid = one row), which
    makes its noise the same integer discrete Laplace that independent releases use.
    ``noise_threshold``: T, the number of noise shares that make one full draw; the sum of K
    sites holds ceil(K / T) draws at most (more sites, more noise)."""
    if isinstance(noise_threshold, bool) or not isinstance(noise_threshold, int) \
            or not 1 <= noise_threshold <= n_sites:
        raise ParameterError(f"noise_threshold must be in [1, n_sites], got {noise_threshold!r}")
    bounds = part_bounds(d=d, n_max=n_max, n_sites=n_sites, x_bound=x_bound, y_bound=y_bound)
    draws = math.ceil(n_sites / noise_threshold)
    out = {}
    for part in PARTS:
        b = noise_scales.get(part)
        if part == "n":
            out[part] = 1.0
            worst = bounds["n"] + (0 if b is None else TAIL_SCALES * draws * b)
            if worst >= _HALF:
                raise ParameterError("n overflows 2^63")
            continue
        if b is None:
            raise ParameterError(f"part {part} needs a noise scale")
        out[part] = choose_scale(max_abs_sum=bounds[part], noise_scale=float(b),
                                 n_sites=n_sites, noise_draws=draws,
                                 rounding_ratio=rounding_ratio)
    return out


def float_sum_error_bound(n_terms: int, max_abs_term: float) -> float:
    """A bound on |computed - exact| for a float64 sum of ``n_terms`` products each bounded by
    ``max_abs_term`` in any summation order: each product is rounded once (relative u) and a sum
    of n terms in any order errs by at most (n - 1) u sum|terms| (Higham, *Accuracy and
    Stability of Numerical Algorithms*, 2nd ed., eq. (4.4)); u = 2^-53. Returned with a 1 %
    margin for the second-order terms (valid while n u << 1)."""
    u = 2.0 ** -53
    return 1.01 * n_terms * u * n_terms * max_abs_term + 1.01 * u * n_terms * max_abs_term


def sum_error_bound(statistics: str, n_terms: int, max_abs_term: float) -> float:
    """E per entry for the named way a site computes its statistics (``STATISTICS``):
    ``float_sum_error_bound`` for float64 sums, 0 for exact integer sums
    (``dpfed.secagg.exact``: the statistic is an exact function of the quantised rows)."""
    if statistics == "exact":
        return 0.0
    if statistics == "float":
        return float_sum_error_bound(n_terms, max_abs_term)
    raise ParameterError(f"statistics must be one of {', '.join(STATISTICS)}, got "
                         f"{statistics!r}")


def grid_sensitivity(real_l1_sensitivity: float, scale: float, n_entries: int, *,
                     integer_valued: bool = False, float_error: float = 0.0) -> int:
    """L1 sensitivity, in grid units, of the *rounded* statistic round(s f(D)).

    Let D, D' be neighbours with ||f(D) - f(D')||_1 <= Delta (the real L1 sensitivity, e.g. from
    ``dpfed.sensitivity``), over m = ``n_entries`` entries. Write a_j = s f_j(D), b_j = s f_j(D')
    and round(x) = x + e(x) with |e(x)| <= 1/2. Then per entry

        |round(a_j) - round(b_j)| <= |a_j - b_j| + |e(a_j)| + |e(b_j)| <= s |delta_j| + 1,

    and since the left side is an integer, it is <= floor(s |delta_j|) + 1 (and 0 when
    delta_j = 0). Summing, with sum_j floor(x_j) <= floor(sum_j x_j):

        ||round(s f(D)) - round(s f(D'))||_1 <= floor(s Delta) + m.

    The "+1 per entry" is attained: entries that move by a hair across a rounding boundary each
    jump one grid unit, however small Delta is. We return ceil(s Delta') + m, where Delta' =
    Delta + 2 ``float_error``: the ceiling absorbs floating-point error in the caller's Delta (it
    is >= floor of the exact value whenever the float is within 1 of it), and ``float_error``
    bounds, in L1 over the m entries, how far a site's *computed* f differs from the exact f
    (summation error, m * ``float_sum_error_bound``), which the rounding step inherits: with
    computed values a_j + s e_j, b_j + s e'_j the per-entry bound becomes
    s (|delta_j| + |e_j| + |e'_j|) + 1.

    ``integer_valued``: f takes integer values and s is an integer (n with s = 1): rounding is
    the identity and the bound is ceil(s Delta), with no per-entry term."""
    if not (math.isfinite(real_l1_sensitivity) and real_l1_sensitivity > 0):
        raise ParameterError("the real sensitivity must be finite and > 0")
    if not is_power_of_two(scale):
        raise ParameterError("the scale must be a power of two")
    if isinstance(n_entries, bool) or not isinstance(n_entries, int) or n_entries < 1:
        raise ParameterError("n_entries must be a positive integer")
    if not (math.isfinite(float_error) and float_error >= 0):
        raise ParameterError("float_error must be finite and >= 0")
    if integer_valued:
        if scale < 1 or float_error:
            raise ParameterError("integer_valued needs an integer scale and exact values")
        return int(math.ceil(real_l1_sensitivity * scale))
    return int(math.ceil((real_l1_sensitivity + 2.0 * float_error) * scale)) + n_entries
