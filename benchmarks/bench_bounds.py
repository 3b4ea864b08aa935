"""Time ``dpfed.bounds.choose_bounds`` (Nieminen 2017, section 3.4 threshold search).

    /work/venv/bin/python benchmarks/bench_bounds.py [--json] [--repeat 3]
    /work/venv/bin/python benchmarks/bench_bounds.py --table [--repeat 10]

Each case runs the full 20 x 20 omega grid with 20 auxiliary data sets x 20 noise draws (the
defaults) and clears the in-memory cache first, so it measures the computation, not the cache.

``--table``: ``dpfed.bounds.choose_bounds_table`` for one protocol repeat's 48 cells (n 100..800,
K 1/3/10, eps 1/2; replace-one, row-norm bound) on auxiliary data shaped like the public lines
of repeats 0.. of GDSC drug 1047, no cache (what `dpfed evaluate` runs once per repeat).
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


def bench_table(repeat):
    from dpfed.auxiliary import AuxiliarySource
    from dpfed.bounds import choose_bounds_table
    from dpfed_apps.evaluation.protocol import ProtocolConfig, load_problem, prepare_repeat

    cfg = ProtocolConfig(neighbouring="replace_one")
    problem = load_problem(1047, cfg)
    cells = [(n, k) for n in range(100, 801, 100) for k in (1, 3, 10)]
    times = []
    for r in range(repeat):
        data = prepare_repeat(problem, cfg, 1047, r)
        src = AuxiliarySource(data.x_public_raw, data.y_public_raw, data.preprocessing,
                              feature_names=cfg.features)
        t = time.perf_counter()
        choose_bounds_table(src, cells, (1.0, 2.0), neighbouring="replace_one", x_norm_bound=1.0,
                            seed=r)
        times.append(time.perf_counter() - t)
    times.sort()
    print(f"choose_bounds_table, 48 cells, 6 populations x 3 noise draws: median "
          f"{1000 * times[len(times) // 2]:.0f} ms, min {1000 * times[0]:.0f} ms, max "
          f"{1000 * times[-1]:.0f} ms over {repeat} repeats")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--table", action="store_true", help="time choose_bounds_table instead")
    args = ap.parse_args(argv)
    if args.table:
        bench_table(args.repeat)
        return
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
