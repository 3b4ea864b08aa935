"""The Bayesian fit: from (aggregated, noisy) sufficient statistics to the posterior of the
regression coefficients (method.md sections 1, 6 and 8; Honkela et al. 2018).

One entry point, ``fit_posterior`` (``posterior.fit``: which model, which strategy, in which
order); each inference strategy and each piece of maths in a module of its own:

- ``names``: ``METHODS``, ``MODELS``, ``FIT_METHODS`` and ``fit_method_options`` (no
  heavy imports: the aggregator checks a spec with them before the fit has loaded);
- ``fit``: ``fit_posterior``, the sequence of a fit (repair, start, Laplace and importance
  sampling, extra starts, mixture or adaptive rounds, HMC when the importance sample's
  k-hat is above 0.7, NUTS fallback); ``METHODS``,
  ``MODELS``, and ``FIT_METHODS``, the names a round spec, ``dpfed simulate`` and the
  evaluation give a fit (``fit_method_options`` turns one into ``fit_posterior``'s arguments);
- ``result``: ``Posterior`` and the errors a fit raises;
- ``targets``: each model's log density for the Laplace fit (compiled or numpy) and the
  starting points of its mode search;
- ``laplace``: Laplace approximation and importance sampling of any smooth log density
  (generic maths); ``psis``: the Pareto k-hat that says whether an importance sample can be
  trusted; ``hmc``: HMC preconditioned by the Laplace approximation, where it cannot (large
  d); ``chains``: the chains' ESS and r-hat;
- ``batched``: the densities and gradients vectorised over many points in numpy (the default
  backend: nothing to compile);
- ``envelope``: the noise-aware density's rotation-invariant envelope, O(d) per point;
  ``envelope_importance``: the nested Laplace proposal built on it, whose draws are weighted
  by the exact density (the fit's attempt 0 from d = 32; ``hmc`` guided by the envelope is
  its attempt 0b);
- ``noise_aware``: the noise-aware model of released statistics (numpy densities, the
  reference); ``noise_aware_jit``: their compiled (Numba) twins and a damped Newton;
- ``nuts``: NUTS on the PyMC models, the reference sampler and the fallback;
- ``model``: the models in PyMC and the compiled mean-field ADVI engine;
- ``advi``: the paper's mean-field ADVI fit; ``closed_form``: the fixed-precision closed
  form (``method="fixed"``);
- ``repair``: the PSD repair of noisy statistics (the plug-in fit);
- ``quality``: how much the statistics told us beyond the public rows.

Importing this package, and the default (Laplace) fit, import neither PyMC nor PyTensor nor
ArviZ: only the NUTS and ADVI paths do, when they run (tests/test_site_imports.py).
"""

from posterior.names import FIT_METHODS, METHODS, MODELS, fit_method_options

__all__ = ["fit_posterior", "Posterior", "PosteriorError", "ConvergenceError",
           "UnknownNoiseError", "METHODS", "MODELS", "FIT_METHODS", "fit_method_options"]

# The fitting code (NumPy linear algebra, SciPy) loads when first asked for, so that
# `from posterior.names import FIT_METHODS` (the aggregator checking a spec before its fit has
# loaded) costs nothing (PEP 562 module __getattr__).
_LAZY = {"fit_posterior": "posterior.fit", "Posterior": "posterior.result",
         "PosteriorError": "posterior.result", "ConvergenceError": "posterior.result",
         "UnknownNoiseError": "posterior.result"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'posterior' has no attribute {name!r}")
