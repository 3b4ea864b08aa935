"""``dpfed simulate --targets N|all``: a joint round (docs/protocol.md "Joint rounds") on the
bundled GDSC data, run through the real aggregator and site processes like the single-target
simulation (dpfed_apps.simulation.run).

The first N drugs of GDSC v17 (file order; ``all``: every one of the 262) are the targets:
every cell line with genomic features is a row, its missing responses empty cells (GDSC fills
82 % of the line x drug matrix). Lines are split into sites, public lines and held-out test
lines (``split_rows``). The coordinator builds the spec from round.toml ``targets`` with the
public lines (coordinator.joint_spec: each drug's centre and scale, default bounds), the sites
release one joint vector each (Laplace, or Gaussian with ``--delta``), the aggregator fits
every target. The report: per target the held-out Spearman correlation of the posterior mean's
predictions with the test lines' responses (Spearman is unchanged by the per-target
standardisation), and their median.

The simulated sites accept the round with ``min_n = 1``: a joint release's count noise grows
with the number of targets (sd ~2600 per site at 262 Laplace targets, eps 2), so the
single-target simulation's ``min_n = 20`` on the noisy count would refuse it at random;
Gaussian rounds need a per-patient (eps, delta) budget at each site (site_node.policy), set
to 5 rounds' worth. The round's quorum is 1: a site whose noisy n_x came out 0 (sd ~160 at
265 Gaussian targets, eps 2, against ~290 rows a site) still refuses (min_n >= 1), and the
round goes on with the others (the report lists the sites that released).
"""

from __future__ import annotations

import csv
import math
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from dpfed_apps.simulation.federation import (COORDINATOR_ID, FederationFailed,
                                              FederationLayout, LocalFederation, _tls_table,
                                              free_port, write_aggregator)
from dpfed_apps.simulation.problem import site_ids, split_rows
from dpfed_apps.simulation.run import (SimulationOptions, _stderr_progress, connected_coordinator,
                                       round_result, secure_plan)
from dpfed.tomlwriter import to_toml


def joint_data(targets: str | int, feature_names=None):
    """(line ids, x (n, d), y (n, m) with NaN, feature names, target column names) of the
    first ``targets`` GDSC drugs (``"all"``: every drug)."""
    from dpfed import datasets
    table = datasets.load_responses()
    m = len(table.drug_ids) if targets == "all" else int(targets)
    if not 1 <= m <= len(table.drug_ids):
        raise ValueError(f"--targets must be 1..{len(table.drug_ids)} or all, got {targets}")
    names = tuple(feature_names) if feature_names else datasets.default_feature_names()
    known = {int(i) for i in datasets.load_genomic_features().line_ids}
    rows = np.array([r for r, i in enumerate(table.line_ids) if int(i) in known])
    ids = table.line_ids[rows]
    y = np.array(table.ln_ic50[rows][:, :m], dtype=np.float64)
    drugs = table.drug_ids[:m]
    keep = ~np.all(np.isnan(y), axis=1)            # a line with none of these drugs
    return (ids[keep], datasets.feature_matrix(names, ids[keep]), y[keep], names,
            [datasets.target_column(d) for d in drugs])


def _write_csv(path: Path, ids, x, y, rows, features, targets) -> None:
    with Path(path).open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["COSMIC_ID", *features, *targets])
        for r in rows:
            w.writerow([int(ids[r]), *(repr(float(v)) for v in x[r]),
                        *("" if math.isnan(v) else repr(float(v)) for v in y[r])])


def _spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    if len(a) < 3:
        return None
    from scipy.stats import spearmanr
    value = float(spearmanr(a, b).statistic)
    return value if math.isfinite(value) else None


def run_joint_simulation(options: SimulationOptions, *, targets: str | int,
                         mechanism: str = "laplace", delta: float = 0.0,
                         progress=_stderr_progress) -> dict:
    """The joint round of the module docstring; returns the report dict
    (``format_joint_report``). FederationFailed if a process or the round fails."""
    t_start = time.monotonic()
    aggregation = options.aggregation or "independent"
    if options.dropouts:
        raise ValueError("--dropouts is not supported with --targets")
    noise_threshold = secure_plan(options.n_sites, 0)[0] if aggregation == "secure" else 0
    ids, x, y, features, columns = joint_data(targets, options.features)
    split = split_rows(len(ids), n_sites=options.n_sites, n_public=options.n_public,
                       n_test=options.n_test, seed=options.seed)
    keep = options.workdir is not None
    root = Path(options.workdir) if keep else Path(tempfile.mkdtemp(prefix="dpfed-joint-"))
    root.mkdir(parents=True, exist_ok=True)
    layout = FederationLayout(root.resolve())
    layout.make()
    port = free_port()
    names = site_ids(options.n_sites)
    federation = LocalFederation(layout, names, port, progress, options.log_level)
    failed = False
    try:
        with federation:
            federation.launch()
            write_aggregator(layout, names, port=port)
            federation.go_aggregator()
            progress(f"GDSC v17: {len(ids)} lines, d = {len(features)}, {len(columns)} "
                     f"targets ({100 * np.mean(~np.isnan(y)):.0f} % of cells present); sites "
                     f"{list(split.site_sizes)}, {split.public.size} public, "
                     f"{split.test.size} test")
            policy_extra = ({"patient_epsilon": 5 * options.epsilon,
                             "patient_delta": min(0.5, 5 * delta)}
                            if mechanism == "gaussian" else {})
            for name, rows in zip(names, split.sites):
                _write_csv(layout.site_csv(name), ids, x, y, rows, features, columns)
                layout.site_config(name).write_text(to_toml({
                    "site_id": name, "aggregator": f"127.0.0.1:{port}",
                    "state_db": str(layout.site_db(name)),
                    "signing_key": str(layout.signing_key(name)),
                    "tls": _tls_table(layout, name),
                    "data": {"path": str(layout.site_csv(name)), "format": "csv",
                             "id_column": "COSMIC_ID"},
                    "policy": {"trusted_coordinators": [str(layout.kit(name) / "keys" /
                                                            f"{COORDINATOR_ID}.pub")],
                               "max_epsilon_per_round": float(options.epsilon),
                               "total_epsilon": float(5 * options.epsilon), "min_n": 1,
                               "allowed_targets": ["*"], "allowed_features": ["*"],
                               "max_noise_threshold": len(names), **policy_extra}}))
            _write_csv(layout.public_csv, ids, x, y, split.public, features, columns)
            config = {"targets": list(columns), "features": list(features),
                      "epsilon": float(options.epsilon), "mechanism": mechanism,
                      **({"delta": float(delta)} if mechanism == "gaussian" else {}),
                      "quorum": 1, "deadline_s": int(options.round_timeout_s),
                      "sites": [], "public": {"path": str(layout.public_csv)},
                      "fit": {"method": options.fit_method, "draws": int(options.fit_draws),
                              "seed": int(options.seed)},
                      **({"aggregation": "secure", "noise_threshold": noise_threshold,
                          "max_site_rows": int(max(split.site_sizes))}
                         if aggregation == "secure" else {})}
            layout.round_config.write_text(to_toml(config))
            failed = True
            from coordinator.client import Coordinator
            from coordinator.roundspec import build_round_spec
            federation.ready(timeout_s=options.startup_timeout_s)
            coordinator = connected_coordinator(options, federation, Coordinator)
            spec = build_round_spec(config, base_dir=layout.root)
            progress(f"starting joint round: {len(columns)} targets, {mechanism}, eps "
                     f"{options.epsilon}" + (f", delta {delta:g}" if delta else "")
                     + f", bounds x {spec.x_bound:g}, y {spec.y_bound:g} (public sds), "
                     f"{aggregation} aggregation")
            status = coordinator.start_round(spec)
            status = coordinator.wait(status.round_id, options.round_timeout_s, poll_s=0.1)
            result = round_result(coordinator, status.round_id, status, progress)
            released = [c.site_id for c in status.contributions]
            failed = False
            federation.terminate()
    except FederationFailed as exc:
        exc.workdir = layout.root
        exc.logs = federation.log_tails()
        raise
    finally:
        if not keep and not failed:
            shutil.rmtree(layout.root, ignore_errors=True)
    import json
    summary = json.loads(result.summary_json)
    # Held-out Spearman per target: the test lines' features through the spec's public
    # pre-processing, predicted with the posterior mean (standardised units; Spearman is
    # unchanged by the target's centre and scale).
    from dpfed.preprocess import Preprocessing
    pre = Preprocessing(tuple(spec.preprocessing.x_mean), 0.0, spec.preprocessing.normalize_rows,
                        x_scale=tuple(spec.preprocessing.x_scale))
    xt = pre.transform_x(x[split.test])
    per_target = []
    for j, entry in enumerate(summary.get("targets", [])):
        yt = y[split.test, j]
        present = ~np.isnan(yt)
        rho = None
        if entry.get("status") == "fitted":
            rho = _spearman(xt[present] @ np.asarray(entry["beta_mean"]), yt[present])
        per_target.append({"target": entry["target"], "status": entry.get("status"),
                           "n": entry.get("n"), "n_test": int(present.sum()),
                           "spearman": rho,
                           "verdict": (entry.get("information") or {}).get("verdict")})
    rhos = [t["spearman"] for t in per_target if t["spearman"] is not None]
    return {"round_id": summary["round_id"], "targets": len(columns),
            "fitted": summary.get("fitted"), "mechanism": mechanism, "delta": delta,
            "epsilon": options.epsilon, "aggregation": aggregation,
            "features": list(features), "n_lines": int(len(ids)),
            "sites": list(split.site_sizes), "released": released,
            "refused": [r.site_id for r in status.refusals],
            "n_public": int(split.public.size),
            "n_test": int(split.test.size), "x_bound": spec.x_bound, "y_bound": spec.y_bound,
            "median_spearman": float(np.median(rhos)) if rhos else None,
            "per_target": per_target, "noise": summary.get("noise"),
            "timings": {"round_s": float(status.round_seconds),
                        "fit_s": float(status.fit_seconds),
                        "total_s": time.monotonic() - t_start},
            "workdir": str(layout.root) if keep else None}


def format_joint_report(r: dict) -> str:
    lines = [f"joint round {r['round_id']}: {r['targets']} GDSC targets ({r['fitted']} fitted), "
             f"{r['mechanism']} eps {r['epsilon']:g}"
             + (f" delta {r['delta']:g}" if r["mechanism"] == "gaussian" else "")
             + f", {r['aggregation']} aggregation",
             f"{r['n_lines']} lines: sites {r['sites']}, {r['n_public']} public, {r['n_test']} "
             f"test; d = {len(r['features'])}; bounds x {r['x_bound']:g}, y {r['y_bound']:g} "
             f"public sds; released: {', '.join(r['released'])}"
             + (f"; refused: {', '.join(r['refused'])}" if r["refused"] else ""),
             "held-out Spearman of the posterior means, median over targets: "
             + (f"{r['median_spearman']:+.3f}" if r["median_spearman"] is not None else "n/a"),
             f"round {r['timings']['round_s']:.2f} s, fit {r['timings']['fit_s']:.1f} s, total "
             f"{r['timings']['total_s']:.1f} s",
             f"{'target':<18} {'status':<7} {'n_j':>6} {'test':>5} {'spearman':>9}  information"]
    for t in r["per_target"]:
        rho = f"{t['spearman']:+.3f}" if t["spearman"] is not None else "-"
        n = t["n"] if t["n"] is not None else "?"
        lines.append(f"{t['target']:<18} {t['status'] or '?':<7} {n:>6} "
                     f"{t['n_test']:>5} {rho:>9}  {t['verdict'] or ''}")
    return "\n".join(lines)
