"""t-of-n Shamir secret sharing of 32-byte secrets (Shamir, CACM 1979; Bonawitz et al. 2017, s. 3).

Field: GF(P) with the Mersenne prime P = 2^521 - 1, so a 256-bit secret is one field element
(no chunking; a 2^127 - 1 field would need 16-byte chunks, which can exceed the prime). A
secret s is the constant term of a random polynomial f of degree t - 1 whose other coefficients
are uniform in GF(P) (``secrets.randbelow``); the share of the holder with index i is (i, f(i)).
Indices are the holders' 1-based positions in the round's sorted site list
(``graph.NeighbourGraph.index``), so they are public, distinct and non-zero.

- Any t shares determine f, and s = f(0) by Lagrange interpolation at 0:
  s = sum_i y_i prod_{j != i} x_j / (x_j - x_i) (mod P).
- Any t - 1 shares are uniformly distributed whatever s is: for every candidate s' there is
  exactly one polynomial of degree t - 1 through (0, s') and the t - 1 points, so they carry no
  information about s (perfect secrecy).

``reconstruct`` refuses fewer than t shares, duplicated or out-of-range indices, and, when more
than t shares are given, shares that do not lie on the polynomial of the first t (a corrupted or
forged share), as well as a result >= 2^256 (which a wrong share produces with probability
1 - 2^-265).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Iterable, Sequence

from dpfed.secagg.codec import Reader, Writer
from dpfed.secagg.errors import MalformedMessage, ParameterError, ReconstructionError

__all__ = ["PRIME", "SECRET_BYTES", "Share", "split", "reconstruct", "interpolate_at_zero"]

PRIME = 2 ** 521 - 1
SECRET_BYTES = 32
_VALUE_BYTES = (PRIME.bit_length() + 7) // 8      # 66
MAX_INDEX = 2 ** 31


@dataclass(frozen=True)
class Share:
    """(index, f(index)) of one holder."""

    index: int
    value: int

    def __post_init__(self):
        if not (isinstance(self.index, int) and 1 <= self.index <= MAX_INDEX):
            raise MalformedMessage(f"share index out of range: {self.index!r}")
        if not (isinstance(self.value, int) and 0 <= self.value < PRIME):
            raise MalformedMessage("share value out of the field")

    def to_bytes(self) -> bytes:
        return Writer().u32(self.index).fixed(self.value.to_bytes(_VALUE_BYTES, "big"),
                                              _VALUE_BYTES).getvalue()

    @classmethod
    def read(cls, reader: Reader) -> "Share":
        index = reader.u32()
        value = int.from_bytes(reader.fixed(_VALUE_BYTES), "big")
        return cls(index, value)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Share":
        r = Reader(data)
        share = cls.read(r)
        r.done()
        return share

    ENCODED_BYTES = 4 + _VALUE_BYTES


def _check_threshold(threshold: int, n: int) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ParameterError(f"threshold must be a positive integer, got {threshold!r}")
    if threshold > n:
        raise ParameterError(f"threshold {threshold} exceeds the {n} holders")


def split(secret: bytes, threshold: int, indices: Sequence[int]) -> list[Share]:
    """Shares of ``secret`` (32 bytes) for the holders ``indices`` (distinct, in [1, 2^31])."""
    if len(secret) != SECRET_BYTES:
        raise ParameterError("a secret is 32 bytes")
    indices = list(indices)
    if len(set(indices)) != len(indices):
        raise ParameterError("holder indices must be distinct")
    if any(not (isinstance(i, int) and 1 <= i <= MAX_INDEX) for i in indices):
        raise ParameterError("holder indices must be integers in [1, 2^31]")
    _check_threshold(threshold, len(indices))
    coeffs = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME)
                                                  for _ in range(threshold - 1)]
    shares = []
    for i in indices:
        acc = 0
        for c in reversed(coeffs):          # Horner
            acc = (acc * i + c) % PRIME
        shares.append(Share(i, acc))
    return shares


def interpolate_at_zero(points: Iterable[tuple[int, int]]) -> int:
    """f(0) of the unique polynomial of degree < len(points) through ``points`` (mod P).

    s = sum_i y_i w_i with Lagrange weights w_i = prod_{j != i} x_j / (x_j - x_i). The x are
    small integers (site positions), so the products are formed exactly in integers and reduced
    once, and the t denominators are inverted together with one modular inversion
    (Montgomery's batch-inversion trick): O(t^2) small-integer products, O(t) field products."""
    pts = list(points)
    xs = [x % PRIME for x, _ in pts]
    if len(set(xs)) != len(xs) or 0 in xs:
        raise ReconstructionError("interpolation points must have distinct non-zero x")
    n = len(xs)
    all_x = 1
    for x in xs:
        all_x *= x
    nums = [all_x // x % PRIME for x in xs]
    dens = [math.prod([xj - xi for xj in xs if xj != xi]) % PRIME for xi in xs]
    # batch inversion: prefix products, one inverse, then unwind
    prefix = [1] * (n + 1)
    for i, d in enumerate(dens):
        prefix[i + 1] = prefix[i] * d % PRIME
    inv = pow(prefix[n], -1, PRIME)
    total = 0
    for i in range(n - 1, -1, -1):
        inv_i = inv * prefix[i] % PRIME          # 1 / dens[i]
        inv = inv * dens[i] % PRIME
        total += pts[i][1] * nums[i] % PRIME * inv_i
    return total % PRIME


def _evaluate(points: Sequence[tuple[int, int]], x: int) -> int:
    """The interpolating polynomial of ``points`` evaluated at ``x``."""
    total = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if j != i:
                num = num * (x - xj) % PRIME
                den = den * (xi - xj) % PRIME
        total = (total + yi * num * pow(den, -1, PRIME)) % PRIME
    return total


def reconstruct(shares: Iterable[Share], threshold: int, *, max_index: int | None = None,
                verify_extra: bool = True) -> bytes:
    """The 32-byte secret from at least ``threshold`` shares (module docstring for refusals).
    ``max_index``: the largest valid holder index (number of sites), if known."""
    shares = list(shares)
    if not all(isinstance(s, Share) for s in shares):
        raise ReconstructionError("shares must be Share values")
    indices = [s.index for s in shares]
    if len(set(indices)) != len(indices):
        raise ReconstructionError("duplicate share index")
    if max_index is not None and any(i > max_index for i in indices):
        raise ReconstructionError(f"share index above {max_index}")
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ReconstructionError(f"threshold must be a positive integer, got {threshold!r}")
    if len(shares) < threshold:
        raise ReconstructionError(f"{len(shares)} shares < threshold {threshold}")
    shares.sort(key=lambda s: s.index)
    base = [(s.index, s.value) for s in shares[:threshold]]
    if verify_extra:
        for s in shares[threshold:]:
            if _evaluate(base, s.index) != s.value:
                raise ReconstructionError(f"share {s.index} is inconsistent with the others")
    secret = interpolate_at_zero(base)
    if secret >= 2 ** (8 * SECRET_BYTES):
        raise ReconstructionError("the shares do not reconstruct a 32-byte secret")
    return secret.to_bytes(SECRET_BYTES, "big")
