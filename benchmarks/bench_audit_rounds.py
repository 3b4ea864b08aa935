"""What the aggregator's audit log costs a secure round, end to end (docs/benchmarks.md, "Audit
log"): the same 1000-site secure round run back to back against aggregators with and without
the log, interleaved, so both see the same load.

A secure round of ``dpfed bench round --aggregation secure`` (dpfed_apps/bench/round.py), but
its plan (every site's precomputed, signed messages: minutes of CPU at 1000 sites) is made
once and reused by every run: the keys, the spec (its deadline hours ahead) and therefore the
aggregator's pushes are the same in every run. Each run starts a fresh aggregator process
(fresh store and log) in one of the variants:

* ``none``: no audit log (``AuditTrail`` replaced by None in the aggregator process: what an
  aggregator without a signing key does, but this one still signs its secure messages);
* ``audit``: the aggregator as it is (aggregator.audit);
* ``old``: the aggregator with another aggregator/audit.py (``--old-audit FILE``, e.g. from
  ``git show REV:aggregator/audit.py``), loaded as module ``audit_old``.

Each repetition runs every variant once, the order rotated from one repetition to the next;
reported: each run, the medians per variant and the median (and range) of the ratios of each
variant to ``none`` within a repetition. The plan's message timestamps must stay within the
aggregator's clock skew (set to 1 h here): keep a run under an hour.

``--cache FILE`` keeps the keys, the spec's times and the plan in FILE (pickle: a benchmark's
scratch file, not a format) for a later invocation with the same sizes, within the hour.

    python benchmarks/bench_audit_rounds.py --sites 1000 --dim 64 --dropouts 10% \\
        --repeat 6 [--variants none,audit] [--old-audit FILE] [--out runs.jsonl] \\
        [--cache plan.pickle] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANT_ENV = "DPFED_BENCH_AUDIT_VARIANT"
OLD_DIR_ENV = "DPFED_BENCH_AUDIT_OLD_DIR"
STATS_ENV = "DPFED_BENCH_AUDIT_STATS"


def variant_process(raw_config: dict, base_dir: str, port_queue, stop_event) -> None:
    """The aggregator process (dpfed_apps.bench.simulated_sites.aggregator_process) in the
    variant the environment names; with the log, its figures are appended to STATS_ENV's
    file when it stops."""
    import aggregator.server as server
    import aggregator.service as service
    from dpfed_apps.bench import simulated_sites

    variant = os.environ[VARIANT_ENV]
    if variant == "none":
        server.AuditTrail = lambda *a, **k: None
    elif variant == "old":
        sys.path.insert(0, os.environ[OLD_DIR_ENV])
        import audit_old
        server.AuditTrail = audit_old.AuditTrail
        if audit_old.audited.__code__.co_argcount == 4:     # before (handler, serializer)
            service.audited = lambda trail, what, handler, streaming, serialize: (
                audit_old.audited(trail, what, handler, streaming), serialize)
        else:
            service.audited = audit_old.audited
    trail_class = server.AuditTrail
    if isinstance(trail_class, type):
        close = trail_class.close

        def close_and_report(self, *args, **kw):
            close(self, *args, **kw)
            with open(os.environ[STATS_ENV], "a") as out:
                out.write(json.dumps({"writer_cpu_s": self.cpu_s, "batches": self.batches,
                                      "sender_cpu_s": round(self.sender_cpu_s, 4)}) + "\n")
        trail_class.close = close_and_report
    simulated_sites.aggregator_process(raw_config, base_dir, port_queue, stop_event)


class Fixed:
    """The keys of the first federation, reused by every later one (so one plan fits all)."""

    def __init__(self, keys=None):
        self.keys = keys

    def parties(self, original):
        def parties(site_ids, folder, raw_extra):
            if self.keys is None:
                out = original(site_ids, folder, raw_extra)
                self.keys = out[2:]
                return out
            from dpfed.wire.signing import public_key_pem
            from dpfed_apps.bench.simulated_sites import BENCH_COORDINATOR
            site_keys, coordinator, aggregator = self.keys
            aggregator.save(folder / "aggregator.key")
            pem = lambda k: public_key_pem(k.public_key).decode()  # noqa: E731
            raw = {"listen": "127.0.0.1:0", "state_db": "bench.sqlite", "insecure": True,
                   "signing_key": "aggregator.key",
                   "sites": [{"site_id": s, "public_key": pem(k)} for s, k in site_keys.items()],
                   "coordinators": [{"coordinator_id": BENCH_COORDINATOR,
                                     "public_key": pem(coordinator)}],
                   **raw_extra}
            return raw, folder, site_keys, coordinator, aggregator
        return parties


def run_round(sites: int, dim: int, dropouts: int, spec_times: dict, cache: dict,
              seed: int = 0) -> dict:
    """One secure round (dpfed_apps.bench.round.run_secure, the plan made once)."""
    import asyncio

    from dpfed import secure_round
    from dpfed.secagg.graph import choose_graph_parameters
    from dpfed.v1 import dpfed_pb2 as pb
    from dpfed.wire.canonical import digest
    from dpfed_apps.bench.secure_sites import plan_round, run_sites
    from dpfed_apps.bench.simulated_sites import process_cpu_s, start_federation

    releasing = sites - dropouts
    graph = choose_graph_parameters(sites, corrupt_sites=0)
    noise_threshold = min(releasing, graph.surviving_holders - graph.corrupt_holders)
    fed = start_federation(sites, dim, workers=16, seed=seed,
                           config={"max_clock_skew_s": 3600},
                           spec_fields=dict(aggregation="secure", noise_threshold=noise_threshold,
                                            max_site_rows=100, quorum=releasing, **spec_times))
    try:
        drop = fed.site_ids[releasing:]
        if "plan" not in cache:
            t = time.perf_counter()
            cache["plan"] = plan_round(fed.spec, digest(fed.spec_envelope.payload),
                                       fed.site_keys, drop, seed,
                                       aggregator_key=fed.aggregator_key)
            cache["plan_s"] = round(time.perf_counter() - t, 1)
            cache["spec"] = fed.spec_envelope.SerializeToString()
        assert fed.spec_envelope.SerializeToString() == cache["spec"], "the spec changed"
        plan = cache["plan"]
        cpu0 = process_cpu_s(fed.proc.pid)
        load = os.getloadavg()[0]
        out = asyncio.run(run_sites(fed.address, plan, fed.spec_envelope,
                                    connections=max(1, -(-sites // 250))))
        cpu1 = process_cpu_s(fed.proc.pid)
        status = out["status"]
        assert status.state == pb.RoundStatus.DONE, status.message
        assert sorted(r.site_id for r in status.refusals) == drop
        _, n = secure_round.build(fed.spec, fed.site_ids).calibration.decode(plan.expected_sum)
        summary = json.loads(fed.coordinator_stub().GetResult(
            pb.RoundQuery(round_id=fed.round_id)).summary_json)
        assert summary["n_total"] == max(0, int(n))
        return {"round_s": round(out["round_s"], 4),
                "phases_s": {p.phase: round(p.seconds, 4) for p in status.phases},
                "server_cpu_s": round(cpu1 - cpu0, 3) if cpu0 is not None else None,
                "loadavg_1min": round(load, 2)}
    finally:
        fed.stop()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sites", type=int, default=1000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dropouts", default="10%")
    p.add_argument("--repeat", type=int, default=6)
    p.add_argument("--variants", default="none,audit")
    p.add_argument("--old-audit", type=Path, help="the aggregator/audit.py of variant 'old'")
    p.add_argument("--out", type=Path, help="append each run as a JSON line")
    p.add_argument("--cache", type=Path, help="reuse (or make) the keys and plan in this file")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    from dpfed_apps.bench import simulated_sites
    from dpfed_apps.bench.round import dropout_count

    variants = args.variants.split(",")
    work = Path(tempfile.mkdtemp(prefix="dpfed-bench-audit-"))
    if "old" in variants:
        source = args.old_audit.read_text()
        # Its writer is started as ``python -m aggregator.audit``: this copy's own instead.
        (work / "audit_old.py").write_text(source.replace('"-m", "aggregator.audit"',
                                                          '"-m", "audit_old"'))
        os.environ[OLD_DIR_ENV] = str(work)
    stats_path = work / "stats.jsonl"
    os.environ[STATS_ENV] = str(stats_path)
    simulated_sites.aggregator_process = variant_process
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from dpfed.wire.signing import SigningKey

    dropouts = dropout_count(args.dropouts, args.sites)
    size = (args.sites, args.dim, dropouts)
    cache: dict = {}
    fixed = Fixed()
    if args.cache and args.cache.exists():
        saved = pickle.loads(args.cache.read_bytes())
        assert saved["size"] == size, f"{args.cache} is for {saved['size']}"
        key = lambda raw: SigningKey(Ed25519PrivateKey.from_private_bytes(raw))  # noqa: E731
        fixed.keys = ({s: key(k) for s, k in saved["sites"].items()},
                      key(saved["coordinator"]), key(saved["aggregator"]))
        cache.update(plan=saved["plan"], plan_s=saved["plan_s"], spec=saved["spec"])
        spec_times = saved["spec_times"]
    else:
        now = int(time.time() * 1000)
        spec_times = {"created_unix_ms": now, "deadline_unix_ms": now + 3 * 3600_000}
    simulated_sites._plaintext_parties = fixed.parties(simulated_sites._plaintext_parties)
    runs = []
    for rep in range(args.repeat):
        order = variants[rep % len(variants):] + variants[:rep % len(variants)]
        for variant in order:
            os.environ[VARIANT_ENV] = variant
            before = stats_path.read_text().count("\n") if stats_path.exists() else 0
            one = run_round(args.sites, args.dim, dropouts, spec_times, cache)
            if args.cache and not args.cache.exists():
                site_keys, coordinator, aggregator = fixed.keys
                raw = lambda k: k.private_key.private_bytes_raw()  # noqa: E731
                args.cache.write_bytes(pickle.dumps({
                    "size": size, "sites": {s: raw(k) for s, k in site_keys.items()},
                    "coordinator": raw(coordinator), "aggregator": raw(aggregator),
                    "plan": cache["plan"], "plan_s": cache["plan_s"], "spec": cache["spec"],
                    "spec_times": spec_times}))
            lines = stats_path.read_text().splitlines() if stats_path.exists() else []
            if len(lines) > before:
                one.update(json.loads(lines[-1]))
            one.update(variant=variant, repeat=rep, finished=time.strftime("%H:%M:%S"))
            runs.append(one)
            if args.out:
                with args.out.open("a") as f:
                    f.write(json.dumps(one) + "\n")
            if not args.json:
                print(json.dumps(one), flush=True)
    summary = {"sites": args.sites, "dim": args.dim, "dropouts": dropouts,
               "repeat": args.repeat, "plan_s": cache.get("plan_s")}
    for v in variants:
        mine = [r for r in runs if r["variant"] == v]
        summary[v] = {"round_s_median": statistics.median(r["round_s"] for r in mine),
                      "round_s_all": [r["round_s"] for r in mine],
                      "server_cpu_s_median": statistics.median(r["server_cpu_s"] or 0
                                                               for r in mine)}
        if v != "none" and "none" in variants:
            ratios = [r["round_s"] / n["round_s"] for r in mine for n in runs
                      if n["variant"] == "none" and n["repeat"] == r["repeat"]]
            summary[v]["ratio_to_none_median"] = round(statistics.median(ratios), 4)
            summary[v]["ratio_to_none_all"] = [round(x, 3) for x in ratios]
    summary["loadavg_1min"] = [r["loadavg_1min"] for r in runs]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
