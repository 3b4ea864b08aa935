"""Is the d = 10 over-coverage the model's or the fast fit's? (issue 21 item 2, lead (i))

    nice -n 10 python benchmarks/coverage_nuts_design.py [--reps 30] [--d 10 --n 2000
        --eps 0.5 --k 10] [--design-sd product|se|0.1+n] [--tune 500 --draws 1000]

The problems are ``benchmarks/coverage_product.py``'s (same generator, same seed, so problem r
is the grid's problem r of the cell). Each release is fitted twice, in units of By:

- the product: ``fit_posterior`` (Laplace / importance sampling, A integrated out with one
  scalar design variance, Abar in the data covariance);
- NUTS (PyMC) on a model that samples the private design A itself: the d(d+1)/2 upper-
  triangle entries of A are latent, each normal with its own mean and variance from the
  design prior and the released R_xx (the per-entry conjugate update of
  ``noise_aware.noise_aware_inputs``, not averaged over entries), and given A the release
  (R_xy, R_yy) is normal with mean (A beta, beta^T A beta + n rho) and covariance
  [[rho A + v_xy I, 2 rho A beta], [., 4 rho beta^T A beta + (2 n + v_n) rho^2 + v_yy]]
  (Bernstein & Sheldon 2019, section 4, with A itself in the covariance); the priors of
  method.md section 1 (lambda0 sampled, not integrated out) and the public rows' exact
  likelihood.

If NUTS on this model also over-covers the population coefficients, the model (its priors
and design prior) sets the intervals; if it covers ~0.90, the fast fit's approximation does.
Coverage is of ``clipped_population_beta`` (as the grid). Prints per-problem timings.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def design_posterior(stats, public, x_bound):
    """Per-entry mean and variance of A (the private design) given its prior and R_xx, in the
    private part's coordinates (``noise_aware.noise_aware_inputs`` without the averaging)."""
    from posterior import noise_aware as na

    a0, va = na.design_prior(stats, public, x_bound)
    vn = stats.noise.variances()["xtx"]
    rxx = np.array(stats.xtx) - public.xtx
    a0 = a0 - public.xtx
    w = va / (va + vn)
    return w * rxx + (1 - w) * a0, va * vn / (va + vn)


def build_latent_design_model(stats, public, x_bound):
    """The PyMC model of the module docstring (A latent), and its initial values."""
    import pymc as pm
    import pytensor.tensor as pt

    from posterior import noise_aware as na

    d = stats.dim
    v = stats.noise.variances()
    m_a, v_a = design_posterior(stats, public, x_bound)
    iu = np.triu_indices(d)
    rxy = np.array(stats.xty) - public.xty
    ryy = float(stats.yty) - float(public.yty)
    n = float(stats.n) - float(public.n)
    pxx, pxy, pyy, pn = public.xtx, public.xty, float(public.yty), float(public.n)
    with pm.Model() as model:
        lam = pm.Gamma("lam", alpha=na.PRIOR_SHAPE, beta=na.PRIOR_RATE)
        lam0 = pm.Gamma("lam0", alpha=na.PRIOR_SHAPE, beta=na.PRIOR_RATE)
        beta = pm.Normal("beta", mu=0.0, sigma=1.0 / pt.sqrt(lam0), shape=(d,))
        # Non-centred: A_jk = m_jk + sd_jk z_jk.
        z = pm.Normal("z", 0.0, 1.0, shape=(len(iu[0]),))
        up = pt.as_tensor(m_a[iu]) + pt.as_tensor(np.sqrt(v_a[iu])) * z
        a = pt.zeros((d, d))
        a = pt.set_subtensor(a[iu], up)
        a = a + a.T - pt.diag(pt.diag(a))
        rho = 1.0 / lam
        ab = pt.dot(a, beta)
        bab = pt.dot(beta, ab)
        r = pt.concatenate([rxy - ab, pt.stack([ryy - bab - n * rho])])
        c11 = rho * a + pt.eye(d) * v["xty"]
        c12 = 2 * rho * ab
        c22 = 4 * rho * bab + (2 * n + v["n"]) * rho ** 2 + v["yty"]
        cov = pt.concatenate([pt.concatenate([c11, c12[:, None]], axis=1),
                              pt.concatenate([c12[None, :], pt.reshape(c22, (1, 1))], axis=1)],
                             axis=0)
        pm.Potential("loglik", pm.logp(pm.MvNormal.dist(mu=pt.zeros(d + 1), cov=cov), r))
        quad = pt.dot(beta, pt.dot(pt.as_tensor(pxx), beta)) - 2 * pt.dot(beta, pxy) + pyy
        pm.Potential("public_loglik", 0.5 * pn * (pt.log(lam) - np.log(2 * np.pi))
                     - 0.5 * lam * quad)
    inp = na.noise_aware_inputs(stats, public, x_bound)
    b0 = np.linalg.solve(inp.abar + np.eye(d) * (1.0 + float(np.sqrt(inp.v_xx))), inp.rxy)
    init = {"lam": 1.0, "lam0": 1.0, "beta": b0, "z": np.zeros(len(iu[0]))}
    return model, init


def nuts_interval(stats, public, x_bound, seed, tune, draws, chains=2):
    import arviz as az
    import pymc as pm

    model, init = build_latent_design_model(stats, public, x_bound)
    logging.getLogger("pymc").setLevel(logging.ERROR)
    with model:
        idata = pm.sample(draws=draws // chains, tune=tune, chains=chains, cores=1,
                          random_seed=seed, progressbar=False, initvals=init,
                          target_accept=0.9, compute_convergence_checks=False,
                          compile_kwargs={"mode": "NUMBA"})
    b = idata.posterior["beta"].values.reshape(-1, stats.dim)
    rhat = float(az.rhat(idata)["beta"].max())
    div = int(idata.sample_stats["diverging"].sum())
    lo, hi = np.quantile(b, [0.05, 0.95], axis=0)
    return lo, hi, rhat, div


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--d", type=int, default=10)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--eps", type=float, default=0.5)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--design-sd", default="product")
    ap.add_argument("--tune", type=int, default=500)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from benchmarks import coverage_product as bench
    bench.set_design_sd(args.design_sd)
    from posterior import fit_posterior

    d, n, eps, k = args.d, args.n, args.eps, args.k
    rng = np.random.default_rng([args.seed, d, n, int(eps * 10), k])
    hit_p, hit_n, w_p, w_n, secs = [], [], [], [], []
    for r in range(args.reps):
        p = bench.problem(rng, d, n, eps, k, ["bound"])
        by = p["units"]["bound"]
        post = fit_posterior(p["release"] + p["public"], public=p["public"], x_bound=p["bx"],
                             y_unit=by, draws=1000, seed=r)
        lo, hi = post.credible_interval(0.9).T
        rel = (p["release"] + p["public"]).in_y_units(by)
        pub = p["public"].in_y_units(by)
        t0 = time.process_time()
        lo_n, hi_n, rhat, div = nuts_interval(rel, pub, p["bx"], r, args.tune, args.draws)
        secs.append(time.process_time() - t0)
        lo_n, hi_n = lo_n * by, hi_n * by
        bp = p["beta_pop"]
        hit_p.append((bp >= lo) & (bp <= hi))
        hit_n.append((bp >= lo_n) & (bp <= hi_n))
        w_p.append(np.mean(hi - lo))
        w_n.append(np.mean(hi_n - lo_n))
        print(f"problem {r}: product {np.mean(hit_p[-1]):.2f} (w {w_p[-1]:.3f}), NUTS latent A "
              f"{np.mean(hit_n[-1]):.2f} (w {w_n[-1]:.3f}), r-hat {rhat:.3f}, divergences {div}, "
              f"{secs[-1]:.0f} CPU-s; running: product {np.mean(hit_p):.3f}, "
              f"NUTS {np.mean(hit_n):.3f}", flush=True)
    print(f"| d {d} n {n} eps {eps:g} K {k}, design {args.design_sd}, {args.reps} problems | "
          f"product {np.mean(hit_p):.3f} ({np.mean(w_p):.3f}) | NUTS latent A "
          f"{np.mean(hit_n):.3f} ({np.mean(w_n):.3f}) | NUTS CPU-s median "
          f"{np.median(secs):.0f} (max {np.max(secs):.0f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
