"""Bounds tuned on public-shaped auxiliary data vs today's, on the bundled GDSC data; and the
forecast of ``dpfed plan`` against the realised gain (issue 9 parts 3-5).

The protocol's splits (``dpfed_apps.evaluation.protocol``: 100 test lines, 10 public lines,
the private pool, nested private sets), K = 1, closed-form fits, numpy Laplace noise with the
mechanism's scales (a synthetic evaluation of a mechanism's utility; never a release). Per (drug,
repeat, n, eps, neighbouring relation), with the exact Sxx sensitivity:

- ``today``: omegas of today's ``choose_bounds(n, d, eps)`` (Gaussian auxiliary data, paper
  search), default split, the plain closed form (lambda = lambda0 = 1; PSD projection);
- ``gauss``: omegas and ridge c tuned on Gaussian auxiliary data with this mechanism and the
  noise-matched ridge, default split;
- ``public``: omegas, Sxx share and ridge c tuned on auxiliary data shaped like this repeat's
  10 public lines (``dpfed.auxiliary``), noise-matched ridge;
- ``public_only`` and ``nonprivate`` (unclipped, every private + public line) for reference.

Then, for add/remove and the ``public`` choice, ``dpfed_apps.forecast.forecast_round`` with the same
bounds, split and ridge (from the public rows only) against the realised gain over public-only.

    PYTHONPATH=$PWD python benchmarks/bounds_gdsc.py --drugs 20 --repeats 2 --out /tmp/bg.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

import numpy as np

from dpfed.auxiliary import AuxiliarySource
from dpfed.bounds import choose_bounds, default_split
from dpfed_apps.forecast import Mechanism, closed_form_fit, forecast_round, score_cell
from dpfed_apps.evaluation.protocol import (ProtocolConfig, eligible_drugs, load_problem,
                                            prepare_repeat, repeat_split)

OMEGAS = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8)
SHARES_CS = dict(ridge_cs=(0.0, 2.0, 8.0, 32.0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drugs", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--sizes", default="100,300,700")
    ap.add_argument("--epsilons", default="1,2")
    ap.add_argument("--relations", default="replace_one,add_remove")
    ap.add_argument("--noise", type=int, default=10, help="noise draws per cell")
    ap.add_argument("--aux-datasets", type=int, default=6)
    ap.add_argument("--aux-noise", type=int, default=6)
    ap.add_argument("--forecast-sizes", default="300,700")
    ap.add_argument("--forecast-datasets", type=int, default=12)
    ap.add_argument("--row-bootstrap", type=float, default=0.5,
                    help="AuxiliarySource row_bootstrap (share of rows copied from public rows)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    sizes = [int(v) for v in args.sizes.split(",")]
    epsilons = [float(v) for v in args.epsilons.split(",")]
    relations = args.relations.split(",")
    f_sizes = [int(v) for v in args.forecast_sizes.split(",") if v]
    cfg = ProtocolConfig(sizes=tuple(sizes), epsilons=tuple(epsilons), repeats=args.repeats)
    # Drugs whose pool reaches the largest n, spread over the eligible list (public rule).
    drugs_all = eligible_drugs(cfg.min_lines)
    t0 = time.time()
    cells = defaultdict(list)           # (variant, rel, eps, n) -> per (drug, repeat) means
    forecasts = []
    d = len(cfg.features)
    drugs = []
    for drug in drugs_all[::max(1, len(drugs_all) // (3 * args.drugs))]:
        if len(drugs) == args.drugs:
            break
        problem = load_problem(drug, cfg)
        if problem.n - cfg.n_test - cfg.n_candidates < max(sizes):
            continue
        drugs.append(drug)
        for rep in range(args.repeats):
            data = prepare_repeat(problem, cfg, drug, rep)
            split = repeat_split(problem.n, cfg, drug, rep)
            source = AuxiliarySource(problem.x[split.public], problem.y[split.public],
                                     data.preprocessing, feature_names=cfg.features,
                                     row_bootstrap=args.row_bootstrap)
            sx, sy = data.sigma_x, data.sigma_y
            rng = np.random.default_rng([drug, rep, 99])
            for rel in relations:
                base = default_split(rel)
                for eps in epsilons:
                    for n in sizes:
                        sites = [(data.x_pool[:n], data.y_pool[:n])]
                        today = choose_bounds(n, d, eps)
                        gauss = choose_bounds(n, d, eps, neighbouring=rel, xtx_sensitivity="exact",
                                              ridge="noise_matched", omegas=OMEGAS, **SHARES_CS)
                        pub = choose_bounds(n, d, eps, auxiliary=source, neighbouring=rel,
                                            xtx_sensitivity="exact", ridge="noise_matched",
                                            search_sxx_share=True, omegas=OMEGAS,
                                            n_datasets=args.aux_datasets, n_noise=args.aux_noise,
                                            seed=drug * 100 + rep, **SHARES_CS)
                        variants = {
                            "today": (today, base, 0.0),
                            "gauss": (gauss, gauss.budget_split, gauss.ridge_c),
                            "public": (pub, pub.budget_split, pub.ridge_c),
                        }
                        for name, (ch, sp, c) in variants.items():
                            bx, by = ch.omega_x * sx, ch.omega_y * sy
                            mech = Mechanism(eps, bx, by, tuple(sp), rel, "exact")
                            res = score_cell(rng, sites, data.x_public, data.y_public, data.x_test,
                                             data.y_test, mech, closed_form_fit(c), args.noise)
                            cells[(name, rel, eps, n)].append(float(np.nanmean(res["private_public"])))
                            if name == "public":
                                cells[("public_only", rel, eps, n)].append(res["public_only"])
                                cells[("nonprivate", rel, eps, n)].append(res["nonprivate"])
                                cells[("public:omega", rel, eps, n)].append(
                                    (ch.omega_x, ch.omega_y, sp[0], c))
                                if rel == "add_remove" and n in f_sizes:
                                    fc = forecast_round(
                                        x_public=problem.x[split.public], y_public=problem.y[split.public],
                                        feature_names=cfg.features, preprocessing=data.preprocessing,
                                        row_bootstrap=args.row_bootstrap,
                                        n_per_site=n, epsilons=[eps], bounds=(bx, by),
                                        neighbouring=rel, budget_split=sp, ridge_c=c,
                                        n_datasets=args.forecast_datasets, n_noise=5,
                                        seed=drug * 100 + rep + 7)["per_epsilon"][0]
                                    forecasts.append(dict(
                                        drug=drug, repeat=rep, eps=eps, n=n,
                                        realised=float(np.nanmean(res["private_public"]) - res["public_only"]),
                                        realised_pub=res["public_only"],
                                        realised_priv=float(np.nanmean(res["private_public"])),
                                        gain=fc["gain"], gain_expected=fc["gain_expected"],
                                        pub=fc["spearman_public_only"]["mean"],
                                        priv=fc["spearman_private_public"]["mean"]))
        print(f"{len(drugs)} drugs, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)

    out = {"drugs": drugs, "repeats": args.repeats, "wall_s": time.time() - t0, "table": [],
           "forecast": forecasts}
    print(f"\n{len(drugs)} drugs x {args.repeats} repeats, K = 1, closed form, exact Sxx "
          f"sensitivity; mean Spearman ({time.time() - t0:.0f} s)\n")
    print("| relation | eps | n | public-only | today | gauss+ridge | public-shaped | non-private | public: omega_x, omega_y, Sxx share, c (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rel in relations:
        for eps in epsilons:
            for n in sizes:
                row = {k: float(np.mean(cells[(k, rel, eps, n)]))
                       for k in ("public_only", "today", "gauss", "public", "nonprivate")}
                om = np.median(np.array(cells[("public:omega", rel, eps, n)]), axis=0)
                out["table"].append(dict(relation=rel, eps=eps, n=n, **row,
                                         public_choice_median=om.tolist()))
                print(f"| {rel} | {eps:g} | {n} | {row['public_only']:.3f} | {row['today']:.3f} | "
                      f"{row['gauss']:.3f} | {row['public']:.3f} | {row['nonprivate']:.3f} | "
                      f"{om[0]:.2g}, {om[1]:.2g}, {om[2]:.2g}, {om[3]:.3g} |")
    if forecasts:
        print("\nForecast (dpfed plan, public rows only) vs realised gain over public-only, add/remove, 'public' choice")
        print("| eps | n | forecast gain | realised gain (mean over drugs) | MAE per drug | in [q10,q90] single-round | in [q10,q90] expected |")
        print("|---|---|---|---|---|---|---|")
        by = defaultdict(list)
        for f in forecasts:
            by[(f["eps"], f["n"])].append(f)
        summary = []
        for (eps, n), fs in sorted(by.items()):
            per_drug = defaultdict(list)
            for f in fs:
                per_drug[f["drug"]].append(f)
            fc_m, re_m, in1, in2 = [], [], [], []
            for drug, ff in per_drug.items():
                fm = np.mean([f["gain"]["mean"] for f in ff])
                rm = np.mean([f["realised"] for f in ff])
                lo1 = np.mean([f["gain"]["q10"] for f in ff])
                hi1 = np.mean([f["gain"]["q90"] for f in ff])
                lo2 = np.mean([f["gain_expected"]["q10"] for f in ff])
                hi2 = np.mean([f["gain_expected"]["q90"] for f in ff])
                fc_m.append(fm)
                re_m.append(rm)
                in1.append(lo1 <= rm <= hi1)
                in2.append(lo2 <= rm <= hi2)
            s = dict(eps=eps, n=n, forecast=float(np.mean(fc_m)), realised=float(np.mean(re_m)),
                     mae=float(np.mean(np.abs(np.array(fc_m) - np.array(re_m)))),
                     cover_single=float(np.mean(in1)), cover_expected=float(np.mean(in2)),
                     drugs=len(fc_m))
            summary.append(s)
            print(f"| {eps:g} | {n} | {s['forecast']:.3f} | {s['realised']:.3f} | {s['mae']:.3f} | "
                  f"{s['cover_single']:.2f} | {s['cover_expected']:.2f} |")
        out["forecast_summary"] = summary
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
