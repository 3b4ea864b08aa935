"""dpfed aggregator: run the aggregator server that collects signed releases and fits."""

from __future__ import annotations

import sys

from dpfed import exitcodes
from dpfed_apps.commands import add_command
from dpfed_apps.commands.audit import add_audit_arguments, show_audit

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
    from dpfed_apps.cli import require_installed

    # Fail fast on a site-only installation, naming the extra, instead of a traceback. Checked,
    # not imported: PyMC takes seconds to import and only the NUTS fits use it (posterior
    # imports it then); tests/test_start_imports.py keeps it out of the start path.
    for module in ("scipy", "pymc"):
        require_installed(module, "aggregator")
    from aggregator.config import ConfigError, load_config
    from aggregator.server import serve as run_server
    from dpfed.audit import AuditError
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
    except AuditError as exc:   # fail closed: no aggregator without its audit log
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
    # Stopped and closed by serve itself: no interpreter teardown after it (cli.exit_at_once).
    s.set_defaults(func=serve, exit_at_once=True)

    a = sub.add_parser(
        "audit", help="show and verify the audit log (round messages received and pushed)",
        description="Show the aggregator's audit log: every round message it received from "
                    "sites and coordinators (with its verdict) and every message it pushed to a "
                    "site, each with the peer and the message digest the peer's own log names; "
                    "hash-chained and signed with signing_key (docs/audit.md).",
        epilog="examples:\n  dpfed aggregator audit --config aggregator.toml --verify\n"
               "      exit 0 and 'chain intact: N entries, head signed by <key id>'; exit 7 and "
               "the first\n      edited, deleted or reordered entry, or forged head, otherwise\n"
               "  dpfed aggregator audit --config aggregator.toml --round r-42 --json\n"
               "  dpfed aggregator audit --config aggregator.toml --verify --against "
               "hospital-a.audit.sqlite\n"
               "      also match the messages exchanged with one site with that site's log")
    add_audit_arguments(a)
    a.add_argument("--config", required=True, help="aggregator.toml")
    a.set_defaults(func=audit)


def audit(args) -> int:
    """``dpfed aggregator audit``: the log at aggregator.toml's audit_log, checked with the
    public half of its signing_key (dpfed_apps.commands.audit.show_audit)."""
    from aggregator.config import ConfigError, load_config
    from aggregator.server import load_signing_key

    prog = "dpfed aggregator audit"
    try:
        config = load_config(args.config, insecure=True)
        key = load_signing_key(config)
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    if key is None:
        print(f"{prog}: {args.config} has no signing_key: the aggregator keeps no audit log "
              f"without one", file=sys.stderr)
        return exitcodes.USAGE
    return show_audit(args, prog, config.audit_path, {key.key_id: key.public_key})
