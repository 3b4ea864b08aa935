"""The aggregator's fit of a joint round: m targets at d features (issue 23; target: 262 targets
at d = 10 in <= 5 s). Three sites release one joint vector each with OpenDP noise
(site_node.joint_release), the public rows give PublicTargets; then
aggregator.joint_fit.fit_joint, the FITTING phase's call, is timed in one process and in a
process pool (the pool is started before the timed runs: the aggregator keeps it between
rounds; its start is reported separately).

    .venv/bin/python benchmarks/bench_joint_fit.py [--targets 262] [--dim 10]
        [--mechanism gaussian] [--epsilon 1] [--workers 1,2] [--repeats 3]

Prints wall and CPU seconds per run (CPU: this process plus the sum of the targets' own fit
CPU seconds measured inside the workers), the targets fitted and refused, and `uptime`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import numpy as np


def problem(m: int, d: int, mechanism: str, epsilon: float, n_site: int = 1000, seed: int = 0):
    from dpfed.joint_noise import JOINT_DEFAULT_SPLIT, calibration_from_spec
    from dpfed.joint_statistics import public_targets
    from dpfed.v1 import dpfed_pb2 as pb
    from site_node.joint_release import release_joint_statistics
    rng = np.random.default_rng(seed)
    n = 200 + 3 * n_site
    x = rng.normal(size=(n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)          # normalised rows (R = 1)
    beta = rng.normal(size=(d, m))
    y = x @ beta + rng.normal(size=(n, m))
    y = (y - y[:200].mean(0)) / y[:200].std(0)             # public centre and scale
    y[rng.random(y.shape) < 0.18] = np.nan                 # GDSC: 82 % of cells present
    spec = pb.RoundSpec(round_id="bench", feature_names=[f"f{i}" for i in range(d)],
                        epsilon=epsilon, x_bound=1.0, y_bound=0.5,
                        budget_split=list(JOINT_DEFAULT_SPLIT), neighbouring="add_remove",
                        fit_method="auto", fit_seed=1, fit_draws=5000, mechanism=mechanism,
                        delta=1e-6 if mechanism == "gaussian" else 0.0,
                        preprocessing=pb.Preprocessing(x_mean=[0.0] * d, normalize_rows=True))
    spec.targets.extend(pb.TargetSpec(name=f"t{j}", y_mean=0.0, y_scale=1.0) for j in range(m))
    spec.public_statistics = public_targets(x[:200], y[:200], 1.0, 0.5, 1.0).to_bytes()
    cal = calibration_from_spec(spec)
    total = None
    for k in range(3):
        rows = slice(200 + k * n_site, 200 + (k + 1) * n_site)
        part = release_joint_statistics(x[rows], y[rows], cal)
        total = part if total is None else total + part
    return spec, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=int, default=262)
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--mechanism", default="gaussian")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from aggregator import joint_fit
    spec, total = problem(args.targets, args.dim, args.mechanism, args.epsilon)
    print(f"m = {args.targets}, d = {args.dim}, {args.mechanism}, eps {args.epsilon}; fit "
          f"draws per target {joint_fit.fit_draws(spec)}, stored {joint_fit.result_draws(spec)}")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    for w in [int(v) for v in args.workers.split(",")]:
        if w > 1:
            t = time.perf_counter()
            joint_fit._run([], w)
            pool = joint_fit._executor(w)
            list(pool.map(abs, range(2 * w)))   # workers started
            joint_fit.fit_joint(spec, total, n_workers=w)   # first fits in each worker
            print(f"workers {w}: pool start + one warm-up fit {time.perf_counter() - t:.2f} s")
        walls, cpus = [], []
        for _ in range(args.repeats):
            t, c = time.perf_counter(), time.process_time()
            entries, _, _ = joint_fit.fit_joint(spec, total, n_workers=w)
            wall = time.perf_counter() - t
            own = time.process_time() - c
            fit_cpu = sum(e.get("fit_cpu_s", 0.0) for e in entries) if w > 1 else 0.0
            walls.append(wall)
            cpus.append(own + fit_cpu)
            fitted = sum(e["status"] == "fitted" for e in entries)
        print(f"workers {w}: wall median {statistics.median(walls):.2f} s "
              f"(runs {', '.join(f'{v:.2f}' for v in walls)}), CPU median "
              f"{statistics.median(cpus):.2f} s; {fitted} of {len(entries)} fitted")
        print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    joint_fit.shutdown_pool()


if __name__ == "__main__":
    main()
