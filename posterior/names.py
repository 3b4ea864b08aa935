"""The names of the fits, apart from the fitting code: what a round spec's ``fit_method``,
``dpfed simulate --fit-method`` and the evaluation may name, and how a name maps to
``fit_posterior``'s arguments. Importing this module imports nothing heavy (no SciPy, no
PyMC), so the aggregator checks a spec's fit method before it has loaded the fit
(``aggregator.aggregate.spec_problems``; the fit loads on a thread once the server listens).
"""

from __future__ import annotations

from dpfed.fit_methods import FIT_METHODS

__all__ = ["METHODS", "MODELS", "FIT_METHODS", "fit_method_options"]

METHODS = ("auto", "laplace", "nuts", "advi", "fixed")
MODELS = ("noise-aware", "exact", "plug-in")

def fit_method_options(fit_method: str) -> dict:
    """``fit_posterior``'s ``method`` and ``plug_in`` for a name of ``FIT_METHODS`` (empty:
    "auto"): "plug-in-<m>" is method <m> with ``plug_in=True``."""
    name = fit_method or "auto"
    return {"method": name.removeprefix("plug-in-"), "plug_in": name.startswith("plug-in-")}
