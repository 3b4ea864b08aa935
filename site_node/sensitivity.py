"""L1 sensitivities and Laplace scales of the sufficient statistics (pure functions).

Implements the noise calibration of Honkela et al. (2018), section 4.2, and Nieminen (2017),
Algorithm 2 (whose loops run to d, not n; method.md section 6), summarised in method.md
section 2. Neighbouring data sets are of equal size and differ in one *replaced* record
(bounded DP), which is where the factor 2 comes from:

- one entry x_j x_k of Sxx moves by at most 2 Bx^2; summing that per-entry bound over the
  d(d+1)/2 upper-triangle entries gives the paper's d(d+1) Bx^2 (Nieminen 2017, proof of
  Theorem 3.9 (i)). This is a valid but *conservative* bound: the exact joint L1 sensitivity
  is d(d+1)/2 Bx^2 (``xtx_sensitivity_tight``), see below. The release uses the paper's value
  (method.md section 2), i.e. twice the noise strictly needed on Sxx;
- Sxy = sum x_i y_i moves by at most 2 Bx By per entry, 2 d Bx By in L1;
- Syy = sum y_i^2 lies in [0, n By^2] and moves by at most By^2.

With budget split (p1, p2, p3), Laplace noise of scale sensitivity / (p eps) on each part
gives eps-DP for the triple by basic composition.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

DEFAULT_BUDGET_SPLIT = (0.35, 0.60, 0.05)  # Nieminen (2017) thesis, section 3.4


def xtx_sensitivity(d: int, x_bound: float) -> float:
    """L1 sensitivity of the upper triangle of X^T X under replace-one: d (d+1) Bx^2."""
    return d * (d + 1) * (x_bound * x_bound)


def xtx_sensitivity_tight(d: int, x_bound: float) -> float:
    """Exact L1 sensitivity of the upper triangle of X^T X under replace-one: d(d+1)/2 Bx^2.

    Not used by the release (which follows the paper); documented because it shows the
    paper's bound is exactly 2x too large. Proof, for rows v, w with |v_j|, |w_j| <= B:
    write v_j v_k - w_j w_k = (a_j s_k + s_j a_k)/2 with a = v - w, s = v + w. Since
    |a_j| + |s_j| = 2 max(|v_j|, |w_j|) <= 2B, with A = sum|a_j|, S = sum|s_j| we get
    sum_{j,k} |v_j v_k - w_j w_k| <= A S <= (A + S)^2 / 4 <= d^2 B^2, and the diagonal
    sum_j |v_j^2 - w_j^2| <= d B^2. The upper triangle is (full + diagonal)/2 <= d(d+1)/2 B^2,
    attained by v = (B, ..., B), w = 0. (tests/test_sensitivity.py checks both by brute force.)
    """
    return d * (d + 1) / 2 * (x_bound * x_bound)


def xty_sensitivity(d: int, x_bound: float, y_bound: float) -> float:
    """L1 sensitivity of X^T y under replace-one: 2 d Bx By."""
    return 2.0 * d * x_bound * y_bound


def yty_sensitivity(y_bound: float) -> float:
    """Sensitivity of y^T y under replace-one: By^2 (each term lies in [0, By^2])."""
    return y_bound * y_bound


def validate_privacy_parameters(epsilon, x_bound, y_bound, budget_split) -> tuple[float, float, float, tuple[float, float, float]]:
    """Check the public privacy parameters; raise ValueError with the reason if invalid."""
    for name, value in (("epsilon", epsilon), ("x_bound", x_bound), ("y_bound", y_bound)):
        # numbers.Real admits numpy scalars (np.float32, np.int64) but not bool, str, None.
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    try:
        split = tuple(float(p) for p in budget_split)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"budget_split must be 3 numbers (Sxx, Sxy, Syy), got {budget_split!r}") from exc
    if len(split) != 3:
        raise ValueError(f"budget_split must have 3 parts (Sxx, Sxy, Syy), got {len(split)}")
    if not all(math.isfinite(p) and p > 0 for p in split):
        raise ValueError(f"every part of budget_split must be finite and > 0, got {split}")
    if abs(sum(split) - 1.0) > 1e-9:
        raise ValueError(f"budget_split must sum to 1, got {sum(split)!r}")
    return float(epsilon), float(x_bound), float(y_bound), split


@dataclass(frozen=True)
class NoiseCalibration:
    """Sensitivity and epsilon share of each released part (method.md section 2)."""

    xtx_sensitivity: float
    xty_sensitivity: float
    yty_sensitivity: float
    xtx_epsilon: float
    xty_epsilon: float
    yty_epsilon: float

    @property
    def xtx_scale(self) -> float:
        return self.xtx_sensitivity / self.xtx_epsilon

    @property
    def xty_scale(self) -> float:
        return self.xty_sensitivity / self.xty_epsilon

    @property
    def yty_scale(self) -> float:
        return self.yty_sensitivity / self.yty_epsilon


def noise_calibration(d: int, epsilon: float, x_bound: float, y_bound: float,
                      budget_split=DEFAULT_BUDGET_SPLIT) -> NoiseCalibration:
    """Sensitivities and per-part epsilons: b_xx = d(d+1)Bx^2/(p1 eps), b_xy = 2dBxBy/(p2 eps),
    b_yy = By^2/(p3 eps)."""
    epsilon, x_bound, y_bound, (p1, p2, p3) = validate_privacy_parameters(
        epsilon, x_bound, y_bound, budget_split)
    if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1:
        raise ValueError(f"dimension must be an integer >= 1, got {d!r}")
    cal = NoiseCalibration(
        xtx_sensitivity(d, x_bound), xty_sensitivity(d, x_bound, y_bound), yty_sensitivity(y_bound),
        p1 * epsilon, p2 * epsilon, p3 * epsilon)
    # Extreme but finite inputs can overflow (Bx = 1e200) or underflow (eps = 1e-320) here;
    # refuse them now, before any noise is drawn, rather than midway through a release.
    for name in ("xtx", "xty", "yty"):
        sens, eps = getattr(cal, f"{name}_sensitivity"), getattr(cal, f"{name}_epsilon")
        scale = sens / eps if eps > 0 else math.inf
        if not (0 < sens < math.inf and 0 < eps < math.inf and 0 < scale < math.inf):
            raise ValueError(f"the {name} noise scale is not a positive finite number "
                             f"(sensitivity {sens!r}, epsilon {eps!r}); bounds or epsilon are out of range")
    return cal
