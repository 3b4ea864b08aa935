"""Does `dpfed plan`'s forecast band hold the realised gain? (issue 21 item 3)

    python benchmarks/forecast_check.py [--splits 10] [--eps 2] [--data airfoil_self_noise,...]
        [--fits closed_form,posterior] [--populations default,public] [--gdsc-drugs 10]
        [--variants closed_form/mix,closed_form/default@100] [--json FILE]

Per split of a UCI set (../shared/data/uci; original rows, no replication): 300 test rows, 10
public rows, the rest one site's private rows; per GDSC drug (``--gdsc-drugs``, every k-th
eligible drug whose pool reaches ``--gdsc-n``; the evaluation protocol's split of repeat 0..:
100 test lines, 10 public lines, the first ``--gdsc-n`` pool lines one site). The round as a
round runs it (the round's pre-processing with public column scales and row norm; bounds,
split and ridge from ``round_choice``; OpenDP release; ``fit_posterior`` with the public rows'
exact clipped statistics as ``public=``, x_bound = Bx, y_unit = By, as
aggregator.rounds.fitting passes them) gives the realised gain = Spearman(private + public) -
Spearman(public only, ``fit_posterior(public, y_unit=By)``) on the test rows. Beside it, from
the public rows only, ``dpfed_apps.forecast.forecast_round`` with the same bounds, split and
ridge, for each fit (``closed_form``: the closed form with the noise-matched ridge;
``posterior``: ``posterior_fit()``, the production posterior with the same inputs as a round)
and each auxiliary population (``default``: ``dpfed.auxiliary``'s defaults, R^2 ~ Beta(2,
20), independent columns with half the rows public copies; ``public``:
``PUBLIC_FIT_POPULATION``, R^2 from the public rows' own fit, rows bootstrapped from the public
rows; the others: ``populations()``). The forecast's populations are scored on as many test
rows as the realised gain (300 UCI, 100 GDSC), so the band carries the same test-set noise;
``fit/population@N`` scores on N. Prints, per data set and variant, the share of rounds whose
realised gain lies in the one-round 10-90 % band with its Clopper-Pearson 95 % interval, the
misses below / above, the median band width and the mean forecast and realised gains;
``--json FILE`` keeps every round.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ON_REFUSAL = "fallback"   # --skip-refused: "skip" (posterior_fit's on_refusal)
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def one_round(xp, yp, xq, yq, xt, yt, pre, eps, rng, variants, n_datasets, n_noise,
              feature_names=None):
    """Raw public (xp, yp), private (xq, yq) and test (xt, yt) rows; ``pre`` the round's
    public pre-processing. Returns {"realised": gain, variant: (mean, q10, q90), ...}."""
    from dpfed.metrics import spearman
    from dpfed.statistics import clipped_exact_statistics
    from dpfed_apps.forecast import forecast_round, posterior_fit
    from dpfed_apps.simulation.public import round_choice
    from posterior import fit_posterior
    from site_node.release import release_statistics

    zp, ypp = pre.apply(xp, yp)
    zq, yqq = pre.apply(xq, yq)
    zt = pre.transform_x(xt)
    ch = round_choice([len(yq)], xp.shape[1], eps, xp, yp, pre, draws=1,
                      feature_names=feature_names, seed=int(rng.integers(1 << 30)))
    bx, by, norm = ch["x_bound"], ch["y_bound"], ch["x_norm_bound"]
    public = clipped_exact_statistics(zp, ypp, bx, by, norm)
    rel = release_statistics(zq, yqq, epsilon=eps, x_bound=bx, y_bound=by,
                             budget_split=ch["budget_split"], x_norm_bound=norm)
    private = fit_posterior(rel + public, public=public, x_bound=bx, y_unit=by, draws=1000,
                            seed=0)
    public_only = fit_posterior(public, y_unit=by, draws=1000, seed=0)
    sp_pub = spearman(public_only.predict(zt), yt)
    realised = spearman(private.predict(zt), yt) - sp_pub
    out = {"realised": float(realised), "bounds": (bx, by), "public_only": float(sp_pub)}
    seed = int(rng.integers(1 << 30))     # the same populations for every variant
    for name in variants:
        fit_name, pop = name.split("/")
        pop, _, n_test = pop.partition("@")   # "@100": the forecast's own test rows
        n_test = int(n_test) if n_test else len(yt)
        t0 = time.perf_counter()
        fc = forecast_round(x_public=xp, y_public=yp, preprocessing=pre,
                            feature_names=feature_names,
                            n_per_site=[len(yq)], epsilons=[eps], bounds=(bx, by),
                            budget_split=ch["budget_split"], ridge_c=ch["ridge_c"],
                            aggregation="secure", n_datasets=n_datasets, n_noise=n_noise,
                            seed=seed, n_test=n_test,
                            fit=None if fit_name == "closed_form" else posterior_fit(
                                on_refusal=ON_REFUSAL),
                            population=populations()[pop])
        g = fc["per_epsilon"][0]["gain"]
        out[name] = (g["mean"], g["q10"], g["q90"])
        # The populations' own band, before the calibration margin (--calibrate reads it).
        out[name + ":populations"] = (g["q10_populations"], g["q90_populations"])
        p = fc["per_epsilon"][0]["spearman_public_only"]   # over populations
        out[name + ":public_only"] = (p["mean"], p["q10"], p["q90"])
        out[name + ":refused"] = g.get("refused", 0)
        out[name + ":s"] = time.perf_counter() - t0
        out["r2_mean:" + pop] = fc["auxiliary"]["r2_mean"]
    return out


def populations() -> dict:
    """The candidate auxiliary populations by name (``forecast_round(population=...)``).
    ``r2flat*``: R^2 from its Gaussian-model posterior under a flat prior (``0``: independent
    columns, fresh public rows; ``1j``: every row a jittered public-row copy); ``cv*``: R^2
    given the public rows' leave-one-out Spearman (``dpfed_apps.forecast_signal``) under a
    flat (``cvflat``, ``CV_SIGNAL_POPULATION``), Beta(1, 3) or Beta(2, 20) prior; ``mixcv``:
    half default, half ``cvflat``; ``nl*``, ``t*``, ``nlt*``: a misspecified response
    (``NONLINEAR``, ``HEAVY``; ``dpfed_apps.forecast_response``) on the default prior, ``flat``
    or ``cv``; ``nl9``, ``nl39``: non-linear share U(0, 0.9), U(0.3, 0.9); ``nl0``: ``nl``
    without public-row copies; ``t24``, ``nlt24``: t residuals with nu ~ U(2.1, 4)."""
    from dpfed_apps.forecast import (CV_SIGNAL_POPULATION, MIXED_POPULATION,
                                     PUBLIC_FIT_POPULATION, R2_FROM_PUBLIC_POPULATION)

    flat = {"r2_prior": (1.0, 1.0), "r2_from_public": True}
    return {"default": None, "public": PUBLIC_FIT_POPULATION,
            "r2post": R2_FROM_PUBLIC_POPULATION, "r2flat": flat, "mix": MIXED_POPULATION,
            "mixflat": ((0.5, None), (0.5, flat)),
            "mixr2": ((0.5, None), (0.5, R2_FROM_PUBLIC_POPULATION)),
            "r2flat0": dict(flat, row_bootstrap=0.0),
            "r2flat1j": dict(flat, row_bootstrap=1.0, row_jitter=True),
            "cvflat": CV_SIGNAL_POPULATION,
            "cvflat0": {"r2_prior": (1.0, 1.0), "r2_from_cv": True, "row_bootstrap": 0.0},
            "cvflat1j": {"r2_prior": (1.0, 1.0), "r2_from_cv": True, "row_bootstrap": 1.0,
                         "row_jitter": True},
            "cv13": {"r2_prior": (1.0, 3.0), "r2_from_cv": True},
            "cv22": {"r2_prior": (2.0, 20.0), "r2_from_cv": True},
            "mixcv": ((0.5, None), (0.5, CV_SIGNAL_POPULATION)),
            # Fifth session (dpfed_apps.forecast_response): "nl" a random smooth non-linear
            # part with a share U(0, 0.6) of the signal variance, "t" Student-t residuals
            # (nu ~ U(2.5, 10)), "nlt" both; on the default R^2 prior, the flat Gaussian-model
            # posterior ("...flat") or the leave-one-out one ("...cv").
            **{f"{name}{prior}": dict(base, **extra)
               for name, extra in (("nl", NONLINEAR), ("t", HEAVY), ("nlt", {**NONLINEAR, **HEAVY}))
               for prior, base in (("", {}), ("flat", flat), ("cv", CV_SIGNAL_POPULATION))},
            # Second screen: a larger non-linear share ("nl9" U(0, 0.9), "nl39" U(0.3, 0.9)),
            # fresh independent-column rows ("nl0": no public-row copies), heavier tails
            # ("t24": nu ~ U(2.1, 4)) alone and with "nl".
            "nl9": {"nonlinear_share": (0.0, 0.9)}, "nl39": {"nonlinear_share": (0.3, 0.9)},
            "nl0": dict(NONLINEAR, row_bootstrap=0.0), "t24": {"residual_df": (2.1, 4.0)},
            "nlt24": dict(NONLINEAR, residual_df=(2.1, 4.0))}


#: The fifth session's misspecified-response options (dpfed_apps.forecast_response).
NONLINEAR = {"nonlinear_share": (0.0, 0.6)}
HEAVY = {"residual_df": (2.5, 10.0)}


def coverage_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson interval of a binomial share k / n."""
    from scipy.stats import beta

    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def leave_one_out(every: dict, target=(0.7, 0.9), level_weight: float = 0.0) -> list[str]:
    """Leave-one-data-set-out choice of a population (no data set tunes its own forecast):
    for each data set, the variant whose coverage on the *other* data sets is the closest to
    the target range (the sum of each one's distance from [0.7, 0.9], ties: the smaller
    distance from 0.8 on average), and that variant's coverage on the held-out set.
    ``level_weight`` w > 0 adds w times the sum over the other data sets of |forecast
    public-only Spearman (mean) - realised public-only (mean)| to that distance (the issue's
    second aim: the public-only level a user is shown).
    ``every``: {data set: [round, ...]} as ``--json`` writes it. Returns table lines."""
    cover, level = {}, {}
    for name, rows in every.items():
        variants = [k for k in rows[0] if "/" in k and ":" not in k]
        cover[name] = {v: (int(sum(r[v][1] <= r["realised"] <= r[v][2] for r in rows)),
                           len(rows)) for v in variants}
        level[name] = {v: abs(np.mean([r[v + ":public_only"][0] for r in rows])
                              - np.mean([r["public_only"] for r in rows]))
                       for v in variants if all(v + ":public_only" in r and "public_only" in r
                                                for r in rows)}
    lines = ["| held-out data set | variant chosen on the others | its coverage there (95 % CI) "
             "| its public-only Spearman (mean) | realised public-only (mean) |",
             "|---|---|---|---|---|"]
    common = set.intersection(*(set(c) for c in cover.values()))
    for held in cover:
        def loss(v):
            shares = [cover[o][v][0] / cover[o][v][1] for o in cover if o != held]
            off = sum(level[o].get(v, np.inf) for o in cover if o != held) \
                if level_weight > 0 else 0.0
            return (sum(max(target[0] - c, 0.0, c - target[1]) for c in shares)
                    + level_weight * off,
                    float(np.mean([abs(c - 0.8) for c in shares])))
        best = min(sorted(common), key=loss)
        k, n = cover[held][best]
        lo, hi = coverage_interval(k, n)
        rows = every[held]
        shown = [r[best + ":public_only"][0] for r in rows if best + ":public_only" in r]
        lines.append(f"| {held} | {best} | {k / n:.2f} ({lo:.2f}-{hi:.2f}) | "
                     + (f"{np.mean(shown):.3f}" if shown else "") + " | "
                     + (f"{np.mean([r['public_only'] for r in rows]):.3f}"
                        if all("public_only" in r for r in rows) else "") + " |")
    return lines


def read_rounds(path, variant: str) -> dict:
    """{data set: [round, ...]} from a ``--json`` file, or from a CSV of rounds with the
    columns data, realised, lower, upper (``benchmarks/results/forecast_band_calibration.csv``:
    the populations' band of ``variant``)."""
    text = Path(path).read_text()
    if not str(path).endswith(".csv"):
        return json.loads(text)
    import csv

    every = {}
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    for row in csv.DictReader(lines):
        every.setdefault(row["data"], []).append(
            {"realised": float(row["realised"]),
             variant + ":populations": (float(row["lower"]), float(row["upper"]))})
    return every


def calibrate(every: dict, variant: str) -> list[str]:
    """The gain band's conformal margins (Q_lo, Q_hi; ``dpfed_apps.forecast_calibration``)
    pooled over every round of ``every`` ({data set: [round, ...]}, several runs' rounds
    appended), and, leave-one-data-set-out, each data set's coverage under the margins fitted
    on the others, with the misses below / above. The band calibrated is the populations' own
    (``variant:populations``; files written before it existed: the variant's band, then
    uncalibrated). Returns table lines."""
    from dpfed_apps.forecast_calibration import band_coverage, band_margins

    def parts(rows):
        y = np.array([r["realised"] for r in rows])
        band = np.array([r.get(variant + ":populations") or r[variant][1:] for r in rows])
        return y, band[:, 0], band[:, 1]

    data = {name: parts(rows) for name, rows in every.items()}
    pooled = band_margins(*(np.concatenate([p[i] for p in data.values()]) for i in range(3)))
    lines = [f"{variant}: margins (Q_lo, Q_hi) = ({pooled[0]:.4f}, {pooled[1]:.4f}) pooled over "
             f"{sum(len(p[0]) for p in data.values())} rounds",
             "| held-out data set | rounds | populations' band | margins fitted on the others "
             "| coverage with them (95 % CI) | below / above |", "|---|---|---|---|---|---|"]
    for held, (y, lo, hi) in data.items():
        m = band_margins(*(np.concatenate([p[i] for o, p in data.items() if o != held])
                           for i in range(3)))
        c = band_coverage(y, lo, hi, m)
        ci = coverage_interval(int(round(c * len(y))), len(y))
        lines.append(f"| {held} | {len(y)} | {band_coverage(y, lo, hi, (0.0, 0.0)):.2f} | "
                     f"({m[0]:.4f}, {m[1]:.4f}) | {c:.2f} ({ci[0]:.2f}-{ci[1]:.2f}) | "
                     f"{int(np.sum(y < lo - m[0]))} / {int(np.sum(y > hi + m[1]))} |")
    return lines


def synthetic(rng, n=1310, d=6):
    """Simulated rounds' data (``--data synth``): correlated columns (one log-normal), a
    linear signal of R^2 ~ U(0.1, 0.7) on a random beta, skewed noise; a new data set per
    split."""
    cov = 0.6 * np.eye(d) + 0.4
    x = rng.multivariate_normal(np.zeros(d), cov, size=n) * rng.uniform(0.5, 3.0, size=d)
    x[:, 0] = np.exp(x[:, 0] / 2)
    r2 = rng.uniform(0.1, 0.7)
    s = x @ rng.standard_normal(d)
    e = rng.gamma(4.0, size=n)
    e = (e - e.mean()) / e.std()
    y = 10.0 + s / s.std() * np.sqrt(r2) + np.sqrt(1 - r2) * e
    return x, y


def uci_rounds(name, splits, eps, variants, n_datasets, n_noise, seed=0):
    from uci import load
    from dpfed.preprocess import Preprocessing

    if name != "synth":
        _, x, y = load(ROOT.parent / "shared" / "data" / "uci" / f"{name}.csv")
    rng = np.random.default_rng(seed)
    for _ in range(splits):
        if name == "synth":
            x, y = synthetic(rng)
        perm = rng.permutation(len(y))
        test, pub, priv = perm[:300], perm[300:310], perm[310:]
        pre = Preprocessing.from_public_data(x[pub], y[pub], scale_columns=True)
        yield one_round(x[pub], y[pub], x[priv], y[priv], x[test], y[test], pre, eps, rng,
                        variants, n_datasets, n_noise)


def gdsc_rounds(drugs, n, eps, variants, n_datasets, n_noise, repeat=0):
    from dpfed_apps.evaluation.protocol import (ProtocolConfig, eligible_drugs, load_problem,
                                                prepare_repeat, repeat_split)

    cfg = ProtocolConfig()
    every = eligible_drugs(cfg.min_lines)
    done = 0
    for drug in every[::max(1, len(every) // (3 * drugs))]:
        if done == drugs:
            break
        problem = load_problem(drug, cfg)
        if problem.n - cfg.n_test - cfg.n_candidates < n:
            continue
        done += 1
        split = repeat_split(problem.n, cfg, drug, repeat)
        data = prepare_repeat(problem, cfg, drug, repeat)
        priv = split.private_pool[:n]
        rng = np.random.default_rng([drug, 21] if repeat == 0 else [drug, 21, repeat])
        out = one_round(problem.x[split.public], problem.y[split.public], problem.x[priv],
                        problem.y[priv], problem.x[split.test], problem.y[split.test],
                        data.preprocessing, eps, rng, variants, n_datasets, n_noise,
                        feature_names=list(cfg.features))
        out["drug"] = int(drug)
        yield out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="airfoil_self_noise,concrete_strength,wine_quality_red",
                    help="UCI sets (comma-separated; empty: none; 'synth': simulated data)")
    ap.add_argument("--splits", type=int, default=10)
    ap.add_argument("--gdsc-drugs", type=int, default=0, help="GDSC drugs (one round each)")
    ap.add_argument("--gdsc-n", type=int, default=700)
    ap.add_argument("--eps", type=float, default=2.0)
    ap.add_argument("--fits", default="closed_form", help="closed_form,posterior")
    ap.add_argument("--populations", default="default", help="default,public")
    ap.add_argument("--variants", default=None,
                    help="fit/population pairs, e.g. closed_form/default,posterior/public "
                         "(overrides --fits x --populations)")
    ap.add_argument("--n-datasets", type=int, default=12)
    ap.add_argument("--n-noise", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--skip-refused", action="store_true",
                    help="production fits: a refused Laplace fit is left out (counted) "
                         "instead of falling back to NUTS")
    ap.add_argument("--leave-one-out", nargs="+", default=None, metavar="JSON",
                    help="only summarise earlier --json files: each data set's coverage under "
                         "the variant chosen on the other data sets")
    ap.add_argument("--calibrate", nargs="+", default=None, metavar="JSON",
                    help="only summarise earlier --json files: the conformal margin of the "
                         "gain band (dpfed_apps.forecast_calibration) pooled over them, and "
                         "each data set's coverage under the margin fitted on the others")
    ap.add_argument("--calibrate-variant", default="closed_form/default",
                    help="--calibrate: the variant whose populations' band is calibrated")
    ap.add_argument("--seed", type=int, default=0, help="UCI and synth splits' seed")
    ap.add_argument("--gdsc-repeat", type=int, default=0,
                    help="GDSC: the evaluation protocol's repeat whose split is used")
    ap.add_argument("--level-weight", type=float, default=0.0,
                    help="--leave-one-out: weight of the public-only level's error beside "
                         "coverage in the choice (0: coverage only)")
    args = ap.parse_args(argv)
    if args.leave_one_out:
        every = {}
        for f in args.leave_one_out:
            every.update(json.loads(Path(f).read_text()))
        print("\n".join(leave_one_out(every, level_weight=args.level_weight)))
        return 0
    if args.calibrate:
        every = {}
        for f in args.calibrate:
            for name, rows in read_rounds(f, args.calibrate_variant).items():
                every.setdefault(name, []).extend(rows)
        print("\n".join(calibrate(every, args.calibrate_variant)))
        return 0
    global ON_REFUSAL
    ON_REFUSAL = "skip" if args.skip_refused else "fallback"
    variants = (args.variants.split(",") if args.variants else
                [f"{f}/{p}" for f in args.fits.split(",") for p in args.populations.split(",")])
    t0 = time.time()
    sets = [(name, lambda name=name: uci_rounds(name, args.splits, args.eps, variants,
                                                 args.n_datasets, args.n_noise, args.seed))
            for name in args.data.split(",") if name]
    if args.gdsc_drugs:
        sets.append((f"GDSC (n = {args.gdsc_n})",
                     lambda: gdsc_rounds(args.gdsc_drugs, args.gdsc_n, args.eps, variants,
                                         args.n_datasets, args.n_noise, args.gdsc_repeat)))
    lines = ["| data | eps | forecast (fit / population) | rounds | forecast gain (mean) "
             "| realised gain (mean) | mean abs. error | realised in [q10, q90] (95 % CI) "
             "| below q10 / above q90 | median band width | s per forecast |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    every = {}
    pooled = {v: [] for v in variants}
    for name, gen in sets:
        rows = []
        for r in gen():
            print("  ", name, {k: (np.round(v, 3).tolist() if not isinstance(v, int) else v)
                               for k, v in r.items()}, file=sys.stderr, flush=True)
            rows.append(r)
        every[name] = rows
        for v in variants:
            inside = [r[v][1] <= r["realised"] <= r[v][2] for r in rows]
            pooled[v] += inside
            lo, hi = coverage_interval(int(sum(inside)), len(inside))
            below = sum(r["realised"] < r[v][1] for r in rows)
            above = sum(r["realised"] > r[v][2] for r in rows)
            lines.append(
                f"| {name} | {args.eps:g} | {v} | {len(rows)} | "
                f"{np.mean([r[v][0] for r in rows]):+.3f} | "
                f"{np.mean([r['realised'] for r in rows]):+.3f} | "
                f"{np.mean([abs(r[v][0] - r['realised']) for r in rows]):.3f} | "
                f"{np.mean(inside):.2f} ({lo:.2f}-{hi:.2f}) | {below} / {above} | "
                f"{np.median([r[v][2] - r[v][1] for r in rows]):.3f} | "
                f"{np.median([r[v + ':s'] for r in rows]):.1f} |")
        print("\n".join(lines[-len(variants):]), flush=True)
    for v in variants:
        lo, hi = coverage_interval(int(sum(pooled[v])), len(pooled[v]))
        lines.append(f"| pooled | {args.eps:g} | {v} | {len(pooled[v])} | | | | "
                     f"{np.mean(pooled[v]):.2f} ({lo:.2f}-{hi:.2f}) | | | |")
    print("\n".join(lines))
    print(f"{args.splits} splits per UCI set, {args.gdsc_drugs} GDSC drugs; "
          f"{args.n_datasets} populations x {args.n_noise} noise draws per forecast; "
          f"{time.time() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(every, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
