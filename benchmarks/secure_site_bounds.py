"""Diagnostic for issue 10: K-site secure aggregation with the clipping bounds of the *smallest
site* (``choose_bounds(n // K, ...)``, what independent releases use) instead of the total n
(``dpfed_apps.evaluation.protocol.bounds_size``, the default of ``dpfed evaluate``: the secure
sum carries one noise draw over n rows, the trade-off of a single site with n rows).

    python benchmarks/secure_site_bounds.py --drugs 60 --repeats 5 --out /tmp/secevel-sitebounds
    python benchmarks/secure_vs_single.py /tmp/secevel-sitebounds/results.csv

Runs the ``dpfed evaluate`` grid (robust_private and nonprivate, K in {1, 10}) in this process
(serial executor) with ``bounds_size`` replaced, and writes the usual report into ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dpfed_apps.evaluation.protocol as protocol  # noqa: E402
import dpfed_apps.evaluation.runner as runner  # noqa: E402


def smallest_site_bounds(n: int, k: int, aggregation: str = "independent") -> int:
    return protocol.site_size(n, k)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drugs", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sites", type=int, default=10)
    ap.add_argument("--neighbouring", default="add_remove")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    from dpfed_apps.evaluation.executor import SerialExecutor
    from dpfed_apps.evaluation.report import write_report

    protocol.bounds_size = runner.bounds_size = smallest_site_bounds
    t0 = time.monotonic()
    config = protocol.ProtocolConfig(repeats=args.repeats, sites=(1, args.sites),
                                     neighbouring=args.neighbouring)
    drugs = protocol.eligible_drugs(config.min_lines)[:args.drugs]
    bounds = protocol.bounds_table(config, len(config.features),
                                   cache_dir=args.out / "bounds-cache")
    tasks = runner.plan_tasks(drugs, config, ("robust_private", "nonprivate"), bounds)
    with SerialExecutor() as ex:
        rows = runner.run_grid(tasks, ex, lambda d, t, r: print(
            f"[site-bounds] {d}/{t} tasks", file=sys.stderr, flush=True) if d % 10 == 0 else None)
    wall = time.monotonic() - t0
    write_report(rows, args.out, wall_s=wall,
                 command="python benchmarks/secure_site_bounds.py " + " ".join(argv or sys.argv[1:]))
    print(f"{len(rows)} rows in {args.out}/results.csv; wall {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
