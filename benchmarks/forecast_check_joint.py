"""Does `dpfed plan`'s forecast band hold the realised gain of a JOINT Gaussian round on GDSC?
(issue 23 part 3; issue 21 item 3's criterion: the 10-90 % band holds the realised gain in
70-90 % of rounds.)

    nice -n 10 python benchmarks/forecast_check_joint.py [--repeats 3] [--drugs 50] [--n 700]
        [--eps 10] [--delta 1e-6] [--variants closed_form/default,closed_form/default@100]
        [--prior-mean] [--json FILE]

Per repeat (``benchmarks/joint_gdsc_study.py``'s split: one permutation of the 988 GDSC lines,
10 public lines shared by every drug, 278 held-out test lines, the private set the pool's
first n lines) ONE joint Gaussian release of all 262 eligible drugs at a per-patient
(eps, delta), K = 1, as the product makes it: ``dpfed.joint_noise.joint_calibration`` with
the product's default split (``JOINT_DEFAULT_SPLIT``), x_bound 1 with unit rows, y_bound 0.5
public sd (the joint round's defaults, coordinator.joint_spec), the site's OpenDP release
(``joint_gdsc_study.release_joint``), each target's view as the aggregator builds it
(``joint_gdsc_study.target_view``), ``fit_posterior`` without the NUTS fallback (as
aggregator.joint_fit). For ``--drugs`` of the drugs (every k-th with >= 2 public responses) the
realised gain = Spearman(private + public fit) - Spearman(``fit_posterior(public_j,
y_unit=By)``, the reference a round reports) on the drug's test lines.

Beside it, from public inputs only (what ``dpfed plan --config round.toml --target DRUG``
computes): ``forecast_round`` with mechanism gaussian, targets = 262, the response rate = the
public lines' fill rate over the 262 drugs, the same bounds and split, the drug's public lines
(standardised by their public mean and sd, as the coordinator's TargetSpec), the round's
pre-processing. Variants ``fit/population[@N]`` as in ``benchmarks/forecast_check.py``
(``@N``: the populations scored on N test rows, 100 = ``dpfed plan``'s default; without it on
as many as the drug's test lines). Prints per variant the share of rounds whose realised gain
lies in the one-round [q10, q90] with its Clopper-Pearson 95 % interval, misses below / above,
mean forecast and realised gains and the median band width; ``--json`` keeps every round.
The drugs of one repeat share one release (their Sxx noise): rounds are not independent
within a repeat, so the interval is somewhat optimistic. ``--prior-mean``: the realised fit
centres every target at the across-target mean m0 as ``aggregator.joint_fit`` does (the
forecast does not model it). docs/evaluation.md "Forecasts for joint rounds" has the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def realised(study, cell, n, drugs, cal, y_bound, seed, prior_mean=False):
    """{drug index: (realised gain, realised public-only Spearman)} of one joint release.
    ``prior_mean``: every target fitted around the across-target mean m0 as
    ``aggregator.joint_fit`` fits it from ``joint_prior.MIN_TARGETS`` targets on
    (``joint_prior.pooled_mean`` of every target's view + public, ``shift``, draws shifted
    back); the reference stays ``fit_posterior(public_j, y_unit=By)``, as the round's."""
    from dpfed.joint_statistics import public_targets
    from posterior import ConvergenceError, PosteriorError, fit_posterior

    x, z = cell.x, cell.z
    priv = cell.pool[:n]
    xq, zq = x[cell.public], z[cell.public]
    xt, zt = x[cell.test], z[cell.test]
    pubt = public_targets(xq, zq, cal.x_bound, y_bound, cal.x_norm_bound)
    total = study.release_joint(x[priv], z[priv], cal)
    m0 = None
    if prior_mean:
        from aggregator.joint_prior import MIN_TARGETS, pooled_mean, shift

        inputs = [study.target_view(total, j, pubt[j]) for j in range(z.shape[1])]
        if len(inputs) >= MIN_TARGETS:
            m0 = pooled_mean(total, inputs, x_bound=cal.x_bound)
    out = {}
    for j in drugs:
        have = np.isfinite(zt[:, j])
        stats, public = study.target_view(total, j, pubt[j])
        if m0 is not None:
            stats = shift(stats, m0)
            public = None if public is None else shift(public, m0)
        try:
            post = fit_posterior(stats, public=public, x_bound=cal.x_bound, y_unit=y_bound,
                                 draws=1000, seed=seed + j, fallback=None)
            beta = np.asarray(post.beta_mean) + (0.0 if m0 is None else m0)
        except (ConvergenceError, PosteriorError, ValueError, ArithmeticError):
            beta = None          # refused: left out (counted)
        pub = fit_posterior(pubt[j], y_unit=y_bound, draws=1000, seed=seed + j)
        sp_pub = study.spearman0(xt[have] @ np.asarray(pub.beta_mean), zt[have, j])
        gain = (study.spearman0(xt[have] @ beta, zt[have, j]) - sp_pub) if beta is not None \
            else math.nan
        out[j] = (gain, sp_pub, int(have.sum()))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--first-repeat", type=int, default=0)
    ap.add_argument("--drugs", type=int, default=50)
    ap.add_argument("--n", type=int, default=700)
    ap.add_argument("--eps", type=float, default=10.0)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--y-bound", type=float, default=None,
                    help="default: coordinator.joint_spec.DEFAULT_Y_BOUND (0.5)")
    ap.add_argument("--variants", default="closed_form/default,closed_form/default@100")
    ap.add_argument("--n-datasets", type=int, default=20)
    ap.add_argument("--n-noise", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--prior-mean", action="store_true",
                    help="realise the round as aggregator.joint_fit does since 5707c62: every "
                         "target around the across-target prior mean m0 (the forecast does not "
                         "model m0)")
    args = ap.parse_args(argv)

    import joint_gdsc_study as study
    from forecast_check import coverage_interval, populations

    from coordinator.joint_spec import DEFAULT_X_BOUND_NORMALISED, DEFAULT_Y_BOUND
    from dpfed.joint_noise import JOINT_DEFAULT_SPLIT, joint_calibration
    from dpfed_apps.forecast import forecast_round, posterior_fit

    y_bound = DEFAULT_Y_BOUND if args.y_bound is None else args.y_bound
    t0 = time.time()
    panel = study.load_panel()
    m, d = panel.m, len(panel.feature_names)
    cal = joint_calibration(d, m, mechanism="gaussian", epsilon=args.eps, delta=args.delta,
                            x_bound=DEFAULT_X_BOUND_NORMALISED, y_bound=y_bound,
                            budget_split=JOINT_DEFAULT_SPLIT, x_norm_bound=1.0)
    variants = args.variants.split(",")
    rows = []
    for rep in range(args.first_repeat, args.first_repeat + args.repeats):
        cell = study.repeat_cell(panel, rep, args.seed, args.n)
        zq = cell.z[cell.public]
        n_pub = np.sum(np.isfinite(zq), axis=0)
        eligible = [j for j in range(m) if n_pub[j] >= 2]
        step = max(1, len(eligible) // args.drugs)
        drugs = eligible[::step][:args.drugs]
        fill = float(np.isfinite(zq).mean())
        real = realised(study, cell, args.n, drugs, cal, y_bound, 1000 * rep,
                        prior_mean=args.prior_mean)
        prep = cell.meta["preprocessing"]
        x_pub_raw = panel.x_raw[cell.public]
        for j in drugs:
            have = np.isfinite(zq[:, j])
            gain, sp_pub, n_test = real[j]
            row = {"repeat": rep, "drug": int(panel.drugs[j]), "realised": gain,
                   "public_only": sp_pub, "n_public": int(have.sum()), "fill_rate": fill}
            seed = int(np.random.SeedSequence([args.seed, rep, j]).generate_state(1)[0])
            for name in variants:
                fit_name, pop = name.split("/")
                pop, _, nt = pop.partition("@")
                t1 = time.perf_counter()
                fc = forecast_round(
                    x_public=x_pub_raw[have], y_public=zq[have, j], preprocessing=prep,
                    feature_names=list(panel.feature_names), n_per_site=args.n,
                    epsilons=[args.eps], bounds=(cal.x_bound, y_bound),
                    budget_split=JOINT_DEFAULT_SPLIT, mechanism="gaussian", delta=args.delta,
                    targets=m, response_rate=fill, n_datasets=args.n_datasets,
                    n_noise=args.n_noise, seed=seed, n_test=int(nt) if nt else n_test,
                    fit=None if fit_name == "closed_form" else posterior_fit(
                        on_refusal="skip"),
                    population=populations()[pop])
                e = fc["per_epsilon"][0]
                g = e["gain"]
                row[name] = (g["mean"], g["q10"], g["q90"])
                row[name + ":public_only"] = e["spearman_public_only"]["mean"]
                row[name + ":refused"] = g.get("refused", 0)
                row[name + ":s"] = time.perf_counter() - t1
            rows.append(row)
            print("  ", {k: (np.round(v, 3).tolist() if isinstance(v, (float, tuple)) else v)
                         for k, v in row.items()}, file=sys.stderr, flush=True)
    ok = [r for r in rows if np.isfinite(r["realised"])]
    lines = [f"| variant | rounds | forecast gain (mean) | realised gain (mean) | mean abs. error "
             f"| realised in [q10, q90] (95 % CI) | below q10 / above q90 | median band width "
             f"| s per forecast |", "|---|---|---|---|---|---|---|---|---|"]
    for v in variants:
        inside = [r[v][1] <= r["realised"] <= r[v][2] for r in ok]
        lo, hi = coverage_interval(int(sum(inside)), len(inside))
        lines.append(
            f"| {v} | {len(ok)} | {np.mean([r[v][0] for r in ok]):+.3f} | "
            f"{np.mean([r['realised'] for r in ok]):+.3f} | "
            f"{np.mean([abs(r[v][0] - r['realised']) for r in ok]):.3f} | "
            f"{np.mean(inside):.2f} ({lo:.2f}-{hi:.2f}) | "
            f"{sum(r['realised'] < r[v][1] for r in ok)} / "
            f"{sum(r['realised'] > r[v][2] for r in ok)} | "
            f"{np.median([r[v][2] - r[v][1] for r in ok]):.3f} | "
            f"{np.median([r[v + ':s'] for r in ok]):.2f} |")
    print("\n".join(lines))
    print(("realised with the across-target prior mean m0; " if args.prior_mean else "") +
          f"GDSC joint Gaussian ({args.eps:g}, {args.delta:g}), {m} drugs in the release, n = "
          f"{args.n}, repeats {args.first_repeat}..{args.first_repeat + args.repeats - 1}, "
          f"{len(rows)} rounds ({len(rows) - len(ok)} refused realised fits left out); "
          f"{args.n_datasets} populations x {args.n_noise} noise draws; "
          f"{time.time() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
