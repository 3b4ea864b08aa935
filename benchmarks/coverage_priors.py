"""Priors and design priors compared on the same problems (issue 21 item 2; paired).

    nice -n 10 python benchmarks/coverage_priors.py [--reps 60] [--cells a,b,c,e,f]
        [--configs gamma,gamma+n,scaled,scaled+n,total,total+n]

The five diagnostic cells of docs/evaluation.md ("The candidate fixes, measured"): a = d 5,
n 500, eps 0.5, K 1; b = d 5, n 500, eps 2, K 10; c = d 5, n 100, eps 0.5, K 10; e = d 10,
n 100, eps 1, K 1; f = d 10, n 2000, eps 0.5, K 10. Each problem is drawn once
(``benchmarks/coverage_product.py``'s ``problem``, seed 0: the grid's problems of the cell; the
bound search dominates the cost) and fitted under every configuration (the Laplace fit without its NUTS fallback: a refusal is counted, not
refitted for minutes): a prior of
``posterior.noise_aware.PRIORS`` (``coverage_product.set_prior``), with "+n" the released
count's noise in the design prior (``coverage_product.with_count_noise``). Prints, per cell and
configuration, the noise-aware coverage of the clipped population coefficients, the mean
90 % width and the noise-free posterior's coverage under the same prior.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CELLS = {"a": (5, 500, 0.5, 1), "b": (5, 500, 2.0, 10), "c": (5, 100, 0.5, 10),
         "e": (10, 100, 1.0, 1), "f": (10, 2000, 0.5, 10)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--cells", default="a,b,c,e,f")
    ap.add_argument("--configs", default="gamma,gamma+n,scaled,scaled+n,total,total+n")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from benchmarks import coverage_product as bench
    from posterior import PosteriorError, fit_posterior

    # ";" separates configurations when one carries hyperparameters ("gamma:2,1,2,1+n").
    configs = args.configs.split(";" if ";" in args.configs else ",")
    t0 = time.time()
    print("| cell | d | n | eps | K | " + " | ".join(configs) + " |")
    print("|" + "---|" * (5 + len(configs)))
    for cell in args.cells.split(","):
        d, n, eps, k = CELLS[cell]
        rng = np.random.default_rng([args.seed, d, n, int(eps * 10), k])
        hit = {c: [] for c in configs}
        wid = {c: [] for c in configs}
        free = {c: [] for c in configs}
        failed = {c: 0 for c in configs}
        for r in range(args.reps):
            p = bench.problem(rng, d, n, eps, k, ["bound"])
            unit = p["units"]["bound"]
            for c in configs:
                prior, plus_n = c.removesuffix("+n"), c.endswith("+n")
                bench.set_prior(prior)
                bench.set_design_sd("product+n" if plus_n else "product")
                try:
                    post = fit_posterior(p["release"] + p["public"], public=p["public"],
                                         x_bound=p["bx"], y_unit=unit, draws=1000, seed=r,
                                         fallback=None)
                    ref = fit_posterior(p["exact"] + p["public"], y_unit=unit, draws=1000,
                                        seed=r, fallback=None)
                except PosteriorError:
                    failed[c] += 1
                    continue
                lo, hi = post.credible_interval(0.9).T
                lo0, hi0 = ref.credible_interval(0.9).T
                bp = p["beta_pop"]
                hit[c].append((bp >= lo) & (bp <= hi))
                free[c].append((bp >= lo0) & (bp <= hi0))
                wid[c].append(np.mean(hi - lo))
        cols = [f"{np.mean(hit[c]):.3f} ({np.mean(wid[c]):.2f}; free {np.mean(free[c]):.3f}"
                + (f"; {failed[c]} refused" if failed[c] else "") + ")" for c in configs]
        print(f"| {cell} | {d} | {n} | {eps:g} | {k} | " + " | ".join(cols) + " |", flush=True)
    print(f"{args.reps} problems per cell; {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
