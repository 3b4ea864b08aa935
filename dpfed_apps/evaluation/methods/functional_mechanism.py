"""Functional-mechanism linear regression (paper section 4.5, model (v); Zhang et al. 2012,
"Functional mechanism: regression analysis under differential privacy", as presented in
Srivastava 2016, sections 4.2-4.3 and Algorithm 1).

Every constant:

1. Linear rescaling (no projection): x~ = x / Rx, y~ = y / Ry with the public ranges of
   ``PrivacySetting`` (Zhang et al. require every attribute in [-1, 1]). A guard projects any
   |x~_ij| > 1 or |y~| > 1 onto the range; a no-op when the ranges are honest.
2. The objective sum_i (y~_i - x~_i^T w)^2 is a polynomial in w; its coefficients are sums
   over records of per-record coefficients:
       w_j w_l (j < l): 2 x~_j x~_l,   w_j^2: x~_j^2,   w_j: -2 y~ x~_j,   constant: y~^2.
   Per record, sum of |coefficients| = (sum_j |x~_j|)^2 + 2 |y~| sum_j |x~_j| + y~^2
   <= d^2 + 2d + 1 = (d + 1)^2, so by Srivastava's Result 1 (Zhang et al. Lemma 1) the L1
   sensitivity of the coefficient vector under replace-one is Delta = 2 (d + 1)^2 (Zhang et al.
   section 4.2). The constant does not move the minimiser and is not released; Delta still
   includes it, which is conservative.
3. Laplace(Delta / eps) on each of the d(d+1)/2 quadratic and d linear coefficients, one
   OpenDP vector Laplace release (``site_node.laplace``): eps-DP per site, bounded DP.
   With K sites each site releases the coefficients of its own rows and the releases are summed
   (the coefficients are sums over records); public rows contribute exact coefficients.
4. The noisy quadratic form M (M_jj = noisy w_j^2 coefficient, M_jl = half the w_j w_l one) may
   be indefinite and the noisy objective unbounded below. Zhang et al. (section 5) repair this
   by regularisation and spectral trimming; we apply both as their published implementation
   does: M <- M + 5 sqrt(2) (Delta / eps) I (5 standard deviations of the Laplace noise), then
   keep only the eigen-directions with eigenvalue > 1e-8 and minimise there:
   w = -1/2 sum_{mu_k > 1e-8} (v_k^T c / mu_k) v_k, with c the noisy linear coefficients.
   Both are post-processing of the release.
5. beta = w * Ry / Rx, so that ``x @ beta`` predicts y in the original units.

Without private rows the fixed-precision posterior mean of the public rows is returned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dpfed_apps.evaluation.methods.base import PrivacySetting, TrainingData, split_rows
from dpfed_apps.evaluation.methods.posterior_fit import public_only_beta
from site_node.laplace import add_laplace_noise

REGULARISATION_SDS = 5.0  # Zhang et al.'s implementation: 5 x sqrt(2) x Delta / eps
EIGEN_TRIM = 1e-8         # eigenvalues at or below this are trimmed (Zhang et al. section 5)


def sensitivity(d: int) -> float:
    """Delta = 2 (d + 1)^2: L1 sensitivity of the polynomial coefficients (replace-one)."""
    return 2.0 * (d + 1) ** 2


def coefficients(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Upper-triangle monomial coefficients (w_j^2: sum x_j^2; w_j w_l, j<l: 2 sum x_j x_l),
    then the linear ones (-2 sum y x_j): a vector of length d(d+1)/2 + d."""
    d = x.shape[1]
    gram = x.T @ x
    iu = np.triu_indices(d)
    quad = np.where(iu[0] == iu[1], 1.0, 2.0) * gram[iu]
    return np.concatenate([quad, -2.0 * (x.T @ y)])


def minimise(coef: np.ndarray, d: int, reg: float) -> np.ndarray:
    """Regularised, spectrally trimmed minimiser of w^T M w + c^T w (step 4)."""
    m = d * (d + 1) // 2
    iu = np.triu_indices(d)
    upper = np.zeros((d, d))
    upper[iu] = coef[:m] * np.where(iu[0] == iu[1], 1.0, 0.5)
    mat = np.triu(upper) + np.triu(upper, 1).T + reg * np.eye(d)
    lin = coef[m:]
    mu, v = np.linalg.eigh(mat)
    keep = mu > EIGEN_TRIM
    g = v[:, keep].T @ lin
    return -0.5 * (v[:, keep] @ (g / mu[keep]))


def unit_range_data(x, y, x_range: float, y_range: float) -> tuple[np.ndarray, np.ndarray]:
    """Rescale by the public ranges into [-1, 1], with the guard projection."""
    return (np.clip(np.asarray(x, dtype=np.float64) / x_range, -1.0, 1.0),
            np.clip(np.asarray(y, dtype=np.float64) / y_range, -1.0, 1.0))


@dataclass(frozen=True)
class FunctionalMechanism:
    name: ClassVar[str] = "functional_mechanism"
    private: ClassVar[bool] = True

    def noisy_coefficients(self, data: TrainingData, setting: PrivacySetting) -> np.ndarray:
        """Sum of the K sites' noisy coefficient vectors plus the exact public ones."""
        y_range = setting.require_y_range(self.name)
        d = data.dim
        total = np.zeros(d * (d + 1) // 2 + d)
        if data.n_public:
            xs, ys = unit_range_data(data.x_public, data.y_public, setting.x_range, y_range)
            total += coefficients(xs, ys)
        xs, ys = unit_range_data(data.x_private, data.y_private, setting.x_range, y_range)
        for rows in split_rows(data.n_private, setting.n_sites):
            noisy, _ = add_laplace_noise(coefficients(xs[rows], ys[rows]), sensitivity(d),
                                         setting.epsilon)
            total += noisy
        return total

    def fit(self, data: TrainingData, setting: PrivacySetting, *, seed: int) -> np.ndarray:
        y_range = setting.require_y_range(self.name)
        if data.n_private == 0:
            return public_only_beta(data.x_public, data.y_public)
        d = data.dim
        coef = self.noisy_coefficients(data, setting)
        # The summed noise of K sites has K times the variance of one release.
        sites = len(split_rows(data.n_private, setting.n_sites))
        noise_sd = math.sqrt(2.0 * sites) * sensitivity(d) / setting.epsilon
        w = minimise(coef, d, REGULARISATION_SDS * noise_sd)
        return w * (y_range / setting.x_range)
