"""Issue 9's GDSC targets from a `dpfed evaluate` results.csv (paired on (drug, repeat)).

    python benchmarks/gdsc_targets.py results/full/results.csv [--json]

For every robust_private cell (eps, K, aggregation, n): its mean Spearman, the public-only mean (n = 0)
over the *same* (drug, repeat) cells (the n = 0 row of summary.md averages over every drug,
the n > 300 rows over fewer), the paired difference with its standard error, the non-private
mean on the same cells and the private / non-private ratio. Targets: difference >= -0.005 at
every n >= 100; ratio >= 0.65 (eps 2) and >= 0.50 (eps 1) at n = 700, K = 1.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    public, nonpriv, priv = {}, {}, defaultdict(dict)
    relation = set()
    with open(args.csv) as fh:
        for r in csv.DictReader(fh):
            if r["error"] or r["spearman"] in ("", "nan"):
                continue
            key = (int(r["drug"]), int(r["repeat"]))
            v = float(r["spearman"])
            if not math.isfinite(v):
                continue
            relation.add(r.get("neighbouring", ""))
            n = int(r["n_private"])
            if r["method"] == "robust_private" and n == 0 and r["sites"] == "1" and \
                    r["epsilon"] == "1.0":
                public[key] = v
            elif r["method"] == "nonprivate" and n > 0:
                nonpriv[(key, n)] = v
            elif r["method"] == "robust_private" and n > 0:
                agg = r.get("aggregation") or "independent"   # older files: independent only
                priv[(float(r["epsilon"]), int(r["sites"]), agg, n)][key] = v
    rows = []
    for (eps, k, agg, n), cells in sorted(priv.items()):
        keys = [c for c in cells if c in public and (c, n) in nonpriv]
        if len(keys) < 2:
            continue
        diffs = [cells[c] - public[c] for c in keys]
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        d = mean(diffs)
        se = math.sqrt(sum((x - d) ** 2 for x in diffs) / (len(diffs) - 1) / len(diffs))
        p, q, npv = mean([cells[c] for c in keys]), mean([public[c] for c in keys]), \
            mean([nonpriv[(c, n)] for c in keys])
        rows.append({"epsilon": eps, "sites": k, "aggregation": agg, "n": n, "cells": len(keys), "private": p,
                     "public_only": q, "difference": d, "se": se, "nonprivate": npv,
                     "ratio": p / npv if npv else float("nan"),
                     "meets_public_target": d >= -0.005})
    if args.json:
        print(json.dumps({"neighbouring": sorted(relation), "rows": rows}, indent=1))
        return 0
    print(f"neighbouring: {', '.join(sorted(relation))}")
    print("| eps | K | aggregation | n | cells | private | public-only (same cells) | difference ± se | "
          "non-private | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        flag = "" if r["meets_public_target"] else " **below**"
        print(f"| {r['epsilon']:g} | {r['sites']} | {r['aggregation']} | {r['n']} | {r['cells']} | "
              f"{r['private']:.3f} | {r['public_only']:.3f} | {r['difference']:+.3f} ± "
              f"{r['se']:.3f}{flag} | {r['nonprivate']:.3f} | {r['ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
