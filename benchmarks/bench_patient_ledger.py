"""The per-patient ledger at scale (issue 23 part 1): the filter (``PrivacyLedger.admitted``) and
the debit (``record_release`` with every included patient, one transaction) for N patients a
release, over MONTHS monthly releases with NEW patients arriving each month, and the keyed
hashing of the ids. Wall and CPU seconds per step; the ledger file's size at the end.

    nice -n 10 .venv/bin/python benchmarks/bench_patient_ledger.py --patients 100000 \\
        --new 10000 --months 12

Results: docs/benchmarks.md, "Per-patient ledger".
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from dpfed.accounting import PureDP
from dpfed.v1 import dpfed_pb2 as pb
from site_node.ledger import PrivacyLedger


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patients", type=int, default=100_000, help="patients in month 1")
    ap.add_argument("--new", type=int, default=10_000, help="new patients each month")
    ap.add_argument("--months", type=int, default=12)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--budget", type=float, default=3.0)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.sqlite"
        ledger = PrivacyLedger(path, site_id="bench", patient_epsilon=args.budget)
        budget = ledger.patient_budget()
        env = pb.SignedEnvelope(payload=b"x" * 2000, payload_type="dpfed.v1.Contribution")
        print("month  patients  hash_s  filter_wall_s  filter_cpu_s  record_wall_s  "
              "record_cpu_s  included")
        for month in range(args.months):
            ids = [f"MRN{i:09d}" for i in range(args.patients + args.new * month)]
            w, c = time.perf_counter(), time.process_time()
            keys = ledger.patient_hasher().keys_of(ids)
            hash_s = time.perf_counter() - w
            w, c = time.perf_counter(), time.process_time()
            ok = ledger.admitted(keys, PureDP(args.epsilon), budget)
            fw, fc = time.perf_counter() - w, time.process_time() - c
            included = [k for k, a in zip(keys, ok) if a]
            seen = [k for k, a in zip(keys, ok) if not a]
            w, c = time.perf_counter(), time.process_time()
            ledger.record_release(round_id=f"m{month}", spec_digest=f"{month:064x}",
                                  epsilon=args.epsilon, n=len(included), envelope=env,
                                  patients=included, seen=seen, patient_budget=budget)
            rw, rc = time.perf_counter() - w, time.process_time() - c
            print(f"{month + 1:5d}  {len(ids):8d}  {hash_s:6.2f}  {fw:13.2f}  {fc:12.2f}  "
                  f"{rw:13.2f}  {rc:12.2f}  {len(included):8d}")
        w = time.perf_counter()
        summary = ledger.patient_summary()
        print(f"histogram ({time.perf_counter() - w:.2f} s): "
              f"{[b['patients'] for b in summary['histogram']]}")
        ledger.close()
        size = sum(p.stat().st_size for p in Path(tmp).glob("ledger.sqlite*"))
        print(f"ledger size {size / 1e6:.1f} MB")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
