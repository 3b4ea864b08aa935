"""Coverage of 90 % credible intervals on synthetic data from the model's prior (issue 9).

    python benchmarks/bench_coverage.py [--reps 200] [--y-unit bound] [--out docs/coverage.md]

Grid: d in {5, 10}, n in {100, 500, 2000}, eps in {0.5, 1, 2}, K in {1, 10}; the noise-aware
fit (default) and the plug-in fit side by side (dpfed_apps.evaluation.coverage); then a clipped
case.
``--y-unit bound`` fits with the priors in units of the y bound, as a round does. Prints a
markdown table.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dpfed_apps.evaluation.coverage import coverage  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--y-unit", choices=("data", "bound", "rms"), default="data",
                    help="the priors' unit of y: the data's own (the model's setting), the "
                         "y bound (what a round fits with), or the root mean square of y "
                         "that the released statistics imply (a candidate)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    unit = None if args.y_unit == "data" else args.y_unit
    t0 = time.time()
    lines = ["| d | n | eps | K | noise-aware | plug-in | width (noise-aware) | refused fits |",
             "|---|---|---|---|---|---|---|---|"]
    for d, n, eps, k in itertools.product((5, 10), (100, 500, 2000), (0.5, 1.0, 2.0), (1, 10)):
        a = coverage(d, n, eps, k, args.reps, y_unit=unit)
        p = coverage(d, n, eps, k, args.reps, plug_in=True, y_unit=unit)
        lines.append(f"| {d} | {n} | {eps:g} | {k} | {a['coverage']:.3f} | {p['coverage']:.3f} "
                     f"| {a['width']:.2f} | {a['failed'] + p['failed']} |")
        print(lines[-1], flush=True)
    lines += ["", "Clipped target (By = max|y| / 3): coverage of the generating beta and of the "
              "clipped data's least-squares coefficients.", "",
              "| d | n | eps | K | generating beta | clipped-data beta |", "|---|---|---|---|---|---|"]
    for d, n, eps, k in ((5, 500, 1.0, 1), (5, 2000, 2.0, 1), (10, 2000, 1.0, 1)):
        a = coverage(d, n, eps, k, args.reps, clip=True, y_unit=unit)
        lines.append(f"| {d} | {n} | {eps:g} | {k} | {a['coverage']:.3f} | "
                     f"{a['coverage_clipped']:.3f} |")
        print(lines[-1], flush=True)
    lines.append(f"\n{args.reps} problems per cell; priors in units of "
                 f"{ {None: 'y', 'bound': 'the y bound', 'rms': 'the released rms of y'}[unit]}; "
                 f"{time.time() - t0:.0f} s.")
    text = "\n".join(lines)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
