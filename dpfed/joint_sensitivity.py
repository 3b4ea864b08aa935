"""L1 and L2 sensitivities of a joint release for m targets (pure functions; issue 23).

One round may name m targets (drugs). X^T X does not depend on the response, so it is released
once and shared by every target (method.md section 13; Neel 2023, PRIMO); per target j the
round releases Sxy_j = X_j^T y_j, Syy_j = y_j^T y_j and the count n_j, computed over the rows
that *have* a response j (GDSC fills 82 % of the patient x drug matrix). The joint vector is

    f(D) = [ Sxx upper triangle (d(d+1)/2) | (n_x) | Sxy_1 .. Sxy_m (d each) |
             Syy_1 .. Syy_m | n_1 .. n_m ]

where the optional n_x (``include_n=True``) counts the rows whose features enter Sxx.

Neighbouring: add/remove one patient (one row with all its responses, each present or
missing). The row's features v are clipped to the box |v_i| <= Bx and, with a row-norm bound R
(``x_norm_bound``), projected into the ball ||v||_2 <= R (``dpfed.sensitivity`` conventions);
response j, when present (a_j = 1), is clipped to |w_j| <= By_j; a missing response (a_j = 0)
contributes nothing to target j. Adding the patient moves f by

    g(v, w, a) = [ (v_i v_k)_{i<=k} | 1 | (a_j w_j v)_j | (a_j w_j^2)_j | (a_j)_j ]   (eq. J1)

(statistics are sums over rows), and removing it by -g. So the sensitivity in any norm is
sup ||g|| over one admissible row.

**L1** (eq. J2). With t = min(Bx, R / sqrt(d)) (``dpfed.sensitivity.coordinate_bound``):

    Delta_1 = d(d+1)/2 t^2 + [1] + sum_j (d t By_j + By_j^2 + 1),

because sum_{i<=k} |v_i v_k| = (||v||_1^2 + ||v||_2^2)/2 and ||v||_1 are both largest at
v = t (1, ..., 1) (inside box and ball; ``dpfed.sensitivity`` module docstring), every a_j = 1
and |w_j| = By_j. With one target and no n_x this is the sum of today's per-part sensitivities
(Sxx, Sxy, Syy, n): the joint vector's L1 grows linearly in m.

**L2** (eq. J3). Write u_i = v_i^2 in [0, c], c = min(Bx^2, R^2), sum_i u_i <= R^2 (no sum
constraint without a ball). Then

    ||g||_2^2 = ((sum u)^2 + sum u_i^2)/2 + [1] + sum_j a_j (w_j^2 sum u + w_j^4 + 1)

(sum_{i<=k} v_i^2 v_k^2 = ((sum u)^2 + sum u^2)/2). It grows with every a_j and |w_j|, and is a
convex function of u, so its maximum over the polytope {0 <= u_i <= c, sum u <= R^2} is at a
vertex. For a given total S = sum u the term sum u_i^2 is largest when the mass is
concentrated: k = floor(S / c) coordinates at c and one at the remainder r = S - k c; and every
term grows with S, so S = min(d c, R^2):

    Delta_2^2 = (S^2 + k c^2 + r^2)/2 + [1] + sum_j (By_j^2 S + By_j^4 + 1).

The worst row for L2 is *concentrated* (with R = 1, Bx = 1: v = e_1, Sxx part 1), the worst
for L1 *spread* (v = t 1, Sxx part d(d+1)/2 t^2 = 0.55 at d = 10): the two norms have
different extreme records. The per-target part of Delta_2^2 adds over targets, so the L2
sensitivity of the targets' block grows like sqrt(m), not m (method.md section 13).

**Weighted L2** (``joint_l2_sensitivity(weights=...)``). A Gaussian mechanism with a separate
standard deviation sigma_p per part p is the unit-variance Gaussian mechanism on the rescaled
vector f_p / sigma_p; its GDP parameter is mu = sup_row sqrt(sum_p ||g_p||^2 / sigma_p^2)
(Dong, Roth & Su 2019). With w_p = 1/sigma_p^2 the function above keeps the same structure
(every weight is >= 0: still convex and increasing in u, a_j, |w_j|), so the same vertex gives
the supremum: Delta_w^2 = w_xx (S^2 + k c^2 + r^2)/2 + w_nx + sum_j (w_xy By_j^2 S
+ w_yy By_j^4 + w_n). The weights may differ per target (sequences of length m).

Replace-one neighbours are not supported here: a joint release with per-target counts is an
add/remove design (method.md section 9: n_j is a count of private facts).
``tests/test_joint_sensitivity.py`` checks every formula by brute force, including the
extreme records, records beyond the bounds and patients with missing responses.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dpfed.sensitivity import check_norm_bound, coordinate_bound

__all__ = ["JointLayout", "joint_l1_sensitivity", "joint_l2_sensitivity", "row_contribution",
           "extreme_rows_l1", "extreme_rows_l2", "concentrated_row"]

PARTS = ("xtx", "n_x", "xty", "yty", "n")


@dataclass(frozen=True)
class JointLayout:
    """Positions of the parts in the joint vector of ``d`` features and ``m`` targets."""

    d: int
    m: int
    include_n: bool = False

    @property
    def sizes(self) -> dict[str, int]:
        return {"xtx": self.d * (self.d + 1) // 2, "n_x": int(self.include_n),
                "xty": self.m * self.d, "yty": self.m, "n": self.m}

    @property
    def size(self) -> int:
        return sum(self.sizes.values())

    def slices(self) -> dict[str, slice]:
        out, start = {}, 0
        for part in PARTS:
            out[part] = slice(start, start + self.sizes[part])
            start += self.sizes[part]
        return out


def _check_dm(d, m) -> tuple[int, int]:
    for name, value in (("d", d), ("m", m)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(d), int(m)


def _positive(name, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _per_target(name, value, m) -> list[float]:
    """A scalar or a sequence of m values, each finite and > 0 (weights may be 0)."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        values = [value] * m
    else:
        values = list(value)
        if len(values) != m:
            raise ValueError(f"{name} must be a number or {m} numbers, got {len(values)}")
    return values


def _y_bounds(y_bound, m) -> list[float]:
    return [_positive("y_bound", b) for b in _per_target("y_bound", y_bound, m)]


def joint_l1_sensitivity(d: int, m: int, x_bound: float, y_bound, *, x_norm_bound=None,
                         include_n: bool = False) -> float:
    """Delta_1 of the joint vector under add/remove (eq. J2 of the module docstring):
    d(d+1)/2 t^2 + [1 if ``include_n``] + sum_j (d t By_j + By_j^2 + 1), t = min(Bx, R/sqrt(d)).
    ``y_bound``: one By for every target or a sequence of m. Attained by v = t (1, ..., 1)
    with every response present at +By_j (``extreme_rows_l1``)."""
    d, m = _check_dm(d, m)
    bx = _positive("x_bound", x_bound)
    by = _y_bounds(y_bound, m)
    t = float(coordinate_bound(d, bx, check_norm_bound(x_norm_bound)))
    total = 0.5 * d * (d + 1) * t * t + (1.0 if include_n else 0.0)
    return total + sum(d * t * b + b * b + 1.0 for b in by)


def concentrated_row(d: int, x_bound: float, x_norm_bound) -> tuple[float, int, float, float]:
    """(S, k, c, r) of the L2-extreme row: k coordinates with v_i^2 = c, one with r, S = kc + r."""
    c = x_bound * x_bound
    norm = check_norm_bound(x_norm_bound)
    if norm is None or d * c <= norm * norm:
        return d * c, d, c, 0.0
    r2 = norm * norm
    c = min(c, r2)
    k = min(d, int(math.floor(r2 / c)))
    r = max(0.0, r2 - k * c) if k < d else 0.0
    return k * c + r, k, c, r


def joint_l2_sensitivity(d: int, m: int, x_bound: float, y_bound, *, x_norm_bound=None,
                         include_n: bool = False, weights: dict | None = None) -> float:
    """Delta_2 of the joint vector under add/remove (eq. J3 of the module docstring):

        sqrt( w_xx (S^2 + k c^2 + r^2)/2 + w_nx + sum_j (w_xy By_j^2 S + w_yy By_j^4 + w_n) )

    with c = min(Bx^2, R^2), S = min(d c, R^2), k = floor(S / c), r = S - k c (no ball: S = d Bx^2,
    k = d, r = 0). ``weights`` (default all 1) maps parts ``xtx``, ``n_x``, ``xty``, ``yty``,
    ``n`` to w_p >= 0 (e.g. 1/sigma_p^2: then the result is the GDP mu of per-part Gaussian
    noise); ``xty``, ``yty``, ``n`` may be sequences of m (per target). Attained by the
    concentrated row of ``extreme_rows_l2``."""
    d, m = _check_dm(d, m)
    bx = _positive("x_bound", x_bound)
    by = _y_bounds(y_bound, m)
    w = {p: 1.0 for p in PARTS}
    if weights:
        unknown = set(weights) - set(PARTS)
        if unknown:
            raise ValueError(f"unknown part(s) in weights: {sorted(unknown)}")
        w.update(weights)
    per = {}
    for p in PARTS:
        vals = _per_target(f"weights[{p}]", w[p], m) if p in ("xty", "yty", "n") else [w[p]]
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) \
                    or v < 0:
                raise ValueError(f"weights[{p}] must be finite and >= 0, got {v!r}")
        per[p] = [float(v) for v in vals]
    s, k, c, r = concentrated_row(d, bx, x_norm_bound)
    total = per["xtx"][0] * 0.5 * (s * s + k * c * c + r * r)
    if include_n:
        total += per["n_x"][0]
    for j, b in enumerate(by):
        total += per["xty"][j] * b * b * s + per["yty"][j] * b ** 4 + per["n"][j]
    return math.sqrt(total)


def row_contribution(v, w, *, include_n: bool = False) -> np.ndarray:
    """g(v, w, a) of eq. J1 for one row: ``v`` its d (already clipped) features, ``w`` its m
    responses with NaN for a missing one. What adding the row adds to the joint vector."""
    v = np.asarray(v, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    present = ~np.isnan(w)
    wz = np.where(present, w, 0.0)
    iu = np.triu_indices(v.size)
    return np.concatenate([np.outer(v, v)[iu], [1.0] if include_n else [],
                           (wz[:, None] * v[None, :]).ravel(), wz * wz,
                           present.astype(np.float64)])


def extreme_rows_l1(d: int, m: int, x_bound: float, y_bound, *, x_norm_bound=None):
    """The L1-extreme record: (v, w) = (t (1, ..., 1), (By_1, ..., By_m))."""
    t = float(coordinate_bound(d, float(x_bound), check_norm_bound(x_norm_bound)))
    return np.full(d, t), np.array(_y_bounds(y_bound, m))


def extreme_rows_l2(d: int, m: int, x_bound: float, y_bound, *, x_norm_bound=None):
    """The L2-extreme record: k coordinates at sqrt(c), one at sqrt(r), the rest 0; every
    response present at +By_j."""
    s, k, c, r = concentrated_row(d, float(x_bound), x_norm_bound)
    v = np.zeros(d)
    v[:k] = math.sqrt(c)
    if k < d:
        v[k] = math.sqrt(r)
    return v, np.array(_y_bounds(y_bound, m))
