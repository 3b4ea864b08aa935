"""Time one secure-aggregation round in memory (dpfed.secagg, docs/secure_aggregation.md).

    PYTHONPATH=. python benchmarks/bench_secagg.py [--sites 10,100,1000] [--dim 64]
        [--dropouts 0.1] [--json]

For each K: K sites with d-dimensional statistics (vector length d(d+1)/2 + d + 2), each
releasing random statistics through ``calibration.calibrate(...).release`` (fixed point plus its
distributed discrete Laplace share, eps = 1, T = number of sites that will contribute), then the
four phases of the protocol, with a fraction of the sites dropping out after key sharing (before
sending their masked input). Every message goes through its byte encoding
(dpfed.secagg.simulate.run_round). Per phase it reports
the sites' summed CPU time, the slowest single site, the aggregator's time and the bytes sent
to the aggregator; ``critical_path_s`` = sum over phases of (slowest site + aggregator), what a
round with sites in parallel and a free network would take. The machine's load average is
printed because other processes on a 2-core box distort the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np

from dpfed.secagg import fixedpoint as fp
from dpfed.secagg.calibration import calibrate
from dpfed.secagg.messages import Phase
from dpfed.secagg.protocol import RoundConfig
from dpfed.secagg.simulate import run_round
from dpfed.sensitivity import noise_calibration
from dpfed.wire.signing import SigningKey


def bench(K: int, d: int, dropout: float) -> dict:
    layout = fp.StatisticsLayout(d)
    L = layout.length
    ids = tuple(f"site-{i:05d}" for i in range(K))
    n_drop = int(math.floor(dropout * K + 1e-9))
    T = K - n_drop
    cfg = RoundConfig.create(f"bench-{K}", ids, L, min_contributors=T,
                             dropout_fraction=dropout, corrupt_fraction=0.1)
    idents = {s: SigningKey.generate() for s in ids}
    grid = calibrate(d=d, n_max=1000, n_sites=K, x_bound=0.2, y_bound=1.0,
                     calibration=noise_calibration(d, 1.0, 0.2, 1.0), noise_threshold=T)
    rng = np.random.default_rng(0)     # synthetic *statistics* only; the noise is CSPRNG
    x, noise_s = {}, []
    for s in ids:
        upper = rng.uniform(-5, 5, size=L - 1)
        t0 = time.perf_counter()
        x[s] = grid.release(upper, 1000)          # encode + distributed noise share
        noise_s.append(time.perf_counter() - t0)
    dropped = ids[::K // n_drop][:n_drop] if n_drop else ()
    t0 = time.perf_counter()
    sim = run_round(cfg, x, idents, drop_before={s: Phase.MASKED_INPUT for s in dropped},
                    aggregator_identity=SigningKey.generate())
    wall = time.perf_counter() - t0
    expect = fp.wrap_sum(x[s] for s in ids if s not in dropped)
    assert np.array_equal(sim.result.vector, expect), "the unmasked sum is wrong"
    phases = {}
    for p in sim.site_seconds:
        phases[p] = {"sites_total_s": round(sim.site_seconds[p], 4),
                     "site_max_s": round(sim.site_seconds_max[p], 4),
                     "aggregator_s": round(sim.aggregator_seconds[p], 4),
                     "bytes_to_aggregator": sim.bytes_to_aggregator[p]}
    critical = max(noise_s) + sum(v["site_max_s"] + v["aggregator_s"] for v in phases.values())
    return {"sites": K, "dim": d, "vector_length": L, "dropouts": n_drop,
            "degree": cfg.degree, "threshold": cfg.threshold,
            "complete_graph": cfg.graph().complete,
            "release_site_mean_s": round(float(np.mean(noise_s)), 4),
            "phases": phases, "round_wall_s": round(wall, 3),
            "critical_path_s": round(critical, 3), "exact_sum": True}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sites", default="10,100,1000")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--dropouts", type=float, default=0.1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = {"load_average": os.getloadavg(), "results": []}
    for K in (int(k) for k in args.sites.split(",")):
        r = bench(K, args.dim, args.dropouts)
        out["results"].append(r)
        if not args.json:
            print(f"K={K} d={args.dim} L={r['vector_length']} dropouts={r['dropouts']} "
                  f"degree={r['degree']} t={r['threshold']} "
                  f"release/site={r['release_site_mean_s']:.4f}s "
                  f"wall={r['round_wall_s']:.2f}s critical={r['critical_path_s']:.3f}s")
            for p, v in r["phases"].items():
                print(f"  {p:13s} sites {v['sites_total_s']:8.3f}s (max {v['site_max_s']:.4f}s)"
                      f"  aggregator {v['aggregator_s']:7.3f}s  {v['bytes_to_aggregator']} B")
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"load average {out['load_average']}")


if __name__ == "__main__":
    main()
