"""Where does accuracy go at large n? Ablations of a round's pipeline (issue 21 item 1).

    python benchmarks/large_n.py [--splits 6] [--n 15737] [--eps 2] [--data synth,airfoil,...]

Each split: 300 held-out test rows, 30 public rows, n private rows (one site; a secure round
of K sites carries one noise draw on the sum, the same law as one site's release of the pooled
rows, so K = 1 and K = 10 secure share these figures). Continuous features: columns scaled by
their public sd, centred with the public means, no row normalisation (as benchmarks/uci.py).

Data: ``synth`` (d = 10, shaped like real tabular data: correlated latent factors, skewed
(log-normal) and heavy-tailed (t3) columns, a 0/1 column, R^2 about 0.5, skewed noise);
the UCI sets of ../shared/data/uci with the private pool *replicated with jitter* (each copy
+ N(0, (0.05 sd)^2) per column) up to n rows; the test and public rows are original rows not
in the pool.

Variants (all on the same split and, where a release is used, the same release):
- nonprivate: exact statistics of the unclipped private + public rows, exact model;
- chosen: the round's bounds (dpfed.bounds.choose_bounds_table on auxiliary data shaped like
  the public rows), OpenDP release at eps, noise-aware fit with y_unit = B_y (what a round does);
- chosen_plugin: the same release, plug-in fit;
- chosen_exact: the same bounds, the exact clipped statistics (eps -> infinity), exact model;
- chosen_eps50: the same bounds, eps 50;
- oracle: best test score over a grid of bounds at eps (not a valid method: an upper bound on
  what the bound choice can buy), with the noise-aware fit.
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

ORACLE_OMX = (0.3, 1.0, 2.0, 3.2, 5.0, 8.0)
ORACLE_OMY = (0.7, 1.0, 1.4, 2.0, 3.0, 5.0)


def synth(rng, rows, d=10):
    k = 3
    load = rng.standard_normal((k, d))
    f = rng.standard_normal((rows, k))
    x = f @ load + rng.standard_normal((rows, d))
    x[:, 0] = np.exp(0.8 * x[:, 0] / x[:, 0].std())                  # log-normal
    x[:, 1] = np.exp(0.5 * x[:, 1] / x[:, 1].std())
    x[:, 2] = x[:, 2] + rng.standard_t(3, rows)                       # heavy tails
    x[:, 3] = (x[:, 3] > 0.5).astype(float)                           # 0/1
    x[:, 4] = np.round(x[:, 4])                                       # integer grades
    beta = rng.standard_normal(d)
    s = (x - x.mean(0)) / x.std(0) @ beta
    noise = rng.gamma(2.0, 1.0, rows)
    noise = (noise - noise.mean()) / noise.std()
    y = 10 + 3 * (s / s.std() + noise)                                # R^2 = 0.5, skewed noise
    return x, y


def load_uci(name):
    from uci import load

    _, x, y = load(ROOT.parent / "shared" / "data" / "uci" / f"{name}.csv")
    return x, y


def make_split(data, n, rng, m=30):
    """(x_pub, y_pub, x_priv, y_priv, x_test, y_test)."""
    if data == "synth":
        x, y = synth(rng, n + 300 + m)
        return x[:m], y[:m], x[300 + m:], y[300 + m:], x[m:300 + m], y[m:300 + m]
    x, y = load_uci(data)
    perm = rng.permutation(len(y))
    test, pub, pool = perm[:300], perm[300:300 + m], perm[300 + m:]
    idx = rng.choice(pool, size=n, replace=True)
    idx[:len(pool)] = pool                                            # every pool row once
    sd = x[pool].std(axis=0)
    sdy = y[pool].std()
    xq = x[idx] + 0.05 * sd * rng.standard_normal((n, x.shape[1]))
    yq = y[idx] + 0.05 * sdy * rng.standard_normal(n)
    return x[pub], y[pub], xq, yq, x[test], y[test]


def run_split(data, n, eps, rng, neighbouring, variants, product=False, m=30,
              scale_columns=True):
    from posterior import fit_posterior, PosteriorError
    from dpfed.auxiliary import AuxiliarySource
    from dpfed.bounds import choose_bounds_table
    from dpfed.metrics import spearman
    from dpfed.preprocess import Preprocessing
    from dpfed.statistics import clipped_exact_statistics, exact_statistics
    from site_node.release import release_statistics

    xp, yp, xq, yq, xt, yt = make_split(data, n, rng, m)
    if product:
        # What a round (coordinator.roundspec) and `dpfed simulate --data FILE` do: the public
        # pre-processing of raw columns (public column scales unless --raw-columns, the code
        # before issue 21), rows normalised, the row-norm bound R = 1.
        scale = np.ones(xp.shape[1])
        pre = Preprocessing.from_public_data(xp, yp, normalize_rows=True,
                                             scale_columns=scale_columns)
    else:
        # benchmarks/uci.py's setting: columns divided by their public sd, no row norm.
        scale = xp.std(axis=0, ddof=1)
        scale[scale == 0] = 1.0
        pre = Preprocessing.from_public_data(xp / scale, yp, normalize_rows=False)
    norm = 1.0 if product else None
    zp, ypc = pre.apply(xp / scale, yp)
    zq, yqc = pre.apply(xq / scale, yq)
    zt = pre.transform_x(xt / scale)
    source = AuxiliarySource(xp / scale, yp, pre)
    sx, sy = source.scales()
    t0 = time.perf_counter()
    table = choose_bounds_table(source, [(n, 1)], [eps], neighbouring=neighbouring,
                                x_norm_bound=norm)
    t_search = time.perf_counter() - t0
    ch = table[(n, 1, float(eps))]
    bx, by = ch.bounds(sx, sy)
    out = {"omega_x": ch.omega_x, "omega_y": ch.omega_y, "sxx_share": ch.budget_split[0],
           "search_s": t_search}

    def score(m):
        return float(spearman(m.predict(zt), yt))

    def private(bx_, by_, eps_, split, plug_in=False, method="auto"):
        public = clipped_exact_statistics(zp, ypc, bx_, by_, norm)
        if eps_ == float("inf"):
            stats = clipped_exact_statistics(np.vstack([zq, zp]), np.concatenate([yqc, ypc]),
                                             bx_, by_, norm)
            return fit_posterior(stats, y_unit=by_, draws=1000, seed=0)
        rel = release_statistics(zq, yqc, epsilon=eps_, x_bound=bx_, y_bound=by_,
                                 budget_split=split, neighbouring=neighbouring,
                                 x_norm_bound=norm)
        return fit_posterior(rel + public, public=public, x_bound=bx_, y_unit=by_, draws=1000,
                             seed=0, plug_in=plug_in, method=method)

    out["nonprivate"] = score(fit_posterior(
        exact_statistics(np.vstack([zq, zp]), np.concatenate([yqc, ypc])), draws=1000, seed=0))
    out["public_only"] = score(fit_posterior(clipped_exact_statistics(zp, ypc, bx, by, norm),
                                             y_unit=by, draws=1000, seed=0))
    split = ch.budget_split
    for v in variants:
        try:
            if v == "chosen":
                out[v] = score(private(bx, by, eps, split))
            elif v == "chosen_plugin":
                out[v] = score(private(bx, by, eps, split, plug_in=True))
            elif v == "chosen_exact":
                out[v] = score(private(bx, by, float("inf"), split))
            elif v == "chosen_eps50":
                out[v] = score(private(bx, by, 50.0, split))
            elif v == "oracle":
                best = (-2.0, None)
                for ox in ORACLE_OMX:
                    for oy in ORACLE_OMY:
                        # Laplace only (no NUTS fallback: 36 fits per split); a refused
                        # candidate is skipped.
                        try:
                            s = score(private(ox * sx, oy * sy, eps, split, method="laplace"))
                        except PosteriorError:
                            continue
                        best = max(best, (s, (ox, oy)))
                out[v], out["oracle_omegas"] = best
            elif v == "oracle_exact":
                best = (-2.0, None)
                for ox in ORACLE_OMX:
                    for oy in ORACLE_OMY:
                        s = score(private(ox * sx, oy * sy, float("inf"), split))
                        best = max(best, (s, (ox, oy)))
                out[v], out["oracle_exact_omegas"] = best
        except PosteriorError as exc:
            out[v] = float("nan")
            print(f"  {v}: refused ({exc})", file=sys.stderr)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="synth,airfoil_self_noise,concrete_strength,wine_quality_red")
    ap.add_argument("--n", type=int, default=15737)
    ap.add_argument("--eps", type=float, default=2.0)
    ap.add_argument("--splits", type=int, default=6)
    ap.add_argument("--neighbouring", default="add_remove")
    ap.add_argument("--variants", default="chosen,chosen_plugin,chosen_exact,chosen_eps50,oracle")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--public", type=int, default=30)
    ap.add_argument("--raw-columns", action="store_true",
                    help="no public per-column scaling (with --product: dpfed simulate today)")
    ap.add_argument("--product", action="store_true",
                    help="raw columns, rows normalised, row-norm bound (dpfed simulate's setting)")
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    t0 = time.time()
    cols = ["nonprivate", "public_only"] + variants
    print("| data | n | eps | omega_x, omega_y, Sxx share (chosen) | "
          + " | ".join(cols) + " | chosen / nonprivate |")
    print("|" + "---|" * (len(cols) + 5))
    for data in args.data.split(","):
        rng = np.random.default_rng(args.seed)
        rows = [run_split(data, args.n, args.eps, rng, args.neighbouring, variants,
                          args.product, args.public, not args.raw_columns)
                for _ in range(args.splits)]
        for r in rows:
            print("  split:", {k: (round(v, 3) if isinstance(v, float) else v)
                               for k, v in r.items()}, file=sys.stderr, flush=True)
        mean = {c: float(np.nanmean([r[c] for r in rows])) for c in cols}
        om = sorted({(r["omega_x"], r["omega_y"], r["sxx_share"]) for r in rows})
        print(f"| {data} | {args.n} | {args.eps:g} | {om} | "
              + " | ".join(f"{mean[c]:.3f}" for c in cols)
              + f" | {mean.get('chosen', float('nan')) / mean['nonprivate']:.3f} |", flush=True)
    print(f"{args.splits} splits; {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
