"""Uniform and normal variates from the operating system's CSPRNG, vectorised with numpy.

Everything secret or noisy in ``dpfed.secagg`` draws its randomness here (or from ``secrets``),
never from numpy's seeded generators: a noise share or a mask seed must be unpredictable to
every other party, including one who knows the code and the time it ran.

- ``uniform(n)``: U = (floor(w / 2^11) + 1/2) 2^-53 for w uniform on 64-bit words from
  ``os.urandom``; U is uniform on the 2^53 midpoints of [0, 1), so 0 < U < 1 always (logs and
  divisions are safe) and each value has probability exactly 2^-53.
- ``standard_normal(n)``: the Box-Muller transform of pairs of such uniforms (Box & Muller
  1958): sqrt(-2 ln U1) cos(2 pi U2), sqrt(-2 ln U1) sin(2 pi U2), exact in exact arithmetic;
  the tail is cut at sqrt(2 * 53 ln 2) ~ 8.6 sd by the 2^-53 grid (probability ~ 1e-17).
"""

from __future__ import annotations

import math
import os

import numpy as np

__all__ = ["random_u64", "uniform", "standard_normal"]


def random_u64(n: int) -> np.ndarray:
    """``n`` independent uniform 64-bit words."""
    return np.frombuffer(os.urandom(8 * int(n)), dtype="<u8").astype(np.uint64)


def uniform(n: int) -> np.ndarray:
    """``n`` independent uniforms on the midpoint grid of [0, 1) with spacing 2^-53."""
    w = random_u64(n) >> np.uint64(11)
    return (w.astype(np.float64) + 0.5) * 2.0 ** -53


def standard_normal(n: int) -> np.ndarray:
    """``n`` independent N(0, 1) variates (Box-Muller)."""
    m = (int(n) + 1) // 2
    r = np.sqrt(-2.0 * np.log(uniform(m)))
    theta = 2.0 * math.pi * uniform(m)
    return np.concatenate([r * np.cos(theta), r * np.sin(theta)])[:n]
