"""``dpfed plan``: forecast what a round would buy, from public inputs only.

Simulates the round on auxiliary data shaped like the public rows (dpfed.auxiliary): each
site's release with the mechanism's clipping and noise, fitted with the closed form and the
noise-matched ridge, scored on held-out auxiliary rows. Per epsilon it prints the expected
held-out Spearman of the public-only model, of private + public and of a non-private fit, the
expected gain over public-only with its 10/90 % quantiles, and the epsilon each site spends.
Costs no privacy: only public numbers and the public rows are read (method.md section 11).

--mechanism gaussian (with --delta) forecasts a Gaussian round: the product runs it as a joint
round of one target, and the forecast uses the product's own calibration
(dpfed.joint_noise.joint_calibration, what the site draws). --targets M (or round.toml's
targets list) forecasts ONE representative target of a joint release of M targets (Sxx
shared, Sxy/Syy/counts of M targets: Gaussian noise on Sxy grows like sqrt(M)), with rows
lacking its response at random (--response-rate), fitted as a round fits it
(dpfed.joint_targets.target_statistics). Its gain is per target; the round costs each patient
its (eps, delta) once for all M targets (issue 23; method.md section 13).
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
  dpfed plan --public public.csv --target Drug_1047_IC50 --n 700 --epsilon 2,10 --mechanism gaussian --delta 1e-6
      a single-target Gaussian round (a joint round of one target); bounds default to the
      joint round's (x_bound 1 with unit rows, y_bound 0.5 public sd; --bounds x,y in those units)
  dpfed plan --config joint_round.toml --n 700 --epsilon 10
      round.toml with targets = [...] (M = their number), mechanism, delta: the gain per target
      of the first listed target (--target another), response rate = the public rows' fill rate
  dpfed plan --public public.csv --target Drug_1047_IC50 --n 700 --epsilon 10 --mechanism gaussian \
      --delta 1e-6 --targets 262 --response-rate 0.82

--json prints one object: d, n_public, n_per_site, sites, neighbouring, xtx_sensitivity, fit,
n_datasets, n_noise, n_test, seed, auxiliary, notes, and per_epsilon: a list of {epsilon,
epsilon_per_site, epsilon_replace_one_equivalent, bounds {x_bound, y_bound, omega_x, omega_y,
sigma_x, sigma_y, chosen}, budget_split, ridge_c, noise_scales, spearman_public_only,
spearman_private_public, spearman_nonprivate (each {mean, q10, q90}), gain {mean, q10, q90, sd,
se_mean, p_positive, q10_populations, q90_populations, band_margins}, gain_expected {mean,
q10, q90}}. gain's q10_populations / q90_populations are over auxiliary populations x noise
draws (one round on n_test held-out rows); its q10 / q90 are those widened by band_margins,
calibrated on realised rounds (dpfed_apps.forecast_calibration); gain_expected's quantiles are
over populations (noise averaged).
Also: mechanism, delta, targets (M), joint_release, response_rate, gain_per_target, target (the
forecast target) at the top; per epsilon per_patient {epsilon, delta, gdp_mu} (what each patient
pays, once, for every target of the round) and noise_sd {xtx, xty, yty, n} (sd per coordinate
of the summed release's noise; Sxx shared, the others per target).

The public CSV needs a header: an id column (default: the first), the target and the features
(default: every other column). Exit codes: 0 ok, 2 bad arguments or inputs.
"""


def _test_rows(n: int) -> int:
    if n < 10:
        raise ValueError("--test-rows must be at least 10 (a Spearman on fewer rows says little)")
    return n


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
                        "about 0.05-0.3 s per fit, datasets x noise-draws fits per epsilon; "
                        "in a joint round a refused fit is left out and counted, as the joint "
                        "round's fit has no NUTS fallback)")
    p.add_argument("--population", choices=["default", "public"], default="default",
                   help="auxiliary populations: default (R^2 ~ Beta(2, 20), public-shaped "
                        "columns) or public (R^2, beta and rows from the public rows' own "
                        "fit; docs/evaluation.md issue 21 'Forecasts')")
    p.add_argument("--datasets", type=int, default=20, help="auxiliary populations (default 20)")
    p.add_argument("--noise-draws", type=int, default=10, help="noise draws each (default 10)")
    p.add_argument("--mechanism", choices=["laplace", "gaussian"], default=None,
                   help="the release's noise: laplace (pure eps) or gaussian ((eps, delta), a "
                        "joint round of >= 1 target). Default: round.toml's, else laplace")
    p.add_argument("--delta", type=float, default=None,
                   help="delta of a gaussian round, 0 < delta < 1 (default: round.toml's)")
    p.add_argument("--targets", type=int, default=None,
                   help="M: forecast one target of a joint release of M targets (default: "
                        "round.toml's targets list; 1 for gaussian; else a single-target round)")
    p.add_argument("--response-rate", type=float, default=None,
                   help="share of rows with the target's response, 0 < r <= 1 (joint rounds; "
                        "default: the public rows' fill rate over round.toml's targets, else 1)")
    p.add_argument("--test-rows", type=int, default=100,
                   help="held-out rows the gain is measured on (default 100): the band is "
                        "one round's gain on that many rows, so it is wider for fewer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _floats(text: str) -> list[float]:
    return [float(v) for v in str(text).split(",") if v.strip()]


def _config(args) -> tuple[dict, "Path | None"]:
    """round.toml (--config) parsed, and its path; ({}, None) without --config."""
    from pathlib import Path

    if not args.config:
        return {}, None
    import tomllib

    path = Path(args.config)
    return tomllib.loads(path.read_text()), path


def _release(args, config: dict) -> tuple[str, float, int]:
    """(mechanism, delta, targets M) from the flags, else round.toml; M = 0 is today's
    single-target Laplace release. ValueError (exit 2) on a combination the product refuses."""
    import math

    mech = args.mechanism or str(config.get("mechanism", "laplace"))
    if mech not in ("laplace", "gaussian"):
        raise ValueError(f"round.toml: mechanism must be laplace or gaussian, got {mech!r}")
    if mech == "gaussian":
        delta = args.delta if args.delta is not None else config.get("delta")
        if delta is None:
            raise ValueError("--mechanism gaussian needs --delta (0 < delta < 1) or a round.toml "
                             "delta")
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) \
                or not (math.isfinite(delta) and 0.0 < delta < 1.0):
            raise ValueError("--delta must be a number with 0 < delta < 1")
        delta = float(delta)
    else:
        if args.delta is not None:
            raise ValueError("--delta is for --mechanism gaussian only (a laplace round is pure "
                             "epsilon-DP)")
        delta = 0.0
    listed = config.get("targets")
    if args.targets is not None:
        if args.targets < 1:
            raise ValueError("--targets must be >= 1")
        m = int(args.targets)
    elif listed:
        m = len(listed)
    else:
        m = 1 if mech == "gaussian" else 0
    if m >= 1 and args.neighbouring != "add_remove":
        raise ValueError("--targets and --mechanism gaussian forecast a joint release, which "
                         "releases every count with noise: they need --neighbouring add_remove")
    if m >= 1 and args.xtx_sensitivity != "exact":
        raise ValueError("a joint release (--targets, --mechanism gaussian) uses the exact Sxx "
                         "sensitivity: drop --xtx-sensitivity paper")
    if args.response_rate is not None:
        r = args.response_rate
        if not (math.isfinite(r) and 0.0 < r <= 1.0):
            raise ValueError("--response-rate must be in (0, 1]")
        if m < 1:
            raise ValueError("--response-rate is for joint releases (--targets M or "
                             "--mechanism gaussian)")
    return mech, delta, m


def _header(path) -> list[str]:
    import csv
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as fh:
        return next(csv.reader(fh, delimiter="\t" if ".tsv" in path.suffixes else ","), [])


def _joint_inputs(args, config: dict, cfg_path) -> dict:
    """The public inputs of a joint (or Gaussian) round's forecast, read as the coordinator
    reads them (coordinator.joint_spec): the forecast target's public rows (those with its
    response), its responses standardised by their public mean and sd (TargetSpec), the
    features' pre-processing from every public row, bounds in those units (--bounds,
    round.toml's, else the joint defaults), the split, and the public fill rate."""
    from pathlib import Path

    import numpy as np

    from coordinator.joint_spec import (DEFAULT_X_BOUND_NORMALISED, DEFAULT_Y_BOUND,
                                        centre_scale, read_public_table, target_list)
    from dpfed.preprocess import Preprocessing

    listed = target_list(config) if "targets" in config else None
    public_conf = config.get("public", {})
    public = args.public
    if public is None and public_conf.get("path"):
        public = str(cfg_path.parent / public_conf["path"])
    if public is None:
        raise ValueError("give the public rows: --public FILE or a --config with public.path")
    if listed:
        target = args.target or listed[0]
        if target not in listed:
            raise ValueError("--target must be one of round.toml's targets")
        columns = listed
    else:
        target = args.target or config.get("target")
        if not target:
            raise ValueError("give the target column (--target)")
        columns = [target]
    path = Path(public)
    features = ([f.strip() for f in args.features.split(",") if f.strip()] if args.features
                else list(config.get("features", [])))
    if not features:
        header = _header(path)
        id_column = args.id_column or (header[0] if header else "")
        features = [h for h in header if h != id_column and h not in columns]
    x_raw, y_raw = read_public_table(path, columns, features)
    j = columns.index(target)
    have = np.isfinite(y_raw[:, j])
    (mean, sd), = centre_scale(y_raw[:, [j]], [target])
    normalize = bool(public_conf.get("normalize_rows", True))
    pre = Preprocessing.from_public_data(x_raw, np.zeros(len(x_raw)), normalize_rows=normalize,
                                         scale_columns=bool(public_conf.get("scale_columns",
                                                                            True)))
    if args.bounds == "choose":
        raise ValueError("--bounds choose is for single-target Laplace rounds; a gaussian or "
                         "joint round takes x_bound,y_bound (y in public sd units) or the "
                         "joint defaults")
    if args.bounds is not None:
        b = _floats(args.bounds)
        if len(b) != 2 or min(b) <= 0:
            raise ValueError("--bounds must be x_bound,y_bound (both > 0)")
        bounds = tuple(b)
    else:
        if "x_bound" in config:
            bx = float(config["x_bound"])
        elif normalize:
            bx = DEFAULT_X_BOUND_NORMALISED
        else:
            raise ValueError("without row normalisation give --bounds x_bound,y_bound")
        bounds = (bx, float(config.get("y_bound", DEFAULT_Y_BOUND)))
    split = tuple(_floats(args.budget_split)) if args.budget_split else (
        tuple(float(v) for v in config["budget_split"]) if config.get("budget_split") else None)
    if split is not None and len(split) != 4:
        raise ValueError("a joint round's budget split needs 4 shares (Sxx, Sxy, Syy, counts)")
    fill = float(np.isfinite(y_raw).mean()) if len(columns) > 1 else 1.0
    return {"x_public": x_raw[have], "y_public": (y_raw[have, j] - mean) / sd,
            "feature_names": features, "preprocessing": pre, "bounds": bounds,
            "budget_split": split, "fill_rate": fill, "target": target}


def _inputs(args, config: dict, cfg_path):
    """(x_public, y_public, feature_names, bounds, split) from --config and/or --public."""
    from dpfed_apps.simulation.problem import csv_problem

    target, features, public, bounds, split = args.target, None, args.public, None, None
    if args.features:
        features = [f.strip() for f in args.features.split(",") if f.strip()]
    if cfg_path is not None:
        target = target or config.get("target")
        features = features or list(config.get("features", [])) or None
        pub = config.get("public", {}).get("path")
        if public is None and pub:
            public = str(cfg_path.parent / pub)
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


def _aggregation(args, config: dict) -> str:
    """--aggregation, else round.toml's ``aggregation`` (--config), else independent."""
    if args.aggregation:
        return args.aggregation
    mode = config.get("aggregation", "independent")
    if mode not in ("independent", "secure"):
        raise ValueError("round.toml: aggregation must be independent or secure")
    return str(mode)


def run(args) -> int:
    from dpfed_apps.forecast import PUBLIC_FIT_POPULATION, forecast_round, posterior_fit

    try:
        config, cfg_path = _config(args)
        mechanism, delta, targets = _release(args, config)
        sizes = [int(v) for v in args.n.split(",") if v.strip()]
        if args.sites is not None:
            if len(sizes) != 1 or args.sites < 1:
                raise ValueError("--sites K needs a single --n and K >= 1")
            sizes = sizes * args.sites
        joint = {}
        if targets >= 1:
            joint = _joint_inputs(args, config, cfg_path)
            x_pub, y_pub, names = joint["x_public"], joint["y_public"], joint["feature_names"]
            bounds, split = joint["bounds"], joint["budget_split"]
        else:
            x_pub, y_pub, names, cfg_bounds, cfg_split = _inputs(args, config, cfg_path)
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
        rate = args.response_rate if args.response_rate is not None else \
            joint.get("fill_rate", 1.0)
        result = forecast_round(x_public=x_pub, y_public=y_pub, feature_names=names,
                                preprocessing=joint.get("preprocessing"),
                                n_per_site=sizes if len(sizes) > 1 else sizes[0],
                                epsilons=_floats(args.epsilon), bounds=bounds,
                                neighbouring=args.neighbouring,
                                xtx_sensitivity=args.xtx_sensitivity, budget_split=split,
                                n_datasets=args.datasets, n_noise=args.noise_draws,
                                n_test=_test_rows(args.test_rows),
                                seed=args.seed, aggregation=_aggregation(args, config),
                                fit=posterior_fit(on_refusal="skip" if targets >= 1 else
                                                  "fallback")
                                if getattr(args, "fit", None) == "posterior" else None,
                                population=PUBLIC_FIT_POPULATION
                                if getattr(args, "population", None) == "public" else None,
                                mechanism=mechanism, delta=delta, targets=targets,
                                response_rate=rate)
        result["target"] = joint.get("target", args.target or config.get("target"))
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
    joint = result.get("joint_release", False)
    gaussian = result.get("mechanism") == "gaussian"
    head = (f"Forecast from public inputs only: {result['sites']} site(s), n per site "
            f"{', '.join(map(str, sizes))}, d = {result['d']}, {result['n_public']} public rows, "
            f"{result['neighbouring']} DP, {result.get('aggregation', 'independent')} "
            f"aggregation; {result['n_datasets']} auxiliary populations x "
            f"{result['n_noise']} noise draws.")
    lines = [head]
    if joint:
        m = result["targets"]
        lines.append(f"Release: {result['mechanism']} mechanism"
                     + (f", delta {result['delta']:g}" if gaussian else "")
                     + f", a joint release of {m} target(s)"
                     + (" (Sxx shared)" if m > 1 else
                        " (a single-target Gaussian round runs as one)")
                     + f"; the forecast target "
                     f"{result.get('target') or '?'}, response rate {result['response_rate']:.2f}"
                     f"; bounds in public sd units of the target.")
    lines += ["",
              ("  (eps, delta)/patient" if gaussian else "  eps/patient" if joint else
               "  eps/site   ")
              + "   bounds (x, y)      public-only   private+public   non-private   "
              + ("gain/target [10%, 90%]   P(gain>0)" if joint else
                 "gain mean [10%, 90%]     P(gain>0)")]
    for r in result["per_epsilon"]:
        g = r["gain"]
        b = r["bounds"]
        cost = (f"({r['epsilon']:g}, {result['delta']:g})" if gaussian else
                f"{r['epsilon']:g}")
        lines.append(
            f"  {cost:>{20 if gaussian else 11}}   {b['x_bound']:<7.3g} {b['y_bound']:<9.3g}  "
            f"{r['spearman_public_only']['mean']:>11.3f}   {r['spearman_private_public']['mean']:>14.3f}   "
            f"{r['spearman_nonprivate']['mean']:>11.3f}   {g['mean']:+.3f} [{g['q10']:+.3f}, {g['q90']:+.3f}]"
            f"   {g['p_positive']:>8.2f}")
    lines += ["", "Held-out Spearman on auxiliary data shaped like the public rows (dpfed.auxiliary: "
              "independent columns with the public frequencies, a modest linear signal).",
              f"[10%, 90%]: one round's gain on {result['n_test']} held-out rows; the "
              "populations' band widened by margins calibrated on realised rounds "
              "(dpfed_apps.forecast_calibration; docs/evaluation.md)."]
    if joint:
        m = result["targets"]
        lines.append(
            (f"The gain is PER TARGET (one representative target of the {m}); " if m > 1 else
             "The gain is that of the round's one target; ")
            + "each patient in the release pays the row's "
            + ("(eps, delta)" if gaussian else "eps") + " once for "
            + (f"all {m} targets together (every target is paid once, in this one release, "
               f"not {m} times)." if m > 1 else "it.")
            + (" Noise sd per coordinate: " + "; ".join(
                f"eps {r['epsilon']:g}: Sxx {r['noise_sd']['xtx']:.3g}"
                + (" (shared)" if m > 1 else "") + f", Sxy "
                f"{r['noise_sd']['xty']:.3g}, Syy {r['noise_sd']['yty']:.3g}, counts "
                f"{r['noise_sd']['n']:.3g}" for r in result["per_epsilon"]) + "."))
    else:
        lines[-1] += (" Each site spends eps/site once"
                      + (" (add/remove; 2 eps under replace-one)." if result["neighbouring"] ==
                         "add_remove" else " (replace-one)."))
    return "\n".join(lines)
