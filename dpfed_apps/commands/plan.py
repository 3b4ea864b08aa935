"""``dpfed plan``: forecast what a round would buy, from public inputs only.

Simulates the round on auxiliary data shaped like the public rows (dpfed.auxiliary): each
site's release with the mechanism's clipping and noise, fitted with the closed form and the
noise-matched ridge, scored on held-out auxiliary rows. Per epsilon it prints the expected
held-out Spearman of the public-only model, of private + public and of a non-private fit, the
expected gain over public-only with its 10/90 % quantiles, and the epsilon each site spends.
Costs no privacy: only public numbers and the public rows are read (method.md section 11).
"""

from __future__ import annotations

import sys

from dpfed import exitcodes, jsonsafe

EPILOG = """\
examples:
  dpfed plan --public public.csv --target Drug_1047_IC50 --n 300,300,100 --epsilon 1,2
      three sites (n 300, 300, 100), bounds chosen on auxiliary data, add/remove DP
  dpfed plan --config round.toml --n 700 --epsilon 0.5,1,2 --json
      target, features, public rows (and bounds, unless --bounds choose) from round.toml
  dpfed plan --public public.csv --target y --n 500 --sites 4 --bounds 0.3,1.5 --neighbouring replace_one

--json prints one object: d, n_public, n_per_site, sites, neighbouring, xtx_sensitivity, fit,
n_datasets, n_noise, n_test, seed, auxiliary, notes, and per_epsilon: a list of {epsilon,
epsilon_per_site, epsilon_replace_one_equivalent, bounds {x_bound, y_bound, omega_x, omega_y,
sigma_x, sigma_y, chosen}, budget_split, ridge_c, noise_scales, spearman_public_only,
spearman_private_public, spearman_nonprivate (each {mean, q10, q90}), gain {mean, q10, q90, sd,
se_mean, p_positive}, gain_expected {mean, q10, q90}}. gain's quantiles are over auxiliary
populations x noise draws (one round); gain_expected's over populations (noise averaged).

The public CSV needs a header: an id column (default: the first), the target and the features
(default: every other column). Exit codes: 0 ok, 2 bad arguments or inputs.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plan", help="forecast a round's gain over public-only data (no privacy cost)",
        description=__doc__, epilog=EPILOG)
    p.add_argument("--config", help="round.toml: target, features, public.path, bounds, split")
    p.add_argument("--public", help="CSV of the public rows (id, features, target)")
    p.add_argument("--target", help="target column of the public CSV")
    p.add_argument("--features", help="comma-separated feature columns (default: all others)")
    p.add_argument("--id-column", help="id column of the public CSV (default: the first)")
    p.add_argument("--n", required=True, help="rows per site, comma-separated (one per site)")
    p.add_argument("--sites", type=int, default=None,
                   help="K sites of --n rows each (when --n is one number)")
    p.add_argument("--epsilon", default="1,2", help="epsilons per site to compare (default: 1,2)")
    p.add_argument("--bounds", default=None,
                   help="'choose' (default without --config) or x_bound,y_bound")
    p.add_argument("--neighbouring", choices=["add_remove", "replace_one"], default="add_remove")
    p.add_argument("--xtx-sensitivity", choices=["exact", "paper"], default="exact")
    p.add_argument("--aggregation", choices=["independent", "secure"], default=None,
                   help="how the sites' releases are summed: independent (one noise draw per "
                        "site) or secure (one draw on the sum; docs/secure_aggregation.md). "
                        "Default: round.toml's, else independent")
    p.add_argument("--budget-split", default=None,
                   help="Sxx,Sxy,Syy[,n] shares (default: 0.35,0.60,0.03,0.02 add/remove, "
                        "0.35,0.60,0.05 replace-one)")
    p.add_argument("--fit", choices=["closed_form", "posterior"], default="closed_form",
                   help="the forecast's fit: closed_form (default; the closed form with the "
                        "noise-matched ridge, ~1 s) or posterior (the production posterior "
                        "with a round's inputs: public statistics, x_bound, y_unit = By; "
                        "about 0.05-0.3 s per fit, datasets x noise-draws fits per epsilon)")
    p.add_argument("--population", choices=["default", "public"], default="default",
                   help="auxiliary populations: default (R^2 ~ Beta(2, 20), public-shaped "
                        "columns) or public (R^2, beta and rows from the public rows' own "
                        "fit; docs/evaluation.md issue 21 'Forecasts')")
    p.add_argument("--datasets", type=int, default=20, help="auxiliary populations (default 20)")
    p.add_argument("--noise-draws", type=int, default=10, help="noise draws each (default 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _floats(text: str) -> list[float]:
    return [float(v) for v in str(text).split(",") if v.strip()]


def _inputs(args):
    """(x_public, y_public, feature_names, bounds, split) from --config and/or --public."""
    from pathlib import Path

    from dpfed_apps.simulation.problem import csv_problem

    target, features, public, bounds, split = args.target, None, args.public, None, None
    if args.features:
        features = [f.strip() for f in args.features.split(",") if f.strip()]
    if args.config:
        import tomllib

        path = Path(args.config)
        config = tomllib.loads(path.read_text())
        target = target or config.get("target")
        features = features or list(config.get("features", [])) or None
        pub = config.get("public", {}).get("path")
        if public is None and pub:
            public = str(path.parent / pub)
        if "x_bound" in config and "y_bound" in config:
            bounds = (float(config["x_bound"]), float(config["y_bound"]))
        if config.get("budget_split"):
            split = tuple(float(v) for v in config["budget_split"])
    if public is None:
        raise ValueError("give the public rows: --public FILE or a --config with public.path")
    if not target:
        raise ValueError("give the target column (--target)")
    problem = csv_problem(public, id_column=args.id_column, target=target, feature_names=features)
    if problem.n < 2:
        raise ValueError(f"{public}: need at least 2 public rows with a target")
    return problem.x, problem.y, problem.feature_names, bounds, split


def _aggregation(args) -> str:
    """--aggregation, else round.toml's ``aggregation`` (--config), else independent."""
    if args.aggregation:
        return args.aggregation
    if args.config:
        import tomllib
        from pathlib import Path

        mode = tomllib.loads(Path(args.config).read_text()).get("aggregation", "independent")
        if mode not in ("independent", "secure"):
            raise ValueError("round.toml: aggregation must be independent or secure")
        return str(mode)
    return "independent"


def run(args) -> int:
    from dpfed_apps.forecast import PUBLIC_FIT_POPULATION, forecast_round, posterior_fit

    try:
        x_pub, y_pub, names, cfg_bounds, cfg_split = _inputs(args)
        sizes = [int(v) for v in args.n.split(",") if v.strip()]
        if args.sites is not None:
            if len(sizes) != 1 or args.sites < 1:
                raise ValueError("--sites K needs a single --n and K >= 1")
            sizes = sizes * args.sites
        if args.bounds is None:
            bounds = cfg_bounds if cfg_bounds is not None else "choose"
        elif args.bounds == "choose":
            bounds = "choose"
        else:
            b = _floats(args.bounds)
            if len(b) != 2 or min(b) <= 0:
                raise ValueError("--bounds must be 'choose' or x_bound,y_bound (both > 0)")
            bounds = tuple(b)
        split = tuple(_floats(args.budget_split)) if args.budget_split else cfg_split
        if split is not None and len(split) == 3 and args.neighbouring == "add_remove":
            split = None  # a replace-one split from round.toml; use the add/remove default
        result = forecast_round(x_public=x_pub, y_public=y_pub, feature_names=names,
                                n_per_site=sizes if len(sizes) > 1 else sizes[0],
                                epsilons=_floats(args.epsilon), bounds=bounds,
                                neighbouring=args.neighbouring,
                                xtx_sensitivity=args.xtx_sensitivity, budget_split=split,
                                n_datasets=args.datasets, n_noise=args.noise_draws,
                                seed=args.seed, aggregation=_aggregation(args),
                                fit=posterior_fit() if getattr(args, "fit", None) == "posterior"
                                else None,
                                population=PUBLIC_FIT_POPULATION
                                if getattr(args, "population", None) == "public" else None)
    except (ValueError, KeyError, OSError) as exc:
        print(f"dpfed plan: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    if args.json:
        print(jsonsafe.dumps(result))
        return exitcodes.OK
    print(format_plan(result))
    return exitcodes.OK


def format_plan(result: dict) -> str:
    sizes = result["n_per_site"]
    lines = [f"Forecast from public inputs only: {result['sites']} site(s), n per site "
             f"{', '.join(map(str, sizes))}, d = {result['d']}, {result['n_public']} public rows, "
             f"{result['neighbouring']} DP, {result.get('aggregation', 'independent')} "
             f"aggregation; {result['n_datasets']} auxiliary populations x "
             f"{result['n_noise']} noise draws.",
             "",
             "  eps/site   bounds (x, y)      public-only   private+public   non-private   "
             "gain mean [10%, 90%]     P(gain>0)"]
    for r in result["per_epsilon"]:
        g = r["gain"]
        b = r["bounds"]
        lines.append(
            f"  {r['epsilon']:>8g}   {b['x_bound']:<7.3g} {b['y_bound']:<9.3g}  "
            f"{r['spearman_public_only']['mean']:>11.3f}   {r['spearman_private_public']['mean']:>14.3f}   "
            f"{r['spearman_nonprivate']['mean']:>11.3f}   {g['mean']:+.3f} [{g['q10']:+.3f}, {g['q90']:+.3f}]"
            f"   {g['p_positive']:>8.2f}")
    lines += ["", "Held-out Spearman on auxiliary data shaped like the public rows (dpfed.auxiliary: "
              "independent columns with the public frequencies, a modest linear signal); "
              "each site spends eps/site once"
              + (" (add/remove; 2 eps under replace-one)." if result["neighbouring"] == "add_remove"
                 else " (replace-one).")]
    return "\n".join(lines)
