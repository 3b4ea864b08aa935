"""The utility cost of a secure round's row cap, and that exact statistics remove it (issue 19).

Three designs of a secure round's site statistics and calibration, run with the same splits and
fit seeds (the secure noise is drawn from the CSPRNG, so it is not common to the runs):

``exact`` (production since this benchmark's second version): every usable row is used, the
    site computes X^T X, X^T y, y^T y exactly in integers from quantised rows
    (``dpfed.secagg.exact``, ``site_node.release.exact_clipped_statistics``) and the grid is
    calibrated with the round's own add/remove sensitivities and no float-error term
    (``calibrate(statistics="exact")``); ``max_site_rows`` only sizes the grid.
``capped`` (commit a3bb63f): a site kept at most ``max_site_rows`` rows by a keyed order, so
    under add/remove a neighbour could be a replacement and Sxx, Sxy, Syy took their
    replace-one sensitivities (Sxy 2 d t By instead of d t By; with the row-norm bound Sxx
    min(d(d+1)/2 Bx^2, d(d+1) t^2) instead of d(d+1)/2 t^2); float64 sums with the float-error
    term. Reconstructed here (``capped_calibration``): the code is gone.
``float`` (before a3bb63f): the add/remove sensitivities, float64 sums with the float-error
    term for ``max_site_rows`` rows, and (then) a refusal for a site with more rows.

In the evaluation ``max_site_rows`` is the largest site's rows, so no cap ever bites: the
differences are the calibrations' (and the quantisation's, ~2^-20 of the bounds).

    python benchmarks/row_cap_cost.py --drugs 60 --repeats 10 --sizes 0,100,200,300 --out /tmp/rowcap3

Runs robust_private with K sites and secure aggregation (T = K, the ``dpfed evaluate``
default bounds) once per design and prints, per (eps, n), the mean Spearman of each, the
paired differences exact - capped and exact - float with their standard errors, and the
public-only fit (n = 0) for context. Also the noise scales of one cell (d = 10, eps 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dpfed_apps.evaluation.methods.robust_private as robust_private  # noqa: E402
import dpfed_apps.evaluation.protocol as protocol  # noqa: E402
import dpfed_apps.evaluation.runner as runner  # noqa: E402
from dpfed.secagg.calibration import calibrate  # noqa: E402
from dpfed.sensitivity import (noise_calibration, xtx_sensitivity,  # noqa: E402
                               xty_sensitivity)
from dpfed.statistics import validate_shapes  # noqa: E402
from site_node.release import clipped_statistics  # noqa: E402

DESIGNS = ("exact", "capped", "float")


def capped_calibration(d, epsilon, x_bound, y_bound, budget_split=None, *,
                       neighbouring="add_remove", xtx_sensitivity_rule="exact",
                       x_norm_bound=None):
    """What ``noise_calibration(..., row_cap=True)`` returned at commit a3bb63f: under
    add/remove, Sxx, Sxy and Syy take their replace-one sensitivities (Syy's is the same)
    and n keeps 1; under replace-one nothing changes."""
    plain = noise_calibration(d, epsilon, x_bound, y_bound, budget_split,
                              neighbouring=neighbouring,
                              xtx_sensitivity=xtx_sensitivity_rule,
                              x_norm_bound=x_norm_bound)
    if neighbouring != "add_remove":
        return plain
    return dataclasses.replace(
        plain,
        xtx_sensitivity=float(xtx_sensitivity(d, x_bound, rule=xtx_sensitivity_rule,
                                              x_norm_bound=x_norm_bound,
                                              neighbouring="replace_one")),
        xty_sensitivity=float(xty_sensitivity(d, x_bound, y_bound, neighbouring="replace_one",
                                              x_norm_bound=x_norm_bound)))


def float_secure_inputs(capped: bool):
    """``robust_private.secure_inputs`` as it was before exact statistics: float64 clipped
    statistics, ``calibrate(statistics="float")`` (the float-error term for the largest
    site's rows), with (``capped``, a3bb63f) or without the row-cap sensitivities."""
    def secure_inputs(blocks, setting, noise_threshold=None):
        shaped = [validate_shapes(x, y) for x, y in blocks]
        d, k = shaped[0][0].shape[1], len(shaped)
        t = k if noise_threshold is None else int(noise_threshold)
        make = capped_calibration if capped else noise_calibration
        rule = {"xtx_sensitivity_rule" if capped else "xtx_sensitivity":
                setting.xtx_sensitivity}
        cal = make(d, setting.epsilon, setting.x_bound, setting.y_bound, setting.budget_split,
                   neighbouring=setting.neighbouring, x_norm_bound=setting.x_norm_bound,
                   **rule)
        grid = calibrate(d=d, n_max=max(x.shape[0] for x, _ in shaped), n_sites=k,
                         x_bound=setting.x_bound, y_bound=setting.y_bound, calibration=cal,
                         noise_threshold=t, statistics="float")
        iu = np.triu_indices(d)
        sites = []
        for x, y in shaped:
            sxx, sxy, syy = clipped_statistics(x, y, setting.x_bound, setting.y_bound,
                                               setting.x_norm_bound)
            sites.append((np.concatenate([sxx[iu], sxy, [syy]]), x.shape[0]))
        return grid, grid.release_many(sites)
    return secure_inputs


def _run(config, drugs, bounds, design: str) -> list[dict]:
    from dpfed_apps.evaluation.executor import SerialExecutor

    production = robust_private.secure_inputs
    if design != "exact":
        robust_private.secure_inputs = float_secure_inputs(capped=design == "capped")
    try:
        tasks = runner.plan_tasks(drugs, config, ("robust_private",), bounds)
        with SerialExecutor() as ex:
            return runner.run_grid(tasks, ex)
    finally:
        robust_private.secure_inputs = production


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


def _paired(a: dict, b: dict, common) -> tuple[float, float]:
    diffs = [a[c] - b[c] for c in common]
    m = sum(diffs) / len(diffs)
    se = math.sqrt(sum((x - m) ** 2 for x in diffs) / (len(diffs) - 1) / len(diffs))
    return m, se


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
    cells = {design: _cells(_run(config, drugs, bounds, design), args.sites)
             for design in DESIGNS}
    lines = []
    for eps, n in sorted(cells["exact"]):
        if n == 0:
            continue
        got = {design: cells[design].get((eps, n), {}) for design in DESIGNS}
        common = sorted(set.intersection(*(set(v) for v in got.values())))
        if len(common) < 2:
            continue
        mean = {design: sum(got[design][c] for c in common) / len(common) for design in DESIGNS}
        d_cap, se_cap = _paired(got["exact"], got["capped"], common)
        d_flt, se_flt = _paired(got["exact"], got["float"], common)
        pub = cells["exact"].get((eps, 0), {})
        lines.append({"epsilon": eps, "n": n, "cells": len(common), **mean,
                      "exact_minus_capped": d_cap, "se_capped": se_cap,
                      "exact_minus_float": d_flt, "se_float": se_flt,
                      "public_only": (sum(pub[c] for c in common if c in pub)
                                      / max(1, sum(1 for c in common if c in pub)))})
    d = len(config.features)
    plain = noise_calibration(d, 1.0, 1.0, 1.0, x_norm_bound=1.0)
    capped = capped_calibration(d, 1.0, 1.0, 1.0, x_norm_bound=1.0)
    scales = {name: {"xtx": c.xtx_scale, "xty": c.xty_scale, "yty": c.yty_scale,
                     "n": c.n_scale} for name, c in (("exact/float", plain), ("capped", capped))}
    print(f"K = {args.sites} secure, {len(drugs)} drugs x {args.repeats} repeats, "
          f"{time.monotonic() - t0:.0f} s")
    print("eps    n  cells   exact  capped   float  exact-capped (se)  exact-float (se)  "
          "public-only")
    for r in lines:
        print(f"{r['epsilon']:3g} {r['n']:4d} {r['cells']:6d}  {r['exact']:.4f}  "
              f"{r['capped']:.4f}  {r['float']:.4f}   {r['exact_minus_capped']:+.4f} "
              f"({r['se_capped']:.4f})   {r['exact_minus_float']:+.4f} ({r['se_float']:.4f})"
              f"      {r['public_only']:.4f}")
    print("noise scales at d = %d, eps 1, Bx = R = 1, By = 1: %s" % (d, json.dumps(scales)))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "row_cap_cost.json").write_text(json.dumps(
            {"cells": lines, "scales": scales}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
