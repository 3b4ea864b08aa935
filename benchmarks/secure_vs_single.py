"""Issue 10's utility target from a ``dpfed evaluate`` results.csv: "K = 10 secure within 0.01
of K = 1 at every (n, eps)".

    python benchmarks/secure_vs_single.py /tmp/secevel-60/results.csv [--k 10] [--json]

For every (eps, n >= 1) it pairs robust_private's cells on the same (drug, repeat): K sites with
secure aggregation vs one site (K = 1), and vs K sites with independent releases, and reports
the mean paired difference of Spearman correlations with its standard error (sd of the
per-cell differences / sqrt(cells); cells of one repeat share a split, so this slightly
understates the se), plus the public-only fit (n = 0) on the same cells for context.

``pooled``: per eps, the difference averaged over n within each (drug, repeat) first, then
over the (drug, repeat) units (the nested n of one unit share their lines and public fit, so
only units are treated as independent), for n in 100..700 (n = 800 reaches 1 drug here).

Verdict per row, d = secure - K=1 with standard error se: "confirmed" if d +- 2 se lies within
+-0.01 (the run has the power to say so); "met" if |d| <= 0.01 but the interval reaches past
it; "missed (n.s.)" if |d| > 0.01 but within 2 se of the band (not distinguishable from
meeting it); "missed" if even |d| - 2 se > 0.01.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpfed_apps.evaluation.report import read_csv  # noqa: E402

TARGET = 0.01


def _paired(a: dict, b: dict) -> tuple[float, float, int]:
    cells = sorted(set(a) & set(b))
    diffs = [a[c] - b[c] for c in cells]
    n = len(diffs)
    if n == 0:
        return float("nan"), float("nan"), 0
    mean = sum(diffs) / n
    if n < 2:
        return mean, float("nan"), n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    return mean, math.sqrt(var / n), n


def score(rows, k: int = 10) -> list[dict]:
    cells: dict[tuple, dict] = defaultdict(dict)   # (variant, eps, n) -> {(drug, rep): rho}
    public: dict[tuple, float] = {}
    for r in rows:
        if r["method"] != "robust_private" or r.get("error"):
            continue
        rho = float(r["spearman"])
        if not math.isfinite(rho):
            continue
        cell = (int(r["drug"]), int(r["repeat"]))
        if int(r["n_private"]) == 0:
            public[cell] = rho
            continue
        agg = r.get("aggregation") or "independent"
        if int(r["sites"]) == 1:
            variant = "single"
        elif int(r["sites"]) == k:
            variant = agg
        else:
            continue
        cells[(variant, float(r["epsilon"]), int(r["n_private"]))][cell] = rho
    out = []
    for eps, n in sorted({(e, n) for (_, e, n) in cells}):
        single, sec, ind = (cells.get((v, eps, n), {}) for v in ("single", "secure",
                                                                 "independent"))
        common = set(single) & set(sec)
        if not common:
            continue
        d1, se1, c1 = _paired(sec, single)
        d2, se2, c2 = _paired(sec, ind)
        mean = lambda m, on: sum(m[c] for c in on) / len(on)  # noqa: E731
        pub = [public[c] for c in common if c in public]
        if abs(d1) + 2 * se1 <= TARGET:
            verdict = "confirmed"
        elif abs(d1) <= TARGET:
            verdict = "met"
        elif abs(d1) - 2 * se1 <= TARGET:
            verdict = "missed (n.s.)"
        else:
            verdict = "missed"
        out.append(dict(epsilon=eps, n_private=n, cells=c1, single=mean(single, common),
                        secure=mean(sec, common),
                        independent=mean(ind, set(ind) & common) if set(ind) & common
                        else float("nan"),
                        public_only=sum(pub) / len(pub) if pub else float("nan"),
                        secure_minus_single=d1, se_single=se1,
                        secure_minus_independent=d2, se_independent=se2, cells_independent=c2,
                        verdict=verdict))
    return out


def pooled(rows, k: int = 10, sizes=range(100, 701, 100)) -> list[dict]:
    """Per eps: secure - K=1 and secure - independent averaged over ``sizes`` per
    (drug, repeat), then mean +- se over those units (module docstring)."""
    vals: dict[tuple, float] = {}
    for r in rows:
        if r["method"] != "robust_private" or r.get("error") or int(r["n_private"]) not in sizes:
            continue
        rho = float(r["spearman"])
        if not math.isfinite(rho) or int(r["sites"]) not in (1, k):
            continue
        variant = "single" if int(r["sites"]) == 1 else (r.get("aggregation") or "independent")
        vals[(variant, float(r["epsilon"]), int(r["n_private"]), int(r["drug"]),
              int(r["repeat"]))] = rho
    out = []
    for eps in sorted({key[1] for key in vals}):
        row = dict(epsilon=eps)
        for other in ("single", "independent"):
            per_unit: dict[tuple, list[float]] = defaultdict(list)
            for (v, e, n, drug, rep), rho in vals.items():
                if v == "secure" and e == eps and (other, e, n, drug, rep) in vals:
                    per_unit[(drug, rep)].append(rho - vals[(other, e, n, drug, rep)])
            units = [sum(d) / len(d) for d in per_unit.values()]
            m = sum(units) / len(units) if units else float("nan")
            se = (math.sqrt(sum((u - m) ** 2 for u in units) / (len(units) - 1) / len(units))
                  if len(units) > 1 else float("nan"))
            row[f"secure_minus_{other}"], row[f"se_{other}"], row[f"units_{other}"] = \
                m, se, len(units)
        out.append(row)
    return out


def markdown(table: list[dict], k: int) -> str:
    lines = [f"| eps | n | cells | K=1 | K={k} secure | K={k} independent | public-only | "
             f"secure - K=1 ± se | secure - independent ± se | target (±{TARGET}) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(
            f"| {r['epsilon']:g} | {r['n_private']} | {r['cells']} | {r['single']:.3f} | "
            f"{r['secure']:.3f} | {r['independent']:.3f} | {r['public_only']:.3f} | "
            f"{r['secure_minus_single']:+.3f} ± {r['se_single']:.3f} | "
            f"{r['secure_minus_independent']:+.3f} ± {r['se_independent']:.3f} | "
            f"{r['verdict']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="results.csv of dpfed evaluate")
    ap.add_argument("--k", type=int, default=10, help="the K of the secure rows (default 10)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = read_csv(args.results)
    table = score(rows, args.k)
    pool = pooled(rows, args.k)
    if not table:
        print("no (eps, n) with both K=1 and secure K rows", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"table": table, "pooled": pool}, indent=1))
    else:
        print(markdown(table, args.k))
        count = lambda *v: sum(r["verdict"] in v for r in table)  # noqa: E731
        worst = max(table, key=lambda r: abs(r["secure_minus_single"]))
        print(f"\n{count('confirmed', 'met')} of {len(table)} (eps, n) within {TARGET} of K=1 "
              f"({count('confirmed')} confirmed at ±2 se); {count('missed (n.s.)')} missed "
              f"within 2 se, {count('missed')} missed beyond 2 se; worst secure - K=1 = "
              f"{worst['secure_minus_single']:+.3f} ± {worst['se_single']:.3f} "
              f"(eps {worst['epsilon']:g}, n {worst['n_private']}, {worst['cells']} cells)")
        print("\nPooled over n = 100..700 per (drug, repeat):")
        for p in pool:
            print(f"- eps {p['epsilon']:g}: secure - K=1 {p['secure_minus_single']:+.4f} ± "
                  f"{p['se_single']:.4f} ({p['units_single']} drug-repeats); secure - "
                  f"independent {p['secure_minus_independent']:+.4f} ± "
                  f"{p['se_independent']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
