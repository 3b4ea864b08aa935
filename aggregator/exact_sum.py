"""Exact, order-independent running sums of float64 vectors (method.md section 3).

The aggregator adds the sites' noisy releases and the public statistics. To make the model's
input a function of the *set* of contributions only (not of their arrival order, a restart or
a re-fit), every entry of the total is the exact sum of its terms, rounded once to the nearest
float64: the same number ``math.fsum`` returns, but vectorised over all d(d+1)/2 + d + 1
entries and updated as each contribution arrives, so closing a round costs one conversion
instead of a pass over every contribution.

How: every finite double is ``M * 2**(p - 1074)`` with an integer ``|M| < 2**53`` and a bit
position ``0 <= p <= 2045``, read straight from its IEEE-754 bits (subnormals included). A
fixed-point number of 2176 bits covers them all; it is kept as 68 signed 64-bit "limbs" of 32
bits each per entry, and adding a double adds to the (at most three) limbs its shifted mantissa
overlaps. Integer addition is exact and commutative, so the limbs are the same whatever the
order. A limb takes less than 2**33 per addition and carries are propagated every 2**29
additions, far from int64 overflow. ``result`` propagates the carries, forms one Python
integer per entry and divides it by ``2**1074``; Python's int / int true division is correctly
rounded, so the result is the exact sum rounded to nearest-even, as ``math.fsum`` returns it
(which also raises on an *intermediate* overflow that this does not have: here only a total
outside the float64 range raises). Cost: about 20 vectorised integer operations per value
instead of ``math.fsum``'s Python-level loop, and done as contributions arrive.

Many rows at once (``add_rows``, the round's path) go through the limbs only as a few column
sums per block: each block of up to ``2**_FOLD_HEADROOM`` rows is split, column by column, into
float64 pieces on a fixed grid that add *exactly* in float64 (the error-free extraction of
ReproBLAS's binned sums: Demmel, Ahrens and Nguyen, "Efficient reproducible floating point
summation and BLAS", UCB/EECS-2016-121, section 3), as ``_fold_block`` explains; every bit a
fold does not take (values far below their column's largest) goes through the limbs as before.
The pieces' sums are exact, so the limbs receive the same integer either way: the result is
unchanged bit for bit, and about 4 float passes per fold replace about 20 integer passes and
three scatter-adds per value (d = 64, rows of 2145 values added 16 at a time as a round
folds them: 0.12 -> 0.032 CPU-ms a row at load 5; docs/benchmarks.md, sixth session).
"""

from __future__ import annotations

import numpy as np

_LIMB_BITS = 32
_LIMB_MASK = (1 << _LIMB_BITS) - 1
_SCALE_BITS = 1074                 # value = integer / 2**1074 (the subnormal spacing)
_LIMBS = 68                        # 2045 + 53 bits in 66 limbs, plus two for carries and sign
_NORMALISE_EVERY = 1 << 29         # additions between carry propagations (|limb| < 2**62)
_FRACTION_MASK = (1 << 52) - 1
_FOLD_HEADROOM = 5                 # a fold's pieces leave 2**5 of headroom below 2**53 ...
_ROWS_PER_BLOCK = 1 << _FOLD_HEADROOM  # ... so a block of 32 rows sums exactly (32: fastest
                                   # here, 64 rows' temporaries outgrow the 2 MB cache)
_MAX_FOLDS = 3                     # then whatever is left goes through the limbs
_MIN_GRID_EXPONENT = -1022         # S = 1.5 * 2**E normal, grid 2**(E - 52) >= 2**-1074
_MAX_GRID_EXPONENT = 1022          # S + x < 2**(E + 1) <= 2**1023 stays finite


class ExactSumError(ArithmeticError):
    """The exact total is outside the float64 range, or a term is not finite."""


def _limb_terms(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For finite float64 ``values`` (any shape): the index of the lowest limb each value
    touches and its three limb contributions (lowest first), each below 2**33 in magnitude,
    which sum to the value's integer ``M * 2**p`` at limb weights 1, 2**32, 2**64."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
    biased_exponent = (bits >> 52) & 0x7FF
    # Normal numbers have an implicit leading 1 and exponent e - 1075; subnormals (e = 0)
    # have none and exponent -1074, i.e. the same as e = 1.
    mantissa = (bits & _FRACTION_MASK) | ((biased_exponent > 0).astype(np.int64) << 52)
    signed = np.where(bits < 0, -mantissa, mantissa)
    position = np.maximum(biased_exponent, 1) - 1
    shift = position & (_LIMB_BITS - 1)
    # signed = high * 2**32 + low with 0 <= low < 2**32 (arithmetic shift floors), so
    # signed << shift = (low << shift) + (high << shift) * 2**32, both parts within int64.
    low = (signed & _LIMB_MASK) << shift                  # in [0, 2**63)
    high = (signed >> _LIMB_BITS) << shift                # |high| < 2**52
    return (position >> 5, low & _LIMB_MASK, (low >> _LIMB_BITS) + (high & _LIMB_MASK),
            high >> _LIMB_BITS)


class ExactSum:
    """Running exact sum of float64 vectors of one length; ``result()`` is correctly rounded.

    Not thread-safe: the caller serialises ``add`` (the round manager holds its lock).
    """

    def __init__(self, length: int):
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        self.length = int(length)
        self._limbs = np.zeros((self.length, _LIMBS), dtype=np.int64)
        self._flat = self._limbs.reshape(-1)       # a view: flat limb index = entry * 68 + limb
        self._base = np.arange(self.length, dtype=np.int64) * _LIMBS
        self._since_normalised = 0
        self.count = 0                             # vectors added

    def _check(self, values: np.ndarray, ndim: int) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != ndim or values.shape[-1] != self.length:
            raise ValueError(f"expected {'a vector' if ndim == 1 else 'rows'} of length "
                             f"{self.length}, got shape {values.shape}")
        if not np.isfinite(values).all():
            raise ExactSumError("cannot sum NaN or infinite values")
        return values

    def add(self, values) -> None:
        """Add one vector. Every entry touches distinct limbs, so plain fancy-index
        additions are exact (no repeated indices within one statement)."""
        values = self._check(values, 1)
        self._reserve(1)
        limb, a0, a1, a2 = _limb_terms(values)
        index = self._base + limb
        self._flat[index] += a0
        self._flat[index + 1] += a1
        self._flat[index + 2] += a2
        self.count += 1

    def add_rows(self, rows) -> None:
        """Add every row of a 2-D array (many contributions at once: a round's queued
        releases, a recovery), in blocks of ``_ROWS_PER_BLOCK``: each block's exact column
        sums by folds (``_fold_block``), anything the folds leave through the limbs."""
        rows = self._check(rows, 2)
        for start in range(0, rows.shape[0], _ROWS_PER_BLOCK):
            block = rows[start:start + _ROWS_PER_BLOCK]
            sums, rest = _fold_block(block)
            if sums:
                self._add_limb_rows(np.stack(sums))
            if rest is not None:
                self._add_limb_rows(rest)
            self.count += block.shape[0]

    def _add_limb_rows(self, rows: np.ndarray) -> None:
        """Add finite rows straight to the limbs; ``np.add.at`` combines the repeated limb
        indices of the rows exactly."""
        self._reserve(rows.shape[0])
        limb, *terms = _limb_terms(rows)
        index = (self._base + limb).reshape(-1)
        for offset, term in enumerate(terms):
            np.add.at(self._flat, index + offset, term.reshape(-1))

    def merge(self, other: "ExactSum") -> None:
        """Add another running sum of the same length (exact)."""
        if other.length != self.length:
            raise ValueError(f"cannot merge sums of length {other.length} and {self.length}")
        self._reserve(other._since_normalised)
        self._flat += other._flat
        self.count += other.count

    def copy(self) -> "ExactSum":
        twin = ExactSum(self.length)
        twin._limbs[...] = self._limbs
        twin._since_normalised, twin.count = self._since_normalised, self.count
        return twin

    def _reserve(self, additions: int) -> None:
        if self._since_normalised + additions > _NORMALISE_EVERY:
            _propagate_carries(self._limbs)
            self._since_normalised = 0
        self._since_normalised += additions

    def result(self) -> np.ndarray:
        """The exact sums rounded to nearest float64; raises ExactSumError if one is
        outside the float64 range."""
        limbs = self._limbs.copy()
        _propagate_carries(limbs)
        # After propagation every limb but the top one is in [0, 2**32): their bytes are the
        # magnitude's little-endian digits, and the signed top limb carries the sign.
        low = np.ascontiguousarray(limbs[:, :-1].astype("<u4")).view(np.uint8)
        low = low.reshape(self.length, -1)
        top = limbs[:, -1].tolist()
        top_shift = _LIMB_BITS * (_LIMBS - 1)
        denominator = 1 << _SCALE_BITS
        out = np.empty(self.length)
        try:
            for i in range(self.length):
                integer = int.from_bytes(low[i].tobytes(), "little") + (top[i] << top_shift)
                out[i] = integer / denominator   # int / int: correctly rounded
        except OverflowError:
            raise ExactSumError(f"the exact sum of entry {i} is outside the float64 range") from None
        return out


def _fold_block(block: np.ndarray) -> tuple[list[np.ndarray], np.ndarray | None]:
    """Split the finite rows of ``block`` (at most ``2**_FOLD_HEADROOM`` of them) into exact
    per-column sums: returns (sums, rest) where the column sums of ``block`` equal, exactly,
    the sum of the vectors in ``sums`` plus the column sums of ``rest`` (None when nothing is
    left). Every vector of ``sums`` and every value of ``rest`` is a finite double.

    Why it is exact (c = _FOLD_HEADROOM, g = 2**(E - 52) the grid of a column's fold): the
    fold takes each x with |x| <= 2**(E - 1 - c) and forms q = fl(S + x) - S with
    S = 1.5 * 2**E. S + x lies in [2**E, 2**(E + 1)], where doubles are the multiples of g, so
    fl(S + x) is S + x rounded to that grid and the subtraction is exact: q is x rounded to
    the nearest multiple of g, and |q| <= 2**(E - 1 - c) since that bound is on the grid.
    r = x - q is exact too (q = 0 when |x| < g / 2; else ulp(x) >= g / 2**53 and r is a
    multiple of ulp(x) below g / 2), and |r| <= g / 2. Up to 2**c pieces q, multiples of g of
    magnitude at most 2**(E - 1 - c), have every partial sum a multiple of g below
    2**(E - 1) = 2**51 g: exactly representable, so the float64 column sum is exact in any
    order. The next fold takes the remainders with E' = E - 52 + c (so |r| <= 2**(E' - 1 - c)).
    E is raised to at least -1022 (S normal; a larger E only loosens the bound), where
    g = 2**-1074 is every double's grid and nothing is left; a block whose values need
    E > 1022 (|x| near the top of the float64 range) is returned whole as ``rest``.
    """
    high = np.max(block, axis=0)
    low = np.min(block, axis=0)
    # m < 2**e for m = max |x| of the column (frexp: m = f * 2**e, 0.5 <= f < 1; e = 0 for 0).
    exponent = np.frexp(np.maximum(high, -low))[1].astype(np.int64) + 1 + _FOLD_HEADROOM
    np.maximum(exponent, _MIN_GRID_EXPONENT, out=exponent)
    if int(exponent.max()) > _MAX_GRID_EXPONENT:
        return [], block
    sums = []
    rest = block
    for fold in range(_MAX_FOLDS):
        shift = np.ldexp(1.5, exponent)
        piece = rest + shift
        piece -= shift
        sums.append(piece.sum(axis=0))
        rest = rest - piece
        # A value has 53 bits and a fold takes 52 - c of them: two folds are the minimum.
        if fold >= 1 and not rest.any():
            return sums, None
        exponent += _FOLD_HEADROOM - 52
        np.maximum(exponent, _MIN_GRID_EXPONENT, out=exponent)
    return sums, rest


def _propagate_carries(limbs: np.ndarray) -> None:
    """In place: move everything above 32 bits of each limb into the next one (arithmetic
    shift = floor division, so negative limbs borrow correctly). The represented integers are
    unchanged; afterwards every limb but the last is in [0, 2**32)."""
    for k in range(limbs.shape[1] - 1):
        carry = limbs[:, k] >> _LIMB_BITS
        limbs[:, k] &= _LIMB_MASK
        limbs[:, k + 1] += carry
