"""Does `dpfed plan`'s forecast band hold the realised gain? (issue 21 item 3)

    python benchmarks/forecast_check.py [--splits 10] [--eps 2] [--data airfoil_self_noise,...]

Per split of a UCI set (../shared/data/uci; original rows, no replication): 300 test rows, 10
public rows, the rest one site's private rows. The round as a round runs it (the round's
pre-processing with public column scales and row norm; bounds, split and ridge from
``round_choice``; OpenDP release; noise-aware fit with the public rows' own likelihood and
y_unit = By) gives the realised gain = Spearman(private + public) - Spearman(public only) on the
test rows. Beside it, from the public rows only, ``dpfed_apps.forecast.forecast_round`` with the
same bounds, split and ridge: its one-round 10-90 % band of the gain, with its default fit (the
closed form with the noise-matched ridge) and, with ``--posterior``, the production posterior
adapter (``posterior_fit("laplace")``). Prints the share of rounds whose realised gain lies in
the band, and the mean forecast and realised gains.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def one_split(x, y, eps, rng, fits, n_datasets, n_noise):
    from dpfed.metrics import spearman
    from dpfed.preprocess import Preprocessing
    from dpfed.statistics import clipped_exact_statistics
    from dpfed_apps.forecast import forecast_round, posterior_fit
    from dpfed_apps.simulation.public import round_choice
    from posterior import fit_posterior
    from site_node.release import release_statistics

    perm = rng.permutation(len(y))
    test, pub, priv = perm[:300], perm[300:310], perm[310:]
    pre = Preprocessing.from_public_data(x[pub], y[pub], scale_columns=True)
    zp, yp = pre.apply(x[pub], y[pub])
    zq, yq = pre.apply(x[priv], y[priv])
    zt = pre.transform_x(x[test])
    ch = round_choice([len(priv)], x.shape[1], eps, x[pub], y[pub], pre, draws=1,
                      seed=int(rng.integers(1 << 30)))
    bx, by, norm = ch["x_bound"], ch["y_bound"], ch["x_norm_bound"]
    public = clipped_exact_statistics(zp, yp, bx, by, norm)
    rel = release_statistics(zq, yq, epsilon=eps, x_bound=bx, y_bound=by,
                             budget_split=ch["budget_split"], x_norm_bound=norm)
    private = fit_posterior(rel + public, public=public, x_bound=bx, y_unit=by, draws=1000,
                            seed=0)
    public_only = fit_posterior(public, y_unit=by, draws=1000, seed=0)
    realised = (spearman(private.predict(zt), y[test])
                - spearman(public_only.predict(zt), y[test]))
    out = {"realised": float(realised)}
    for name in fits:
        fit = None if name == "closed_form" else posterior_fit("laplace")
        fc = forecast_round(x_public=x[pub], y_public=y[pub], preprocessing=pre,
                            n_per_site=[len(priv)], epsilons=[eps], bounds=(bx, by),
                            budget_split=ch["budget_split"], ridge_c=ch["ridge_c"],
                            aggregation="secure", n_datasets=n_datasets, n_noise=n_noise,
                            seed=int(rng.integers(1 << 30)), fit=fit)
        g = fc["per_epsilon"][0]["gain"]
        out[name] = (g["mean"], g["q10"], g["q90"])
    return out


def main(argv=None) -> int:
    from uci import load

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="airfoil_self_noise,concrete_strength,wine_quality_red")
    ap.add_argument("--splits", type=int, default=10)
    ap.add_argument("--eps", type=float, default=2.0)
    ap.add_argument("--posterior", action="store_true")
    ap.add_argument("--n-datasets", type=int, default=12)
    ap.add_argument("--n-noise", type=int, default=5)
    args = ap.parse_args(argv)
    fits = ["closed_form"] + (["posterior"] if args.posterior else [])
    t0 = time.time()
    print("| data | eps | fit | rounds | forecast gain (mean) | realised gain (mean) "
          "| realised in [q10, q90] |")
    print("|---|---|---|---|---|---|---|")
    for name in args.data.split(","):
        _, x, y = load(ROOT.parent / "shared" / "data" / "uci" / f"{name}.csv")
        rng = np.random.default_rng(0)
        rows = [one_split(x, y, args.eps, rng, fits, args.n_datasets, args.n_noise)
                for _ in range(args.splits)]
        for r in rows:
            print("  ", r, file=sys.stderr, flush=True)
        for f in fits:
            inside = np.mean([r[f][1] <= r["realised"] <= r[f][2] for r in rows])
            print(f"| {name} | {args.eps:g} | {f} | {len(rows)} | "
                  f"{np.mean([r[f][0] for r in rows]):+.3f} | "
                  f"{np.mean([r['realised'] for r in rows]):+.3f} | {inside:.2f} |", flush=True)
    print(f"{args.splits} splits per data set; {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
