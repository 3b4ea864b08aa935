"""``dpfed choose-bounds``: clipping thresholds for a round, from public numbers only.

Runs dpfed.bounds.choose_bounds (Nieminen 2017 section 3.4; method.md section 4) on synthetic
data of the same n, d and epsilon, and scales the chosen multipliers by public sigmas. Costs no
privacy: nothing private is read.
"""

from __future__ import annotations

import sys

from dpfed import exitcodes, jsonsafe

EPILOG = """\
examples:
  dpfed choose-bounds --n 250 --d 10 --epsilon 2
      omega_x, omega_y and the score grid's best cell; add public sigmas to get the bounds:
  dpfed choose-bounds --n 250 --d 10 --epsilon 2 --sigma-x 0.316 --sigma-y 1.55 --json
      {"omega_x": ..., "omega_y": ..., "x_bound": ..., "y_bound": ..., ...}
  dpfed choose-bounds --n 700 --d 10 --epsilon 2 --public public.csv --target Drug_1047_IC50 \
      --neighbouring add_remove --xtx-sensitivity exact --noise-matched-ridge --search-sxx-share
      tuned on auxiliary data shaped like the public rows; sigmas from them

n is the size of the SMALLEST site's data (public under bounded DP). sigma_x defaults to
1/sqrt(d), exact for row-normalised features; sigma_y must come from public data.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "choose-bounds", help="choose clipping thresholds on synthetic data (no privacy cost)",
        description=__doc__, epilog=EPILOG)
    p.add_argument("--n", type=int, required=True, help="rows at the (smallest) site")
    p.add_argument("--d", type=int, required=True, help="number of features")
    p.add_argument("--epsilon", type=float, required=True, help="epsilon each site spends")
    p.add_argument("--budget-split", default=None,
                   help="Sxx,Sxy,Syy[,n] shares of epsilon (default: 0.35,0.60,0.05; "
                        "add/remove 0.35,0.60,0.03,0.02)")
    p.add_argument("--sigma-x", type=float, help="public scale of the pre-processed features "
                                                 "(default: 1/sqrt(d))")
    p.add_argument("--sigma-y", type=float, help="public scale of the centred target")
    p.add_argument("--datasets", type=int, default=20, help="auxiliary data sets (default: 20)")
    p.add_argument("--noise-draws", type=int, default=20, help="noise draws each (default: 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default: 0)")
    p.add_argument("--public", help="CSV of public rows (id, features, target): tune on auxiliary "
                                    "data shaped like them (dpfed.auxiliary); sigmas from them")
    p.add_argument("--target", help="target column of --public")
    p.add_argument("--features", help="comma-separated feature columns of --public (default: all)")
    p.add_argument("--neighbouring", choices=["replace_one", "add_remove"], default="replace_one")
    p.add_argument("--xtx-sensitivity", choices=["paper", "exact"], default="paper")
    p.add_argument("--noise-matched-ridge", action="store_true",
                   help="tune for the closed form with ridge 1 + c sd(Sxx noise), c chosen too")
    p.add_argument("--search-sxx-share", action="store_true",
                   help="also search the Sxx share of the split (0.3..0.8)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from dpfed.bounds import choose_bounds, row_normalised_sigma_x

    from dpfed.bounds import default_split

    try:
        split = (tuple(float(v) for v in args.budget_split.split(",")) if args.budget_split
                 else default_split(args.neighbouring))
        source, sigma_y = None, args.sigma_y
        sigma_x = args.sigma_x
        if args.public:
            from dpfed.auxiliary import AuxiliarySource
            from dpfed.preprocess import Preprocessing
            from dpfed_apps.simulation.problem import csv_problem

            if not args.target:
                raise ValueError("--public needs --target")
            names = [f for f in args.features.split(",") if f] if args.features else None
            prob = csv_problem(args.public, target=args.target, feature_names=names)
            pre = Preprocessing.from_public_data(prob.x, prob.y, scale_columns=True)
            source = AuxiliarySource(prob.x, prob.y, pre, feature_names=prob.feature_names)
            psx, psy = source.scales()
            sigma_x = psx if sigma_x is None else sigma_x
            sigma_y = psy if sigma_y is None else sigma_y
        choice = choose_bounds(args.n, args.d, args.epsilon, budget_split=split,
                               n_datasets=args.datasets, n_noise=args.noise_draws, seed=args.seed,
                               auxiliary=source, neighbouring=args.neighbouring,
                               xtx_sensitivity=args.xtx_sensitivity,
                               ridge="noise_matched" if args.noise_matched_ridge else "fixed",
                               search_sxx_share=args.search_sxx_share)
        split = choice.budget_split
        sigma_x = sigma_x if sigma_x is not None else row_normalised_sigma_x(args.d)
        bounds = choice.bounds(sigma_x, sigma_y) if sigma_y is not None else None
    except (ValueError, KeyError, OSError) as exc:
        print(f"dpfed choose-bounds: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    out = {"n": args.n, "d": args.d, "epsilon": args.epsilon, "budget_split": list(split),
           "omega_x": choice.omega_x, "omega_y": choice.omega_y,
           "best_spearman": choice.best_score, "sigma_x": sigma_x, "sigma_y": sigma_y,
           "auxiliary": choice.auxiliary, "neighbouring": choice.neighbouring,
           "ridge": choice.ridge, "ridge_c": choice.ridge_c,
           "x_bound": bounds[0] if bounds else None, "y_bound": bounds[1] if bounds else None}
    if args.json:
        print(jsonsafe.dumps(out))
        return exitcodes.OK
    print(f"omega_x = {choice.omega_x:g}, omega_y = {choice.omega_y:g} "
          f"(mean synthetic Spearman {choice.best_score:.3f}; n={args.n}, d={args.d}, "
          f"eps={args.epsilon:g})")
    if bounds:
        print(f"x_bound = {bounds[0]:.4g} (sigma_x {sigma_x:.4g}), "
              f"y_bound = {bounds[1]:.4g} (sigma_y {sigma_y:.4g})")
    else:
        print(f"x_bound = omega_x x sigma_x = {choice.omega_x * sigma_x:.4g} with sigma_x = "
              f"{sigma_x:.4g}; y_bound = omega_y x sigma_y (give --sigma-y from public data)")
    return exitcodes.OK
