"""dpfed console: a coordinator's web console: rounds, sites, budgets and posteriors.

Serves web pages for one coordinator, talking to the aggregator with the coordinator's
mutual-TLS identity (read-only RPCs, and StartRound signed with the coordinator's key). See
docs/console.md.
"""

from __future__ import annotations

import logging
import signal
import sys
import tomllib
from pathlib import Path

from dpfed import exitcodes
from dpfed_apps.cli import command_prog, require
from dpfed_apps.commands import add_command
from dpfed_apps.commands.round import UsageError, add_connection_args, check_coordinator_keys, connect

log = logging.getLogger(__name__)

EPILOG = """\
examples:
  dpfed console --config coordinator.toml
      on this machine only (the default); prints http://127.0.0.1:8765/?token=... : open
      that address (the token in it logs the browser in; a new one each start)
  dpfed console --config coordinator.toml --port 9000
  dpfed console --config coordinator.toml --host 0.0.0.0 \\
        --tls-cert console.pem --tls-key console.key --token-file console.token
      on the network: HTTPS and an access token are required, or it refuses to start

coordinator.toml (the coordinator kit of `dpfed provision`) may have a [console] table:
  [console]
  host = "127.0.0.1"           # loopback by default; any other address needs the next three
  port = 8765
  tls_cert = "console.pem"     # HTTPS certificate and key (PEM)
  tls_key = "console.key"
  token_file = "console.token" # access token (>= 16 characters, file mode 600); without it
                               # a fresh token is made at start and printed with the URL
  state_dir = "console-state"  # where the forecasts of rounds started here are kept
  spec_dir = "."               # relative paths in uploaded round.toml files start here

Without signing_key and coordinator_id in coordinator.toml the console is read-only.
Stop it with Ctrl-C (exit 0).

exit codes: 0 stopped, 1 could not listen, 2 bad options or config (including an unsafe bind),
            6 the console extra is not installed (pip install "dpfed[console]")
"""


def run(args) -> int:
    for module in ("starlette", "uvicorn", "jinja2", "multipart"):
        require(module, "console")
    from dpfed_apps.console.config import ConsoleConfigError, settings_from
    from dpfed_apps.console.server import BindError, ConsoleServer, build_console

    prog = command_prog(args)
    conf, base = {}, Path(".")
    if args.config:
        path = Path(args.config)
        try:
            conf = tomllib.loads(path.read_text())
            check_coordinator_keys(conf, str(path))
        except (OSError, tomllib.TOMLDecodeError, UsageError) as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return exitcodes.USAGE
        base = path.parent
    signing = bool(args.key or conf.get("signing_key")) and bool(
        args.coordinator_id or conf.get("coordinator_id"))
    try:
        settings = settings_from(conf.get("console", {}), base, host=args.host, port=args.port,
                                 tls_cert=args.tls_cert, tls_key=args.tls_key,
                                 token_file=args.token_file, state_dir=args.state_dir)
        coordinator = connect(args, signing=signing)
    except (ConsoleConfigError, UsageError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    coordinator.timeout_s = args.rpc_timeout
    address = args.aggregator or conf.get("aggregator", "")
    if not signing:
        log.warning("no signing key in the configuration: the console is read-only")
    try:
        coordinator.list_rounds(limit=1)
    except Exception as exc:  # noqa: BLE001 - only a warning; the pages say it too
        log.warning("the aggregator at %s does not answer yet (%s); the console starts anyway "
                    "and its pages say so until it does", address,
                    getattr(exc, "code", lambda: type(exc).__name__)())
    try:
        server = ConsoleServer(build_console(coordinator, address, settings,
                                             coordinator_id=coordinator.coordinator_id))
    except BindError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        coordinator.close()
        return exitcodes.ERROR
    # Printed once, Jupyter style: the only place a token made at start is shown.
    token = ("open this address: the token in it logs you in" if settings.token is None
             else "access token: the one in token_file")
    print(f"dpfed console: {server.login_url}  (coordinator {coordinator.coordinator_id or '-'}"
          f", aggregator {address}; {token}; Ctrl-C stops)", flush=True)
    log.info("console for %s on %s (access token %s, %s)", address, server.url,
             "from token_file" if settings.token else "made at start",
             "can start rounds" if signing else "read-only")

    def stop(signum, frame):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        coordinator.close()
    print("dpfed console: stopped", file=sys.stderr)
    return exitcodes.OK


def register(subparsers) -> None:
    p = add_command(subparsers, "console", __doc__,
                    help="a coordinator's web console: rounds, sites, budgets, results",
                    epilog=EPILOG)
    add_connection_args(p, signing=True)
    p.add_argument("--host", help="address to listen on (default: 127.0.0.1; any non-loopback "
                                  "address needs --tls-cert, --tls-key and --token-file)")
    p.add_argument("--port", type=int, help="port to listen on (default: 8765; 0: any free port)")
    p.add_argument("--tls-cert", help="HTTPS certificate (PEM)")
    p.add_argument("--tls-key", help="HTTPS private key (PEM)")
    p.add_argument("--token-file", help="file holding the access token (mode 600; default: a "
                                        "fresh token made at start, printed with the URL)")
    p.add_argument("--state-dir", help="folder for the forecasts of rounds started here "
                                       "(default: console-state next to coordinator.toml)")
    p.add_argument("--rpc-timeout", type=float, default=10.0,
                   help="seconds to wait for the aggregator per call")
    p.set_defaults(func=run)
