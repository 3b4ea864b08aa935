"""The aggregator's own work for an independent round, without gRPC: CPU per round.

The same 1000 signed consents and contributions as bench_round.py / bench_round_floor.py
(dpfed_apps/bench/simulated_sites.py), handed straight to the RoundManager of an aggregator
running in this process (AggregatorServer, fit skipped): every consent through
``phase_message`` + ``consent_later``, once all are durable every contribution through
``contribute_later``, until the round is DONE. Every check, the store's group commit (fsync)
and the exact sum run as in a real round; only gRPC and asyncio are absent. What is reported
is the process's CPU seconds (all threads: the caller's checks and the store writer's
commits and sums) and the wall time, so an A/B of two trees (a git worktree on PYTHONPATH,
alternated) on a loaded machine compares the Python a round costs per message, which the
wall-clock ratio of bench_round_floor.py buries under the machine's noise.

    python benchmarks/bench_round_inproc.py --sites 1000 --dim 64 --repeat 3 [--json]

Results are in docs/benchmarks.md ("Against the floor of its own two messages").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run_once(sites: int, dim: int, seed: int = 0) -> dict:
    import numpy as np

    from aggregator.config import config_from_dict
    from aggregator.server import AggregatorServer
    from dpfed.v1 import dpfed_pb2 as pb
    from dpfed.wire.canonical import digest
    from dpfed_apps.bench import simulated_sites as ss

    site_ids = [f"site-{i:04d}" for i in range(sites)]
    folder = Path(tempfile.mkdtemp(prefix="dpfed-inproc-"))
    raw, base, keys, coordinator, _ = ss._plaintext_parties(
        site_ids, folder, {"skip_fit": True, "grace_s": 0})
    server = AggregatorServer(config_from_dict(raw, str(base)))
    server.start()
    try:
        now = int(time.time() * 1000)
        spec = pb.RoundSpec(round_id="inproc-1", coordinator_id=ss.BENCH_COORDINATOR,
                            target="y", feature_names=[f"x{i}" for i in range(dim)],
                            epsilon=1.0, x_bound=0.5, y_bound=1.0,
                            budget_split=list(ss.BENCH_SPLIT), quorum=sites,
                            deadline_unix_ms=now + 600_000, created_unix_ms=now,
                            fit_method="laplace")
        envelope = coordinator.sign(spec)
        spec_digest = digest(envelope.payload)
        contributions = [pb.SignedEnvelope.FromString(b) for b in ss.sign_contributions(
            keys, spec.round_id, spec_digest, dim, np.random.default_rng(seed))]
        consents = [pb.SignedEnvelope.FromString(b)
                    for b in ss.sign_consents(keys, spec.round_id, spec_digest)]
        manager = server.manager
        cpu0, t0 = time.process_time(), time.perf_counter()
        manager.start_round(envelope)
        pending = []
        for e in consents:
            message, live = manager.phase_message(e)
            pending.append(manager.consent_later(message, e, live))
        for f in pending:
            f.result()
        consent_s = time.perf_counter() - t0
        pending = [manager.contribute_later(e) for e in contributions]
        for f in pending:
            assert f.result().accepted
        while manager.status(spec.round_id).state not in (pb.RoundStatus.DONE,
                                                          pb.RoundStatus.FAILED):
            time.sleep(0.001)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        assert manager.status(spec.round_id).state == pb.RoundStatus.DONE
        return {"sites": sites, "dim": dim, "wall_s": round(wall, 4),
                "consent_s": round(consent_s, 4), "cpu_s": round(cpu, 3),
                "loadavg_1min": round(os.getloadavg()[0], 2)}
    finally:
        server.stop(0)
        shutil.rmtree(folder, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sites", type=int, default=1000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    runs = [run_once(args.sites, args.dim, seed) for seed in range(args.repeat)]
    summary = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "consent_s", "cpu_s")}
    if args.json:
        print(json.dumps({"runs": runs, "median": summary}))
    else:
        for r in runs:
            print(r)
        print("median", summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
