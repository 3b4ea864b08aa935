"""Load benchmark: one aggregator process, N simulated sites (each its own Ed25519 key) all
contributing to one round at once; reports round time, the aggregator's peak memory and how
many calls it shed with RESOURCE_EXHAUSTED (its maximum_concurrent_rpcs, aggregator/config.py).

It reuses benchmarks/bench_round.py's aggregator process and release generator; what it adds
is the load-shedding path: a shed Contribute is resent after a jittered exponential backoff,
the way site_node/client.py treats RESOURCE_EXHAUSTED (not an answer: resend the same bytes).
Peak memory is the aggregator process's VmHWM from /proc (its resident high-water mark).

    python benchmarks/bench_load.py --sites 1000 5000 [--dim 16] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import secrets
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_round import _aggregator_process, _release  # noqa: E402


def _proc_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def run_load(sites: int, dim: int = 16, *, channels: int | None = None, seed: int = 0,
             max_concurrent_rpcs: int | None = None, max_workers: int = 16) -> dict:
    import grpc
    from dpfed.v1 import dpfed_pb2 as pb
    from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
    from dpfed.wire.canonical import digest
    from dpfed.wire.signing import SigningKey, public_key_pem

    rng = np.random.default_rng(seed)
    jitter = random.Random(seed)
    site_ids = [f"site-{i:05d}" for i in range(sites)]
    t_keys = time.perf_counter()
    site_keys = {s: SigningKey.generate() for s in site_ids}
    keys_s = time.perf_counter() - t_keys
    coordinator = SigningKey.generate()
    tmp = tempfile.mkdtemp(prefix="dpfed-load-")
    raw = {"listen": "127.0.0.1:0", "state_db": "load.sqlite", "insecure": True,
           "skip_fit": True, "max_workers": max_workers, "grace_s": 0,
           "sites": [{"site_id": s, "public_key": public_key_pem(k.public_key).decode()}
                     for s, k in site_keys.items()],
           "coordinators": [{"coordinator_id": "bench",
                             "public_key": public_key_pem(coordinator.public_key).decode()}]}
    if max_concurrent_rpcs is not None:
        raw["max_concurrent_rpcs"] = max_concurrent_rpcs
    ctx = mp.get_context("spawn")
    port_queue, stop_event = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_aggregator_process, args=(raw, tmp, port_queue, stop_event))
    proc.start()
    try:
        port = port_queue.get(timeout=300)
        rss_idle_kib = _proc_kib(proc.pid, "VmRSS")
        address = f"127.0.0.1:{port}"
        now = int(time.time() * 1000)
        spec = pb.RoundSpec(round_id="load-1", coordinator_id="bench", target="y",
                            feature_names=[f"x{i}" for i in range(dim)], epsilon=1.0,
                            x_bound=0.5, y_bound=1.0, budget_split=[0.35, 0.6, 0.05],
                            quorum=sites, deadline_unix_ms=now + 600_000, created_unix_ms=now,
                            fit_method="fixed")
        spec_envelope = coordinator.sign(spec)
        spec_digest = digest(spec_envelope.payload)
        contributions = []
        for s in site_ids:
            stats = _release(dim, 100, rng)
            contributions.append(site_keys[s].sign(pb.Contribution(
                round_id="load-1", site_id=s, statistics=stats.to_bytes(), n=stats.n,
                epsilon_spent=1.0, spec_digest=spec_digest,
                timestamp_unix_ms=int(time.time() * 1000), nonce=secrets.token_hex(16))))

        # Real sites have a connection each; ~250 concurrent streams per HTTP/2 connection
        # keeps the simulation from testing one giant connection instead of the server.
        channels = channels or max(4, sites // 250)
        chans = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                 for _ in range(channels)]
        stubs = [pb_grpc.AggregatorStub(c) for c in chans]
        for c in chans:
            grpc.channel_ready_future(c).result(timeout=30)
        t0 = time.perf_counter()
        stubs[0].StartRound(spec_envelope, timeout=60)
        pending = list(range(sites))
        shed, dropped, attempt = 0, 0, 0
        while pending:
            futures = [(i, stubs[i % channels].Contribute.future(contributions[i], timeout=120))
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
            status = stubs[0].GetRound(pb.RoundQuery(round_id="load-1"), timeout=30)
            if status.state in (pb.RoundStatus.DONE, pb.RoundStatus.FAILED):
                break
            time.sleep(0.005)
        round_s = time.perf_counter() - t0
        assert status.state == pb.RoundStatus.DONE, status.message
        summary = json.loads(stubs[0].GetResult(pb.RoundQuery(round_id="load-1"),
                                                timeout=30).summary_json)
        assert summary["n_total"] == 100 * sites and len(summary["sites"]) == sites
        peak_kib = _proc_kib(proc.pid, "VmHWM")
        for c in chans:
            c.close()
        return {"sites": sites, "dim": dim, "round_s": round(round_s, 3),
                "aggregator_peak_rss_mb": round(peak_kib / 1024, 1),
                "aggregator_idle_rss_mb": round(rss_idle_kib / 1024, 1),
                "shed_resource_exhausted": shed, "dropped_unavailable_or_cancelled": dropped,
                "resend_waves": attempt, "channels": channels,
                "max_concurrent_rpcs": raw.get("max_concurrent_rpcs", "default"),
                "max_workers": max_workers, "key_generation_s": round(keys_s, 2),
                "contribution_bytes": len(contributions[0].SerializeToString())}
    finally:
        stop_event.set()
        proc.join(30)
        if proc.is_alive():
            proc.terminate()


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
