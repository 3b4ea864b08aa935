"""ADASSP: sufficient statistics perturbation with adaptive ridge damping (Wang 2018, UAI,
"Revisiting differentially private linear regression"), with the Gaussian-mechanism constants
of Kalaja (2020), Algorithm 3. **(eps, delta)-DP, not pure eps-DP** like the other private
methods: compare it with that in mind.

Pre-processing: the robust private LR projection (Kalaja 2020, section 3.4 combines the two):
every x_ij is clipped to [-Bx, Bx] and y to [-By, By]; a guard then projects rows onto the
public L2 range ``x_range`` (a no-op for unit-norm rows). Hence ||x_i|| <= X := min(sqrt(d) Bx,
x_range) and |y_i| <= Y := By.

Mechanism (per site; eps and delta split in three equal parts, eps' = eps/3, delta' = delta/3,
so c := 2 ln(1.25/delta') = 2 ln(3.75/delta), Kalaja's constant; Z are standard normal):

1. lambda_min = smallest eigenvalue of X^T X; released as
       l~ = max(lambda_min + sqrt(c) S_min / eps' Z - c S_min / eps', 0)
   (the shift makes l~ a high-probability lower bound; Kalaja Alg. 3 line 2).
2. Ridge lambda = max(0, sqrt(d ln(2 d^2 / rho)) sigma_xx - l~), rho = 0.05 (Wang's
   failure probability; Kalaja does not state it), sigma_xx the noise sd of step 3. With
   Kalaja's sigma_xx = sqrt(c) X^2 / eps' this is exactly his sqrt(d c ln(2d^2/rho)) X^2 / eps';
   written through sigma_xx it follows the larger replace-one noise below. (Kalaja's line 3 reads "sqrt(d2 log(3.75/
   delta) ...)"; we read it as d * 2 log(3.75/delta), the same substitution log(6/delta) ->
   2 log(3.75/delta) as in every other line of the algorithm, not d^2.)
3. X^T X released as the upper triangle + sqrt(c) S_xx / eps' Z (symmetric noise, mirrored).
4. X^T y released + sqrt(c) S_xy / eps' Z.
5. beta = (X^T X~ + lambda I)^-1 X^T y~ (public rows' exact statistics added to both).

Sensitivities (L2, **replace-one**, the bounded DP of the whole project; Wang and Kalaja use
add/remove neighbours, where they are X^2, X^2, X Y):
S_min = X^2 (Weyl: x x^T - x' x'^T has spectral norm <= X^2);
S_xx = sqrt(2) X^2 (||x x^T - x' x'^T||_F^2 = ||x||^4 + ||x'||^4 - 2 (x^T x')^2 <= 2 X^4; the
released upper triangle has a subset of those squared entries; attained by orthogonal rows);
S_xy = 2 X Y.

Sampling: OpenDP's Gaussian mechanism (``make_gaussian``, discrete Gaussian on a 2^k grid from a
CSPRNG), never numpy. The classical bound behind sigma = sqrt(2 ln(1.25/delta')) S / eps' is
only proved for eps' < 1 (Dwork & Roth 2014, Theorem A.1); so every part's scale is the larger
of Kalaja's sigma and the smallest sigma for which OpenDP's own privacy map certifies
(eps', delta') at sensitivity S (zCDP -> approximate DP conversion, grid rounding included).
For eps' < 1 this is Kalaja's sigma; for larger eps the certificate governs.

Federated (K sites): the sites' l~ are summed (lambda_min is superadditive, so the sum is still
a lower bound of the pooled lambda_min), as are the noisy X^T X, X^T y; the first term of the
ridge lambda is multiplied by sqrt(K) because the summed noise has K times the variance.
(Our extension; Wang's algorithm is for one data holder.)
Without private rows the fixed-precision posterior mean of the public rows is returned.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import opendp.prelude as dp

from dpfed.statistics import symmetric_gram
from dpfed_apps.evaluation.methods.base import PrivacySetting, TrainingData, split_rows
from dpfed_apps.evaluation.methods.posterior_fit import public_only_beta

dp.enable_features("contrib")

FAILURE_PROBABILITY = 0.05   # rho of Wang (2018)
_GRID_BITS_BELOW_SENSITIVITY = 40  # as site_node.laplace: grid 2^k, k = floor(log2 S) - 40


def gaussian_constant(delta: float) -> float:
    """c = 2 ln(1.25 / (delta / 3)) = 2 ln(3.75 / delta) (Kalaja 2020, Algorithm 3)."""
    return 2.0 * math.log(3.75 / delta)


def kalaja_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """sqrt(2 ln(3.75/delta)) * S / (eps/3): the per-part scale of Algorithm 3."""
    return math.sqrt(gaussian_constant(delta)) * sensitivity / (epsilon / 3.0)


def sensitivities(x_norm: float, y_bound: float) -> dict:
    """Replace-one L2 sensitivities of lambda_min, upper(X^T X), X^T y (module docstring)."""
    return {"lambda_min": x_norm ** 2, "xtx": math.sqrt(2.0) * x_norm ** 2,
            "xty": 2.0 * x_norm * y_bound}


def _gaussian(size: int, scale: float, k: int):
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
    return dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale, k=k)


def _certified_epsilon(meas, sensitivity: float, delta: float) -> float:
    return dp.c.make_zCDP_to_approxDP(meas).map(sensitivity).epsilon(delta)


@functools.lru_cache(maxsize=1024)
def calibrated_gaussian(size: int, sensitivity: float, epsilon: float, delta: float):
    """(measurement, scale) for one part with budget (epsilon, delta): the larger of the
    classical scale S sqrt(2 ln(1.25/delta)) / epsilon and the smallest scale (to a relative
    1e-6) whose OpenDP certificate is within (epsilon, delta)."""
    k = math.floor(math.log2(sensitivity)) - _GRID_BITS_BELOW_SENSITIVITY
    scale = sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
    meas = _gaussian(size, scale, k)
    if _certified_epsilon(meas, sensitivity, delta) <= epsilon:
        return meas, scale
    lo, hi = scale, scale * 2.0
    while _certified_epsilon(_gaussian(size, hi, k), sensitivity, delta) > epsilon:
        lo, hi = hi, hi * 2.0
    while hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        if _certified_epsilon(_gaussian(size, mid, k), sensitivity, delta) <= epsilon:
            hi = mid
        else:
            lo = mid
    return _gaussian(size, hi, k), hi


def add_gaussian_noise(values: np.ndarray, sensitivity: float, epsilon: float,
                       delta: float) -> tuple[np.ndarray, float]:
    """Release ``values`` (1-D) (epsilon, delta)-DP for L2 sensitivity ``sensitivity`` with
    OpenDP's Gaussian mechanism. Returns the noisy values and the scale used."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)):
        raise ValueError("values must be a non-empty, finite 1-D array")
    meas, scale = calibrated_gaussian(values.size, float(sensitivity), float(epsilon),
                                      float(delta))
    return np.asarray(meas(values.tolist()), dtype=np.float64), scale


def project_rows(x: np.ndarray, y: np.ndarray, setting: PrivacySetting):
    """Clip to the bounds, then the guard projection onto ||x_i|| <= x_range."""
    x = np.clip(x, -setting.x_bound, setting.x_bound)
    norms = np.linalg.norm(x, axis=1)
    x = x * (setting.x_range / np.maximum(norms, setting.x_range))[:, None]
    return x, np.clip(y, -setting.y_bound, setting.y_bound)


def row_norm_bound(d: int, setting: PrivacySetting) -> float:
    """X = min(sqrt(d) Bx, x_range): the bound on ||x_i|| after ``project_rows``."""
    return min(math.sqrt(d) * setting.x_bound, setting.x_range)


@dataclass(frozen=True)
class AdaSSP:
    rho: float = FAILURE_PROBABILITY
    name: ClassVar[str] = "adassp"
    private: ClassVar[bool] = True

    def __post_init__(self):
        if not 0 < self.rho < 1:
            raise ValueError(f"rho must be in (0, 1), got {self.rho!r}")

    def site_release(self, x: np.ndarray, y: np.ndarray, setting: PrivacySetting):
        """One site's (l~, noisy X^T X, noisy X^T y, noise sd of X^T X) of its private rows."""
        d = x.shape[1]
        eps3, delta3 = setting.epsilon / 3.0, setting.delta_or_default / 3.0
        xn = row_norm_bound(d, setting)
        sens = sensitivities(xn, setting.y_bound)
        c = gaussian_constant(setting.delta_or_default)
        xc, yc = project_rows(x, y, setting)
        gram = symmetric_gram(xc)
        lam_min = float(np.linalg.eigvalsh(gram)[0])
        noisy_min, scale_min = add_gaussian_noise(np.array([lam_min]), sens["lambda_min"],
                                                  eps3, delta3)
        # Shift by sqrt(c) x the noise sd: a high-probability lower bound (Alg. 3, line 2).
        lam_tilde = max(float(noisy_min[0]) - math.sqrt(c) * scale_min, 0.0)
        iu = np.triu_indices(d)
        upper, scale_xx = add_gaussian_noise(gram[iu], sens["xtx"], eps3, delta3)
        xtx = np.zeros((d, d))
        xtx[iu] = upper
        xtx = np.triu(xtx) + np.triu(xtx, 1).T
        xty, _ = add_gaussian_noise(xc.T @ yc, sens["xty"], eps3, delta3)
        return lam_tilde, xtx, xty, scale_xx

    def fit(self, data: TrainingData, setting: PrivacySetting, *, seed: int) -> np.ndarray:
        if data.n_private == 0:
            return public_only_beta(data.x_public, data.y_public)
        d = data.dim
        xtx = data.x_public.T @ data.x_public
        xty = data.x_public.T @ data.y_public
        lam_tilde, scale_xx = 0.0, 0.0
        blocks = split_rows(data.n_private, setting.n_sites)
        for rows in blocks:
            lt, sxx, sxy, scale_xx = self.site_release(data.x_private[rows],
                                                       data.y_private[rows], setting)
            lam_tilde += lt
            xtx = xtx + sxx
            xty = xty + sxy
        # Every site uses the same scale; the sum of K releases has sd sqrt(K) scale_xx.
        first = math.sqrt(len(blocks) * d * math.log(2 * d * d / self.rho)) * scale_xx
        ridge = max(0.0, first - lam_tilde)
        try:
            return np.linalg.solve(xtx + ridge * np.eye(d), xty)
        except np.linalg.LinAlgError:
            # A singular noisy matrix (measure zero): least-squares solution instead.
            return np.linalg.lstsq(xtx + ridge * np.eye(d), xty, rcond=None)[0]
