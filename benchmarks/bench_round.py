"""Round latency benchmark: coordinator StartRound -> all N contributions verified, stored and
summed at the aggregator (the fit is skipped with the aggregator's bench-only `skip_fit`).

Real gRPC on loopback, real Ed25519 keys: the aggregator runs in its own process; the N
simulated sites live in this one as lightweight clients. Their releases are pre-computed and
each site signs its own contribution before the clock starts (sites sign in parallel in
reality, so one process signing 1000 in series would time this machine, not the federation).

    python benchmarks/bench_round.py --sites 10 100 1000 --dim 64 [--repeat 5] [--json]

With --repeat R each size runs R times (a fresh aggregator process each time) and the median
is reported with the minimum and the load average, because other processes on a small
machine distort single runs. Results and the machine are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import statistics
import tempfile
import time

import numpy as np


def _aggregator_process(raw_config: dict, base_dir: str, port_queue, stop_event) -> None:
    import logging
    logging.basicConfig(level=logging.WARNING)
    from aggregator.config import config_from_dict
    from aggregator.server import AggregatorServer
    server = AggregatorServer(config_from_dict(raw_config, base_dir))
    port_queue.put(server.start())
    stop_event.wait()
    server.stop(0)


def _process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (Linux /proc; None elsewhere)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _release(d: int, n: int, rng) -> "Statistics":
    from dpfed.statistics import Statistics
    a = rng.normal(size=(d, d))
    return Statistics(np.triu(a) + np.triu(a, 1).T, rng.normal(size=d), float(abs(rng.normal()) + n), n)


def run_bench(sites: int, dim: int, *, channels: int = 4, workers: int = 16,
              seed: int = 0) -> dict:
    import grpc
    from dpfed.v1 import dpfed_pb2 as pb
    from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
    from dpfed.wire.signing import SigningKey, public_key_pem

    rng = np.random.default_rng(seed)
    site_ids = [f"site-{i:04d}" for i in range(sites)]
    site_keys = {s: SigningKey.generate() for s in site_ids}
    coordinator = SigningKey.generate()
    tmp = tempfile.mkdtemp(prefix="dpfed-bench-")
    raw = {"listen": "127.0.0.1:0", "state_db": "bench.sqlite", "insecure": True,
           "skip_fit": True, "max_workers": workers, "grace_s": 0,
           "sites": [{"site_id": s, "public_key": public_key_pem(k.public_key).decode()}
                     for s, k in site_keys.items()],
           "coordinators": [{"coordinator_id": "bench",
                             "public_key": public_key_pem(coordinator.public_key).decode()}]}
    ctx = mp.get_context("spawn")
    port_queue, stop_event = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_aggregator_process, args=(raw, tmp, port_queue, stop_event))
    proc.start()
    try:
        port = port_queue.get(timeout=120)
        address = f"127.0.0.1:{port}"
        now = int(time.time() * 1000)
        spec = pb.RoundSpec(round_id="bench-1", coordinator_id="bench", target="y",
                            feature_names=[f"x{i}" for i in range(dim)], epsilon=1.0,
                            x_bound=0.5, y_bound=1.0, budget_split=[0.35, 0.6, 0.05],
                            quorum=sites, deadline_unix_ms=now + 600_000, created_unix_ms=now,
                            fit_method="fixed")
        spec_envelope = coordinator.sign(spec)
        from dpfed.wire.canonical import digest
        spec_digest = digest(spec_envelope.payload)

        t_sign = time.perf_counter()
        contributions = []
        for s in site_ids:
            stats = _release(dim, 100, rng)
            contributions.append(site_keys[s].sign(pb.Contribution(
                round_id="bench-1", site_id=s, statistics=stats.to_bytes(), n=stats.n,
                epsilon_spent=1.0, spec_digest=spec_digest,
                timestamp_unix_ms=int(time.time() * 1000), nonce=secrets.token_hex(16))))
        sign_s = time.perf_counter() - t_sign

        chans = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                 for _ in range(channels)]
        stubs = [pb_grpc.AggregatorStub(c) for c in chans]
        for c in chans:
            grpc.channel_ready_future(c).result(timeout=30)
        server_cpu0, client_cpu0 = _process_cpu_s(proc.pid), time.process_time()
        t0 = time.perf_counter()
        stubs[0].StartRound(spec_envelope, timeout=60)
        futures = [stubs[i % channels].Contribute.future(env, timeout=120)
                   for i, env in enumerate(contributions)]
        replies = [f.result() for f in futures]
        t_contributed = time.perf_counter() - t0
        while True:
            status = stubs[0].GetRound(pb.RoundQuery(round_id="bench-1"), timeout=30)
            if status.state in (pb.RoundStatus.DONE, pb.RoundStatus.FAILED):
                break
            time.sleep(0.002)
        round_s = time.perf_counter() - t0
        server_cpu1, client_cpu = _process_cpu_s(proc.pid), time.process_time() - client_cpu0
        assert all(r.accepted for r in replies)
        assert status.state == pb.RoundStatus.DONE, status.message
        summary = json.loads(stubs[0].GetResult(pb.RoundQuery(round_id="bench-1")).summary_json)
        assert summary["n_total"] == 100 * sites
        for c in chans:
            c.close()
        return {"sites": sites, "dim": dim, "round_s": round(round_s, 4),
                "loadavg_1min": round(os.getloadavg()[0], 2),
                "contributions_acked_s": round(t_contributed, 4),
                "server_quorum_s": status.round_seconds,
                "server_sum_s": round(summary["timings"]["fit_s"], 4),
                "site_signing_s_serial": round(sign_s, 4),
                # CPU time in the timed window: the aggregator process (all its threads) and
                # this client process; they share the machine's cores.
                "server_cpu_s": (round(server_cpu1 - server_cpu0, 3)
                                 if server_cpu0 is not None and server_cpu1 is not None else None),
                "client_cpu_s": round(client_cpu, 3),
                "contribution_bytes": len(contributions[0].SerializeToString())}
    finally:
        stop_event.set()
        proc.join(30)
        if proc.is_alive():
            proc.terminate()


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
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    for d in args.dim:
        for n in args.sites:
            r = run_repeated(n, d, args.repeat, channels=args.channels, workers=args.workers)
            print(json.dumps(r) if args.json else
                  f"{r['sites']:>5} sites, d={r['dim']}: round {r['round_s']:.3f} s median of "
                  f"{r['repeat']} (min {r['round_s_min']:.3f}; all acked "
                  f"{r['contributions_acked_s']:.3f} s, sum {r['server_sum_s']:.4f} s; "
                  f"load {r['loadavg_1min']})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
