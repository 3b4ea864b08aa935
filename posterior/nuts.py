"""NUTS (Hoffman & Gelman 2014; PyMC's sampler) on the PyMC definitions of the models
(``posterior.model``): the reference sampler, and the fallback of the default Laplace fit when
it refuses (``posterior.fit``).

- ``fit_exact``: the exact model of method.md section 1 (``build_model``; exact and plug-in
  statistics), started at the variational fit (``posterior.advi.variational_init``);
- ``fit_noise_aware``: the noise-aware model of method.md section 8
  (``build_noise_aware_model``), started at the ridge start of the Laplace fit.

Reports divergences, r-hat and ESS (ArviZ); a run whose r-hat exceeds ``rhat_max`` is refused
with ``ConvergenceError``. PyMC and ArviZ are imported here, when a NUTS fit runs.
"""

from __future__ import annotations

import math

import numpy as np

from posterior.advi import variational_init
from posterior.result import ConvergenceError, Posterior, draws_summary
from posterior.targets import start

__all__ = ["fit_exact", "fit_noise_aware", "sample"]


def fit_noise_aware(stats, public, rep, diag, ss, draws, *, x_bound=None, tune, chains,
                    target_accept, rhat_max) -> Posterior:
    """NUTS on ``posterior.model.build_noise_aware_model`` (the reference sampler)."""
    from posterior import noise_aware as na
    from posterior.model import build_noise_aware_model

    inp = na.noise_aware_inputs(stats, public, x_bound)
    u0 = start(stats, inp.abar, 3.0 * float(np.sqrt(inp.v_xx)) + 1.0)
    initvals = {"lam": float(np.exp(u0[-1])), "lam0": 1.0, "beta": u0[:-1]}
    return sample(build_noise_aware_model(inp), initvals, stats, rep, diag, ss, draws,
                  model_name="noise-aware", tune=tune, chains=chains,
                  target_accept=target_accept, rhat_max=rhat_max)


def fit_exact(stats, rep, diag, ss, draws, *, tune, chains, target_accept, rhat_max) -> Posterior:
    """NUTS on ``posterior.model.build_model`` (the exact model of method.md section 1)."""
    import pymc as pm

    from posterior.model import build_model
    from posterior.noise_aware import active_prior

    model, _ = build_model(stats.dim, prior=active_prior())
    with model:
        pm.set_data({"xtx": stats.xtx, "xty": stats.xty, "yty": np.float64(stats.yty),
                     "n": np.float64(stats.n)})
    mu0, _ = variational_init(stats)
    initvals = {"lam": float(np.exp(mu0[0])), "lam0": float(np.exp(mu0[1])), "beta": mu0[2:]}
    return sample(model, initvals, stats, rep, diag, ss, draws, model_name="exact", tune=tune,
                  chains=chains, target_accept=target_accept, rhat_max=rhat_max)


def sample(model, initvals, stats, rep, diag, ss, draws, *, model_name, tune, chains,
           target_accept, rhat_max) -> Posterior:
    """PyMC's NUTS on ``model`` (value variables lam, lam0, beta), with r-hat, ESS and
    divergences (ArviZ) in ``diag``; not converged (r-hat above ``rhat_max``) raises."""
    import logging

    import arviz as az
    import pymc as pm

    chains = int(chains)
    per_chain = int(math.ceil(draws / chains))
    seed_int = int(ss.generate_state(1, dtype=np.uint32)[0])
    pm_logger = logging.getLogger("pymc")
    level = pm_logger.level
    pm_logger.setLevel(logging.ERROR)
    try:
        with model:
            idata = pm.sample(draws=per_chain, tune=int(tune), chains=chains, cores=1,
                              random_seed=seed_int, progressbar=False, initvals=initvals,
                              target_accept=target_accept, compute_convergence_checks=False,
                              return_inferencedata=True)
    finally:
        pm_logger.setLevel(level)
    post = idata.posterior
    beta_draws = post["beta"].values.reshape(-1, stats.dim)[:draws]
    rhat, ess = az.rhat(idata), az.ess(idata)
    max_rhat = float(max(float(rhat[v].max()) for v in ("beta", "lam", "lam0")))
    min_ess = float(min(float(ess[v].min()) for v in ("beta", "lam", "lam0")))
    divergences = int(idata.sample_stats["diverging"].sum())
    converged = bool(max_rhat <= rhat_max)
    diag.update(converged=converged, iterations=per_chain * chains, chains=chains,
                tune=int(tune), max_rhat=max_rhat, min_ess_bulk=min_ess,
                divergences=divergences, rhat_max=rhat_max)
    if not converged:
        raise ConvergenceError(f"NUTS did not converge: max r-hat {max_rhat:.3f} > {rhat_max}",
                               diag)
    return Posterior("nuts", beta_draws.mean(axis=0), beta_draws,
                     draws_summary(post["lam"].values.ravel()),
                     draws_summary(post["lam0"].values.ravel()), diag, rep, stats, model_name)
