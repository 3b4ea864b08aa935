"""``dpfed choose-bounds``: clipping thresholds for a round, from public numbers only.

Runs dpfed.bounds.choose_bounds (Nieminen 2017 section 3.4; method.md section 4) on synthetic
data of the same n, d and epsilon, and scales the chosen multipliers by public sigmas. Costs no
privacy: nothing private is read.
"""

from __future__ import annotations

import argparse
import json
import sys

from dpfed import exitcodes

EPILOG = """\
examples:
  dpfed choose-bounds --n 250 --d 10 --epsilon 2
      omega_x, omega_y and the score grid's best cell; add public sigmas to get the bounds:
  dpfed choose-bounds --n 250 --d 10 --epsilon 2 --sigma-x 0.316 --sigma-y 1.55 --json
      {"omega_x": ..., "omega_y": ..., "x_bound": ..., "y_bound": ..., ...}

n is the size of the SMALLEST site's data (public under bounded DP). sigma_x defaults to
1/sqrt(d), exact for row-normalised features; sigma_y must come from public data.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "choose-bounds", help="choose clipping thresholds on synthetic data (no privacy cost)",
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, required=True, help="rows at the (smallest) site")
    p.add_argument("--d", type=int, required=True, help="number of features")
    p.add_argument("--epsilon", type=float, required=True, help="epsilon each site spends")
    p.add_argument("--budget-split", default="0.35,0.60,0.05",
                   help="Sxx,Sxy,Syy shares of epsilon (default: 0.35,0.60,0.05)")
    p.add_argument("--sigma-x", type=float, help="public scale of the pre-processed features "
                                                 "(default: 1/sqrt(d))")
    p.add_argument("--sigma-y", type=float, help="public scale of the centred target")
    p.add_argument("--datasets", type=int, default=20, help="auxiliary data sets (default: 20)")
    p.add_argument("--noise-draws", type=int, default=20, help="noise draws each (default: 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default: 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from dpfed.bounds import choose_bounds, row_normalised_sigma_x

    try:
        split = tuple(float(v) for v in args.budget_split.split(","))
        choice = choose_bounds(args.n, args.d, args.epsilon, budget_split=split,
                               n_datasets=args.datasets, n_noise=args.noise_draws, seed=args.seed)
        sigma_x = args.sigma_x if args.sigma_x is not None else row_normalised_sigma_x(args.d)
        bounds = choice.bounds(sigma_x, args.sigma_y) if args.sigma_y is not None else None
    except ValueError as exc:
        print(f"dpfed choose-bounds: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    out = {"n": args.n, "d": args.d, "epsilon": args.epsilon, "budget_split": list(split),
           "omega_x": choice.omega_x, "omega_y": choice.omega_y,
           "best_spearman": choice.best_score, "sigma_x": sigma_x, "sigma_y": args.sigma_y,
           "x_bound": bounds[0] if bounds else None, "y_bound": bounds[1] if bounds else None}
    if args.json:
        print(json.dumps(out))
        return exitcodes.OK
    print(f"omega_x = {choice.omega_x:g}, omega_y = {choice.omega_y:g} "
          f"(mean synthetic Spearman {choice.best_score:.3f}; n={args.n}, d={args.d}, "
          f"eps={args.epsilon:g})")
    if bounds:
        print(f"x_bound = {bounds[0]:.4g} (sigma_x {sigma_x:.4g}), "
              f"y_bound = {bounds[1]:.4g} (sigma_y {args.sigma_y:.4g})")
    else:
        print(f"x_bound = omega_x x sigma_x = {choice.omega_x * sigma_x:.4g} with sigma_x = "
              f"{sigma_x:.4g}; y_bound = omega_y x sigma_y (give --sigma-y from public data)")
    return exitcodes.OK
