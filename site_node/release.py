"""The private release of a site's sufficient statistics (method.md sections 2 and 9).

``release_statistics`` is the mechanism of Honkela et al. (2018), section 4.2: project every
value into the public bounds, compute X^T X, X^T y, y^T y, and add Laplace noise to each with
the scales of ``dpfed.sensitivity``. Under add/remove neighbours (the default) n is private
and released with discrete Laplace noise too; under replace-one (bounded DP, the paper's) n
is public and released exactly.

With a row-norm bound R (``x_norm_bound``; a round whose pre-processing normalises rows has
R = 1, ``dpfed.sensitivity.row_norm_bound``) every clipped row is also projected into the L2
ball of radius R (scaled down if longer; a unit row is unchanged), which lowers the Sxx and
Sxy sensitivities once Bx exceeds R / sqrt(d) (``dpfed.sensitivity``, "Row-norm bound").
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

from dpfed.secagg.exact import ExactAccumulator, ExactStatistics, quantize, quantum_exponents
from dpfed.statistics import (Statistics, exact_statistics, non_finite_error,
                              validate_shapes)
from dpfed.sensitivity import (check_neighbouring, check_norm_bound, check_xtx_rule,
                               default_budget_split, expected_noise, noise_calibration,
                               validate_privacy_parameters)
from site_node.laplace import add_count_noise, add_laplace_noise

__all__ = ["release_statistics", "release_many", "exact_statistics", "clip", "clipped_statistics",
           "exact_clipped_statistics", "ReleaseInfo"]

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


def project_rows(x: np.ndarray, x_norm_bound: float) -> np.ndarray:
    """Every row of ``x`` scaled (in place) into the L2 ball of radius ``x_norm_bound``:
    rows longer than R are multiplied by R / ||row|| (1 - 1e-12), so that the result is
    below R in floating point too; shorter rows are left alone. Returns ``x``."""
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    over = norms > x_norm_bound
    if np.any(over):
        x[over] *= (x_norm_bound * (1.0 - 1e-12) / norms[over])[:, None]
    return x


def clipped_statistics(x: np.ndarray, y: np.ndarray, x_bound: float, y_bound: float,
                       x_norm_bound: float | None = None
                       ) -> tuple[np.ndarray, np.ndarray, float]:
    """Exact (noise-free) X^T X, X^T y, y^T y of the clipped data, in one fused pass.

    Same values as ``exact_statistics(clip(x, Bx), clip(y, By))`` up to floating-point
    summation order, but the rows are clipped block by block into a small reusable buffer that
    stays in cache for the block's Gram update (no n x d temporary, one read of ``x``). Large
    inputs are split into contiguous row ranges accumulated concurrently (``_row_parallelism``)
    and the partial sums added. Also checks finiteness block by block (clipping would silently
    turn inf into a bound), raising the ValueError of ``dpfed.statistics.validate_data`` for
    the first bad row before any noise is drawn. With ``x_norm_bound`` R the clipped rows are
    then projected into the L2 ball of radius R (``project_rows``).
    ``x`` (n x d) and ``y`` (n,) must be float64 with matching shapes (``validate_shapes``).
    """
    n, d = x.shape
    workers = _row_parallelism(n, d)
    if workers == 1:
        xtx, xty, yty = _accumulate(x, y, x_bound, y_bound, 0, x_norm_bound)
    else:
        edges = np.linspace(0, n, workers + 1).astype(int)
        with _PARALLEL_PASS, _BLAS.limit(limits=1, user_api="blas"):
            futures = [_pool().submit(_accumulate, x[a:b], y[a:b], x_bound, y_bound, int(a),
                                      x_norm_bound)
                       for a, b in zip(edges[:-1], edges[1:])]
            wait(futures)  # every thread done before the BLAS limit is lifted
        # In row order, so the error reported is the one for the first bad row.
        parts = [f.result() for f in futures]
        xtx = sum(p[0] for p in parts[1:]) + parts[0][0]
        xty = sum(p[1] for p in parts[1:]) + parts[0][1]
        yty = float(sum(p[2] for p in parts))
    return np.triu(xtx) + np.triu(xtx, 1).T, xty, yty


def _clipped_blocks(x: np.ndarray, y: np.ndarray, x_bound: float, y_bound: float,
                    row_offset: int, x_norm_bound: float | None = None):
    """Blocks of the rows clipped to the bounds (and projected into the row-norm ball),
    checked for non-finite values block by block (rows numbered from ``row_offset`` in error
    messages). The yielded arrays are reused buffers: consume each before the next."""
    n, d = x.shape
    rows = max(64, min(max(n, 1), _BLOCK_BYTES // (8 * d)))
    bx = np.empty((rows, d))
    by = np.empty(rows)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        xs, ys = x[start:stop], y[start:stop]
        error = non_finite_error(xs, ys, row_offset=row_offset + start)
        if error is not None:
            raise error
        zb, ub = bx[:stop - start], by[:stop - start]
        np.clip(xs, -x_bound, x_bound, out=zb)
        np.clip(ys, -y_bound, y_bound, out=ub)
        if x_norm_bound is not None:
            project_rows(zb, x_norm_bound)
        yield zb, ub


def _accumulate(x: np.ndarray, y: np.ndarray, x_bound: float, y_bound: float,
                row_offset: int, x_norm_bound: float | None = None
                ) -> tuple[np.ndarray, np.ndarray, float]:
    """The blocked clip + accumulate loop over ``x``, ``y``; xtx is summed in full (not yet
    mirrored)."""
    d = x.shape[1]
    xtx = np.zeros((d, d))
    xty = np.zeros(d)
    yty = 0.0
    for zb, ub in _clipped_blocks(x, y, x_bound, y_bound, row_offset, x_norm_bound):
        xtx += zb.T @ zb  # numpy uses BLAS syrk for a.T @ a
        xty += zb.T @ ub
        yty += float(ub @ ub)
    return xtx, xty, yty


def exact_clipped_statistics(x: np.ndarray, y: np.ndarray, x_bound: float, y_bound: float,
                             x_norm_bound: float | None = None) -> ExactStatistics:
    """The exact statistics a site encodes in a secure round (``dpfed.secagg.exact``): the
    rows clipped (and projected into the row-norm ball) as ``clipped_statistics`` does, then
    every value quantised toward zero to the round's public power-of-two grid and X^T X, X^T y,
    y^T y summed exactly in integers. Any number of rows (no cap, no refusal on n); within
    the quantisation (a relative 2^-20 of the bounds per value) of ``clipped_statistics``.
    Checks finiteness block by block as ``clipped_statistics`` does. Zero rows give zeros."""
    x, y = _data_shapes(x, y)
    d = x.shape[1]
    qx, qy = quantum_exponents(x_bound, y_bound, x_norm_bound)
    acc = ExactAccumulator(d, qx, qy)
    for zb, ub in _clipped_blocks(x, y, x_bound, y_bound, 0, x_norm_bound):
        acc.add(quantize(zb, qx), quantize(ub, qy))
    return acc.result()


class ReleaseInfo(dict):
    """Accounting of one release: the relation, the Sxx rule, epsilon per part as certified
    by OpenDP (``epsilon_n`` only under add/remove) and in total."""


def _parameters(epsilon, x_bound, y_bound, budget_split, neighbouring, xtx_sensitivity):
    """Checked public parameters (ValueError before anything is computed or drawn)."""
    check_neighbouring(neighbouring)
    check_xtx_rule(xtx_sensitivity)
    if budget_split is None:
        budget_split = default_budget_split(neighbouring)
    return validate_privacy_parameters(epsilon, x_bound, y_bound, budget_split,
                                       neighbouring=neighbouring)


def _info(cal, epsilon, x_bound, y_bound, budget_split, n, d, eps_parts, **extra) -> ReleaseInfo:
    eps_xx, eps_xy, eps_yy, eps_n = eps_parts
    info = ReleaseInfo(
        epsilon=float(epsilon), neighbouring=cal.neighbouring, xtx_sensitivity=cal.xtx_rule,
        epsilon_xtx=eps_xx, epsilon_xty=eps_xy, epsilon_yty=eps_yy,
        epsilon_certified=eps_xx + eps_xy + eps_yy + (eps_n or 0.0),
        x_bound=float(x_bound), y_bound=float(y_bound),
        budget_split=[float(p) for p in budget_split], n=int(n), dim=d, **extra)
    if eps_n is not None:
        info["epsilon_n"] = eps_n
    if cal.x_norm_bound is not None:
        info["x_norm_bound"] = cal.x_norm_bound
    return info


def release_statistics(x, y, *, epsilon: float, x_bound: float, y_bound: float,
                       budget_split=None, neighbouring: str = "add_remove",
                       xtx_sensitivity: str = "exact", x_norm_bound: float | None = None,
                       return_info: bool = False):
    """Release eps-differentially private sufficient statistics of private data ``(x, y)``.

    Every value of ``x`` is clipped to [-x_bound, x_bound] and of ``y`` to [-y_bound, y_bound];
    then Laplace noise is added to the d(d+1)/2 upper-triangle entries of X^T X (mirrored, so
    the result is exactly symmetric), to X^T y and to y^T y, with scale sensitivity / (share of
    epsilon) for the sensitivities of ``dpfed.sensitivity`` (method.md sections 2 and 9).

    ``neighbouring="add_remove"`` (default; unbounded DP, neighbours differ by the presence of
    one record): ``budget_split`` has 4 shares (Sxx, Sxy, Syy, n; default
    ``DEFAULT_SPLIT_ADD_REMOVE``) and n is released as n + discrete Laplace noise of scale
    1/(p4 eps) from OpenDP (integer domain, CSPRNG), then clamped at 0. The clamp is
    post-processing of the DP value, so it costs no privacy; it biases n up slightly when n is
    within a few scales of 0. The returned ``Statistics.n`` is that noisy n.
    ``neighbouring="replace_one"`` (bounded DP, the paper's): 3 shares and n released exactly;
    it is not protected.
    ``xtx_sensitivity``: "exact" (d(d+1)/2 Bx^2) or "paper" (d(d+1) Bx^2, twice the noise).
    ``x_norm_bound``: R, the rows are also projected into the L2 ball of radius R and the
    sensitivities use it (module docstring); None: coordinate clipping only.

    The returned statistics carry ``noise = dpfed.sensitivity.expected_noise(...)``. The
    bounds, the split and any pre-processing parameters must be public: the caller must not
    derive them from ``(x, y)``.

    Raises ValueError, releasing nothing, on invalid parameters or data.
    With ``return_info=True`` returns ``(Statistics, ReleaseInfo)``.
    """
    # Parameters first, then data: either failing raises before anything is computed.
    epsilon, x_bound, y_bound, budget_split = _parameters(
        epsilon, x_bound, y_bound, budget_split, neighbouring, xtx_sensitivity)
    x_norm_bound = check_norm_bound(x_norm_bound)
    x, y = _data_shapes(x, y)
    d = x.shape[1]
    cal, noise = _calibration(d, epsilon, x_bound, y_bound, budget_split, neighbouring,
                              xtx_sensitivity, x_norm_bound)
    # Raises on NaN/inf before any noise is drawn.
    sxx, sxy, syy = clipped_statistics(x, y, x_bound, y_bound, x_norm_bound)
    iu = np.triu_indices(d)

    # Large upper triangles are sampled in two concurrent pieces: the same mechanism with the
    # same certificate (site_node.laplace docstring), only faster on an idle multi-core host.
    # Sxy, Syy and n (d + 2 values, under 1 ms) are sampled after it, in a fixed order.
    xtx_upper, eps_xx = add_laplace_noise(sxx[iu], cal.xtx_sensitivity, cal.xtx_epsilon,
                                          chunks=2 if iu[0].size >= _CHUNKED_NOISE_MIN else 1)
    xty, eps_xy = add_laplace_noise(sxy, cal.xty_sensitivity, cal.xty_epsilon)
    yty, eps_yy = add_laplace_noise(np.array([syy]), cal.yty_sensitivity, cal.yty_epsilon)
    n, eps_n = _release_counts([x.shape[0]], cal)

    # The noisy upper triangle is mirrored, so Sxx is exactly symmetric (method.md step 5).
    stats = Statistics.from_upper(d, n[0], np.concatenate([xtx_upper, xty, yty]), noise)
    if not return_info:
        return stats
    return stats, _info(cal, epsilon, x_bound, y_bound, budget_split, n[0], d,
                        (eps_xx, eps_xy, eps_yy, eps_n))


def _calibration(d: int, epsilon: float, x_bound: float, y_bound: float, budget_split,
                 neighbouring: str, xtx_sensitivity: str, x_norm_bound: float | None):
    """The noise calibration of one release (``dpfed.sensitivity.noise_calibration``: each
    part's sensitivity and epsilon share) and the noise description its statistics carry
    (``dpfed.sensitivity.expected_noise``), from the same arguments so that the two agree;
    ``release_statistics`` and ``release_many`` both use it. Draws nothing."""
    cal = noise_calibration(d, epsilon, x_bound, y_bound, budget_split,
                            neighbouring=neighbouring, xtx_sensitivity=xtx_sensitivity,
                            x_norm_bound=x_norm_bound)
    noise = expected_noise(d, epsilon, x_bound, y_bound, budget_split,
                           neighbouring=neighbouring, xtx_sensitivity=xtx_sensitivity,
                           x_norm_bound=x_norm_bound)
    return cal, noise


def _data_shapes(x, y) -> tuple[np.ndarray, np.ndarray]:
    """``validate_shapes``, except that a data set of zero rows (d >= 1 columns) is allowed:
    its statistics are zero and its release is noise alone. A site whose rows were all left
    out (site_node.data, site_node.rows) answers like any other: whether it has rows is not
    something it may reveal for free."""
    xa, ya = np.asarray(x), np.asarray(y)
    if xa.ndim == 2 and ya.ndim == 1 and xa.shape[0] == 0 == ya.shape[0] and xa.shape[1] > 0:
        return xa.astype(np.float64), ya.astype(np.float64)
    return validate_shapes(x, y)


def _release_counts(counts: list[int], cal) -> tuple[list[int], float | None]:
    """The released n of each count: exact under replace-one (public there, no epsilon); under
    add/remove, OpenDP discrete Laplace with the n share, clamped at 0 (post-processing)."""
    if cal.n_sensitivity is None:
        return [int(c) for c in counts], None
    noisy, certified = add_count_noise(counts, cal.n_epsilon)
    return [max(0, v) for v in noisy], certified


def release_many(blocks, *, epsilon: float, x_bound: float, y_bound: float,
                 budget_split=None, neighbouring: str = "add_remove",
                 xtx_sensitivity: str = "exact", x_norm_bound: float | None = None,
                 return_info: bool = False):
    """Release each ``(x, y)`` of ``blocks`` (K separate data sets, e.g. the K sites of the
    federated evaluation, method.md section 3) exactly as ``release_statistics`` releases it
    (same ``neighbouring``, ``xtx_sensitivity``, ``x_norm_bound`` and split), but with the noise of all K releases
    drawn in one OpenDP call per part instead of K.

    Every block is clipped and its exact Sxx, Sxy, Syy computed (``clipped_statistics``; any
    invalid block raises ValueError before any noise is drawn). Then, per part (the upper
    triangles of Sxx, the Sxy vectors, the Syy values, and under add/remove the counts n), the
    K blocks' values are concatenated and released by ONE call with the sensitivity and
    epsilon share of a *single* release (``dpfed.sensitivity``).

    Why this is the same mechanism, with the same guarantee per data set:
    - OpenDP's vector Laplace mechanism rounds each coordinate to the grid 2^k and adds i.i.d.
      discrete Laplace noise per coordinate; the grid k depends only on the sensitivity and the
      scale is one number for the whole vector. So the concatenated call gives every block
      independent noise with the per-coordinate distribution of a single release, and blocks
      are independent of each other -- as K separate calls would be. (The counts: integer
      discrete Laplace, no grid, i.i.d. per coordinate.)
    - Neighbouring inputs: each block is its own data set (a site); a neighbour changes one
      record of ONE block (replaces it, or adds/removes it), which moves only that block's part
      by at most the single-release L1 sensitivity Delta (the other blocks' values, and their
      rounding to the grid, are unchanged). So Delta is the L1 sensitivity of the concatenated
      vector, and that is what the measurement is calibrated for (not K Delta: the K blocks are
      not one data set).
    - Grid-rounding slack: ``add_laplace_noise`` calibrates on the *whole* concatenated vector
      (size K m), i.e. OpenDP's privacy map charges the rounding slack K m 2^k of every
      coordinate, not only the changed block's m 2^k. The certified epsilon at distance Delta
      is therefore <= the share, and the scale is at least the single-release scale (larger by
      at most (K-1) m 2^k / Delta <= (K-1) m 2^-40 relative, ~5e-10 for K = 10, d = 10): never
      less noise than K separate releases.
    Each block is eps-DP with respect to its own records, as with ``release_statistics``. The
    privacy loss of one data set does not grow with K.

    All blocks must have the same number of columns d; rows may differ. Returns a list of
    ``Statistics`` (each with ``noise = expected_noise(...)``) in block order; with
    ``return_info=True`` a list of ``(Statistics, ReleaseInfo)`` where the epsilons are
    OpenDP's certificates of the concatenated calls (which bound every block's loss).
    """
    epsilon, x_bound, y_bound, budget_split = _parameters(
        epsilon, x_bound, y_bound, budget_split, neighbouring, xtx_sensitivity)
    x_norm_bound = check_norm_bound(x_norm_bound)
    blocks = list(blocks)
    if not blocks:
        raise ValueError("release_many needs at least one (x, y) block")
    shaped = [validate_shapes(x, y) for x, y in blocks]
    d = shaped[0][0].shape[1]
    if any(x.shape[1] != d for x, _ in shaped):
        raise ValueError("every block must have the same number of columns d, got "
                         f"{sorted({x.shape[1] for x, _ in shaped})}")
    cal, noise = _calibration(d, epsilon, x_bound, y_bound, budget_split, neighbouring,
                              xtx_sensitivity, x_norm_bound)
    # All data validated and reduced before the first noise is drawn.
    exact = [clipped_statistics(x, y, x_bound, y_bound, x_norm_bound) for x, y in shaped]
    iu = np.triu_indices(d)
    m = iu[0].size
    k = len(exact)
    xx_all = np.concatenate([sxx[iu] for sxx, _, _ in exact])
    xy_all = np.concatenate([sxy for _, sxy, _ in exact])
    yy_all = np.array([syy for _, _, syy in exact])
    # Same fixed part order as release_statistics: Sxx, Sxy, Syy, then n.
    xx_noisy, eps_xx = add_laplace_noise(
        xx_all, cal.xtx_sensitivity, cal.xtx_epsilon,
        chunks=2 if xx_all.size >= _CHUNKED_NOISE_MIN else 1)
    xy_noisy, eps_xy = add_laplace_noise(xy_all, cal.xty_sensitivity, cal.xty_epsilon)
    yy_noisy, eps_yy = add_laplace_noise(yy_all, cal.yty_sensitivity, cal.yty_epsilon)
    ns, eps_n = _release_counts([x.shape[0] for x, _ in shaped], cal)
    out = []
    for j in range(k):
        stats = Statistics.from_upper(d, ns[j], np.concatenate(
            [xx_noisy[j * m:(j + 1) * m], xy_noisy[j * d:(j + 1) * d], yy_noisy[j:j + 1]]),
            noise)
        if not return_info:
            out.append(stats)
            continue
        out.append((stats, _info(cal, epsilon, x_bound, y_bound, budget_split, ns[j], d,
                                 (eps_xx, eps_xy, eps_yy, eps_n), blocks_per_call=k)))
    return out
