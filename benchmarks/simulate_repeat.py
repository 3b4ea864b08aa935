"""Run `dpfed simulate` (its defaults) N times and count private >= public-only (issue 9).

    python benchmarks/simulate_repeat.py [--runs 20] [-- extra simulate args]

With the defaults every run uses the same split (seed 0); the DP noise differs (OpenDP draws
it from the OS CSPRNG). Prints one line per run and a summary; --json for machines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("extra", nargs="*", help="arguments passed to dpfed simulate")
    args = ap.parse_args(argv)
    rows = []
    for i in range(args.runs):
        t = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "dpfed_apps.cli", "simulate", "--json",
                              *args.extra], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout)
        m = r["metrics"]
        rows.append({"private": m["spearman_private"], "public_only": m["spearman_public_only"],
                     "nonprivate": m["spearman_nonprivate"], "seconds": time.monotonic() - t,
                     "verdict": r.get("information", {}).get("verdict")})
        if not args.json:
            print(f"run {i + 1:2d}: private {rows[-1]['private']:+.3f}  public-only "
                  f"{rows[-1]['public_only']:+.3f}  non-private {rows[-1]['nonprivate']:+.3f}  "
                  f"{rows[-1]['seconds']:.1f} s  ({rows[-1]['verdict']})", flush=True)
    wins = sum(r["private"] >= r["public_only"] for r in rows)
    summary = {"runs": len(rows), "private_ge_public_only": wins,
               "private_mean": statistics.mean(r["private"] for r in rows),
               "private_min": min(r["private"] for r in rows),
               "public_only": rows[0]["public_only"], "nonprivate": rows[0]["nonprivate"],
               "median_seconds": statistics.median(r["seconds"] for r in rows), "rows": rows}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"private >= public-only in {wins} of {len(rows)} runs; private mean "
              f"{summary['private_mean']:.3f} (min {summary['private_min']:.3f}), public-only "
              f"{summary['public_only']:.3f}, non-private {summary['nonprivate']:.3f}; median "
              f"{summary['median_seconds']:.1f} s per run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
