"""The public quantities of a round: pre-processing means, sigmas and clipping bounds.

Everything here comes from the public lines or from public sizes n (bounded DP: n is public),
never from the sites' private rows (method.md section 4).
"""

from __future__ import annotations

import math

import numpy as np

from dpfed.preprocess import Preprocessing
from dpfed.simulation.problem import Problem, Split


def public_preprocessing(problem: Problem, split: Split) -> Preprocessing:
    """Centring means from the public lines only (method.md section 4: never the sites')."""
    if split.public.size == 0:
        raise ValueError("the round needs public lines for its pre-processing means")
    return Preprocessing.from_public_data(problem.x[split.public], problem.y[split.public])


def public_sigmas(preprocessing: Preprocessing, x_public: np.ndarray,
                  y_public: np.ndarray) -> tuple[float, float]:
    """``(sigma_x, sigma_y)``: scales of the pre-processed features and target, public lines only.

    After row normalisation every row has unit norm, so the entries' root mean square is about
    1/sqrt(d); that is the fallback when the public lines cannot say (all rows at the mean).
    sigma_y falls back to 1 with fewer than two public lines.
    """
    d = preprocessing.dim
    z, yc = preprocessing.apply(x_public, y_public)
    sigma_x = float(np.std(z)) if z.size else 0.0
    if not (math.isfinite(sigma_x) and sigma_x > 0):
        sigma_x = 1.0 / math.sqrt(d)
    sigma_y = float(np.std(yc, ddof=1)) if yc.size >= 2 else 1.0
    if not (math.isfinite(sigma_y) and sigma_y > 0):
        sigma_y = 1.0
    return sigma_x, sigma_y


def round_bounds(n_per_site: int, d: int, epsilon: float, sigma_x: float,
                 sigma_y: float, *, neighbouring: str = "add_remove",
                 xtx_sensitivity: str = "exact") -> tuple[float, float]:
    """Clipping bounds from ``dpfed.bounds.choose_bounds`` (synthetic data of the same n, d,
    eps; method.md section 4) for the round's mechanism (relation, Sxx rule, default split),
    scaled by the public sigmas. Uses only public numbers."""
    from dpfed.bounds import choose_bounds
    from dpfed.sensitivity import default_budget_split

    choice = choose_bounds(int(n_per_site), int(d), float(epsilon),
                           budget_split=default_budget_split(neighbouring),
                           neighbouring=neighbouring, xtx_sensitivity=xtx_sensitivity)
    x_bound, y_bound = choice.bounds(sigma_x, sigma_y)
    return float(x_bound), float(y_bound)


def round_choice(n_per_site, d: int, epsilon: float, x_public: np.ndarray, y_public: np.ndarray,
                 preprocessing: Preprocessing, *, feature_names=None,
                 neighbouring: str = "add_remove", xtx_sensitivity: str = "exact",
                 seed: int = 0) -> dict:
    """Bounds and budget split of a round, tuned on auxiliary data shaped like the public
    lines (``dpfed.bounds.choose_bounds_table``; the release's row-norm bound when the
    pre-processing normalises rows). ``n_per_site``: the sites' sizes (public under bounded
    DP; planned sizes otherwise). Returns {"x_bound", "y_bound", "budget_split", "ridge_c",
    "x_norm_bound"}. Uses only public numbers and the public lines."""
    from dpfed.auxiliary import AuxiliarySource
    from dpfed.bounds import choose_bounds_table
    from dpfed.sensitivity import row_norm_bound

    sizes = [int(v) for v in n_per_site]
    norm = row_norm_bound(preprocessing.normalize_rows)
    source = AuxiliarySource(x_public, y_public, preprocessing, feature_names=feature_names)
    cell = (sum(sizes), len(sizes))
    table = choose_bounds_table(source, [cell], [float(epsilon)], neighbouring=neighbouring,
                                xtx_sensitivity=xtx_sensitivity, x_norm_bound=norm, seed=seed)
    choice = table[cell + (float(epsilon),)]
    x_bound, y_bound = choice.bounds(*source.scales())
    return {"x_bound": float(x_bound), "y_bound": float(y_bound),
            "budget_split": tuple(choice.budget_split), "ridge_c": float(choice.ridge_c),
            "x_norm_bound": norm}
