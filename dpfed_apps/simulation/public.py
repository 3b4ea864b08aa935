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
    return Preprocessing.from_public_data(problem.x[split.public], problem.y[split.public])


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
