"""Round latency benchmark as a script: ``python benchmarks/bench_round.py --sites 10 100 1000
--dim 64 [--repeat 5] [--tls] [--json]``. The benchmark itself is ``dpfed_apps.bench.round``
(shipped in the wheel, so ``dpfed bench round`` works from an installed package)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dpfed_apps.bench.round import main, run_bench, run_repeated  # noqa: E402,F401

if __name__ == "__main__":
    raise SystemExit(main())
