"""The private release of a site's sufficient statistics (method.md section 2, steps 2-5).

``release_statistics`` is the whole mechanism of Honkela et al. (2018), section 4.2: project
every value into the public bounds, compute X^T X, X^T y, y^T y, and add Laplace noise to
each with the scales of ``site_node.sensitivity``. It is eps-DP under *bounded* DP
(neighbours differ by replacing one record), so n is released exactly.
"""

from __future__ import annotations

import numpy as np

from dpfed.statistics import Statistics, exact_statistics, symmetric_gram, validate_data
from site_node.laplace import add_laplace_noise
from site_node.sensitivity import (DEFAULT_BUDGET_SPLIT, noise_calibration,
                                   validate_privacy_parameters)

__all__ = ["release_statistics", "exact_statistics", "clip", "ReleaseInfo"]


def clip(values: np.ndarray, bound: float) -> np.ndarray:
    """Project every value into [-bound, bound] (paper, eq. (4.2); method.md step 2)."""
    return np.clip(values, -bound, bound)


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
    validate_privacy_parameters(epsilon, x_bound, y_bound, budget_split)
    x, y = validate_data(x, y)
    d = x.shape[1]
    cal = noise_calibration(d, epsilon, x_bound, y_bound, budget_split)
    xc = clip(x, x_bound)
    yc = clip(y, y_bound)
    iu = np.triu_indices(d)

    xtx_upper, eps_xx = add_laplace_noise(symmetric_gram(xc)[iu], cal.xtx_sensitivity, cal.xtx_epsilon)
    xty, eps_xy = add_laplace_noise(xc.T @ yc, cal.xty_sensitivity, cal.xty_epsilon)
    yty, eps_yy = add_laplace_noise(np.array([yc @ yc]), cal.yty_sensitivity, cal.yty_epsilon)

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
