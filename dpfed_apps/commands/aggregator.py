"""dpfed aggregator: run the aggregator server that collects signed releases and fits."""

from __future__ import annotations

import sys

from dpfed import exitcodes
from dpfed_apps.commands import add_command

EPILOG = """\
example:
  dpfed aggregator serve --config aggregator.toml
      listens on `listen`, keeps rounds in `state_db` (SQLite; survives restarts), accepts
      contributions only from the [[sites]] keys and rounds only from [[coordinators]] keys.
      Stop with Ctrl-C or SIGTERM: running calls finish, open rounds resume on restart.
      Mutual TLS with the [tls] table of the aggregator kit from `dpfed provision`; without
      one it refuses to start (exit 2) unless --insecure (plaintext, local tests only).
"""


def serve(args) -> int:
    from dpfed_apps.cli import require

    # Fail fast on a site-only installation, naming the extra, instead of a traceback.
    for module in ("scipy", "pymc"):
        require(module, "aggregator")
    from aggregator.config import ConfigError, load_config
    from aggregator.server import serve as run_server
    from dpfed.transport import warn_plaintext
    try:
        config = load_config(args.config, insecure=args.insecure)
        if config.tls is None:
            warn_plaintext("aggregator serve")
        else:
            # An expired or mismatched certificate would only show as failed handshakes at the
            # clients; say so here, before listening.
            from dpfed.identity import certificate_problems
            problems = certificate_problems(config.tls, "aggregator", "aggregator")
            if problems:
                raise ConfigError("[tls]: " + "; ".join(problems))
            from dpfed.identity import expiry_warning
            warning = expiry_warning(config.tls.cert)
            if warning:
                print(f"warning: {warning}", file=sys.stderr)
        return run_server(args.config, insecure=args.insecure)
    except ConfigError as exc:
        print(f"dpfed aggregator serve: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except OSError as exc:
        print(f"dpfed aggregator serve: {exc}", file=sys.stderr)
        return exitcodes.ERROR


def register(subparsers) -> None:
    p = add_command(subparsers, "aggregator", __doc__,
                    help="run the aggregator server", epilog=EPILOG)
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("serve", help="serve until SIGTERM/SIGINT", epilog=EPILOG)
    s.add_argument("--config", required=True, help="aggregator.toml (see docs/interfaces.md)")
    s.add_argument("--insecure", action="store_true",
                   help="plaintext gRPC without certificates, even if the config has [tls] "
                        "(local tests only)")
    s.set_defaults(func=serve)
