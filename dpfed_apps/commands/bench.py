"""dpfed bench: time a federated round over real gRPC on this machine."""

from __future__ import annotations

import sys

from dpfed import exitcodes, jsonsafe
from dpfed_apps.commands import add_command

EPILOG = """\
example:
  dpfed bench round --sites 1000 --dim 64 --repeat 5 --json
      starts an aggregator process on loopback, N simulated sites with their own Ed25519
      keys and pre-computed releases, and times StartRound -> all N contributions verified,
      stored and summed (the posterior fit is skipped); medians over the repeats. JSON keys:
      sites, dim, tls, round_s (median), round_s_min, contributions_acked_s, server_sum_s,
      server_cpu_s, client_cpu_s, loadavg_1min (per run), ... Figures for this machine:
      docs/benchmarks.md.
  dpfed bench round --aggregation secure --sites 100 --dim 64 --dropouts 10% --json
      a secure round (consent, key agreement, masked release, unmasking): every site message
      is computed before the clock starts and checked against what the aggregator pushes;
      JSON adds phases_s, site_max_s (the slowest site per step) and critical_path_s.
  dpfed bench round --sites 1000 --dim 64 --tls
      the same over mutual TLS: a CA and kits from dpfed provision in a temporary folder,
      one connection and certificate per site, as in production.
"""


def bench_round(args) -> int:
    from dpfed_apps.bench.round import describe_secure, dropout_count, run_repeated

    if args.sites < 1 or args.dim < 1 or args.repeat < 1:
        print("dpfed bench round: --sites, --dim and --repeat must be at least 1",
              file=sys.stderr)
        return exitcodes.USAGE
    if args.aggregation == "secure":
        try:
            dropouts = dropout_count(args.dropouts, args.sites)
        except ValueError:
            dropouts = -1
        if args.tls or args.sites < 2 or not 0 <= dropouts < args.sites:
            print("dpfed bench round: --aggregation secure needs --sites >= 2, 0 <= --dropouts "
                  "< --sites (a number or a percentage) and no --tls", file=sys.stderr)
            return exitcodes.USAGE
        result = run_repeated(args.sites, args.dim, args.repeat, aggregation="secure",
                              dropouts=dropouts)
        print(jsonsafe.dumps(result) if args.json else describe_secure(result))
        return exitcodes.OK
    if args.dropouts not in ("0", 0):
        print("dpfed bench round: --dropouts needs --aggregation secure", file=sys.stderr)
        return exitcodes.USAGE
    result = run_repeated(args.sites, args.dim, args.repeat, tls=args.tls)
    if args.json:
        print(jsonsafe.dumps(result))
    else:
        print(f"{result['sites']} sites, d={result['dim']}"
              f"{' (mutual TLS)' if result['tls'] else ''}: round {result['round_s']:.3f} s "
              f"median of {result['repeat']} (min {result['round_s_min']:.3f} s; all "
              f"contributions acknowledged after {result['contributions_acked_s']:.3f} s, "
              f"exact sum {result['server_sum_s']:.4f} s; load average "
              f"{result['loadavg_1min']})")
    return exitcodes.OK


def register(subparsers) -> None:
    p = add_command(subparsers, "bench", __doc__, help="benchmark a federated round", epilog=EPILOG)
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    r = sub.add_parser("round", help="round latency with N simulated sites", epilog=EPILOG)
    r.add_argument("--sites", type=int, default=100, help="number of simulated sites")
    r.add_argument("--dim", type=int, default=64, help="number of features d")
    r.add_argument("--repeat", type=int, default=1,
                   help="runs to take the median of (default 1)")
    r.add_argument("--tls", action="store_true",
                   help="mutual TLS with kits from dpfed provision (default: plaintext loopback)")
    r.add_argument("--aggregation", choices=("independent", "secure"), default="independent",
                   help="secure: consent, key agreement, masked release and unmasking with "
                        "SiteSession-driven sites (benchmarks/secure_sites.py)")
    r.add_argument("--dropouts", default="0",
                   help="secure: sites that drop out after key agreement (N or N%%)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=bench_round)
