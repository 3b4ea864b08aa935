"""Choices of the noise-aware fit made on auxiliary data, never on test rows (issue 9).

Populations are drawn by ``dpfed.auxiliary.AuxiliarySource`` from the 10 public lines of
repeats of GDSC drugs *outside* the first 60 eligible ones (the set the GDSC tables of
docs/evaluation.md use); predictions are scored on held-out rows of the same population. The
release is simulated with the mechanism's scales (``dpfed.sensitivity.noise_calibration``,
row-norm bound R = 1, Bx = 1, i.e. no coordinate clipping of a unit row; numpy Laplace noise:
a synthetic study of the fit, never a release).

    python benchmarks/aux_fit_study.py --study omega_y [--relation replace_one]
    python benchmarks/aux_fit_study.py --study design_sd [--relation add_remove]
    python benchmarks/aux_fit_study.py --study n_share --relation add_remove

``omega_y``: the noise-aware posterior mean and the noise-matched ridge (c = 4) for
B_y = omega_y sigma_y, omega_y in 0.2 .. 2 (why ``dpfed.bounds.TABLE_OMEGAS_Y`` starts at 0.7).
``design_sd``: the posterior mean with ``posterior.noise_aware.DESIGN_PRIOR_RELATIVE_SD`` in
{0.05, 0.1, 0.2, 0.3}, fitted to the *same* releases (paired), B_y = sigma_y, Sxx share 0.2.
``n_share`` (add/remove only): the n share of the budget in {0.01, 0.02, 0.05, 0.1} (Sxx 0.2,
Syy 0.03, Sxy the rest), each its own release, B_y = sigma_y.
Prints mean Spearman per cell and the paired differences with their standard errors.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from posterior import ConvergenceError, fit_posterior  # noqa: E402
from posterior import noise_aware as na  # noqa: E402
from dpfed.auxiliary import AuxiliarySource  # noqa: E402
from dpfed.metrics import LinearTestRanks  # noqa: E402
from dpfed.noise import NoiseDescription  # noqa: E402
from dpfed.sensitivity import noise_calibration  # noqa: E402
from dpfed.statistics import Statistics, clipped_exact_statistics  # noqa: E402
from dpfed_apps.evaluation.protocol import (ProtocolConfig, eligible_drugs,  # noqa: E402
                                            load_problem, prepare_repeat)

CELLS = [(700, 1, 2.0), (700, 1, 1.0), (300, 1, 1.0), (300, 3, 1.0), (700, 10, 1.0),
         (300, 10, 2.0)]


def simulated_release(rng, x, y, bx, by, k, eps, split, relation) -> Statistics:
    """Sum of K site releases (rows split in K blocks): clip, row-norm ball R = 1, Laplace
    noise of the mechanism's scales per site, with its noise description."""
    cal = noise_calibration(x.shape[1], eps, bx, by, split, neighbouring=relation,
                            x_norm_bound=1.0)
    d = x.shape[1]
    z = np.clip(x, -bx, bx)
    z = z * np.minimum(1.0, 1.0 / np.linalg.norm(z, axis=1))[:, None]
    yc = np.clip(y, -by, by)
    iu = np.triu_indices(d)
    e = np.zeros((d, d))
    e[iu] = rng.laplace(size=(k, iu[0].size)).sum(axis=0) * cal.xtx_scale
    e = e + np.triu(e, 1).T
    n = len(y)
    if cal.n_scale is not None:
        n = max(0, int(round(n + float(np.sum(np.round(rng.laplace(size=k) * cal.n_scale))))))
    noise = NoiseDescription.single("laplace", xtx=cal.xtx_scale, xty=cal.xty_scale,
                                    yty=cal.yty_scale, n=cal.n_scale, draws=k)
    return Statistics(z.T @ z + e, z.T @ yc + rng.laplace(size=(k, d)).sum(axis=0) *
                      cal.xty_scale, float(yc @ yc + rng.laplace(size=k).sum() * cal.yty_scale),
                      n, noise)


def ridge(stats: Statistics, c: float, k: int, xtx_scale: float) -> np.ndarray:
    w, v = np.linalg.eigh(stats.xtx)
    return v @ ((v.T @ stats.xty) / (np.maximum(w, 0.0) + 1 + c * np.sqrt(2 * k) * xtx_scale))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", choices=("omega_y", "design_sd", "n_share"), required=True)
    ap.add_argument("--relation", default="replace_one", choices=("replace_one", "add_remove"))
    ap.add_argument("--drugs", type=int, default=24, help="drugs 100, 101, ... of the eligible list")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--populations", type=int, default=2)
    args = ap.parse_args(argv)
    cfg = ProtocolConfig(neighbouring=args.relation)
    rel = args.relation
    base_split = (0.2, 0.75, 0.05) if rel == "replace_one" else (0.2, 0.75, 0.03, 0.02)
    if args.study == "n_share" and rel != "add_remove":
        ap.error("--study n_share needs --relation add_remove (n is public under replace-one)")
    variants = {"omega_y": (0.2, 0.3, 0.5, 0.7, 1.0, 1.4, 2.0), "design_sd": (0.05, 0.1, 0.2, 0.3),
                "n_share": (0.01, 0.02, 0.05, 0.1)}[args.study]
    rows = []
    t0 = time.time()
    for drug in eligible_drugs()[100:100 + args.drugs]:
        problem = load_problem(drug, cfg)
        for rep in range(args.repeats):
            data = prepare_repeat(problem, cfg, drug, rep)
            src = AuxiliarySource(data.x_public_raw, data.y_public_raw, data.preprocessing,
                                  feature_names=cfg.features)
            _, sy = src.scales()
            rng = np.random.default_rng([drug, rep])
            for _ in range(args.populations):
                aux = src.sample(rng, max(n for n, _, _ in CELLS), 100)
                scorer = LinearTestRanks(aux.x_test, aux.y_test)
                for n, k, eps in CELLS:
                    row = {"cell": (n, k, eps)}
                    if args.study == "n_share":
                        by = sy
                        pub = clipped_exact_statistics(aux.x_public, aux.y_public, 1.0, by, 1.0)
                        for v in variants:
                            sp = (0.2, 0.77 - v, 0.03, v)
                            st = simulated_release(rng, aux.x[:n], aux.y[:n], 1.0, by, k, eps,
                                                   sp, rel) + pub
                            try:
                                p = fit_posterior(st, public=pub, x_bound=1.0, draws=500,
                                                  seed=1, method="laplace")
                                row[v] = float(scorer.spearman_many(p.beta_mean[None], constant=0.0)[0])
                            except ConvergenceError:
                                row[v] = np.nan
                    elif args.study == "design_sd":
                        by = sy
                        pub = clipped_exact_statistics(aux.x_public, aux.y_public, 1.0, by, 1.0)
                        st = simulated_release(rng, aux.x[:n], aux.y[:n], 1.0, by, k, eps,
                                               base_split, rel) + pub
                        old = na.DESIGN_PRIOR_RELATIVE_SD
                        for v in variants:
                            na.DESIGN_PRIOR_RELATIVE_SD = v
                            try:
                                p = fit_posterior(st, public=pub, x_bound=1.0, draws=500,
                                                  seed=1, method="laplace")
                                row[v] = float(scorer.spearman_many(p.beta_mean[None], constant=0.0)[0])
                            except ConvergenceError:
                                row[v] = np.nan
                        na.DESIGN_PRIOR_RELATIVE_SD = old
                    else:
                        for v in variants:
                            by = v * sy
                            pub = clipped_exact_statistics(aux.x_public, aux.y_public, 1.0, by,
                                                           1.0)
                            st = simulated_release(rng, aux.x[:n], aux.y[:n], 1.0, by, k, eps,
                                                   base_split, rel) + pub
                            cal = noise_calibration(10, eps, 1.0, by, base_split,
                                                    neighbouring=rel, x_norm_bound=1.0)
                            row[("ridge", v)] = float(scorer.spearman_many(
                                ridge(st, 4.0, k, cal.xtx_scale)[None], constant=0.0)[0])
                            try:
                                p = fit_posterior(st, public=pub, x_bound=1.0, draws=500,
                                                  seed=1, method="laplace")
                                row[v] = float(scorer.spearman_many(p.beta_mean[None], constant=0.0)[0])
                            except ConvergenceError:
                                row[v] = np.nan
                    rows.append(row)
        print(f"drug {drug}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"\n{args.study}, {rel}: {len(rows) // len(CELLS)} populations per cell "
          f"({time.time() - t0:.0f} s); mean held-out Spearman of the posterior mean")
    print("| n | K | eps | " + " | ".join(str(v) for v in variants) + " |")
    print("|---|---|---|" + "---|" * len(variants))
    for cell in CELLS:
        sel = [r for r in rows if r["cell"] == cell]
        vals = [np.nanmean([r[v] for r in sel]) for v in variants]
        print(f"| {cell[0]} | {cell[1]} | {cell[2]:g} | " + " | ".join(f"{m:.3f}" for m in vals)
              + " |")
    means = {v: np.nanmean([r[v] for r in rows]) for v in variants}
    print("all cells: " + ", ".join(f"{v}: {m:.4f}" for v, m in means.items()))
    if args.study == "omega_y":
        rmeans = {v: np.nanmean([r[("ridge", v)] for r in rows]) for v in variants}
        print("ridge (c = 4): " + ", ".join(f"{v}: {m:.4f}" for v, m in rmeans.items()))
    ref = {"design_sd": 0.3, "omega_y": 1.0, "n_share": 0.02}[args.study]
    for v in variants:
        if v == ref:
            continue
        diff = np.array([r[v] - r[ref] for r in rows])
        diff = diff[np.isfinite(diff)]
        print(f"paired {v} - {ref}: {diff.mean():+.4f} +- {diff.std(ddof=1) / np.sqrt(diff.size):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
