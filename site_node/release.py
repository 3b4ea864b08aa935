"""The private release of a site's sufficient statistics (method.md section 2, steps 2-5).

``release_statistics`` is the whole mechanism of Honkela et al. (2018), section 4.2: project
every value into the public bounds, compute X^T X, X^T y, y^T y, and add Laplace noise to
each with the scales of ``site_node.sensitivity``. It is eps-DP under *bounded* DP
(neighbours differ by replacing one record), so n is released exactly.
"""

from __future__ import annotations

import numpy as np

from dpfed.statistics import (Statistics, exact_statistics, non_finite_error,
                              validate_shapes)
from site_node.laplace import add_laplace_noise
from site_node.sensitivity import (DEFAULT_BUDGET_SPLIT, noise_calibration,
                                   validate_privacy_parameters)

__all__ = ["release_statistics", "exact_statistics", "clip", "clipped_statistics", "ReleaseInfo"]

# Rows per block of the fused clip + accumulate pass: about 1 MiB of clipped features, so the
# block stays in the per-core L2 cache between clipping it and multiplying it.
_BLOCK_BYTES = 1 << 20
# Upper triangles at least this long (d >= 45) get their noise sampled in two threads.
_CHUNKED_NOISE_MIN = 1024


def clip(values: np.ndarray, bound: float) -> np.ndarray:
    """Project every value into [-bound, bound] (paper, eq. (4.2); method.md step 2)."""
    return np.clip(values, -bound, bound)


def clipped_statistics(x: np.ndarray, y: np.ndarray, x_bound: float, y_bound: float
                       ) -> tuple[np.ndarray, np.ndarray, float]:
    """Exact (noise-free) X^T X, X^T y, y^T y of the clipped data, in one fused pass.

    Same values as ``exact_statistics(clip(x, Bx), clip(y, By))`` up to floating-point
    summation order, but the rows are clipped block by block into a small reusable buffer that
    stays in cache for the block's Gram update (no n x d temporary, one read of ``x``). Also
    checks finiteness block by block (clipping would silently turn inf into a bound), raising
    the ValueError of ``dpfed.statistics.validate_data`` before any noise is drawn.
    ``x`` (n x d) and ``y`` (n,) must be float64 with matching shapes (``validate_shapes``).
    """
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
        error = non_finite_error(xs, ys, row_offset=start)
        if error is not None:
            raise error
        zb, ub = bx[:stop - start], by[:stop - start]
        np.clip(xs, -x_bound, x_bound, out=zb)
        np.clip(ys, -y_bound, y_bound, out=ub)
        xtx += zb.T @ zb  # numpy uses BLAS syrk for a.T @ a
        xty += zb.T @ ub
        yty += float(ub @ ub)
    return np.triu(xtx) + np.triu(xtx, 1).T, xty, yty


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
    xtx_upper, eps_xx = add_laplace_noise(sxx[iu], cal.xtx_sensitivity, cal.xtx_epsilon,
                                          chunks=2 if iu[0].size >= _CHUNKED_NOISE_MIN else 1)
    xty, eps_xy = add_laplace_noise(sxy, cal.xty_sensitivity, cal.xty_epsilon)
    yty, eps_yy = add_laplace_noise(np.array([syy]), cal.yty_sensitivity, cal.yty_epsilon)

    xtx = np.zeros((d, d))
    xtx[iu] = xtx_upper
    xtx = np.triu(xtx) + np.triu(xtx, 1).T
    stats = Statistics(xtx, xty, float(yty[0]), x.shape[0])
    if not return_info:
        return stats
    info = ReleaseInfo(epsilon=float(epsilon), epsilon_xtx=eps_xx, epsilon_xty=eps_xy,
                       epsilon_yty=eps_yy, epsilon_certified=eps_xx + eps_xy + eps_yy,
                       x_bound=float(x_bound), y_bound=float(y_bound),
                       budget_split=[float(p) for p in budget_split], n=int(x.shape[0]), dim=d)
    return stats, info
