"""What the aggregator's audit log costs per round, alone (docs/benchmarks.md, "Audit log").

Feeds an aggregator.audit.AuditTrail what a round of N sites at dimension d gives it (the
spec pushed to every site, N consents received, a release notice pushed to every site, N
contributions received: 4N entries, the real signed bytes) the way the gRPC handlers do
(a list append each, a push serialised, ``--spread`` seconds apart in total, as arrivals over
a round), waits until everything is committed, and reports the writer process's CPU time, this
process's (the side the aggregator pays: the appends, the pushes' serialisation, which gRPC
would do anyway, and the sender thread: ``sender_cpu_s``), the time of an append, and the
batches (transactions and signed heads) written. End-to-end rounds with and without the log:
``dpfed bench round``; secure rounds: benchmarks/bench_audit_rounds.py.

    python benchmarks/bench_audit.py --sites 1000 --dim 64 --repeat 5 [--json]
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregator.audit import AuditTrail  # noqa: E402
from dpfed import audit  # noqa: E402
from dpfed.statistics import Statistics  # noqa: E402
from dpfed.v1 import dpfed_pb2 as pb  # noqa: E402
from dpfed.wire.canonical import canonical_bytes, digest  # noqa: E402
from dpfed.wire.signing import SigningKey  # noqa: E402


def round_messages(sites: int, dim: int):
    """(spec envelope, notice envelopes, consent bytes, contribution bytes) of one round."""
    coordinator = SigningKey.generate()
    names = [f"site-{i:04d}" for i in range(sites)]
    spec = coordinator.sign(pb.RoundSpec(round_id="bench", coordinator_id="coord", target="y",
                                         feature_names=[f"x{i}" for i in range(dim)],
                                         epsilon=1.0, quorum=sites, sites=names))
    spec_digest = digest(spec.payload)
    rng = np.random.default_rng(0)
    a = rng.normal(size=(dim, dim))
    stats = Statistics(a + a.T, rng.normal(size=dim), 3.0, 100).to_bytes()
    key = SigningKey.generate()      # one key for all: signing is not what is timed
    consents, contributions = [], []
    for s in names:
        consents.append(key.sign(pb.PhaseMessage(
            round_id="bench", site_id=s, spec_digest=spec_digest, phase="consent",
            timestamp_unix_ms=1, nonce=secrets.token_hex(16))).SerializeToString())
        contributions.append(key.sign(pb.Contribution(
            round_id="bench", site_id=s, statistics=stats, n=100, epsilon_spent=1.0,
            spec_digest=spec_digest, timestamp_unix_ms=1,
            nonce=secrets.token_hex(16))).SerializeToString())
    notice = pb.PhaseNotice(round_id="bench", phase="release",
                            spec_envelope=spec.SerializeToString(), participants=names)
    notices = [pb.SignedEnvelope(payload=canonical_bytes(notice),
                                 payload_type="dpfed.v1.PhaseNotice") for _ in names]
    return names, spec, notices, consents, contributions


def run_once(sites: int, dim: int, spread_s: float, messages, interval_s: float) -> dict:
    names, spec, notices, consents, contributions = messages
    key = SigningKey.generate()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "aggregator.audit.sqlite"
        key.save(Path(folder) / "aggregator.key")
        trail = AuditTrail(path, signing_key=Path(folder) / "aggregator.key",
                           interval_s=interval_s)
        trail.ready()
        heads0 = len(audit.read(path).heads)
        # What the hooks call: ``push`` serialises a push (the bytes gRPC then sends).
        calls = ([lambda s=s: trail.push(spec, s) for s in names]
                 + [lambda c=c: trail.received("SendPhase", c, "accepted") for c in consents]
                 + [lambda s=s, n=n: trail.push(n, s) for s, n in zip(names, notices)]
                 + [lambda c=c: trail.received("Contribute", c, "accepted")
                    for c in contributions])
        pause = spread_s / len(calls)
        cpu0, t0 = time.process_time(), time.perf_counter()
        put_s = 0.0
        for call in calls:
            t = time.perf_counter()
            call()
            put_s += time.perf_counter() - t
            if pause:
                time.sleep(pause)
        assert trail.flush(120) and trail.failed is None
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        trail.close()
        writer_cpu = trail.cpu_s
        contents = audit.read(path)
        assert audit.verify(contents, {key.key_id: key.public_key}).ok
        entries = len(contents.rows) - 1
        batches = len(contents.heads) - heads0
        size = sum(p.stat().st_size for p in Path(folder).glob("*"))
    return {"sites": sites, "dim": dim, "entries": entries, "batches": batches,
            "spread_s": spread_s, "interval_s": interval_s, "wall_s": round(wall, 3),
            # CPU of the writer process (its whole life: open, append, close), and of this
            # process (the handlers' puts, the queue's feeder thread, this loop); bytes.
            "writer_cpu_s": round(writer_cpu, 4),
            "writer_us_per_entry": round(writer_cpu / entries * 1e6, 1),
            "process_cpu_s": round(cpu, 4), "sender_cpu_s": round(trail.sender_cpu_s, 4),
            "put_us_per_entry": round(put_s / entries * 1e6, 2), "bytes": size}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sites", type=int, default=1000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--spread", type=float, default=1.5,
                   help="seconds over which the round's messages arrive (default 1.5, a "
                        "1000-site round on this machine)")
    p.add_argument("--interval", type=float, default=AuditTrail.INTERVAL_S,
                   help="the writer's batch interval (default: the aggregator's)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    messages = round_messages(args.sites, args.dim)
    runs = [run_once(args.sites, args.dim, args.spread, messages, args.interval)
            for _ in range(args.repeat)]
    out = {k: statistics.median(r[k] for r in runs) if isinstance(runs[0][k], float)
           else runs[0][k] for k in runs[0]}
    out["repeat"] = args.repeat
    out["writer_cpu_s_all"] = [r["writer_cpu_s"] for r in runs]
    out["batches_all"] = [r["batches"] for r in runs]
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['entries']} entries ({args.sites} sites, d = {args.dim}) over "
              f"{args.spread} s: writer CPU {out['writer_cpu_s']:.3f} s median "
              f"({out['writer_us_per_entry']} us an entry), {out['batches']} batches, put "
              f"{out['put_us_per_entry']} us, "
              f"{out['bytes'] / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
