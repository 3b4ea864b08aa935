"""The private release of a site's sufficient statistics (method.md section 2, steps 2-5).

``release_statistics`` is the whole mechanism of Honkela et al. (2018), section 4.2: project
every value into the public bounds, compute X^T X, X^T y, y^T y, and add Laplace noise to
each with the scales of ``site_node.sensitivity``. It is eps-DP under *bounded* DP
(neighbours differ by replacing one record), so n is released exactly.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

from dpfed.statistics import (Statistics, exact_statistics, non_finite_error,
                              validate_shapes)
from site_node.laplace import add_laplace_noise
from site_node.sensitivity import (DEFAULT_BUDGET_SPLIT, noise_calibration,
                                   validate_privacy_parameters)

__all__ = ["release_statistics", "release_many", "exact_statistics", "clip", "clipped_statistics",
           "ReleaseInfo"]

# Rows per block of the fused clip + accumulate pass: about 1 MiB of clipped features, so the
# block stays in the per-core L2 cache between clipping it and multiplying it.
_BLOCK_BYTES = 1 << 20
# Upper triangles at least this long (d >= 45) get their noise sampled in two threads.
_CHUNKED_NOISE_MIN = 1024
# Data at least this large (n x d x 8 bytes) is clipped and accumulated by one thread per core
# over contiguous row ranges, each with single-threaded BLAS (see _row_parallelism).
_PARALLEL_MIN_BYTES = 8 << 20
_MAX_ROW_WORKERS = 4

try:  # optional: without it the pass runs in one thread with BLAS's own threading
    from threadpoolctl import ThreadpoolController
except ImportError:  # pragma: no cover - the [site] extra installs it
    ThreadpoolController = None

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_BLAS: "ThreadpoolController | None" = None
# The BLAS thread limit is process-wide: one parallel pass at a time, so that overlapping
# releases cannot restore each other's limits out of order.
_PARALLEL_PASS = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=_MAX_ROW_WORKERS,
                                       thread_name_prefix="dpfed-release")
        return _POOL


def _row_parallelism(n: int, d: int) -> int:
    """How many threads share the clip + accumulate pass. BLAS's own threads cover only the
    X^T X product; clipping and the finiteness scan are single-threaded numpy and leave the
    other core idle for about a third of the pass. Splitting the rows between one thread per
    core, each with single-threaded BLAS, keeps every core busy for the whole pass (numpy's
    loops and BLAS both release the GIL)."""
    global _BLAS
    if ThreadpoolController is None or n * d * 8 < _PARALLEL_MIN_BYTES:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    workers = min(cores, _MAX_ROW_WORKERS)
    if workers > 1 and _BLAS is None:
        _BLAS = ThreadpoolController()
    return workers


def clip(values: np.ndarray, bound: float) -> np.ndarray:
    """Project every value into [-bound, bound] (paper, eq. (4.2); method.md step 2)."""
    return np.clip(values, -bound, bound)


def clipped_statistics(x: np.ndarray, y: np.ndarray, x_bound: float, y_bound: float
                       ) -> tuple[np.ndarray, np.ndarray, float]:
    """Exact (noise-free) X^T X, X^T y, y^T y of the clipped data, in one fused pass.

    Same values as ``exact_statistics(clip(x, Bx), clip(y, By))`` up to floating-point
    summation order, but the rows are clipped block by block into a small reusable buffer that
    stays in cache for the block's Gram update (no n x d temporary, one read of ``x``). Large
    inputs are split into contiguous row ranges accumulated concurrently (``_row_parallelism``)
    and the partial sums added. Also checks finiteness block by block (clipping would silently
    turn inf into a bound), raising the ValueError of ``dpfed.statistics.validate_data`` for
    the first bad row before any noise is drawn.
    ``x`` (n x d) and ``y`` (n,) must be float64 with matching shapes (``validate_shapes``).
    """
    n, d = x.shape
    workers = _row_parallelism(n, d)
    if workers == 1:
        xtx, xty, yty = _accumulate(x, y, x_bound, y_bound, 0)
    else:
        edges = np.linspace(0, n, workers + 1).astype(int)
        with _PARALLEL_PASS, _BLAS.limit(limits=1, user_api="blas"):
            futures = [_pool().submit(_accumulate, x[a:b], y[a:b], x_bound, y_bound, int(a))
                       for a, b in zip(edges[:-1], edges[1:])]
            wait(futures)  # every thread done before the BLAS limit is lifted
        # In row order, so the error reported is the one for the first bad row.
        parts = [f.result() for f in futures]
        xtx = sum(p[0] for p in parts[1:]) + parts[0][0]
        xty = sum(p[1] for p in parts[1:]) + parts[0][1]
        yty = float(sum(p[2] for p in parts))
    return np.triu(xtx) + np.triu(xtx, 1).T, xty, yty


def _accumulate(x: np.ndarray, y: np.ndarray, x_bound: float, y_bound: float,
                row_offset: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The blocked clip + accumulate loop over ``x``, ``y`` (rows numbered from
    ``row_offset`` in error messages); xtx is summed in full (not yet mirrored)."""
    n, d = x.shape
    rows = max(64, min(n, _BLOCK_BYTES // (8 * d)))
    bx = np.empty((rows, d))
    by = np.empty(rows)
    xtx = np.zeros((d, d))
    xty = np.zeros(d)
    yty = 0.0
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        xs, ys = x[start:stop], y[start:stop]
        error = non_finite_error(xs, ys, row_offset=row_offset + start)
        if error is not None:
            raise error
        zb, ub = bx[:stop - start], by[:stop - start]
        np.clip(xs, -x_bound, x_bound, out=zb)
        np.clip(ys, -y_bound, y_bound, out=ub)
        xtx += zb.T @ zb  # numpy uses BLAS syrk for a.T @ a
        xty += zb.T @ ub
        yty += float(ub @ ub)
    return xtx, xty, yty


class ReleaseInfo(dict):
    """Accounting of one release: epsilon per part as certified by OpenDP and in total."""


def release_statistics(x, y, *, epsilon: float, x_bound: float, y_bound: float,
                       budget_split=DEFAULT_BUDGET_SPLIT, return_info: bool = False):
    """Release eps-differentially private sufficient statistics of private data ``(x, y)``.

    Every value of ``x`` is clipped to [-x_bound, x_bound] and of ``y`` to [-y_bound, y_bound];
    then Laplace noise is added to the d(d+1)/2 upper-triangle entries of X^T X (mirrored, so
    the result is exactly symmetric), to X^T y and to y^T y with scales
    d(d+1)Bx^2/(p1 eps), 2dBxBy/(p2 eps) and By^2/(p3 eps) (method.md section 2).

    Privacy: eps-DP under *bounded* differential privacy, i.e. for neighbouring data sets of
    the same size n that differ in one replaced record. ``n`` is released exactly; it is not
    protected (under add/remove neighbours it would be, and the sensitivities would differ).
    The bounds, the split and any pre-processing parameters must be public: the caller must
    not derive them from ``(x, y)``.

    Raises ValueError, releasing nothing, on invalid parameters or data.
    With ``return_info=True`` returns ``(Statistics, ReleaseInfo)``.
    """
    # Parameters first, then data: either failing raises before anything is computed.
    epsilon, x_bound, y_bound, budget_split = validate_privacy_parameters(
        epsilon, x_bound, y_bound, budget_split)
    x, y = validate_shapes(x, y)
    d = x.shape[1]
    cal = noise_calibration(d, epsilon, x_bound, y_bound, budget_split)
    # Raises on NaN/inf before any noise is drawn.
    sxx, sxy, syy = clipped_statistics(x, y, x_bound, y_bound)
    iu = np.triu_indices(d)

    # Large upper triangles are sampled in two concurrent pieces: the same mechanism with the
    # same certificate (site_node.laplace docstring), only faster on an idle multi-core host.
    # Sxy and Syy (d + 1 values, under 1 ms) are sampled after it, in a fixed order.
    xtx_upper, eps_xx = add_laplace_noise(sxx[iu], cal.xtx_sensitivity, cal.xtx_epsilon,
                                          chunks=2 if iu[0].size >= _CHUNKED_NOISE_MIN else 1)
    xty, eps_xy = add_laplace_noise(sxy, cal.xty_sensitivity, cal.xty_epsilon)
    yty, eps_yy = add_laplace_noise(np.array([syy]), cal.yty_sensitivity, cal.yty_epsilon)

    # The noisy upper triangle is mirrored, so Sxx is exactly symmetric (method.md step 5).
    stats = Statistics.from_upper(d, x.shape[0], np.concatenate([xtx_upper, xty, yty]))
    if not return_info:
        return stats
    info = ReleaseInfo(epsilon=float(epsilon), epsilon_xtx=eps_xx, epsilon_xty=eps_xy,
                       epsilon_yty=eps_yy, epsilon_certified=eps_xx + eps_xy + eps_yy,
                       x_bound=float(x_bound), y_bound=float(y_bound),
                       budget_split=[float(p) for p in budget_split], n=int(x.shape[0]), dim=d)
    return stats, info


def release_many(blocks, *, epsilon: float, x_bound: float, y_bound: float,
                 budget_split=DEFAULT_BUDGET_SPLIT, return_info: bool = False):
    """Release each ``(x, y)`` of ``blocks`` (K separate data sets, e.g. the K sites of the
    federated evaluation, method.md section 3) exactly as ``release_statistics`` releases it,
    but with the noise of all K releases drawn in three OpenDP calls instead of 3 K.

    Every block is clipped and its exact Sxx, Sxy, Syy computed (``clipped_statistics``; any
    invalid block raises ValueError before any noise is drawn). Then, per part (the upper
    triangles of Sxx, the Sxy vectors, the Syy values), the K blocks' values are concatenated
    and released by ONE ``add_laplace_noise`` call with the sensitivity and epsilon share of a
    *single* release (d(d+1)Bx^2 / p1 eps etc., ``site_node.sensitivity``).

    Why this is the same mechanism, with the same guarantee per data set:
    - OpenDP's vector Laplace mechanism rounds each coordinate to the grid 2^k and adds i.i.d.
      discrete Laplace noise per coordinate; the grid k depends only on the sensitivity and the
      scale is one number for the whole vector. So the concatenated call gives every block
      independent noise with the per-coordinate distribution of a single release, and blocks
      are independent of each other -- as K separate calls would be.
    - Neighbouring inputs: each block is its own data set (a site); a neighbour replaces one
      record of ONE block, which moves only that block's part by at most the single-release
      L1 sensitivity Delta (the other blocks' values, and their rounding to the grid, are
      unchanged). So Delta is the L1 sensitivity of the concatenated vector, and that is what
      the measurement is calibrated for (not K Delta: the K blocks are not one data set).
    - Grid-rounding slack: ``add_laplace_noise`` calibrates on the *whole* concatenated vector
      (size K m), i.e. OpenDP's privacy map charges the rounding slack K m 2^k of every
      coordinate, not only the changed block's m 2^k. The certified epsilon at distance Delta
      is therefore <= the share, and the scale is at least the single-release scale (larger by
      at most (K-1) m 2^k / Delta <= (K-1) m 2^-40 relative, ~5e-10 for K = 10, d = 10): never
      less noise than K separate releases.
    Each block is eps-DP (bounded DP, n exact) with respect to its own records, as with
    ``release_statistics``. The privacy loss of one data set does not grow with K.

    All blocks must have the same number of columns d; rows may differ. Returns a list of
    ``Statistics`` in block order; with ``return_info=True`` a list of
    ``(Statistics, ReleaseInfo)`` where the epsilons are OpenDP's certificates of the
    concatenated calls (which bound every block's loss).
    """
    epsilon, x_bound, y_bound, budget_split = validate_privacy_parameters(
        epsilon, x_bound, y_bound, budget_split)
    blocks = list(blocks)
    if not blocks:
        raise ValueError("release_many needs at least one (x, y) block")
    shaped = [validate_shapes(x, y) for x, y in blocks]
    d = shaped[0][0].shape[1]
    if any(x.shape[1] != d for x, _ in shaped):
        raise ValueError("every block must have the same number of columns d, got "
                         f"{sorted({x.shape[1] for x, _ in shaped})}")
    cal = noise_calibration(d, epsilon, x_bound, y_bound, budget_split)
    # All data validated and reduced before the first noise is drawn.
    exact = [clipped_statistics(x, y, x_bound, y_bound) for x, y in shaped]
    iu = np.triu_indices(d)
    m = iu[0].size
    k = len(exact)
    xx_all = np.concatenate([sxx[iu] for sxx, _, _ in exact])
    xy_all = np.concatenate([sxy for _, sxy, _ in exact])
    yy_all = np.array([syy for _, _, syy in exact])
    # Same fixed part order as release_statistics: Sxx, then Sxy, then Syy.
    xx_noisy, eps_xx = add_laplace_noise(
        xx_all, cal.xtx_sensitivity, cal.xtx_epsilon,
        chunks=2 if xx_all.size >= _CHUNKED_NOISE_MIN else 1)
    xy_noisy, eps_xy = add_laplace_noise(xy_all, cal.xty_sensitivity, cal.xty_epsilon)
    yy_noisy, eps_yy = add_laplace_noise(yy_all, cal.yty_sensitivity, cal.yty_epsilon)
    out = []
    for j, (x, _) in enumerate(shaped):
        stats = Statistics.from_upper(d, x.shape[0], np.concatenate(
            [xx_noisy[j * m:(j + 1) * m], xy_noisy[j * d:(j + 1) * d], yy_noisy[j:j + 1]]))
        if not return_info:
            out.append(stats)
            continue
        out.append((stats, ReleaseInfo(
            epsilon=float(epsilon), epsilon_xtx=eps_xx, epsilon_xty=eps_xy, epsilon_yty=eps_yy,
            epsilon_certified=eps_xx + eps_xy + eps_yy, x_bound=float(x_bound),
            y_bound=float(y_bound), budget_split=[float(p) for p in budget_split],
            n=int(x.shape[0]), dim=d, blocks_per_call=k)))
    return out
