"""Repair of noisy sufficient statistics so that the model of method.md section 1 is proper.

Laplace noise on ``Sxx`` makes it indefinite surprisingly often (at n=800, d=10, eps=2 many
eigenvalues are negative), and noise on ``Syy`` can make the quadratic form of the
likelihood (Honkela et al. 2018, eq. (4.1)),

    Q(beta) = beta^T Sxx beta - 2 beta^T Sxy + Syy,

negative or even unbounded below. The likelihood ``n/2 log lambda - lambda/2 Q(beta)`` then
grows without bound in ``lambda`` and the posterior is improper: ADVI's loss runs to -1e30
(method.md section 6, first pitfall).

``repair_statistics`` makes three minimal changes:

1. **PSD projection of Sxx.** Eigen-decompose ``Sxx = V diag(w) V^T`` and clip the eigenvalues
   at a floor ``f > 0``: ``Sxx' = V diag(max(w, f)) V^T``. With ``f = 0`` this is the nearest
   positive semi-definite matrix in Frobenius norm (Higham 1988); a strictly positive floor is
   needed as well, because along a null direction of ``Sxx'`` the form ``Q`` is linear in beta
   and unbounded below whenever ``Sxy`` has a component there.
2. **Sxy off the clipped directions** (default ``project_xty=True``). Along an eigenvector
   whose eigenvalue had to be clipped the noisy release carries no usable information about
   beta, but the component of Sxy there, divided by the small floor, would dominate both the
   posterior mean and the implied fit (and force a huge raise of Syy in step 3). The component
   of Sxy along those eigenvectors is set to 0, so ``Q`` there is ``f beta_v^2 >= 0`` and beta
   follows the prior; with ``f -> 0`` this is exactly the condition ``Syy >= Sxy^T Sxx^+ Sxy``
   with the pseudo-inverse. On synthetic data (n=800, d=10, eps=2) this raised the test
   Spearman correlation of ADVI predictions from 0.40 to 0.59 (10 releases).
3. **Floor of the residual sum of squares.** ``min_beta Q(beta) = Syy - Sxy^T Sxx'^-1 Sxy`` is
   the residual sum of squares the statistics imply. If it is below ``rss_floor > 0``, raise
   ``Syy`` by the difference, so ``Q(beta) >= rss_floor`` for every beta.

After both, ``lambda | beta`` has the Gamma(a + n/2, b + Q(beta)/2) full conditional with
``Q >= rss_floor > 0`` and the joint posterior is proper.

Privacy: all steps read only the released statistics and public constants. They are
post-processing of an eps-DP release and cost no privacy budget (Dwork and Roth 2014,
Proposition 2.1). Nothing here looks at private data.

All functions are pure: they return new values and never modify their arguments.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from dpfed.statistics import Statistics

__all__ = [
    "Repair",
    "DEFAULT_RELATIVE_EIGEN_FLOOR",
    "DEFAULT_RELATIVE_RSS_FLOOR",
    "eigen_floor_for",
    "project_psd",
    "implied_rss",
    "repair_statistics",
    "no_repair",
]

#: Eigenvalues of Sxx are clipped at this fraction of the largest |eigenvalue|.
DEFAULT_RELATIVE_EIGEN_FLOOR = 1e-3
#: The implied residual sum of squares is kept at least this fraction of the scale of Syy.
DEFAULT_RELATIVE_RSS_FLOOR = 1e-6
# Absolute floors for the degenerate all-zero statistics (e.g. Statistics.zeros(d)).
_TINY = 1e-12


@dataclass(frozen=True)
class Repair:
    """What ``repair_statistics`` changed (all zero / False when nothing was changed).

    ``negative_eigenvalues``: eigenvalues of Sxx that were < 0; ``clipped_eigenvalues``:
    eigenvalues raised to ``eigen_floor`` (includes the negative ones); ``min_eigenvalue``:
    smallest eigenvalue before the repair; ``yty_raised_by``: amount added to Syy;
    ``rss_before``: implied residual sum of squares ``Syy - Sxy^T Sxx'^-1 Sxy`` after the PSD
    projection and before raising Syy; ``xtx_change_frobenius``: ||Sxx' - Sxx||_F;
    ``xty_change_norm``: ||Sxy' - Sxy||_2 (the components dropped along clipped directions).
    """

    changed: bool
    negative_eigenvalues: int
    clipped_eigenvalues: int
    min_eigenvalue: float
    eigen_floor: float
    xtx_change_frobenius: float
    xty_change_norm: float
    rss_before: float
    rss_floor: float
    yty_raised_by: float

    def to_dict(self) -> dict:
        return {k: (v if isinstance(v, (bool, int)) else float(v)) for k, v in asdict(self).items()}


def no_repair() -> Repair:
    """The record of a repair that changed nothing (the noise-aware and exact models fit the
    statistics as released)."""
    return Repair(False, 0, 0, float("nan"), 0.0, 0.0, 0.0, float("nan"), 0.0, 0.0)


def eigen_floor_for(eigenvalues: np.ndarray, relative: float = DEFAULT_RELATIVE_EIGEN_FLOOR) -> float:
    """Default eigenvalue floor: ``relative`` times the largest |eigenvalue| (scale-free).

    Using |eigenvalue| keeps the floor on the scale of the noise when every eigenvalue is
    negative (tiny n, large noise).
    """
    scale = float(np.max(np.abs(eigenvalues))) if eigenvalues.size else 0.0
    return max(relative * scale, _TINY)


def _from_eigen(v: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``v diag(w) v^T``, exactly symmetric (upper triangle mirrored), as ``Statistics``
    requires."""
    m = (v * w) @ v.T
    return np.triu(m) + np.triu(m, 1).T


def project_psd(xtx: np.ndarray, floor) -> tuple[np.ndarray, np.ndarray]:
    """Clip the eigenvalues of symmetric ``xtx`` at ``floor`` (>= 0); return (matrix, eigenvalues).

    The one PSD projection of dpfed (the repair below, the noise-aware model's Abar).
    ``floor`` is a number, or a function of the eigenvalues returning one (a floor relative to
    the spectrum without a second decomposition). The result is exactly symmetric.
    """
    w, v = np.linalg.eigh(xtx)
    floor = floor(w) if callable(floor) else floor
    if not floor >= 0:
        raise ValueError(f"eigenvalue floor must be >= 0, got {floor!r}")
    return _from_eigen(v, np.maximum(w, floor)), w


def implied_rss(xtx: np.ndarray, xty: np.ndarray, yty: float) -> float:
    """``min_beta Q(beta) = Syy - Sxy^T Sxx^-1 Sxy`` for positive definite ``xtx``."""
    c = np.linalg.cholesky(xtx)
    z = np.linalg.solve(c, xty)
    return float(yty - z @ z)


def repair_statistics(stats: Statistics, *, eigen_floor: float | None = None,
                      relative_eigen_floor: float = DEFAULT_RELATIVE_EIGEN_FLOOR,
                      rss_floor: float | None = None,
                      relative_rss_floor: float = DEFAULT_RELATIVE_RSS_FLOOR,
                      project_xty: bool = True) -> tuple[Statistics, Repair]:
    """Return statistics for which the model of method.md section 1 is proper, and a record.

    Post-processing of a DP release: free of privacy cost (see the module docstring).

    ``eigen_floor``: eigenvalues of Sxx below it are raised to it; default
    ``relative_eigen_floor * max|eigenvalue|``. ``rss_floor``: minimum of the quadratic form
    ``Q(beta)`` over beta after the repair; default ``relative_rss_floor * max(|Syy|,
    Sxy^T Sxx'^-1 Sxy, 1)``. Statistics that already satisfy both floors are returned
    unchanged (the very same object), so the repair is the identity on well-conditioned
    exact statistics. ``project_xty``: drop the components of Sxy along clipped eigenvectors
    (step 2 of the module docstring).
    """
    if not isinstance(stats, Statistics):
        raise TypeError(f"expected Statistics, got {type(stats).__name__}")
    xtx = stats.xtx
    w, v = np.linalg.eigh(xtx)
    floor = eigen_floor_for(w, relative_eigen_floor) if eigen_floor is None else float(eigen_floor)
    if not (np.isfinite(floor) and floor > 0):
        raise ValueError(f"eigen_floor must be finite and > 0, got {eigen_floor!r}")
    clipped = int(np.sum(w < floor))
    wc = np.maximum(w, floor)
    if clipped:
        new_xtx = _from_eigen(v, wc)
    else:
        new_xtx = xtx
    coef = v.T @ stats.xty
    new_xty = stats.xty
    if clipped and project_xty:
        coef = np.where(w < floor, 0.0, coef)
        new_xty = v @ coef
    # Sxy'^T Sxx'^-1 Sxy' in the eigenbasis of the projection (no second factorisation).
    explained = float(np.sum(coef ** 2 / wc))
    rss = stats.yty - explained
    if rss_floor is None:
        rss_floor = relative_rss_floor * max(abs(stats.yty), explained, 1.0)
    rss_floor = float(rss_floor)
    if not (np.isfinite(rss_floor) and rss_floor > 0):
        raise ValueError(f"rss_floor must be finite and > 0, got {rss_floor!r}")
    raise_by = max(0.0, rss_floor - rss)
    new_yty = stats.yty + raise_by
    changed = bool(clipped or raise_by > 0)
    record = Repair(
        changed=changed,
        negative_eigenvalues=int(np.sum(w < 0)),
        clipped_eigenvalues=clipped,
        min_eigenvalue=float(w[0]),
        eigen_floor=floor,
        xtx_change_frobenius=float(np.linalg.norm(new_xtx - xtx)) if clipped else 0.0,
        xty_change_norm=float(np.linalg.norm(new_xty - stats.xty)) if clipped else 0.0,
        rss_before=rss,
        rss_floor=rss_floor,
        yty_raised_by=raise_by,
    )
    if not changed:
        return stats, record
    return Statistics(new_xtx, new_xty, new_yty, stats.n), record
