"""The public quantities of a round: pre-processing means and clipping bounds (the sigmas that
scale them: ``dpfed.preprocess.public_sigmas``).

Everything here comes from the public lines or from public sizes n (bounded DP: n is public),
never from the sites' private rows (method.md section 4).
"""

from __future__ import annotations



from dpfed.preprocess import Preprocessing
from dpfed_apps.simulation.problem import Problem, Split


def public_preprocessing(problem: Problem, split: Split) -> Preprocessing:
    """Centring means from the public lines only (method.md section 4: never the sites')."""
    if split.public.size == 0:
        raise ValueError("the round needs public lines for its pre-processing means")
    # Continuous columns divided by their public sd (binary ones keep 1): one unit for every
    # coordinate of the release's box and noise (dpfed.preprocess, issue 21).
    return Preprocessing.from_public_data(problem.x[split.public], problem.y[split.public],
                                          scale_columns=True)


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
                 seed: int = 0, draws: int | None = None) -> dict:
    """Bounds and budget split of a round, tuned on auxiliary data shaped like the public
    lines (``dpfed.bounds.choose_bounds_table``; the release's row-norm bound when the
    pre-processing normalises rows). ``n_per_site``: the sites' sizes (public under bounded
    DP; planned sizes otherwise); ``draws``: independent noise draws in their sum, one per
    site by default, 1 for a secure round (dpfed.secure_round). Returns {"x_bound", "y_bound", "budget_split", "ridge_c",
    "x_norm_bound"}. Uses only public numbers and the public lines."""
    from dpfed.auxiliary import AuxiliarySource
    from dpfed.bounds import choose_bounds_table
    from dpfed.sensitivity import row_norm_bound

    sizes = [int(v) for v in n_per_site]
    norm = row_norm_bound(preprocessing.normalize_rows)
    source = AuxiliarySource(x_public, y_public, preprocessing, feature_names=feature_names)
    cell = (sum(sizes), len(sizes) if draws is None else int(draws))
    table = choose_bounds_table(source, [cell], [float(epsilon)], neighbouring=neighbouring,
                                xtx_sensitivity=xtx_sensitivity, x_norm_bound=norm, seed=seed)
    choice = table[cell + (float(epsilon),)]
    x_bound, y_bound = choice.bounds(*source.scales())
    return {"x_bound": float(x_bound), "y_bound": float(y_bound),
            "budget_split": tuple(choice.budget_split), "ridge_c": float(choice.ridge_c),
            "x_norm_bound": norm}
