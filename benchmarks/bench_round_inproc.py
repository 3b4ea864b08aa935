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

    python benchmarks/bench_round_inproc.py --sites 1000 --dim 64 --repeat 3 [--json] [--parts]

``--parts`` also reports the CPU seconds (``time.thread_time``, on whichever thread ran it)
and the calls of each part of the aggregator's work (``PARTS``: the signature checks, the
decoders, the checks, the store writer's commits, the exact sum), timed by wrappers put
around those functions for the timed round only and removed after it: the per-site table
of docs/benchmarks.md ("Against the floor, fourth session"). Parts nest (a contribution's
decode is inside ``verify_site``), so they are not to be added up blindly.

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

#: (module, attribute path, label) of each part ``--parts`` times; indented labels are
#: inside the part above them.
PARTS = (
    ("aggregator.authentication", "SiteAuthenticator.verify_site",
     "verify_site: limits, Ed25519, decode, fields"),
    ("aggregator.authentication", "verify_signature", "  Ed25519 check, contribution"),
    ("dpfed.wire.signing", "verify_signature", "  Ed25519 check, consent (signing.verify)"),
    ("aggregator.authentication", "fast_contribution", "  decode a contribution"),
    ("aggregator.contribution_wire", "canonical_b64decode", "    strict base64"),
    ("dpfed.wire.signing", "parse_canonical", "  decode a consent"),
    ("aggregator.authentication", "check_fields", "  field limits"),
    ("aggregator.authentication", "check_envelope_size", "  envelope limits"),
    ("aggregator.rounds.release", "ReleasePhase.admit_contribution",
     "admit_contribution (verify_site included)"),
    ("aggregator.rounds.release", "aggregate.encoded_n", "  the statistics' n"),
    ("aggregator.rounds.release", "declared_noise", "  the declared noise"),
    ("aggregator.rounds.consent", "ConsentPhase.consent_later",
     "consent_later: checks, reservation, queueing"),
    ("aggregator.store", "RoundStore.submit_group", "queueing a group commit"),
    ("aggregator.store", "RoundStore._commit_batch", "writer: SQLite batch and COMMIT"),
    ("aggregator.rounds.release", "ReleasePhase.complete_contribution",
     "writer: complete_contribution"),
    ("aggregator.running_total", "RunningTotal.add_encoded", "  queue the values for the sum"),
    ("aggregator.running_total", "RunningTotal.fold", "  exact sum (fold: a block of 16)"),
)


def _timed_parts():
    """Wrap every PARTS function with a thread_time accumulator; returns (totals, undo)."""
    import functools
    import importlib

    totals: dict[str, list] = {}
    undo = []
    for module_name, path, label in PARTS:
        owner = importlib.import_module(module_name)
        *outer, name = path.split(".")
        for attr in outer:
            owner = getattr(owner, attr)
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        entry = totals.setdefault(label, [0.0, 0])

        def timed(*args, _f=original, _e=entry, **kwargs):
            t0 = time.thread_time()
            try:
                return _f(*args, **kwargs)
            finally:
                _e[0] += time.thread_time() - t0
                _e[1] += 1
        if not callable(original) or isinstance(original, (staticmethod, classmethod)):
            raise TypeError(f"{module_name}.{path} is not a plain function or method")
        functools.update_wrapper(timed, original)
        setattr(owner, name, timed)
        undo.append((owner, name, original))

    def restore():
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)
    return totals, restore


def run_once(sites: int, dim: int, seed: int = 0, parts: bool = False) -> dict:
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
        totals, restore = _timed_parts() if parts else (None, lambda: None)
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
        restore()
        assert manager.status(spec.round_id).state == pb.RoundStatus.DONE
        out = {"sites": sites, "dim": dim, "wall_s": round(wall, 4),
               "consent_s": round(consent_s, 4), "cpu_s": round(cpu, 3),
               "loadavg_1min": round(os.getloadavg()[0], 2)}
        if totals is not None:
            out["parts"] = {label: {"cpu_s": round(s, 4), "calls": n}
                            for label, (s, n) in totals.items()}
        return out
    finally:
        server.stop(0)
        shutil.rmtree(folder, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sites", type=int, default=1000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--parts", action="store_true",
                   help="also the CPU seconds and calls of each part of the work (PARTS)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    runs = [run_once(args.sites, args.dim, seed, parts=args.parts)
            for seed in range(args.repeat)]
    summary = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "consent_s", "cpu_s")}
    if args.json:
        print(json.dumps({"runs": runs, "median": summary}))
    else:
        for r in runs:
            print({k: v for k, v in r.items() if k != "parts"})
            for label, part in r.get("parts", {}).items():
                print(f"  {label:50s} {part['cpu_s']:8.4f} CPU-s {part['calls']:6d} calls "
                      f"{1e6 * part['cpu_s'] / max(part['calls'], 1):8.1f} us a call")
        print("median", summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
