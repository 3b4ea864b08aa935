"""Output-perturbed linear regression (paper section 4.5, model (iv), after Wu et al. 2015,
arXiv:1512.06388; output perturbation of regularised ERM as in Chaudhuri et al. 2011).

The paper says only that it "learns parameters beta using the same LR model [...], but instead
of statistics the parameters are perturbed, in a data-independent manner", with a constrained
optimiser (minConf). Our definition, every constant explicit:

1. Linear rescaling into the unit ball (no projection of outliers): x~ = x / Rx, y~ = y / Ry
   with the public ranges Rx = ``x_range`` (row L2 norm) and Ry = ``y_range``. A guard
   projects rows with ||x~|| > 1 onto the unit sphere and y~ into [-1, 1]; it is a no-op when
   the ranges are honest and keeps the sensitivity argument valid when they are not.
2. Exact minimiser of the strongly convex, constrained objective over all N = n_priv + n_pub
   training rows (public rows enter the objective like private ones; they are the same in
   neighbouring data sets):
       w* = argmin_{||w||_2 <= R} (1/N) sum_i (y~_i - x~_i^T w)^2 + (lam/2) ||w||_2^2
   with R = 1 and lam = sqrt(d / (N eps)), data-independent choices as in the reference
   implementation of the paper (DPBayes/robust-private-lr, LR_output_perturbation.m).
   Solved exactly: w(c) = (X~^T X~ + c I)^-1 X~^T y~ with c = N lam / 2 if ||w(c)|| <= R,
   otherwise the c > N lam / 2 with ||w(c)|| = R (KKT of the ball constraint; bisection to
   machine precision on ||w(c)||, which decreases in c).
3. Sensitivity (replace-one). On the ball ||w|| <= R with ||x~|| <= 1 and |y~| <= 1, the loss
   l(w) = (y~ - x~^T w)^2 has gradient 2 (x~^T w - y~) x~ of norm <= L = 2 (R + 1). The
   objective is lam-strongly convex and changing one record changes it by (l' - l)/N, whose
   gradient has norm <= 2L/N; the first-order optimality conditions on the convex ball then
   give ||w*(D) - w*(D')||_2 <= 2L / (N lam) = 4 (R + 1) / (N lam) =: Delta_2
   (Chaudhuri et al. 2011, Corollary 8, with a general Lipschitz constant).
   The reference implementation uses (12 R + 8) / (N lam) instead; we could not trace that
   constant and use the derived one.
4. Noise. Chaudhuri's mechanism draws b with density proportional to exp(-eps ||b||_2 /
   Delta_2); OpenDP has no such sampler and numpy is not used for DP noise. We use OpenDP's
   vector Laplace mechanism (``site_node.laplace``) with the L1 sensitivity
   Delta_1 = sqrt(d) Delta_2 >= ||w*(D) - w*(D')||_1, i.e. i.i.d. Laplace(sqrt(d) Delta_2 / eps)
   per coordinate: eps-DP (bounded DP), with about sqrt(2) times the expected noise norm of the
   L2 mechanism. (The reference code's direction sampler, a normalised uniform draw from a
   cube, is not uniform on the sphere; our noise does not depend on it.)
5. beta = w_dp * Ry / Rx, so that ``x @ beta`` predicts y in the original units.

Not federated: the minimiser needs all rows in one place (n_sites > 1 raises ValueError).
Without private rows there is nothing to protect: the fixed-precision posterior mean of the
public rows is returned (``posterior_fit.public_only_beta``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dpfed_apps.evaluation.methods.base import PrivacySetting, TrainingData
from dpfed_apps.evaluation.methods.posterior_fit import public_only_beta
from site_node.laplace import add_laplace_noise

BALL_RADIUS = 1.0  # R: the constraint ||w||_2 <= R of the reference implementation


def regularisation(d: int, n: int, epsilon: float) -> float:
    """lam = sqrt(d / (N eps)), data-independent (only public d, N, eps)."""
    return math.sqrt(d / (n * epsilon))


def l2_sensitivity(n: int, lam: float, radius: float = BALL_RADIUS) -> float:
    """Delta_2 = 2 L / (N lam) with the Lipschitz constant L = 2 (R + 1) (module docstring)."""
    return 4.0 * (radius + 1.0) / (n * lam)


def unit_ball_data(x, y, x_range: float, y_range: float) -> tuple[np.ndarray, np.ndarray]:
    """Rescale by the public ranges, then the guard projection onto ||x|| <= 1, |y| <= 1."""
    x = np.asarray(x, dtype=np.float64) / x_range
    norms = np.linalg.norm(x, axis=1)
    x = x / np.maximum(norms, 1.0)[:, None]
    return x, np.clip(np.asarray(y, dtype=np.float64) / y_range, -1.0, 1.0)


def constrained_ridge(sxx: np.ndarray, sxy: np.ndarray, c0: float, radius: float) -> np.ndarray:
    """argmin over ||w|| <= radius of w^T sxx w - 2 w^T sxy + c0 ||w||^2 (exact up to rounding).

    With sxx = V diag(s) V^T, w(c) = V diag(1/(s + c)) V^T sxy; ||w(c)|| decreases in c."""
    s, v = np.linalg.eigh(sxx)
    s = np.maximum(s, 0.0)  # sxx is a Gram matrix; clears rounding below zero
    g = v.T @ sxy

    def norm_at(c):
        return float(np.linalg.norm(g / (s + c)))

    if norm_at(c0) <= radius:
        c = c0
    else:
        lo, hi = c0, max(c0, float(np.linalg.norm(g)) / radius) * 2.0
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if norm_at(mid) > radius:
                lo = mid
            else:
                hi = mid
            if hi - lo <= 1e-15 * hi:
                break
        c = hi
    return v @ (g / (s + c))


@dataclass(frozen=True)
class OutputPerturbation:
    radius: float = BALL_RADIUS
    name: ClassVar[str] = "output_perturbation"
    private: ClassVar[bool] = True

    def __post_init__(self):
        if not (math.isfinite(self.radius) and self.radius > 0):
            raise ValueError(f"radius must be finite and > 0, got {self.radius!r}")

    def fit(self, data: TrainingData, setting: PrivacySetting, *, seed: int) -> np.ndarray:
        if setting.n_sites != 1:
            raise ValueError("output_perturbation needs all rows in one place; n_sites must be 1")
        y_range = setting.require_y_range(self.name)
        if data.n_private == 0:
            return public_only_beta(data.x_public, data.y_public)
        x = np.vstack([data.x_private, data.x_public])
        y = np.concatenate([data.y_private, data.y_public])
        xs, ys = unit_ball_data(x, y, setting.x_range, y_range)
        n, d = xs.shape
        lam = regularisation(d, n, setting.epsilon)
        # (1/N)||y - Xw||^2 + lam/2 ||w||^2 has the minimiser of ||y - Xw||^2 + (N lam/2)||w||^2.
        w = constrained_ridge(xs.T @ xs, xs.T @ ys, n * lam / 2.0, self.radius)
        delta_1 = math.sqrt(d) * l2_sensitivity(n, lam, self.radius)
        w_dp, _ = add_laplace_noise(w, delta_1, setting.epsilon)
        return w_dp * (y_range / setting.x_range)
