"""Coverage of 90 % intervals in the product's own setting (issue 21 item 2).

    python benchmarks/coverage_product.py [--reps 60] [--unit bound,public_rms]
        [--design-sd product|se|0.15|se+n] [--prior gamma|scaled|scaled:a,b,a0,b0]
        [--d 5 --n 500 --eps 2 --k 10]

Each problem: (lambda, lambda0, beta) from the priors of method.md section 1 (y's own units),
rows of unit norm, n private rows, 10 public rows. Then what a round does: the bounds, split
and ridge from the bound search on auxiliary data shaped like the public rows
(``dpfed.bounds.choose_bounds_table``, row-norm bound R = 1 so Bx = 1; By = omega_y sigma_y,
sigma_y the public rows'), the private y clipped at By, K independent releases (numpy Laplace
of the add/remove mechanism's law and scales, row-norm bound: this tests the fit), the public
rows clipped like the private ones, ``fit_posterior(y_unit=...)``. Coverage is of the
clipped-data model's population coefficients (``clipped_population_beta``: least squares
of clip(y, By) on 200,000 fresh rows of the same generator; what the posterior is about
under clipping) and,
beside it, of the sample's clipped least squares and of the generating beta; the noise-free
posterior's coverage of the same estimand separates the priors from the noise model.
Width: mean 90 % interval width, and its ratio to the noise-free posterior's (the exact
clipped statistics of the same rows, same unit).

Units (``--unit``): ``bound`` = By (the round's unit, ``aggregator.aggregate.fit``);
``public_rms`` = a candidate, the root mean square of the public rows' clipped responses
(``public_rms_unit``: public, exact, no release value enters it), kept within [By / 4, By].
Measured and not adopted (docs/evaluation.md, issue 21). ``half_bound`` = By / 2, a diagnostic:
the priors' scale at which their prior-predictive sd of y (about 2 units) equals the bound.

Design prior (``--design-sd``, a diagnostic; docs/evaluation.md): ``product`` =
``posterior.noise_aware.design_prior`` as it is; a number = its relative sd
``DESIGN_PRIOR_RELATIVE_SD`` set to that value in this process; ``se`` = the candidate of
``design_prior_se``: the per-entry sd of the public second moments' own standard error, half
the normal-theory sqrt((M_jj M_kk + M_jk^2) / n_pub) (halved with the half-way shrinkage to
isotropic), instead of a constant. Measured and not adopted (issue 21 item 2).

Priors (``--prior``): a name of ``posterior.noise_aware.PRIORS`` ("gamma", the paper's;
"scaled", the normal-gamma prior lambda0 = lambda g; "total", the total-variance prior), or
``name:a,b,a0,b0[,total[,width]]`` for other hyperparameters; installed as ``noise_aware.PRIOR`` in this process (every fit of
the run, the noise-free reference too).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
POPULATION_ROWS = 200_000
sys.path.insert(0, str(ROOT))


def public_rms_unit(y_bound: float, public) -> float:
    """sqrt(Syy / n) of the clipped public rows, kept within [By / 4, By]; By with < 2 rows."""
    if public is None or public.n < 2 or not public.yty > 0:
        return float(y_bound)
    return float(min(max(np.sqrt(public.yty / public.n), 0.25 * y_bound), y_bound))


def clipped_population_beta(rng, beta, lam, y_bound, rows=POPULATION_ROWS):
    """The clipped-data model's population coefficients: least squares of clip(y, By) on x
    over ``rows`` fresh rows of the same generator (unit-norm x, y = x beta + N(0, 1/lam))."""
    x = rng.standard_normal((rows, beta.size))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = np.clip(x @ beta + rng.standard_normal(rows) / np.sqrt(lam), -y_bound, y_bound)
    return np.linalg.lstsq(x, y, rcond=None)[0]


def problem(rng, d, n, eps, k, unit_names, n_public=10):
    from dpfed.auxiliary import AuxiliarySource
    from dpfed.bounds import choose_bounds_table
    from dpfed.preprocess import Preprocessing
    from dpfed.sensitivity import expected_noise
    from dpfed.statistics import Statistics, clipped_exact_statistics

    lam, lam0 = rng.gamma(2, 0.5), rng.gamma(2, 0.5)
    beta = rng.standard_normal(d) / np.sqrt(lam0)
    x = rng.standard_normal((n + n_public, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = x @ beta + rng.standard_normal(n + n_public) / np.sqrt(lam)
    xp, yp, xq, yq = x[n:], y[n:], x[:n], y[:n]
    pre = Preprocessing((0.0,) * d, 0.0, True, source="synthetic")
    source = AuxiliarySource(xp, yp, pre)
    choice = choose_bounds_table(source, [(n, k)], [eps], x_norm_bound=1.0, n_datasets=3,
                                 n_noise=2, seed=int(rng.integers(1 << 30)))[(n, k, float(eps))]
    bx, by = choice.bounds(*source.scales())
    split = choice.budget_split
    yc = np.clip(yq, -by, by)
    exact = clipped_exact_statistics(xq, yq, bx, by, 1.0)
    beta_clipped = np.linalg.lstsq(xq, yc, rcond=None)[0]
    beta_pop = clipped_population_beta(np.random.default_rng(int(rng.integers(1 << 30))),
                                       beta, lam, by)
    one = expected_noise(d, eps, bx, by, split, x_norm_bound=1.0)
    noise = sum([one] * (k - 1), one)
    m = d * (d + 1) // 2
    values = exact.upper_values().copy()
    sc = {p: getattr(one, p)[0].scale for p in ("xtx", "xty", "yty", "n")}
    for _ in range(k):
        values[:m] += rng.laplace(size=m) * sc["xtx"]
        values[m:m + d] += rng.laplace(size=d) * sc["xty"]
        values[-1] += rng.laplace() * sc["yty"]
    n_rel = max(n + int(np.sum(np.round(rng.laplace(size=k) * sc["n"]))), 1)
    release = Statistics.from_upper(d, n_rel, values, noise)
    public = clipped_exact_statistics(xp, yp, bx, by, 1.0)
    units = {"bound": by, "public_rms": public_rms_unit(by, public), "half_bound": 0.5 * by}
    return dict(beta=beta, beta_clipped=beta_clipped, beta_pop=beta_pop, lam=lam, lam0=lam0,
                bx=bx, by=by, release=release,
                public=public, exact=exact, units={u: units[u] for u in unit_names},
                omega_y=choice.omega_y)


def design_prior_se(stats, public, x_bound=None):
    """``noise_aware.design_prior`` with the candidate sd (module docstring, ``se``): the prior
    mean unchanged, the variance of entry (j, k) n_priv^2 (M_jj M_kk + M_jk^2) / (4 n_pub) with
    M the clipped public second moments (normal theory's variance of their mean, halved in sd
    for the half-way shrinkage). With fewer than 2 public rows: the product's rule."""
    mean, var = _PRODUCT_DESIGN_PRIOR[0](stats, public, x_bound)
    if public is None or public.n < 2:
        return mean, var
    m = public.xtx / public.n
    if x_bound is not None:   # clipped like a private row (design_prior)
        diag = np.diag(m)
        shrink = np.sqrt(np.minimum(1.0, float(x_bound) ** 2
                                    / np.where(diag > 0, diag, np.inf)))
        m = m * np.outer(shrink, shrink)
    n_priv = max(float(stats.n) - public.n, 1.0)
    dg = np.maximum(np.diag(m), 1e-12 * max(np.trace(m) / stats.dim, 1e-300))
    return mean, 0.25 * (np.outer(dg, dg) + m * m) / float(public.n) * n_priv ** 2


_PRODUCT_DESIGN_PRIOR = None


def with_count_noise(rule):
    """``rule`` (a design_prior) with the released count's noise in its variance: the prior
    mean of the private part is n_priv M with n_priv from the released n, so each entry also
    varies by M_jk^2 v_n (v_n: the count's public noise variance)."""
    def prior(stats, public, x_bound=None):
        from posterior.noise_aware import count_noise_variance

        mean, var = rule(stats, public, x_bound)
        n_pub = public.n if public is not None else 0
        m = (mean - (public.xtx if public is not None else 0.0)) / max(float(stats.n) - n_pub,
                                                                      1.0)
        return mean, var + count_noise_variance(m, stats)
    return prior


def set_design_sd(rule: str) -> None:
    """Install the ``--design-sd`` rule in ``posterior.noise_aware`` (this process only);
    a "+n" suffix adds the released count's noise to the design prior (``with_count_noise``);
    "+c" / "-c" switch the count's rank-one likelihood term on / off (``COUNT_IN_LIKELIHOOD``;
    without either, the product's setting). "product" is the product's design prior,
    "act0.22" a relative sd of 0.22 / sqrt(d) (``DESIGN_PRIOR_ACTION_SD``), a number a fixed
    relative sd (the rule before issue 21's fix: "0.1-c"), "wishart" or "wishart0.3" the
    Wishart-shaped design prior (``DESIGN_PRIOR_WISHART``, with its share kappa if given)."""
    global _PRODUCT_DESIGN_PRIOR
    from posterior import noise_aware as na

    if _PRODUCT_DESIGN_PRIOR is None:
        _PRODUCT_DESIGN_PRIOR = (na.design_prior, na.DESIGN_PRIOR_RELATIVE_SD,
                                 na.DESIGN_PRIOR_ACTION_SD, na.COUNT_IN_LIKELIHOOD,
                                 na.DESIGN_PRIOR_WISHART, na.DESIGN_PRIOR_WISHART_SHARE)
    # Every rule starts from the product's (a setting of an earlier call is undone).
    (na.design_prior, na.DESIGN_PRIOR_RELATIVE_SD, na.DESIGN_PRIOR_ACTION_SD,
     na.COUNT_IN_LIKELIHOOD, na.DESIGN_PRIOR_WISHART,
     na.DESIGN_PRIOR_WISHART_SHARE) = _PRODUCT_DESIGN_PRIOR
    if rule.endswith(("+c", "-c")):
        na.COUNT_IN_LIKELIHOOD = rule.endswith("+c")
        rule = rule[:-2]
    base, plus_n = rule.removesuffix("+n"), rule.endswith("+n")
    if base != "product" and not base.startswith("wishart"):
        na.DESIGN_PRIOR_WISHART = False    # the rules below are the per-entry (older) prior's
    if base == "se":
        na.design_prior = design_prior_se
    elif base.startswith("wishart"):   # "wishart0.3": DESIGN_PRIOR_WISHART, share 0.3
        na.DESIGN_PRIOR_WISHART = True
        if base != "wishart":
            na.DESIGN_PRIOR_WISHART_SHARE = float(base[7:])
    elif base.startswith("act"):   # "act0.22": DESIGN_PRIOR_ACTION_SD = 0.22
        na.DESIGN_PRIOR_ACTION_SD = float(base[3:])
    elif base != "product":
        na.DESIGN_PRIOR_RELATIVE_SD = float(base)
        na.DESIGN_PRIOR_ACTION_SD = None
    if plus_n:
        na.design_prior = with_count_noise(na.design_prior)


_PRODUCT_PRIORS = None


def set_prior(spec: str) -> None:
    """Install the ``--prior`` choice as ``posterior.noise_aware.PRIOR`` and ``BOUND_PRIOR``
    (this process: every fit of the run, with or without a unit); "product" leaves the
    product's (the paper's without a unit, "bound" in units of By)."""
    global _PRODUCT_PRIORS
    from posterior import noise_aware as na

    if _PRODUCT_PRIORS is None:
        _PRODUCT_PRIORS = (na.PRIOR, na.BOUND_PRIOR)
    na.PRIOR, na.BOUND_PRIOR = _PRODUCT_PRIORS
    if spec == "product":
        return
    name, _, hyper = spec.partition(":")
    if name not in na.PRIORS:
        raise SystemExit(f"unknown prior {name!r}; known: {sorted(na.PRIORS)}")
    base = na.PRIORS[name]
    if hyper:
        vals = [float(v) for v in hyper.split(",")]
        base = na.Prior(spec, *vals[:4], base.kind, *(vals[4:5] or [base.total]),
                        *(vals[5:6] or [base.width]))
    na.PRIOR = na.BOUND_PRIOR = base


def run_cell(d, n, eps, k, reps, unit_names, seed=0, draws=1000):
    from posterior import PosteriorError, fit_posterior

    rng = np.random.default_rng([seed, d, n, int(eps * 10), k])
    acc = {(u, f): {"hit": [], "hit_pop": [], "hit_gen": [], "w": [], "w0": []}
           for u in unit_names for f in ("aware", "plugin")}
    free = {u: [] for u in unit_names}   # the noise-free posterior's coverage (population)
    failed = 0
    for r in range(reps):
        p = problem(rng, d, n, eps, k, unit_names)
        for u, unit in p["units"].items():
            try:
                ref = fit_posterior(p["exact"] + p["public"], y_unit=unit, draws=draws, seed=r)
                lo0, hi0 = ref.credible_interval(0.9).T
                free[u].append((p["beta_pop"] >= lo0) & (p["beta_pop"] <= hi0))
                for f in ("aware", "plugin"):
                    post = fit_posterior(p["release"] + p["public"], public=p["public"],
                                         x_bound=p["bx"], y_unit=unit, draws=draws, seed=r,
                                         plug_in=(f == "plugin"))
                    lo, hi = post.credible_interval(0.9).T
                    a = acc[(u, f)]
                    a["hit"].append((p["beta_clipped"] >= lo) & (p["beta_clipped"] <= hi))
                    a["hit_pop"].append((p["beta_pop"] >= lo) & (p["beta_pop"] <= hi))
                    a["hit_gen"].append((p["beta"] >= lo) & (p["beta"] <= hi))
                    a["w"].append(np.mean(hi - lo))
                    a["w0"].append(np.mean(hi0 - lo0))
            except PosteriorError:
                failed += 1
    out = {}
    for key, a in acc.items():
        # Monte Carlo standard error of cov_pop: the problems are independent, a problem's
        # d coefficients are not (they share the release), so over per-problem means.
        per_problem = np.mean(a["hit_pop"], axis=1) if a["hit_pop"] else np.array([np.nan])
        out[key] = {"cov": float(np.mean(a["hit"])), "cov_pop": float(np.mean(a["hit_pop"])),
                    "cov_pop_se": float(np.std(per_problem, ddof=1) / np.sqrt(per_problem.size))
                    if per_problem.size > 1 else float("nan"),
                    "cov_gen": float(np.mean(a["hit_gen"])),
                    "width": float(np.mean(a["w"])),
                    "ratio": float(np.mean(a["w"]) / np.mean(a["w0"])),
                    "cov_free": float(np.mean(free[key[0]]))}
    return out, failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--unit", default="bound")
    ap.add_argument("--design-sd", default="product",
                    help="product, se, or a relative sd (diagnostic; module docstring)")
    ap.add_argument("--prior", default="product",
                    help="product, gamma, scaled, bound, or name:a,b,a0,b0 (module docstring)")
    ap.add_argument("--d", default="5,10")
    ap.add_argument("--n", default="100,500,2000")
    ap.add_argument("--eps", default="0.5,1,2")
    ap.add_argument("--k", default="1,10")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    units = args.unit.split(",")
    set_design_sd(args.design_sd)
    set_prior(args.prior)
    t0 = time.time()
    head = "| d | n | eps | K |"
    for u in units:
        head += (f" {u}: noise-aware, population clipped beta (sample LS; gen. beta) |"
                 " width (x noise-free) | plug-in (population; sample LS) | noise-free posterior |")
    print(head + " refused |")
    print("|" + "---|" * (4 + 4 * len(units) + 1))
    grid = itertools.product(*(map(float if a == "eps" else int, getattr(args, a).split(","))
                               for a in ("d", "n", "eps", "k")))
    for d, n, eps, k in grid:
        res, failed = run_cell(d, n, eps, k, args.reps, units, seed=args.seed)
        line = f"| {d} | {n} | {eps:g} | {k} |"
        for u in units:
            a, p = res[(u, "aware")], res[(u, "plugin")]
            line += (f" {a['cov_pop']:.3f} +- {a['cov_pop_se']:.3f} ({a['cov']:.3f}; "
                     f"{a['cov_gen']:.3f}) | {a['width']:.2f} "
                     f"(x{a['ratio']:.2f}) | {p['cov_pop']:.3f} ({p['cov']:.3f}) | "
                     f"{a['cov_free']:.3f} |")
        print(line + f" {failed} |", flush=True)
    print(f"{args.reps} problems per cell (+- a Monte Carlo standard error over problems); "
          f"{time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
