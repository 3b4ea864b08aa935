"""Load benchmark: one aggregator process, N simulated sites (each its own Ed25519 key) all
contributing to one round at once; reports round time, the aggregator's peak memory and how
many calls it shed with RESOURCE_EXHAUSTED (its maximum_concurrent_rpcs, aggregator/config.py).

The aggregator process and the simulated sites are dpfed_apps/bench/simulated_sites.py's, as in
bench_round.py; what this adds is the load-shedding path: a shed Contribute is resent after a
jittered exponential backoff, the way site_node/client.py treats RESOURCE_EXHAUSTED (not an answer: resend the same bytes).
Peak memory is the aggregator process's VmHWM from /proc (its resident high-water mark).

    python benchmarks/bench_load.py --sites 1000 5000 [--dim 16] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dpfed_apps.bench.simulated_sites import process_kib, start_federation  # noqa: E402


def run_load(sites: int, dim: int = 16, *, channels: int | None = None, seed: int = 0,
             max_concurrent_rpcs: int | None = None, max_workers: int = 16) -> dict:
    import grpc
    from dpfed.v1 import dpfed_pb2 as pb

    jitter = random.Random(seed)
    config = {} if max_concurrent_rpcs is None else {"max_concurrent_rpcs": max_concurrent_rpcs}
    t_setup = time.perf_counter()
    fed = start_federation(sites, dim, round_id="load-1", workers=max_workers, seed=seed,
                           config=config, site_id_format="site-{:05d}")
    try:
        setup_s = time.perf_counter() - t_setup
        rss_idle_kib = process_kib(fed.proc.pid, "VmRSS")
        # Real sites have a connection each; ~250 concurrent streams per HTTP/2 connection
        # keeps the simulation from testing one giant connection instead of the server.
        channels = channels or max(4, sites // 250)
        coordinator = fed.coordinator_stub()
        contribute = fed.contribute_callables(channels)
        query = pb.RoundQuery(round_id=fed.round_id)
        t0 = time.perf_counter()
        coordinator.StartRound(fed.spec_envelope, timeout=60)
        # Consent phase first (the load test is about the release phase's Contribute calls).
        for f in [contribute[i][1].future(fed.consents[i], timeout=120) for i in range(sites)]:
            f.result()
        pending = list(range(sites))
        shed, dropped, attempt = 0, 0, 0
        while pending:
            futures = [(i, contribute[i][0].future(fed.contributions[i], timeout=120))
                       for i in pending]
            pending = []
            for i, f in futures:
                try:
                    reply = f.result()
                    assert reply.accepted, reply.message
                except grpc.RpcError as exc:
                    code = exc.code()
                    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        shed += 1
                    elif code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                        dropped += 1  # connection-level trouble: not an answer, resend
                    else:
                        raise
                    pending.append(i)
            if pending:  # the same bytes again, after a jittered exponential backoff
                time.sleep(min(2.0, 0.05 * 2 ** attempt) * jitter.uniform(0.5, 1.0))
                attempt += 1
        while True:
            status = coordinator.GetRound(query, timeout=30)
            if status.state in (pb.RoundStatus.DONE, pb.RoundStatus.FAILED):
                break
            time.sleep(0.005)
        round_s = time.perf_counter() - t0
        assert status.state == pb.RoundStatus.DONE, status.message
        summary = json.loads(coordinator.GetResult(query, timeout=30).summary_json)
        assert summary["n_total"] == 100 * sites and len(summary["sites"]) == sites
        peak_kib = process_kib(fed.proc.pid, "VmHWM")
        return {"sites": sites, "dim": dim, "round_s": round(round_s, 3),
                "aggregator_peak_rss_mb": round(peak_kib / 1024, 1),
                "aggregator_idle_rss_mb": round(rss_idle_kib / 1024, 1),
                "shed_resource_exhausted": shed, "dropped_unavailable_or_cancelled": dropped,
                "resend_waves": attempt, "channels": channels,
                "max_concurrent_rpcs": max_concurrent_rpcs or "default",
                "max_workers": max_workers, "setup_s": round(setup_s, 2),
                "contribution_bytes": len(fed.contributions[0])}
    finally:
        fed.stop()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="example: python benchmarks/bench_load.py --sites 1000 "
                                       "5000 --json")
    p.add_argument("--sites", type=int, nargs="+", default=[1000, 5000])
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--max-concurrent-rpcs", type=int, default=None,
                   help="override the aggregator's cap (default: its config default)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    import logging
    logging.basicConfig(level=logging.ERROR)
    for n in args.sites:
        r = run_load(n, args.dim, max_concurrent_rpcs=args.max_concurrent_rpcs)
        print(json.dumps(r) if args.json else
              f"{r['sites']:>5} sites, d={r['dim']}: round {r['round_s']:.2f} s, aggregator "
              f"peak RSS {r['aggregator_peak_rss_mb']:.0f} MB (idle "
              f"{r['aggregator_idle_rss_mb']:.0f} MB), {r['shed_resource_exhausted']} calls "
              f"shed with RESOURCE_EXHAUSTED and resent", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
