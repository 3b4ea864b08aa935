"""``dpfed simulate``: a whole federation on this machine, on bundled GDSC data.

Starts an aggregator and K site nodes as separate processes (real gRPC on loopback, real
Ed25519 keys), runs one round and compares the private model with non-private and
public-only baselines on held-out cell lines. See dpfed_apps.simulation.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from dpfed import exitcodes, jsonsafe
from dpfed.fit_methods import FIT_METHODS   # the fits' names: --help needs no fitting code

HELP = "run a federation (aggregator + K sites as processes) on this machine and score it"


EPILOG = """\
examples:
  dpfed simulate                               3 sites, eps 2, Nutlin-3a, ADVI: a readable report
  dpfed simulate --sites 10 --epsilon 1 --drug 1373 --seed 4
  dpfed simulate --sites 5 --dropouts 2         secure aggregation; 2 sites stop after key agreement
  dpfed simulate --aggregation independent     every site's release carries its own noise
  dpfed simulate --json > result.json          one JSON object (round_id, sites, metrics, timings)
  dpfed simulate --data my.csv --target response --workdir run1   your own CSV; keep the folder
  dpfed simulate --console                     then keep the federation running with the web
                                               console on 127.0.0.1:8765 until Ctrl-C; open
                                               the printed http://127.0.0.1:8765/?token=...
  dpfed simulate --console 0                   the console on any free port (the URL is printed)

With --console the report is printed after Ctrl-C, once everything has stopped (exit 0).

exit codes: 0 done, 3 the round failed (the process logs are printed and the folder kept),
            2 bad options or data, 130 interrupted (every child process is stopped)
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate", help=HELP, description=HELP + ".", epilog=EPILOG)
    p.add_argument("--sites", type=int, default=3, help="number of site processes")
    p.add_argument("--epsilon", type=float, default=2.0, help="epsilon each site spends")
    p.add_argument("--drug", type=int, default=1047,
                   help="GDSC drug id (1047 = Nutlin-3a, 1373 = Dabrafenib, 1036 = PLX4720)")
    p.add_argument("--features", default=None,
                   help="comma-separated feature names (GDSC: e.g. TP53_mut,tissue=leukemia); "
                        "default: the public rule (5 most frequent mutations + 5 most common "
                        "tissues) or, with --data, every other column")
    p.add_argument("--data", type=Path, default=None,
                   help="a CSV (id column, feature columns, target) to use instead of GDSC")
    p.add_argument("--id-column", default=None, help="with --data: id column (default: first)")
    p.add_argument("--target", default=None, help="with --data: target column (default: last)")
    p.add_argument("--public", type=int, default=10, help="public (non-private) lines")
    p.add_argument("--test", type=int, default=100, help="held-out test lines")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and of the fit")
    p.add_argument("--fit-method", default="auto", choices=list(FIT_METHODS),
                   help="posterior fit at the aggregator (and for the baselines)")
    p.add_argument("--draws", type=int, default=5000, help="posterior draws")
    p.add_argument("--workdir", type=Path, default=None,
                   help="folder for keys, configs, data, state and logs (kept); default: a "
                        "temporary folder, removed on success")
    p.add_argument("--timeout", type=float, default=600.0, help="round timeout in seconds")
    p.add_argument("--aggregation", choices=("secure", "independent"), default=None,
                   help="secure aggregation with distributed noise (default for 2 sites or "
                        "more) or independent releases (default for one site)")
    p.add_argument("--dropouts", type=int, default=0,
                   help="secure: this many sites stop right after key agreement, before "
                        "releasing (the round waits for them until its release step ends)")
    p.add_argument("--targets", default=None, metavar="N|all",
                   help="a joint round (docs/protocol.md 'Joint rounds'): the first N GDSC "
                        "drugs (or all 262) as targets of one release; independent "
                        "aggregation unless --aggregation secure")
    p.add_argument("--mechanism", choices=("laplace", "gaussian"), default="laplace",
                   help="with --targets: the noise (gaussian needs --delta)")
    p.add_argument("--delta", type=float, default=None,
                   help="with --mechanism gaussian: the delta each patient pays (e.g. 1e-6)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a report")
    p.add_argument("--console", type=int, nargs="?", const=8765, default=None, metavar="PORT",
                   help="after the round, keep the federation running and serve the "
                        "coordinator's web console on 127.0.0.1:PORT (default 8765; 0: a free "
                        "port) until Ctrl-C")
    # Every child stopped, the work folder removed, the report printed when run returns: no
    # interpreter teardown after it (cli.exit_at_once).
    p.set_defaults(func=run, exit_at_once=True)


def console_hold(port: int, out):
    """The ``hold`` of run_simulation for --console: serve the console (as the simulation's
    coordinator, over mutual TLS), keep the simulation's forecast for its round, print the
    URL on ``out`` and wait for Ctrl-C or SIGTERM; then stop the console (the simulation
    stops the federation)."""
    import threading

    def hold(federation, coordinator, round_id, forecast):
        from dpfed_apps.console.config import ConsoleSettings
        from dpfed_apps.console.server import serve_in_thread
        from dpfed_apps.simulation.federation import COORDINATOR_ID

        root = federation.layout.root
        settings = ConsoleSettings(port=port, state_dir=root / "console", spec_dir=root)
        server = serve_in_thread(coordinator, federation.address, settings,
                                 coordinator_id=COORDINATOR_ID)
        stop = threading.Event()
        previous = {sig: signal.signal(sig, lambda signum, frame: stop.set())
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            server.console.data.forecasts.save(
                round_id, forecast, note="made by dpfed simulate before the round")
            print(f"dpfed simulate: console at {server.login_url} - the aggregator and "
                  f"{len(federation.site_names)} sites keep running; round.toml to start "
                  f"another round is {root / 'round.toml'}; Ctrl-C stops everything",
                  file=out, flush=True)
            while not stop.wait(0.5):
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            server.stop()
            print("dpfed simulate: stopping the console and the federation", file=sys.stderr,
                  flush=True)

    return hold


class _Interrupts:
    """Turns SIGINT and SIGTERM into KeyboardInterrupt and remembers that one came: PyMC
    swallows KeyboardInterrupt during a fit and returns what it has, and an interrupted run
    must not end with exit code 0 and a half-fitted baseline."""

    def __init__(self):
        self.received = False

    def __call__(self, signum, frame):
        self.received = True
        raise KeyboardInterrupt


def run(args) -> int:
    from dpfed_apps import simulation
    from dpfed_apps.cli import require, require_installed

    # The simulation runs every role: it needs the site and the aggregator extras. Checked,
    # not imported (PyMC alone takes seconds; the default fit never imports it).
    for module, extra in (("opendp", "all"), ("scipy", "all"), ("pymc", "all")):
        require_installed(module, extra)
    if args.console is not None:
        for module in ("starlette", "uvicorn", "jinja2", "multipart"):
            require(module, "console")
        if not 0 <= args.console <= 65535:
            print("dpfed simulate: --console PORT must be 0..65535", file=sys.stderr)
            return exitcodes.USAGE

    if (args.sites < 1 or args.epsilon <= 0 or args.public < 1 or args.test < 2
            or args.dropouts < 0):
        print("dpfed simulate: need --sites >= 1, --epsilon > 0, --public >= 1, --test >= 2, "
              "--dropouts >= 0", file=sys.stderr)
        return exitcodes.USAGE
    features = tuple(f.strip() for f in args.features.split(",") if f.strip()) if args.features else None
    options = simulation.SimulationOptions(
        n_sites=args.sites, epsilon=args.epsilon, drug=args.drug, features=features,
        data=args.data, id_column=args.id_column, target=args.target, n_public=args.public,
        n_test=args.test, seed=args.seed, fit_method=args.fit_method, fit_draws=args.draws,
        workdir=args.workdir, round_timeout_s=args.timeout, log_level=args.log_level,
        aggregation=args.aggregation, dropouts=args.dropouts)
    joint = None
    if args.targets is not None or args.mechanism != "laplace" or args.delta is not None:
        problem = _joint_problem(args)
        if problem:
            print(f"dpfed simulate: {problem}", file=sys.stderr)
            return exitcodes.USAGE
        joint = {"targets": args.targets if args.targets == "all" else int(args.targets),
                 "mechanism": args.mechanism, "delta": args.delta or 0.0}
    # SIGTERM cleans up like Ctrl-C: the finally blocks stop the child processes.
    interrupts = _Interrupts()
    previous = {sig: signal.signal(sig, interrupts) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        hold = None if args.console is None else console_hold(
            args.console, sys.stderr if args.json else sys.stdout)
        if joint is not None:
            from dpfed_apps.simulation.joint import run_joint_simulation
            result = run_joint_simulation(options, **joint)
        else:
            result = simulation.run_simulation(options, hold=hold)
    except KeyboardInterrupt:
        print("dpfed simulate: interrupted; all processes stopped", file=sys.stderr)
        return exitcodes.INTERRUPTED
    except (ValueError, KeyError, FileNotFoundError) as exc:
        print(f"dpfed simulate: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except simulation.FederationFailed as exc:
        print(f"dpfed simulate: round failed: {exc}", file=sys.stderr)
        print(getattr(exc, "logs", ""), file=sys.stderr)
        if getattr(exc, "workdir", None):
            print(f"dpfed simulate: work folder kept for inspection: {exc.workdir}", file=sys.stderr)
        return exitcodes.ROUND_FAILED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if interrupts.received:
        print("dpfed simulate: interrupted; all processes stopped", file=sys.stderr)
        return exitcodes.INTERRUPTED
    if args.json:
        print(jsonsafe.dumps(result, sort_keys=True))
    elif joint is not None:
        from dpfed_apps.simulation.joint import format_joint_report
        print(format_joint_report(result))
    else:
        print(simulation.format_report(result))
    return exitcodes.OK


def _joint_problem(args) -> str:
    """What is wrong with the joint-round options ("" if nothing)."""
    if args.targets is None:
        return "--mechanism and --delta need --targets N|all"
    if args.targets != "all" and not (args.targets.isdigit() and int(args.targets) >= 1):
        return f"--targets must be a number >= 1 or all, got {args.targets!r}"
    if args.data is not None or args.target is not None or args.console is not None \
            or args.dropouts:
        return "--targets runs on the bundled GDSC data, without --data/--target/--console/" \
               "--dropouts"
    if args.mechanism == "gaussian" and not (args.delta is not None and 0 < args.delta < 1):
        return "--mechanism gaussian needs --delta with 0 < delta < 1"
    if args.mechanism == "laplace" and args.delta is not None:
        return "--delta is only for --mechanism gaussian"
    return ""
