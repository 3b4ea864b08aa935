"""Console page-render benchmark (issue 13): each page of `dpfed console` against a real
aggregator whose store holds 1000 sites and 500 rounds; the logic is in
dpfed_apps/bench/console.py, the results in docs/benchmarks.md ("Console pages").

    python benchmarks/bench_console.py [--repeat 20] [--browser] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpfed_apps.bench.console import markdown, run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="fetches per page (server side)")
    parser.add_argument("--browser", action="store_true",
                        help="also time page loads in headless Chromium (/usr/bin/chromium)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    report = run(repeat=args.repeat, browser=args.browser)
    report["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "platform": platform.platform(), "load": os.getloadavg()}
    print(json.dumps(report, indent=2) if args.json else markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
