"""Secure JOINT round end to end (issue 23 parts 2-3): K real SiteNodes (own keys, ledgers,
csv files with d features and m responses, a quarter of the cells missing) and the real
aggregator over gRPC, the Gaussian mechanism with distributed Skellam noise; timed from
StartRound until the round is DONE (fit skipped: the per-target fit is the aggregator's
fitting step, timed in its own benchmark). Everything runs in this one process (the sites'
SiteClient threads share the GIL and the 2 cores with the aggregator), so the round time
includes every site's work serialised: pessimistic against a deployment where each site has
its own machine.

Also timed in isolation (process CPU): the grid calibration of the spec, one site's exact
joint statistics + its noise share + encoding (``JointGridCalibration.release_exact``), and
the aggregator's decode + checks of the unmasked sum.

    nice -n 10 .venv/bin/python benchmarks/bench_secure_joint.py --sites 10 --dim 10 \\
        --targets 262 --rows 100 --repeat 3

Target (brief): 10 sites, d = 10, m = 262: round <= 5 s. Results: docs/benchmarks.md,
"Secure joint round".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def write_site(path: Path, n: int, d: int, m: int, features, targets, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    beta = rng.normal(size=(d, m)) / math.sqrt(d)
    y = x @ beta + rng.normal(size=(n, m))
    y[rng.random(y.shape) < 0.25] = np.nan
    lines = ["id," + ",".join(features + targets)]
    for k in range(n):
        cells = [f"{v:.4f}" for v in x[k]] + ["" if math.isnan(v) else f"{v:.4f}" for v in y[k]]
        lines.append(f"{seed}-{k}," + ",".join(cells))
    path.write_text("\n".join(lines) + "\n")


def one_round(args, repeat: int) -> dict:
    from dpfed.v1 import dpfed_pb2 as pb
    from tests import secure_federation as sf

    d, m = args.dim, args.targets
    features = [f"g{i}" for i in range(d)]
    targets = [f"drug{j}" for j in range(m)]
    sf.FEATURES = features          # the harness's spec and csv use these names
    with tempfile.TemporaryDirectory() as tmp:
        fed = sf.SecureFed(Path(tmp), args.sites, policy_extra={
            "patient_epsilon": 4.0, "patient_delta": 1e-5} if args.per_patient else None)
        for i, s in enumerate(fed.sites):
            write_site(Path(tmp) / f"{s}.csv", args.rows, d, m, features, targets, seed=i + 1)
        if not args.per_patient:
            # A Gaussian round needs the site's (eps, delta) per-patient budget (site policy).
            fed.policy_extra = {"patient_epsilon": 4.0, "patient_delta": 1e-5}
        fed.start_aggregator()
        try:
            fed.start_clients()
            coordinator = fed.coordinator()
            spec = fed.spec(f"joint-{repeat}", t=args.threshold, quorum=args.threshold,
                            rows=10 * args.rows, target="",
                            targets=[pb.TargetSpec(name=t, y_mean=0.0, y_scale=1.0)
                                     for t in targets],
                            mechanism="gaussian", delta=1e-5,
                            budget_split=[0.30, 0.60, 0.05, 0.05],
                            preprocessing=pb.Preprocessing(x_mean=[0.0] * d, y_mean=0.0,
                                                           normalize_rows=False),
                            deadline_s=args.deadline)
            t0 = time.perf_counter()
            c0 = time.process_time()
            coordinator.start_round(spec)
            status = coordinator.wait(spec.round_id, args.deadline, poll_s=0.02)
            round_s = time.perf_counter() - t0
            cpu_s = time.process_time() - c0
            if status.state != pb.RoundStatus.DONE:
                raise SystemExit(f"round failed: {status.message}")
            phases = {p.phase: round(p.seconds, 3) for p in status.phases}
            live = fed.manager.context.rounds[spec.round_id]
            grid = live.secure.calibration
            return {"round_s": round(round_s, 3), "process_cpu_s": round(cpu_s, 3),
                    "phases": phases, "vector": grid.length, "kappa": round(grid.kappa, 4)}
        finally:
            fed.stop()


def components(args) -> dict:
    from dpfed.joint_noise import joint_calibration
    from dpfed.secagg.joint_calibration import calibrate_joint
    from site_node.secure import joint_exact_clipped_statistics

    d, m = args.dim, args.targets
    c0 = time.process_time()
    cal = joint_calibration(d, m, mechanism="gaussian", epsilon=1.0, delta=1e-5, x_bound=0.5,
                            y_bound=2.0, budget_split=[0.30, 0.60, 0.05, 0.05])
    grid = calibrate_joint(cal, n_max=10 * args.rows, n_sites=args.sites,
                           noise_threshold=args.threshold)
    calib_s = time.process_time() - c0
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.rows, d))
    y = rng.normal(size=(args.rows, m))
    y[rng.random(y.shape) < 0.25] = np.nan
    c0 = time.process_time()
    stats = joint_exact_clipped_statistics(x, y, 0.5, 2.0)
    stats_s = time.process_time() - c0
    c0 = time.process_time()
    vectors = [grid.release_exact(stats) for _ in range(args.sites)]
    release_s = (time.process_time() - c0) / args.sites
    from dpfed.secagg import fixedpoint as fp
    c0 = time.process_time()
    values = grid.decode(fp.wrap_sum(vectors))
    grid.check_sum(values)
    decode_s = time.process_time() - c0
    return {"calibration_cpu_s": round(calib_s, 4), "site_exact_stats_cpu_s": round(stats_s, 4),
            "site_encode_and_share_cpu_s": round(release_s, 4),
            "aggregator_decode_check_cpu_s": round(decode_s, 4), "vector": grid.length,
            "kappa": round(grid.kappa, 4)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sites", type=int, default=10)
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--targets", type=int, default=262)
    ap.add_argument("--rows", type=int, default=100, help="rows per site")
    ap.add_argument("--threshold", type=int, default=5, help="noise threshold T (= quorum)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=120,
                    help="round deadline s (consent gets a third of it, at most 120 s): 600 "
                         "for 10,000 rows per site")
    ap.add_argument("--per-patient", action="store_true", default=True)
    args = ap.parse_args(argv)
    out = {"args": vars(args), "load_before": os.getloadavg(), "components": components(args)}
    runs = [one_round(args, r) for r in range(args.repeat)]
    out["runs"] = runs
    times = sorted(r["round_s"] for r in runs)
    out["round_s_median"] = times[len(times) // 2]
    out["round_s_min"] = times[0]
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
