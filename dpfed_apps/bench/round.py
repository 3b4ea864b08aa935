"""Round latency benchmark: coordinator StartRound -> all N contributions verified, stored and
summed at the aggregator (the fit is skipped with the aggregator's bench-only `skip_fit`).

Real gRPC on loopback, real Ed25519 keys: the aggregator runs in its own process; the N
simulated sites live in this one as lightweight clients (dpfed_apps/bench/simulated_sites.py).
Their releases are pre-computed and each site signs its own contribution before the clock
starts (sites sign in parallel in reality, so one process signing 1000 in series would time
this machine, not the federation). Plaintext by default; --tls provisions a CA and kits with
dpfed_apps.ca and uses mutual TLS with one connection per site, as in production.

    python benchmarks/bench_round.py --sites 10 100 1000 --dim 64 [--repeat 5] [--tls] [--json]

With --repeat R each size runs R times (a fresh aggregator process each time) and the median
is reported with the minimum and the load average, because other processes on a small
machine distort single runs. Results and the machine are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from dpfed_apps.bench.simulated_sites import process_cpu_s, start_federation


def run_bench(sites: int, dim: int, *, channels: int = 4, workers: int = 16,
              seed: int = 0, tls: bool = False) -> dict:
    from dpfed.v1 import dpfed_pb2 as pb

    t_setup = time.perf_counter()
    fed = start_federation(sites, dim, workers=workers, tls=tls, seed=seed)
    try:
        setup_s = time.perf_counter() - t_setup
        coordinator = fed.coordinator_stub()
        contribute = fed.contribute_callables(channels)
        query = pb.RoundQuery(round_id=fed.round_id)
        server_cpu0, client_cpu0 = process_cpu_s(fed.proc.pid), time.process_time()
        t0 = time.perf_counter()
        coordinator.StartRound(fed.spec_envelope, timeout=60)
        # Consent phase: every site consents; the round moves to RELEASE with the last one.
        consents = [phase.future(env, timeout=120)
                    for (_, phase), env in zip(contribute, fed.consents)]
        for f in consents:
            f.result()
        t_consented = time.perf_counter() - t0
        futures = [call.future(env, timeout=120)
                   for (call, _), env in zip(contribute, fed.contributions)]
        replies = [f.result() for f in futures]
        t_contributed = time.perf_counter() - t0
        while True:
            status = coordinator.GetRound(query, timeout=30)
            if status.state in (pb.RoundStatus.DONE, pb.RoundStatus.FAILED):
                break
            time.sleep(0.002)
        round_s = time.perf_counter() - t0
        server_cpu1 = process_cpu_s(fed.proc.pid)
        client_cpu = time.process_time() - client_cpu0
        assert all(r.accepted for r in replies)
        assert status.state == pb.RoundStatus.DONE, status.message
        summary = json.loads(coordinator.GetResult(query).summary_json)
        assert summary["n_total"] == 100 * sites
        return {"sites": sites, "dim": dim, "tls": tls, "round_s": round(round_s, 4),
                "loadavg_1min": round(os.getloadavg()[0], 2),
                "consents_acked_s": round(t_consented, 4),
                "contributions_acked_s": round(t_contributed, 4),
                "server_quorum_s": status.round_seconds,
                "server_sum_s": round(summary["timings"]["fit_s"], 4),
                "setup_s": round(setup_s, 2),
                # CPU time in the timed window: the aggregator process (all its threads) and
                # this client process; they share the machine's cores.
                "server_cpu_s": (round(server_cpu1 - server_cpu0, 3)
                                 if server_cpu0 is not None and server_cpu1 is not None else None),
                "client_cpu_s": round(client_cpu, 3),
                "contribution_bytes": len(fed.contributions[0])}
    finally:
        fed.stop()


def run_repeated(sites: int, dim: int, repeat: int, **kw) -> dict:
    """Median over ``repeat`` runs of every timing, with the minimum round time and the load
    average at the start of each run."""
    runs = []
    for _ in range(repeat):
        load = os.getloadavg()[0]
        runs.append({**run_bench(sites, dim, **kw), "loadavg_1min": round(load, 2)})
    out = {k: statistics.median(r[k] for r in runs) if isinstance(runs[0][k], float) else runs[0][k]
           for k in runs[0]}
    out.update(repeat=repeat, round_s_min=min(r["round_s"] for r in runs),
               loadavg_1min=[r["loadavg_1min"] for r in runs])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sites", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--dim", type=int, nargs="+", default=[64])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--channels", type=int, default=4, help="client gRPC channels")
    p.add_argument("--workers", type=int, default=16, help="aggregator gRPC worker threads")
    p.add_argument("--tls", action="store_true",
                   help="mutual TLS with kits from dpfed_apps.ca (one connection per site)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    for d in args.dim:
        for n in args.sites:
            r = run_repeated(n, d, args.repeat, channels=args.channels, workers=args.workers,
                             tls=args.tls)
            print(json.dumps(r) if args.json else
                  f"{r['sites']:>5} sites, d={r['dim']}: round {r['round_s']:.3f} s median of "
                  f"{r['repeat']} (min {r['round_s_min']:.3f}; all acked "
                  f"{r['contributions_acked_s']:.3f} s, sum {r['server_sum_s']:.4f} s; "
                  f"load {r['loadavg_1min']})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
