"""The utility cost of pricing secure rounds' row cap (issue 19, item 3).

A secure round no longer refuses a site with more usable rows than ``max_site_rows``: the site
keeps that many (site_node.rows), and the noise is calibrated for neighbours that may differ
by a replacement (``dpfed.sensitivity.capped_relation``: Sxy 2 d t By instead of d t By, and
with the row-norm bound Sxx min(d(d+1)/2 Bx^2, d(d+1) t^2) instead of d(d+1)/2 t^2).

    python benchmarks/row_cap_cost.py --drugs 30 --repeats 3 --out /tmp/rowcap

Runs robust_private with K sites and secure aggregation (T = K, the ``dpfed evaluate``
default bounds) twice on the same splits and seeds: with the row-cap calibration (what
production does) and without it (before), and prints, per (eps, n), the mean Spearman of
each and the paired difference (capped - uncapped) with its standard error, plus the
public-only fit (n = 0) for context. Also the noise scales of one cell (d = 10, eps 1).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import evaluation.methods.robust_private as robust_private  # noqa: E402
import evaluation.protocol as protocol  # noqa: E402
import evaluation.runner as runner  # noqa: E402
from dpfed.sensitivity import noise_calibration  # noqa: E402


def _run(config, drugs, bounds, row_cap: bool) -> list[dict]:
    from evaluation.executor import SerialExecutor

    def calibration(*args, **kw):
        kw["row_cap"] = row_cap
        return noise_calibration(*args, **kw)

    robust_private.noise_calibration = calibration
    try:
        tasks = runner.plan_tasks(drugs, config, ("robust_private",), bounds)
        with SerialExecutor() as ex:
            return runner.run_grid(tasks, ex)
    finally:
        robust_private.noise_calibration = noise_calibration


def _cells(rows, k: int) -> dict:
    out = defaultdict(dict)
    for r in rows:
        if r["method"] != "robust_private" or r.get("error"):
            continue
        rho = float(r["spearman"])
        if not math.isfinite(rho):
            continue
        n = int(r["n_private"])
        if n and int(r["sites"]) != k:
            continue
        out[(float(r["epsilon"]), n)][(int(r["drug"]), int(r["repeat"]))] = rho
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drugs", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sites", type=int, default=10)
    ap.add_argument("--sizes", default="0,100,300,500,700")
    ap.add_argument("--epsilons", default="1,2")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    t0 = time.monotonic()
    config = protocol.ProtocolConfig(repeats=args.repeats, sites=(args.sites,),
                                     aggregations=("secure",),
                                     sizes=tuple(int(v) for v in args.sizes.split(",")),
                                     epsilons=tuple(float(v) for v in args.epsilons.split(",")))
    drugs = protocol.eligible_drugs(config.min_lines)[:args.drugs]
    bounds = protocol.bounds_table(config, len(config.features))
    capped = _cells(_run(config, drugs, bounds, True), args.sites)
    plain = _cells(_run(config, drugs, bounds, False), args.sites)
    lines = []
    for eps, n in sorted(capped):
        if n == 0:
            continue
        a, b = capped[(eps, n)], plain.get((eps, n), {})
        common = sorted(set(a) & set(b))
        diffs = [a[c] - b[c] for c in common]
        m = sum(diffs) / len(diffs)
        se = math.sqrt(sum((x - m) ** 2 for x in diffs) / (len(diffs) - 1) / len(diffs))
        pub = capped.get((eps, 0), {})
        lines.append({"epsilon": eps, "n": n, "cells": len(common),
                      "capped": sum(a[c] for c in common) / len(common),
                      "uncapped": sum(b[c] for c in common) / len(common),
                      "diff": m, "se": se,
                      "public_only": (sum(pub[c] for c in common if c in pub)
                                      / max(1, sum(1 for c in common if c in pub)))})
    d = len(config.features)
    scales = {}
    for cap in (False, True):
        cal = noise_calibration(d, 1.0, 1.0, 1.0, x_norm_bound=1.0, row_cap=cap)
        scales["row_cap" if cap else "plain"] = {"xtx": cal.xtx_scale, "xty": cal.xty_scale,
                                                "yty": cal.yty_scale, "n": cal.n_scale}
    print(f"K = {args.sites} secure, {len(drugs)} drugs x {args.repeats} repeats, "
          f"{time.monotonic() - t0:.0f} s")
    print("eps    n  cells  capped  uncapped  capped-uncapped (se)  public-only")
    for r in lines:
        print(f"{r['epsilon']:3g} {r['n']:4d} {r['cells']:6d}  {r['capped']:.4f}  "
              f"{r['uncapped']:.4f}    {r['diff']:+.4f} ({r['se']:.4f})       "
              f"{r['public_only']:.4f}")
    print("noise scales at d = %d, eps 1, Bx = R = 1, By = 1: %s" % (d, json.dumps(scales)))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "row_cap_cost.json").write_text(json.dumps(
            {"cells": lines, "scales": scales}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
