"""dpfed aggregator: run the aggregator server that collects signed releases and fits."""

from __future__ import annotations

import argparse
import sys

from dpfed import exitcodes

EPILOG = """\
example:
  dpfed aggregator serve --config aggregator.toml
      listens on `listen`, keeps rounds in `state_db` (SQLite; survives restarts), accepts
      contributions only from the [[sites]] keys and rounds only from [[coordinators]] keys.
      Stop with Ctrl-C or SIGTERM: running calls finish, open rounds resume on restart.
"""


def serve(args) -> int:
    from aggregator.config import ConfigError
    from aggregator.server import serve as run_server
    try:
        return run_server(args.config)
    except ConfigError as exc:
        print(f"dpfed aggregator serve: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except OSError as exc:
        print(f"dpfed aggregator serve: {exc}", file=sys.stderr)
        return exitcodes.ERROR


def register(subparsers) -> None:
    p = subparsers.add_parser("aggregator", help="run the aggregator server",
                              description=__doc__.splitlines()[0].split(": ", 1)[1],
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("serve", help="serve until SIGTERM/SIGINT", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--config", required=True, help="aggregator.toml (see docs/interfaces.md)")
    s.set_defaults(func=serve)
