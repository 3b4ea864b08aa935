"""Time ``dpfed.bounds.choose_bounds`` (Nieminen 2017, section 3.4 threshold search).

    /work/venv/bin/python benchmarks/bench_bounds.py [--json] [--repeat 3]

Each case runs the full 20 x 20 omega grid with 20 auxiliary data sets x 20 noise draws (the
defaults) and clears the in-memory cache first, so it measures the computation, not the cache.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

from dpfed.bounds import choose_bounds

CASES = [(100, 10, 1.0), (800, 10, 1.0), (800, 10, 2.0), (5000, 10, 1.0), (800, 30, 1.0)]


def bench(n, d, eps, repeat):
    times = []
    for r in range(repeat):
        choose_bounds.cache_clear()
        t = time.perf_counter()
        res = choose_bounds(n, d, eps, seed=r)
        times.append(time.perf_counter() - t)
    return dict(n=n, d=d, epsilon=eps, seconds_min=min(times), seconds_median=sorted(times)[len(times) // 2],
                omega_x=res.omega_x, omega_y=res.omega_y, best_score=res.best_score)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    rows = [bench(n, d, e, args.repeat) for n, d, e in CASES]
    if args.json:
        print(json.dumps({"machine": platform.processor() or platform.machine(),
                          "cpus": os.cpu_count(), "results": rows}, indent=2))
        return
    print(f"choose_bounds, 20x20 grid, 20 data sets x 20 noise draws ({os.cpu_count()} CPUs)\n")
    print("| n | d | eps | min s | median s | omega_x | omega_y | best Spearman |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['d']} | {r['epsilon']} | {r['seconds_min']:.2f} | "
              f"{r['seconds_median']:.2f} | {r['omega_x']} | {r['omega_y']} | {r['best_score']:.3f} |")


if __name__ == "__main__":
    main()
