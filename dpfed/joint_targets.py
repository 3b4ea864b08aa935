"""What the fit of one target sees in a joint release: the missing-response model (issue 23).

A joint release carries Sxx over all n_x rows, but target j's regression is over the n_j rows
that have response j: its design is Sxx_j = sum over those rows of x x^T, which is never
released (releasing it per target is what the joint round avoids). Model (stated in
docs/method.md section 13):

**MCAR.** Which rows lack response j does not depend on x or on the response (missing
completely at random; on GDSC a drug is missing for a line because it was not screened there).
Then, given the n_x rows, the rows with response j are a simple random sample of n_j of them,
and (sampling without replacement, per upper entry (a, b) of the design)

    E[Sxx_j | Sxx] = r Sxx,   Var(Sxx_j[a,b] - r Sxx[a,b]) = n_j (1 - r) V_ab,   r = n_j / n_x,

with V_ab the variance over rows of x_a x_b (the finite-population correction is (1 - r)).
So the view of target j is ``Statistics(r R_xx, R_xy_j, R_yy_j, n_j)`` where R are the released
values, and its noise description is the joint one with three changes:

1. ``xtx`` scaled by r (the release noise of r R_xx);
2. a gaussian term with variance n_j (1 - r) V, V a *public* bound on the mean over upper
   entries of V_ab <= E[x_a^2 x_b^2]: the smaller of (i) the mean of c min(M_aa, M_bb), where
   c = min(Bx^2, R^2) bounds a clipped x_a^2 and M are the public rows' second moments with
   the diagonal clipped to c (``second_moments``; without public rows M_aa = c, the worst
   case), and (ii) S tr(M) / (d(d+1)/2), because sum_{a<=b} x_a^2 x_b^2 = (|x|^4 + sum x_a^4)/2
   <= |x|^4 <= S |x|^2 with S = min(d c, R^2) the largest clipped |x|^2 (for unit rows at
   d = 10, (ii) is 1/55 where (i) is 1/10);
3. a gaussian term for the error of r itself: r comes from the released counts, with relative
   variance cv^2 = v_n / n_j^2 + v_n / n_x^2 (v_n the counts' noise variance), which moves the
   whole matrix by r R_xx cv; its per-entry variance is taken as cv^2 times the mean square of
   r R_xx over the upper entries (post-processing of released values).

The noise-aware posterior (method.md section 8) models its design noise by one variance per
upper entry, so terms 2 and 3 enter it exactly like release noise: they widen the intervals by
what the missing responses cost. With every response present (r = 1) terms 2 and 3 vanish and
the view is the single-target release. Everything used is public or released.
``tests/test_joint_targets.py`` simulates MCAR subsets and checks the stated variance.
"""

from __future__ import annotations

import math

import numpy as np

from dpfed.joint_statistics import JointStatistics
from dpfed.noise import NoiseDescription, NoiseTerm
from dpfed.statistics import Statistics

__all__ = ["target_statistics", "subset_variance_bound"]

# The description's scale factor must be > 0: a target with no released rows keeps a tiny one.
_MIN_RATIO = 1e-12


def subset_variance_bound(d: int, x_bound: float, x_norm_bound: float | None = None,
                          second_moments: np.ndarray | None = None) -> float:
    """A public bound on the mean over the d(d+1)/2 upper entries of the per-row variance of
    x_a x_b (module docstring, term 2: the smaller of bounds (i) and (ii))."""
    c = float(x_bound) ** 2
    if x_norm_bound is not None:
        c = min(c, float(x_norm_bound) ** 2)
    if second_moments is None:
        diag = np.full(d, c)
    else:
        m = np.asarray(second_moments, dtype=np.float64)
        if m.shape != (d, d) or not np.all(np.isfinite(m)):
            raise ValueError(f"second_moments must be a finite ({d}, {d}) matrix")
        diag = np.clip(np.diag(m), 0.0, c)
    iu = np.triu_indices(d)
    by_entry = float(np.mean(c * np.minimum.outer(diag, diag)[iu]))
    s_max = d * c if x_norm_bound is None else min(d * c, float(x_norm_bound) ** 2)
    by_norm = s_max * min(float(np.sum(diag)), s_max) / (d * (d + 1) / 2)
    return min(by_entry, by_norm)


def target_statistics(joint: JointStatistics, j: int, *, x_bound: float,
                      x_norm_bound: float | None = None,
                      second_moments: np.ndarray | None = None) -> Statistics:
    """The statistics of target ``j`` that its fit sees (module docstring), with the noise
    description that includes what the missing responses add. ``joint`` must carry a noise
    description (EXACT is allowed: then only the subset terms are added)."""
    if joint.noise is None:
        raise ValueError("the noise of these joint statistics is unknown")
    if not 0 <= j < joint.targets:
        raise IndexError(f"target {j} out of range (the release has {joint.targets})")
    d = joint.dim
    n_x, n_j = int(joint.n_x), int(joint.n[j])
    r = min(1.0, n_j / n_x) if n_x > 0 else 0.0
    xtx = r * joint.xtx
    base = joint.noise
    extra = []
    subset_var = n_j * (1.0 - r) * subset_variance_bound(d, x_bound, x_norm_bound,
                                                         second_moments)
    if subset_var > 0:
        extra.append(NoiseTerm("gaussian", math.sqrt(subset_var)))
    v_n = base.variance("n")
    if v_n > 0 and r > 0:
        cv2 = v_n / max(n_j, 1) ** 2 + v_n / max(n_x, 1) ** 2
        iu = np.triu_indices(d)
        ratio_var = cv2 * float(np.mean(xtx[iu] ** 2))
        if ratio_var > 0:
            extra.append(NoiseTerm("gaussian", math.sqrt(ratio_var)))
    # Sxy_j's noise is the joint xty term for every target (one law per part); r R_xx is
    # exactly symmetric (a scalar times a symmetric matrix).
    scaled = base.scaled(xtx=max(r, _MIN_RATIO))
    noise = NoiseDescription(scaled.xtx + tuple(extra), base.xty, base.yty, base.n)
    return Statistics(xtx, joint.xty[j], float(joint.yty[j]), n_j, noise)
