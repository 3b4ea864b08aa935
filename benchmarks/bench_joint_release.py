"""Time the site's joint release (issue 23): 262 targets x d = 10 at n = 1e5 on one core.

    OPENBLAS_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/bench_joint_release.py \
        [--n 100000] [--d 10] [--m 262] [--missing 0.18] [--repeat 5] [--json]

Target: ``site_node.joint_release.release_joint_statistics`` <= 1 s on one core (BLAS held to
one thread; the release itself is single-threaded except Laplace's chunked Sxx sampling, which
at d = 10 is one chunk). Reports, per mechanism (laplace, gaussian), the median and minimum wall
and process-CPU time of the whole release, of the exact clipped pass alone
(``joint_clipped_statistics``) and of the lead's vectorised ``dpfed.joint_statistics.
joint_exact_statistics`` for comparison, plus the load average (2 shared cores: timings are
noisy). The data: features N(0, 1), responses N(0, 1.5^2) with a share ``--missing`` of cells
NaN (GDSC fills 82 % of the patient x drug matrix). The noise is OpenDP's CSPRNG, never seeded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics as st
import time

import numpy as np

from dpfed.joint_noise import joint_calibration
from dpfed.joint_statistics import joint_exact_statistics
from site_node.joint_release import joint_clipped_statistics, release_joint_statistics


def timeit(fn, repeat):
    fn()   # warm-up: OpenDP's measurement cache, page faults
    wall, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {"wall_median": st.median(wall), "wall_min": min(wall),
            "cpu_median": st.median(cpu), "cpu_min": min(cpu)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=10)
    ap.add_argument("--m", type=int, default=262)
    ap.add_argument("--missing", type=float, default=0.18)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    data_rng = np.random.default_rng(0)   # synthetic data only; never noise
    x = data_rng.normal(size=(args.n, args.d))
    y = 1.5 * data_rng.normal(size=(args.n, args.m))
    y[data_rng.random(y.shape) < args.missing] = np.nan
    rows = {}
    bx, by = 2.0, 3.0
    rows["clipped pass (joint_clipped_statistics)"] = timeit(
        lambda: joint_clipped_statistics(x, y, bx, by), args.repeat)
    rows["vectorised exact (joint_exact_statistics)"] = timeit(
        lambda: joint_exact_statistics(x, y, bx, by), args.repeat)
    for mechanism, delta in (("laplace", 0.0), ("gaussian", 1e-6)):
        cal = joint_calibration(args.d, args.m, mechanism=mechanism, epsilon=2.0, delta=delta,
                                x_bound=bx, y_bound=by)
        rows[f"release {mechanism}"] = timeit(lambda: release_joint_statistics(x, y, cal),
                                              args.repeat)
    out = {"n": args.n, "d": args.d, "m": args.m, "missing": args.missing,
           "loadavg": os.getloadavg(), "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
           "rows": rows}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"n = {args.n}, d = {args.d}, m = {args.m}, missing {args.missing:.0%}, "
          f"OPENBLAS_NUM_THREADS={out['blas_threads']}, load {out['loadavg']}")
    print(f"{'':45s} {'wall med':>9s} {'wall min':>9s} {'cpu med':>9s}")
    for name, r in rows.items():
        print(f"{name:45s} {r['wall_median']:9.3f} {r['wall_min']:9.3f} {r['cpu_median']:9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
