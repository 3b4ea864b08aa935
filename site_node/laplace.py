"""Floating-point-safe Laplace noise from OpenDP, fed by a cryptographic RNG.

Textbook inverse-CDF Laplace sampling on doubles leaks the input (Mironov 2012, "On
significance of the least significant bits for differential privacy"). OpenDP's
``make_laplace`` rounds the input to a grid 2^k and adds *discrete* Laplace noise sampled
exactly from the operating system's CSPRNG (Canonne, Kamath, Steinke 2020), so the output
carries no floating-point side channel. numpy's generators are never used for DP noise.

We fix the grid at k = floor(log2(sensitivity)) - 40: sampling is ~4x faster than OpenDP's
default of the finest grid, and rounding the input to the grid adds at most ``size * 2^k``
(about 2e-9 of the sensitivity per 1000 entries) to the L1 distance. That extra distance is
not ignored: the scale is calibrated with OpenDP's own privacy map so that the privacy loss
OpenDP certifies never exceeds the epsilon we charge.

Chunked sampling (``chunks > 1``). The vector Laplace mechanism adds i.i.d. noise per
coordinate: round each value to the grid 2^k, add discrete Laplace noise of scale b / 2^k in
grid units. Running it on pieces of the vector with the *same* scale b and grid k produces
exactly the same output distribution as running it on the whole vector, so it is the same
mechanism and has the same privacy loss: for neighbours with L1 distance Delta, the loss is
sum over all coordinates of |round(v_j) - round(v'_j)| / b <= (Delta + size 2^k) / b, whichever
piece a coordinate is in (the L1 distance is shared between the pieces, not granted to each).
So the certificate is taken from OpenDP's map of the *whole-vector* measurement (rounding slack
size * 2^k, summed over all pieces); the per-piece measurements are only used to sample.
Calibrating each piece separately at the full sensitivity would instead cost chunks x epsilon.
OpenDP is called through ctypes, which releases the GIL, so the pieces can run in threads.
"""

from __future__ import annotations

import functools
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_GRID_BITS_BELOW_SENSITIVITY = 40


@functools.cache
def _opendp():
    """OpenDP's prelude, its "contrib" features on (``make_laplace``), imported on the first
    release: a site imports this module at start and a secure round never calls OpenDP (its
    noise is dpfed.secagg's), and the import costs about 0.4 CPU-s per process
    (docs/benchmarks.md, "Start")."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp


@functools.lru_cache(maxsize=256)
def _calibrated_measurement(size: int, sensitivity: float, epsilon: float):
    """The OpenDP Laplace measurement on vectors of ``size`` floats whose certified privacy
    loss at L1 distance ``sensitivity`` is at most ``epsilon``. Returns (measurement, scale,
    certified epsilon)."""
    dp = _opendp()
    k = math.floor(math.log2(sensitivity)) - _GRID_BITS_BELOW_SENSITIVITY
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
    metric = dp.l1_distance(T=float)
    # Rounding to the grid moves each entry by at most 2^(k-1) on each data set; pay for the
    # worst case up front, then let OpenDP's map have the last word.
    scale = (sensitivity + size * 2.0**k) / epsilon
    for _ in range(64):
        meas = dp.m.make_laplace(domain, metric, scale=scale, k=k)
        certified = meas.map(sensitivity)
        if certified <= epsilon:
            return meas, scale, certified
        scale = math.nextafter(scale * (1 + 1e-12), math.inf)
    raise RuntimeError("could not calibrate the Laplace scale")  # pragma: no cover


@functools.lru_cache(maxsize=256)
def _piece_measurement(size: int, scale: float, k: int):
    """Sampling-only measurement: same per-coordinate mechanism (scale, grid k) on a piece."""
    dp = _opendp()
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
    return dp.m.make_laplace(domain, dp.l1_distance(T=float), scale=scale, k=k)


_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="dpfed-laplace")
    return _POOL


def laplace_scale(size: int, sensitivity: float, epsilon: float) -> float:
    """The Laplace scale actually used for ``size`` entries with this sensitivity and epsilon
    (sensitivity / epsilon up to a relative 1e-8)."""
    return _calibrated_measurement(size, float(sensitivity), float(epsilon))[1]


def add_laplace_noise(values: np.ndarray, sensitivity: float, epsilon: float, *,
                      chunks: int = 1) -> tuple[np.ndarray, float]:
    """Release ``values`` (1-D) with Laplace noise calibrated so that the release is
    ``epsilon``-DP for an L1 sensitivity of ``sensitivity``.

    ``chunks > 1`` samples that many contiguous pieces concurrently in threads; it is the same
    mechanism with the same certificate (module docstring).
    Returns the noisy values and the privacy loss OpenDP certifies (<= epsilon).
    """
    values = np.ascontiguousarray(values, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError("values must be a non-empty 1-D array")
    if not np.all(np.isfinite(values)):
        raise ValueError("values must be finite")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be finite and > 0, got {sensitivity!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunks must be a positive integer, got {chunks!r}")
    meas, scale, certified = _calibrated_measurement(values.size, float(sensitivity), float(epsilon))
    chunks = min(chunks, values.size)
    if chunks == 1:
        return np.asarray(meas(values.tolist()), dtype=np.float64), certified
    k = math.floor(math.log2(float(sensitivity))) - _GRID_BITS_BELOW_SENSITIVITY
    pieces = np.array_split(values, chunks)
    futures = [_pool().submit(_piece_measurement(p.size, scale, k), p.tolist()) for p in pieces]
    noisy = np.concatenate([np.asarray(f.result(), dtype=np.float64) for f in futures])
    return noisy, certified


@functools.lru_cache(maxsize=256)
def _count_measurement(size: int, epsilon: float):
    """OpenDP's discrete Laplace mechanism on vectors of ``size`` 64-bit integers, L1
    sensitivity 1, scale 1/epsilon nudged up (by ulps, if ever needed) until OpenDP certifies
    a loss <= ``epsilon`` at distance 1. Returns (measurement, scale, certified)."""
    dp = _opendp()
    domain = dp.vector_domain(dp.atom_domain(T="i64"), size=size)
    metric = dp.l1_distance(T="i64")
    scale = 1.0 / epsilon
    for _ in range(64):
        meas = dp.m.make_laplace(domain, metric, scale=scale)
        certified = meas.map(1)
        if certified <= epsilon:
            return meas, scale, certified
        scale = math.nextafter(scale, math.inf)
    raise RuntimeError("could not calibrate the discrete Laplace scale")  # pragma: no cover


def add_count_noise(counts, epsilon: float) -> tuple[list[int], float]:
    """Release integer ``counts`` (each the row count of its own data set, L1 sensitivity 1
    under add/remove neighbours) with OpenDP's discrete Laplace noise: P(e = k) proportional to
    exp(-|k| epsilon), exact integer sampling from the OS CSPRNG (Canonne, Kamath, Steinke
    2020), never numpy. One call for many counts draws independent noise per count, the same
    mechanism as one call per count (a neighbour changes one count by 1).

    Returns the noisy counts (Python ints, may be negative: clamping is the caller's
    post-processing) and the loss OpenDP certifies at distance 1 (<= epsilon)."""
    counts = [int(c) for c in counts]
    if not counts:
        raise ValueError("counts must be non-empty")
    if any(not 0 <= c < 2**62 for c in counts):
        raise ValueError("counts must be non-negative and below 2^62")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    meas, _, certified = _count_measurement(len(counts), float(epsilon))
    return [int(v) for v in meas(counts)], certified
