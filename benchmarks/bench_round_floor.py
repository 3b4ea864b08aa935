"""What the round benchmark's transport alone costs: the floor under `bench_round.py`.

The same N signed contributions as the round benchmark (dpfed_apps/bench/simulated_sites.py), sent
the same way (4 plaintext HTTP/2 connections, futures from one client process), to a server
in its own process with the aggregator's gRPC options, thread pool and pending-call limits,
whose Contribute handler does only part of the aggregator's work:

* ``empty``:  nothing (replies with a constant ContributeReply): Python gRPC itself;
* ``verify``: parses the envelope and checks its Ed25519 signature against the site's key,
  nothing else: gRPC plus the one cryptographic check every contribution needs;
* ``aio-empty``, ``aio-verify``: the same on grpc.aio's asyncio server instead of the
  thread-pool server (is the other server flavour cheaper per call?), the handler running on
  the event loop;
* ``aio-verify-pool``: ``aio-verify`` with the handler handed to a thread pool
  (``run_in_executor``), as a handler that blocks (on a disk commit, say) must be;
* ``aio-verify-2phase``: ``aio-verify`` for the round's two signed messages per site, as
  the round sends them since issue 10: N consents (SendPhase, a PhaseMessage each) and once
  all are answered the N contributions; the floor of a round with a consent phase;
* ``aio-verify-2phase-handoff``: ``aio-verify-2phase`` whose handler, after the check, waits
  for another thread to answer it (a queue to one thread that completes each call's asyncio
  future with ``call_soon_threadsafe``), as the round's handler waits for the store's
  writer thread: the transport cost of a reply that is not ready when the handler runs;
* ``aio-verify-2phase-batch``: the same, but the answering thread takes every call queued
  so far and completes them all in one ``call_soon_threadsafe`` (one wake-up of the loop per
  batch, as a group commit could answer its batch);
* ``aio-verify-2phase-yield``: the handler suspends on a future the event loop itself
  completes (``call_soon``), no thread: what the suspension alone costs;

and, interleaved with them, the real round (bench_round.run_bench: every check, the fsynced
store and the exact sum). Wall time runs from the first send to the last reply (``consents_s``:
to the last reply of the first phase); CPU is user + system seconds of the server process and
of this client process over the same window.

    python benchmarks/bench_round_floor.py --sites 1000 --dim 64 --repeat 5 [--json]

Results and the machine are in docs/benchmarks.md ("Round latency").
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dpfed_apps.bench.simulated_sites import (CONTRIBUTE, SEND_PHASE,  # noqa: E402
                                              process_cpu_s, sign_consents,
                                              sign_contributions)

MODES = ("empty", "verify", "aio-empty", "aio-verify", "aio-verify-pool", "aio-verify-2phase",
         "aio-verify-2phase-handoff", "aio-verify-2phase-batch", "aio-verify-2phase-yield")


def _handler(mode: str, public_keys: dict[str, bytes],
             payload_type: str = "dpfed.v1.Contribution"):
    """The handler of ``mode`` for messages of ``payload_type`` (Contribute's, or SendPhase's
    "dpfed.v1.PhaseMessage"): raw request bytes in, serialised reply out."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from dpfed.v1 import dpfed_pb2 as pb
    from dpfed.wire.signing import verify_signature

    reply = (pb.ContributeReply(accepted=True, message="ok")
             if payload_type == "dpfed.v1.Contribution" else pb.Ack(message="ok"))
    reply = reply.SerializeToString()
    keys = {kid: Ed25519PublicKey.from_public_bytes(raw) for kid, raw in public_keys.items()}

    def empty(request: bytes, context) -> bytes:
        return reply

    def verify(request: bytes, context) -> bytes:
        envelope = pb.SignedEnvelope.FromString(request)
        verify_signature(envelope, keys[envelope.key_id], payload_type)
        return reply

    return verify if "verify" in mode else empty


def server_process(mode: str, public_keys: dict[str, bytes], workers: int, port_queue,
                   stop_event) -> None:
    """Serve Contribute in ``mode`` on a free loopback port until ``stop_event``."""
    import asyncio
    from concurrent import futures

    import grpc

    from aggregator.config import AggregatorConfig
    from aggregator.server import pending_call_options
    from dpfed.transport import SERVER_OPTIONS

    cfg = AggregatorConfig()   # the defaults the real aggregator runs with
    options = SERVER_OPTIONS + pending_call_options(cfg)
    fn = _handler(mode, public_keys)
    if mode.startswith("aio"):
        import queue
        import threading

        pool = futures.ThreadPoolExecutor(max_workers=workers)
        handoff: queue.SimpleQueue = queue.SimpleQueue()

        def answer() -> None:   # the stand-in for the store's writer thread
            while (item := handoff.get()) is not None:
                loop, waiter, reply = item
                loop.call_soon_threadsafe(waiter.set_result, reply)

        def answer_batches() -> None:   # the same, one wake-up of the loop per batch
            def resolve(batch) -> None:
                for _, waiter, reply in batch:
                    waiter.set_result(reply)
            while (item := handoff.get()) is not None:
                batch = [item]
                while not handoff.empty():
                    batch.append(handoff.get())
                item[0].call_soon_threadsafe(resolve, batch)

        if mode.endswith("-handoff"):
            threading.Thread(target=answer, daemon=True).start()
        if mode.endswith("-batch"):
            threading.Thread(target=answer_batches, daemon=True).start()

        async def reply_of(reply: bytes) -> bytes:
            if not mode.endswith(("-handoff", "-batch", "-yield")):
                return reply
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            if mode.endswith("-yield"):   # suspended, answered by the loop itself
                loop.call_soon(waiter.set_result, reply)
                return await waiter
            handoff.put((loop, waiter, reply))
            return await waiter

        async def handle(request, context):
            if mode.endswith("-pool"):
                return await asyncio.get_running_loop().run_in_executor(pool, fn, request,
                                                                        context)
            return await reply_of(fn(request, context))

        phase = _handler(mode, public_keys, "dpfed.v1.PhaseMessage")

        async def handle_phase(request, context):
            return await reply_of(phase(request, context))

        async def serve():
            server = grpc.aio.server(options=options,
                                     maximum_concurrent_rpcs=cfg.max_concurrent_rpcs)
            server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
                "dpfed.v1.Aggregator",
                {"Contribute": grpc.unary_unary_rpc_method_handler(handle),
                 "SendPhase": grpc.unary_unary_rpc_method_handler(handle_phase)})])
            port_queue.put(server.add_insecure_port("127.0.0.1:0"))
            await server.start()
            while not stop_event.is_set():
                await asyncio.sleep(0.05)
            await server.stop(0)
        asyncio.run(serve())
        return
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=options,
                         maximum_concurrent_rpcs=cfg.max_concurrent_rpcs)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "dpfed.v1.Aggregator", {"Contribute": grpc.unary_unary_rpc_method_handler(fn)})])
    port_queue.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    stop_event.wait()
    server.stop(0)


def run_floor(mode: str, sites: int, dim: int, *, channels: int = 4, workers: int = 16,
              seed: int = 0) -> dict:
    import grpc
    import numpy as np
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from dpfed.transport import CHANNEL_OPTIONS
    from dpfed.wire.signing import SigningKey

    site_keys = {f"site-{i:04d}": SigningKey.generate() for i in range(sites)}
    contributions = sign_contributions(site_keys, "floor-1", "0" * 64, dim,
                                       np.random.default_rng(seed))
    consents = (sign_consents(site_keys, "floor-1", "0" * 64) if "-2phase" in mode
                else [])
    public = {k.key_id: k.public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
              for k in site_keys.values()}
    ctx = mp.get_context("spawn")
    port_queue, stop_event = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=server_process, args=(mode, public, workers, port_queue,
                                                    stop_event))
    proc.start()
    chans = []
    try:
        port = port_queue.get(timeout=120)
        options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
        chans = [grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
                 for _ in range(channels)]
        for c in chans:
            grpc.channel_ready_future(c).result(timeout=60)
        calls = [c.unary_unary(CONTRIBUTE) for c in chans]
        phases = [c.unary_unary(SEND_PHASE) for c in chans]
        time.sleep(0.2)   # let the server settle after the connections
        load = os.getloadavg()[0]
        server_cpu0, client_cpu0 = process_cpu_s(proc.pid), time.process_time()
        t0 = time.perf_counter()
        answered = [phases[i % channels].future(env, timeout=120)
                    for i, env in enumerate(consents)]
        for f in answered:
            f.result()
        first_phase = time.perf_counter() - t0
        futures = [calls[i % channels].future(env, timeout=120)
                   for i, env in enumerate(contributions)]
        for f in futures:
            f.result()
        wall = time.perf_counter() - t0
        server_cpu1, client_cpu = process_cpu_s(proc.pid), time.process_time() - client_cpu0
        return {"mode": mode, "sites": sites, "dim": dim, "wall_s": round(wall, 4),
                "consents_s": round(first_phase, 4) if consents else None,
                "server_cpu_s": (round(server_cpu1 - server_cpu0, 3)
                                 if server_cpu0 is not None and server_cpu1 is not None else None),
                "client_cpu_s": round(client_cpu, 3), "loadavg_1min": round(load, 2)}
    finally:
        for c in chans:
            c.close()
        stop_event.set()
        proc.join(30)
        if proc.is_alive():
            proc.terminate()


def run_round(sites: int, dim: int, **kw) -> dict:
    from dpfed_apps.bench.round import run_bench
    load = os.getloadavg()[0]
    r = run_bench(sites, dim, **kw)
    return {"mode": "round", "sites": sites, "dim": dim, "wall_s": r["round_s"],
            "consents_s": r["consents_acked_s"],
            "server_cpu_s": r["server_cpu_s"], "client_cpu_s": r["client_cpu_s"],
            "loadavg_1min": round(load, 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sites", type=int, default=1000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--modes", default=",".join((*MODES, "round")),
                   help="comma-separated, of " + ", ".join((*MODES, "round")))
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.repeat):   # interleaved, so every mode sees the same load
        for m in modes:
            r = run_round(args.sites, args.dim) if m == "round" else run_floor(m, args.sites,
                                                                               args.dim)
            runs[m].append(r)
            if not args.json:
                print(f"{m:>10}: wall {r['wall_s']:.3f} s (consents {r['consents_s']} s), "
                      f"server CPU {r['server_cpu_s']} s, client CPU {r['client_cpu_s']} s, "
                      f"load {r['loadavg_1min']}", flush=True)
    summary = [{"mode": m, "sites": args.sites, "dim": args.dim, "repeat": args.repeat,
                **{k: statistics.median(r[k] for r in rs)
                   for k in ("wall_s", "server_cpu_s", "client_cpu_s")},
                "wall_s_min": min(r["wall_s"] for r in rs),
                "loadavg_1min": [r["loadavg_1min"] for r in rs]} for m, rs in runs.items()]
    # Issue 21's figure: the round over the floor of its own two messages, per interleaved
    # repeat (both saw the same load), and the median of those ratios.
    pairs = None
    if {"round", "aio-verify-2phase"} <= set(runs):
        pairs = [round(r["wall_s"] / f["wall_s"], 3)
                 for r, f in zip(runs["round"], runs["aio-verify-2phase"])]
    if args.json:
        print(json.dumps({"results": summary, "round_over_2phase_floor": pairs}))
    else:
        for s in summary:
            print(f"median {s['mode']:>10}: wall {s['wall_s']:.3f} s (min {s['wall_s_min']:.3f}), "
                  f"server CPU {s['server_cpu_s']} s, client CPU {s['client_cpu_s']} s")
        if pairs:
            print(f"round / aio-verify-2phase per repeat: {pairs}, median "
                  f"{statistics.median(pairs):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
