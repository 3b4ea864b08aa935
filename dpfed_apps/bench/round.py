"""Round latency benchmark: coordinator StartRound -> all N contributions verified, stored and
summed at the aggregator (the fit is skipped with the aggregator's bench-only `skip_fit`).

Real gRPC on loopback, real Ed25519 keys: the aggregator runs in its own process; the N
simulated sites live in this one as lightweight clients (dpfed_apps/bench/simulated_sites.py).
Their releases are pre-computed and each site signs its own contribution before the clock
starts (sites sign in parallel in reality, so one process signing 1000 in series would time
this machine, not the federation). Plaintext by default; --tls provisions a CA and kits with
dpfed_apps.ca and uses mutual TLS with one connection per site, as in production.

    python benchmarks/bench_round.py --sites 10 100 1000 --dim 64 [--repeat 5] [--tls] [--json]
    python benchmarks/bench_round.py --aggregation secure --sites 100 1000 --dim 64 --dropouts 10%

``--aggregation secure`` times a secure round (consent, key agreement, masked release,
unmasking, sum) with SiteSession-driven sites on real Subscribe streams; what is measured and
what is precomputed is in dpfed_apps/bench/secure_sites.py.

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


def run_secure(sites: int, dim: int, *, dropouts: int = 0, workers: int = 16, seed: int = 0,
               connections: int | None = None, tls: bool = False) -> dict:
    """One secure round (dpfed_apps/bench/secure_sites.py): T = the sites that release (capped,
    with the sparse graph, at the surviving holders a site is sure to keep: a site's own
    neighbourhood must hold T survivors, RoundConfig.holder_floor), the last ``dropouts``
    sites refuse in the release step after key agreement."""
    import asyncio

    from dpfed_apps.bench.secure_sites import plan_round, run_sites
    from dpfed import secure_round
    from dpfed.v1 import dpfed_pb2 as pb
    from dpfed.wire.canonical import digest

    if tls:
        raise ValueError("--tls is not implemented for --aggregation secure (plaintext only)")
    from dpfed.secagg.graph import choose_graph_parameters

    releasing = sites - dropouts
    graph = choose_graph_parameters(sites, corrupt_sites=0)
    noise_threshold = min(releasing, graph.surviving_holders - graph.corrupt_holders)
    t_setup = time.perf_counter()
    fed = start_federation(sites, dim, workers=workers, seed=seed,
                           config={"max_clock_skew_s": 3600},
                           spec_fields=dict(aggregation="secure", noise_threshold=noise_threshold,
                                            max_site_rows=100, quorum=releasing))
    try:
        spec = fed.spec
        drop = fed.site_ids[releasing:]
        t_plan = time.perf_counter()
        plan = plan_round(spec, digest(fed.spec_envelope.payload), fed.site_keys, drop, seed,
                          aggregator_key=fed.aggregator_key)
        plan_s = time.perf_counter() - t_plan
        setup_s = time.perf_counter() - t_setup
        server_cpu0, client_cpu0 = process_cpu_s(fed.proc.pid), time.process_time()
        out = asyncio.run(run_sites(fed.address, plan, fed.spec_envelope,
                                    connections=connections or max(1, -(-sites // 250))))
        server_cpu1 = process_cpu_s(fed.proc.pid)
        status = out["status"]
        assert status.state == pb.RoundStatus.DONE, status.message
        assert sorted(r.site_id for r in status.refusals) == drop   # announced dropouts
        # The sum the aggregator unmasked is the planned one: its n is the decoded n.
        calibration = secure_round.build(spec, fed.site_ids).calibration
        _, n = calibration.decode(plan.expected_sum)
        query = pb.RoundQuery(round_id=fed.round_id)
        summary = json.loads(fed.coordinator_stub().GetResult(query).summary_json)
        assert summary["n_total"] == max(0, int(n)), (summary["n_total"], n)
        phases = {p.phase: round(p.seconds, 4) for p in status.phases}
        site_max = plan.site_max_s
        return {"aggregation": "secure", "sites": sites, "dim": dim, "dropouts": dropouts,
                "noise_threshold": noise_threshold, "degree": plan.config.degree,
                "threshold": plan.config.threshold, "tls": False,
                "round_s": round(out["round_s"], 4),
                "phases_s": phases,
                "site_max_s": site_max, "sites_cpu_s": plan.site_total_s,
                "critical_path_s": round(out["round_s"] + sum(site_max.values()), 4),
                "server_cpu_s": (round(server_cpu1 - server_cpu0, 3)
                                 if server_cpu0 is not None and server_cpu1 is not None
                                 else None),
                "client_cpu_s": round(time.process_time() - client_cpu0, 3),
                "loadavg_1min": round(os.getloadavg()[0], 2),
                "setup_s": round(setup_s, 2), "plan_s": round(plan_s, 2),
                "masked_bytes": len(plan.answers[fed.site_ids[0]]["release"])}
    finally:
        fed.stop()


def run_repeated(sites: int, dim: int, repeat: int, *, aggregation: str = "independent",
                 dropouts: int = 0, **kw) -> dict:
    """Median over ``repeat`` runs of every timing, with the minimum round time and the load
    average at the start of each run."""
    runs = []
    for _ in range(repeat):
        load = os.getloadavg()[0]
        one = (run_secure(sites, dim, dropouts=dropouts, **kw) if aggregation == "secure"
               else run_bench(sites, dim, **kw))
        runs.append({**one, "loadavg_1min": round(load, 2)})
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
    p.add_argument("--aggregation", choices=("independent", "secure"), default="independent")
    p.add_argument("--dropouts", default="0",
                   help="secure: sites that drop out after key agreement (a number, or a "
                        "percentage of the sites such as 10%%)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    for d in args.dim:
        for n in args.sites:
            extra = ({"workers": args.workers, "dropouts": dropout_count(args.dropouts, n)}
                     if args.aggregation == "secure" else
                     {"channels": args.channels, "workers": args.workers, "tls": args.tls})
            r = run_repeated(n, d, args.repeat, aggregation=args.aggregation, **extra)
            if args.aggregation == "secure":
                print(json.dumps(r) if args.json else describe_secure(r), flush=True)
                continue
            print(json.dumps(r) if args.json else
                  f"{r['sites']:>5} sites, d={r['dim']}: round {r['round_s']:.3f} s median of "
                  f"{r['repeat']} (min {r['round_s_min']:.3f}; all acked "
                  f"{r['contributions_acked_s']:.3f} s, sum {r['server_sum_s']:.4f} s; "
                  f"load {r['loadavg_1min']})", flush=True)
    return 0


def dropout_count(text, sites: int) -> int:
    """``--dropouts``: "10" sites or "10%" of them (rounded down)."""
    text = str(text).strip()
    if text.endswith("%"):
        return int(sites * float(text[:-1]) / 100)
    return int(text)


def describe_secure(r: dict) -> str:
    steps = ", ".join(f"{k.lower()} {v:.3f}" for k, v in r["phases_s"].items())
    return (f"{r['sites']:>5} sites, d={r['dim']}, {r['dropouts']} dropout(s), secure "
            f"(k {r['degree']}, t {r['threshold']}, T {r['noise_threshold']}): round "
            f"{r['round_s']:.3f} s median of {r['repeat']} (min {r['round_s_min']:.3f}; phases "
            f"{steps} s); slowest site per step {r['site_max_s']} s; critical path "
            f"{r['critical_path_s']:.3f} s; load {r['loadavg_1min']}")


if __name__ == "__main__":
    raise SystemExit(main())
