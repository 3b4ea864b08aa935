"""Time the eps-DP release against computing X^T X alone (method.md section 2).

    /work/venv/bin/python benchmarks/bench_release.py [--json] [--repeat 7] [--quick]

For each (n, d) it reports the median and minimum wall time of ``release_statistics``
(clip + X^T X, X^T y, y^T y + OpenDP Laplace noise on d(d+1)/2 + d + 1 values), of
``x.T @ x`` alone and their ratio (target: release <= 2.5 x X^T X at n = 1e5, d = 64), plus
the split into the fused clip/accumulate pass and the OpenDP sampling. The machine's load
average is printed because other processes on a 2-core box distort the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics as st
import time

import numpy as np

from site_node.laplace import add_laplace_noise
from site_node.release import clipped_statistics, release_statistics
from site_node.sensitivity import noise_calibration

GRID = [(n, d) for n in (1_000, 10_000, 100_000) for d in (10, 64, 100)]


def timeit(fn, repeat):
    fn()  # warm-up (and OpenDP measurement cache)
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return st.median(ts), min(ts)


def bench(n, d, repeat):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, d)) / np.sqrt(d)
    y = rng.normal(size=n)
    kw = dict(epsilon=1.0, x_bound=0.2, y_bound=1.5)
    rel_med, rel_min = timeit(lambda: release_statistics(x, y, **kw), repeat)
    xtx_med, xtx_min = timeit(lambda: x.T @ x, repeat)
    stats_med, _ = timeit(lambda: clipped_statistics(x, y, 0.2, 1.5), repeat)
    cal = noise_calibration(d, 1.0, 0.2, 1.5)
    upper = np.zeros(d * (d + 1) // 2)
    noise_med, _ = timeit(lambda: add_laplace_noise(upper, cal.xtx_sensitivity, cal.xtx_epsilon), repeat)
    return dict(n=n, d=d, release_ms=rel_med * 1e3, release_min_ms=rel_min * 1e3,
                xtx_ms=xtx_med * 1e3, xtx_min_ms=xtx_min * 1e3, ratio=rel_med / xtx_med,
                ratio_min=rel_min / xtx_min, clipped_stats_ms=stats_med * 1e3,
                opendp_xtx_noise_ms=noise_med * 1e3)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="only n = 1e5, d = 64")
    args = ap.parse_args(argv)
    grid = [(100_000, 64)] if args.quick else GRID
    load_before = os.getloadavg()
    rows = [bench(n, d, args.repeat) for n, d in grid]
    meta = dict(cpus=os.cpu_count(), loadavg_before=load_before, loadavg_after=os.getloadavg())
    if args.json:
        print(json.dumps({**meta, "results": rows}, indent=2))
        return
    print(f"release_statistics vs X^T X; {meta['cpus']} CPUs, load average "
          f"{load_before[0]:.2f} -> {meta['loadavg_after'][0]:.2f}; median (min) of {args.repeat}\n")
    print("| n | d | release ms | X^T X ms | ratio | clip+stats ms | OpenDP Sxx noise ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']:,} | {r['d']} | {r['release_ms']:.1f} ({r['release_min_ms']:.1f}) | "
              f"{r['xtx_ms']:.1f} ({r['xtx_min_ms']:.1f}) | {r['ratio']:.2f} ({r['ratio_min']:.2f}) | "
              f"{r['clipped_stats_ms']:.1f} | {r['opendp_xtx_noise_ms']:.1f} |")


if __name__ == "__main__":
    main()
