"""Private vs non-private on the UCI regression data (continuous features; issue 9 target).

    python benchmarks/uci.py [--repeats 10] [--epsilons 1,2] [--json]

For each data set in ../shared/data/uci (or --data DIR): per repeat a random permutation
gives 200 test rows, 30 public rows and the rest (>= 800) as ONE site's private rows. Every
column is divided by its public standard deviation (a public scale), then the round's
pre-processing centres with the public means (no row normalisation: the features are
continuous measurements). The clipping bounds and the budget split are chosen on auxiliary
data shaped like the public rows (dpfed.bounds.choose_bounds with dpfed.auxiliary), the
release is the production one (site_node.release_statistics, OpenDP), the fit the production
noise-aware posterior. Scores: Spearman of predictions on the test rows, for the private
model, the non-private model (exact statistics of the same rows, exact model) and the 30
public rows alone. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load(path: Path):
    with path.open() as fh:
        rows = list(csv.reader(fh))
    data = np.array([[float(v) for v in r] for r in rows[1:]])
    return rows[0][:-1], data[:, :-1], data[:, -1]


def one_repeat(names, x, y, eps, rng, neighbouring):
    from posterior import fit_posterior
    from dpfed.auxiliary import AuxiliarySource
    from dpfed.bounds import choose_bounds
    from dpfed.metrics import spearman
    from dpfed.preprocess import Preprocessing
    from dpfed.statistics import clipped_exact_statistics, exact_statistics
    from site_node.release import release_statistics

    perm = rng.permutation(len(y))
    test, pub, priv = perm[:200], perm[200:230], perm[230:]
    scale = x[pub].std(axis=0, ddof=1)
    scale[scale == 0] = 1.0
    xs = x / scale
    pre = Preprocessing.from_public_data(xs[pub], y[pub], normalize_rows=False)
    zp, yp = pre.apply(xs[pub], y[pub])
    zq, yq = pre.apply(xs[priv], y[priv])
    zt = pre.transform_x(xs[test])
    sigma_x, sigma_y = float(np.std(zp)), float(np.std(yp))
    aux = AuxiliarySource(xs[pub], y[pub], pre, feature_names=tuple(names))
    choice = choose_bounds(len(priv), x.shape[1], eps, auxiliary=aux, neighbouring=neighbouring,
                           xtx_sensitivity="exact", ridge="noise_matched",
                           search_sxx_share=True, n_datasets=8, n_noise=8)
    bx, by = choice.bounds(sigma_x, sigma_y)
    # As a round does (coordinator.roundspec, aggregator.aggregate.fit): the public rows
    # clipped with the round's bounds, the x bound given to the noise-aware fit's design
    # prior and the y bound as the priors' response unit (the public-only fit too, as the
    # round's information statement).
    public = clipped_exact_statistics(zp, yp, bx, by)
    release = release_statistics(zq, yq, epsilon=eps, x_bound=bx, y_bound=by,
                                 budget_split=choice.budget_split, neighbouring=neighbouring)
    private = fit_posterior(release + public, public=public, x_bound=bx, y_unit=by,
                            draws=1000, seed=0)
    nonprivate = fit_posterior(exact_statistics(np.vstack([zq, zp]), np.concatenate([yq, yp])),
                               draws=1000, seed=0)
    public_only = fit_posterior(public, y_unit=by, draws=1000, seed=0)
    return {k: spearman(m.predict(zt), y[test]) for k, m in
            (("private", private), ("nonprivate", nonprivate), ("public_only", public_only))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "uci")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--epsilons", default="1,2")
    ap.add_argument("--neighbouring", default="add_remove,replace_one")
    ap.add_argument("--only", help="one data set (file stem), e.g. wine_quality_red")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()
    out = []
    for path in sorted(args.data.glob(f"{args.only or '*'}.csv")):
        names, x, y = load(path)
        for rel in args.neighbouring.split(","):
            for eps in (float(e) for e in args.epsilons.split(",")):
                rng = np.random.default_rng(0)
                from posterior import PosteriorError

                scores, refused = [], 0
                for _ in range(args.repeats):
                    try:
                        scores.append(one_repeat(names, x, y, eps, rng, rel))
                    except PosteriorError:
                        refused += 1   # a refused fit is counted, not hidden
                if not scores:
                    continue
                mean = {k: float(np.mean([s[k] for s in scores])) for k in scores[0]}
                out.append({"data": path.stem, "n_private": len(y) - 230, "neighbouring": rel,
                            "epsilon": eps, "refused": refused, **mean,
                            "ratio": mean["private"] / mean["nonprivate"]})
                if not args.json:
                    r = out[-1]
                    print(f"| {r['data']} | {r['n_private']} | {rel} | {eps:g} | "
                          f"{r['private']:.3f} | {r['nonprivate']:.3f} | {r['public_only']:.3f} | "
                          f"{r['ratio']:.2f} | {refused} |", flush=True)
    if args.json:
        print(json.dumps({"rows": out, "repeats": args.repeats, "seconds": time.time() - t0}))
    else:
        print(f"{args.repeats} repeats per row; {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
