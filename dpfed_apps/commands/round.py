"""dpfed round: start a federated round as coordinator, follow it, print its result."""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

from dpfed import exitcodes, jsonsafe
from dpfed_apps.commands import add_command
from dpfed_apps.cli import command_prog

EPILOG = """\
examples:
  dpfed round start --spec round.toml --aggregator 127.0.0.1:50051 \\
        --key keys/coordinator.key --coordinator-id coordinator --insecure --wait
  dpfed round start --spec round.toml --config coordinator.toml --wait --json
  dpfed round status r-20250101-120000-abc123 --config coordinator.toml
  dpfed round result r-20250101-120000-abc123 --config coordinator.toml [--json]
  dpfed round result r-20250101-120000-abc123 --config coordinator.toml --target Drug_1
  dpfed round list --config coordinator.toml [--limit 20] [--json]

coordinator.toml holds the connection so it need not be typed each time:
  aggregator = "127.0.0.1:50051"
  coordinator_id = "coordinator"
  signing_key = "keys/coordinator.key"
  site_keys = "site-keys"    # secure rounds: <site_id>.pub of every site (the CA's public/sites/)
  aggregator_key = "aggregator.pub"   # secure rounds: the CA's public/aggregator.pub
  [tls]                      # from `dpfed provision` (the coordinator kit has this file)
  ca_cert = "tls/ca.pem"
  cert = "tls/coordinator.pem"
  key = "tls/coordinator.key"
  (or --insecure / insecure = true: plaintext, local tests only)

exit codes: 0 done (or started, without --wait), 2 bad spec or config (also: a secure round
            without site_keys or aggregator_key), 3 round failed, 4 refused by the
            aggregator (key not registered) or by the coordinator (a secure round's invited
            site has no record in site_keys, or the aggregator lists another key for it),
            5 aggregator unreachable
"""


def add_connection_args(p: argparse.ArgumentParser, *, signing: bool) -> None:
    p.add_argument("--config", help="coordinator.toml with aggregator, coordinator_id, "
                                    "signing_key, insecure/[tls]")
    p.add_argument("--aggregator", help="aggregator address host:port")
    if signing:
        p.add_argument("--key", help="coordinator's Ed25519 private key (dpfed keygen)")
        p.add_argument("--coordinator-id", help="coordinator id registered at the aggregator")
        p.add_argument("--site-keys", metavar="DIR",
                       help="the coordinator's record of the sites' identity keys, "
                            "DIR/<site_id>.pub (the CA's public/sites/): secure rounds pin "
                            "them (default: site_keys of --config)")
        p.add_argument("--aggregator-key", metavar="FILE",
                       help="the coordinator's record of the aggregator's identity key (the "
                            "CA's public/aggregator.pub): secure rounds pin it (default: "
                            "aggregator_key of --config)")
    p.add_argument("--insecure", action="store_true", help="plaintext gRPC (local tests only)")


class UsageError(Exception):
    pass


# Every key coordinator.toml may have; anything else is an error naming the nearest one.
# site_keys: the folder of the sites' <site_id>.pub (the CA's public/sites/), whose key ids a
# secure round's spec pins (coordinator.client.Coordinator.pin_site_keys); aggregator_key:
# the aggregator's public key file (the CA's public/aggregator.pub), whose key id it pins
# (Coordinator.pin_aggregator_key).
COORDINATOR_KEYS = frozenset({"aggregator", "coordinator_id", "signing_key", "server_name",
                              "insecure", "tls", "console", "site_keys",
                              "aggregator_key"})   # [console]: dpfed console
TLS_KEYS = frozenset({"ca_cert", "cert", "key"})


def check_coordinator_keys(conf: dict, where: str) -> None:
    """UsageError naming every unknown key of a parsed coordinator.toml (exit 2)."""
    from dpfed.configkeys import check_keys
    check_keys(conf, COORDINATOR_KEYS, UsageError, where)
    if isinstance(conf.get("tls"), dict):
        check_keys(conf["tls"], TLS_KEYS, UsageError, where, prefix="tls.")
    if isinstance(conf.get("console"), dict):
        from dpfed_apps.console.config import CONSOLE_KEYS
        check_keys(conf["console"], CONSOLE_KEYS, UsageError, where, prefix="console.")


def connect(args, *, signing: bool):
    """A coordinator.client.Coordinator from the command line and/or coordinator.toml."""
    from coordinator.client import Coordinator
    from dpfed.transport import TlsFiles
    conf, base = {}, Path(".")
    if getattr(args, "config", None):
        path = Path(args.config)
        try:
            conf = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise UsageError(f"{path}: {exc}") from None
        check_coordinator_keys(conf, str(path))
        base = path.parent
    address = args.aggregator or conf.get("aggregator")
    if not address:
        raise UsageError("give --aggregator HOST:PORT or a --config with `aggregator`")
    key = coord_id = site_keys = aggregator_key = None
    if signing:
        key = args.key or (str(base / conf["signing_key"]) if "signing_key" in conf else None)
        coord_id = args.coordinator_id or conf.get("coordinator_id")
        if not key or not coord_id:
            raise UsageError("starting a round needs --key and --coordinator-id (or a --config "
                             "with signing_key and coordinator_id)")
        site_keys = getattr(args, "site_keys", None)
        if site_keys is None and "site_keys" in conf:
            if not isinstance(conf["site_keys"], str) or not conf["site_keys"]:
                raise UsageError("site_keys must be a path (a folder of <site_id>.pub files)")
            site_keys = base / conf["site_keys"]
        aggregator_key = getattr(args, "aggregator_key", None)
        if aggregator_key is None and "aggregator_key" in conf:
            if not isinstance(conf["aggregator_key"], str) or not conf["aggregator_key"]:
                raise UsageError("aggregator_key must be a path (the aggregator's .pub file)")
            aggregator_key = base / conf["aggregator_key"]
    insecure = args.insecure or conf.get("insecure", False) is True
    tls = None
    if not insecure:
        t = conf.get("tls")
        if not t:
            raise UsageError("mutual TLS is required: give --config with the coordinator kit's "
                             "coordinator.toml from `dpfed provision` (it has the [tls] table), "
                             "or --insecure for plaintext local tests")
        if not isinstance(t, dict) or not all(isinstance(t.get(k), str)
                                              for k in ("ca_cert", "cert", "key")):
            raise UsageError("[tls] needs ca_cert, cert and key (paths to PEM files)")
        tls = TlsFiles(base / t["ca_cert"], base / t["cert"], base / t["key"])
        for path in (tls.ca_cert, tls.cert, tls.key):
            if not Path(path).is_file():
                raise UsageError(f"[tls] names {str(path)!r}, which does not exist")
    else:
        from dpfed.transport import warn_plaintext
        warn_plaintext(command_prog(args).removeprefix("dpfed "))
    if site_keys is not None:
        from coordinator.client import load_site_keys
        try:
            site_keys = load_site_keys(site_keys)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if aggregator_key is not None:
        from coordinator.client import load_aggregator_key
        try:
            aggregator_key = load_aggregator_key(aggregator_key)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    try:
        return Coordinator(address, key, coord_id or "", tls, server_name=conf.get("server_name"),
                           site_keys=site_keys, aggregator_key=aggregator_key)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load the signing key: {exc}") from None


def rpc_exit_code(exc, args) -> int:
    """The exit code of a failed RPC, after saying on stderr what the aggregator said."""
    import grpc
    code = exc.code()
    print(f"{command_prog(args)}: aggregator said {code.name}: {exc.details()}", file=sys.stderr)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return exitcodes.UNAVAILABLE
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return exitcodes.REFUSED
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS):
        return exitcodes.USAGE
    return exitcodes.ERROR


def _status_dict(status) -> dict:
    from google.protobuf import json_format
    return json_format.MessageToDict(status, preserving_proto_field_name=True)


def _print_status(status) -> None:
    from dpfed.v1 import dpfed_pb2 as pb
    state = pb.RoundStatus.State.Name(status.state)
    print(f"round {status.round_id}: {state}" + (f" - {status.message}" if status.message else ""))
    if status.spec.targets:
        names = [t.name for t in status.spec.targets]
        print(f"  joint round: {len(names)} targets ({', '.join(names[:5])}"
              f"{', ...' if len(names) > 5 else ''}), {status.spec.mechanism or 'laplace'} noise")
    print(f"  contributions: {len(status.contributions)} (quorum {status.quorum}): "
          + ", ".join(f"{c.site_id} ({c.hidden or f'n={c.n}'})" for c in status.contributions))
    if status.refusals:
        print("  refusals: " + "; ".join(f"{r.site_id}: {r.hidden or r.reason}"
                                         for r in status.refusals))
    if status.consented:
        print(f"  consented: {len(status.consented)}: " + ", ".join(status.consented))
    if status.missing_sites:
        print("  waiting for: " + ", ".join(status.missing_sites))
    if status.dropped:
        print("  dropped (consented, never released): " + ", ".join(status.dropped))
    if status.phases:
        print("  phases: " + ", ".join(
            f"{p.phase} {p.seconds:.3f} s" if p.seconds else f"{p.phase} (running)"
            for p in status.phases))
    if status.round_seconds or status.fit_seconds:
        print(f"  round {status.round_seconds:.3f} s, fit {status.fit_seconds:.2f} s")


def _exit_for_state(status) -> int:
    from dpfed.v1 import dpfed_pb2 as pb
    return exitcodes.ROUND_FAILED if status.state == pb.RoundStatus.FAILED else exitcodes.OK


def start(args) -> int:
    import grpc
    from coordinator.client import KeyPinError
    from coordinator.roundspec import RoundSpecError, build_round_spec
    spec_path = Path(args.spec)
    try:
        config = tomllib.loads(spec_path.read_text())
        spec = build_round_spec(config, base_dir=spec_path.parent)
        coordinator = connect(args, signing=True)
    except (OSError, tomllib.TOMLDecodeError, RoundSpecError, UsageError, ValueError) as exc:
        print(f"{command_prog(args)}: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    with coordinator:
        try:
            status = coordinator.start_round(spec)
            print(f"started round {status.round_id} (spec digest {status.spec_digest[:16]})",
                  file=sys.stderr)
            if args.wait:
                timeout = args.timeout or (spec.deadline_unix_ms - spec.created_unix_ms) / 1000 + 600
                status = coordinator.wait(status.round_id, timeout)
        except grpc.RpcError as exc:
            return rpc_exit_code(exc, args)
        except KeyPinError as exc:   # nothing was signed
            print(f"{command_prog(args)}: {exc}", file=sys.stderr)
            return exc.exit_code
    if args.json:
        print(jsonsafe.dumps(_status_dict(status), indent=2))
    else:
        _print_status(status)
    return _exit_for_state(status)


def query(args, call):
    """Connect read-only, run ``call(coordinator)`` and return ``(answer, None)``, or
    ``(None, exit code)`` after saying on stderr, naming the command, what went wrong (bad
    options, or the RPC)."""
    import grpc
    try:
        coordinator = connect(args, signing=False)
    except UsageError as exc:
        print(f"{command_prog(args)}: {exc}", file=sys.stderr)
        return None, exitcodes.USAGE
    with coordinator:
        try:
            return call(coordinator), None
        except grpc.RpcError as exc:
            return None, rpc_exit_code(exc, args)


def status_cmd(args) -> int:
    status, code = query(args, lambda c: c.status(args.round_id))
    if code is not None:
        return code
    if args.json:
        print(jsonsafe.dumps(_status_dict(status), indent=2))
    else:
        _print_status(status)
    return _exit_for_state(status)


def list_cmd(args) -> int:
    reply, code = query(args, lambda c: c.list_rounds(limit=args.limit, before=args.before or ""))
    if code is not None:
        return code
    if args.json:
        from google.protobuf import json_format
        print(jsonsafe.dumps([json_format.MessageToDict(r, preserving_proto_field_name=True)
                          for r in reply.rounds], indent=2))
        return exitcodes.OK
    if not reply.rounds:
        print("no rounds")
        return exitcodes.OK
    import datetime as dt
    from dpfed.v1 import dpfed_pb2 as pb
    width = max(8, *(len(r.round_id) for r in reply.rounds))
    print(f"{'round':<{width}}  {'state':<8}  {'started (UTC)':<19}  {'eps':>5}  "
          f"{'consent':>7}  {'released':>8}  {'refused':>7}  target")
    for r in reply.rounds:
        started = dt.datetime.fromtimestamp(r.started_unix_ms / 1000, dt.timezone.utc)
        print(f"{r.round_id:<{width}}  {pb.RoundStatus.State.Name(r.state):<8}  "
              f"{started:%Y-%m-%d %H:%M:%S}  {r.epsilon:>5.3g}  "
              f"{r.consented:>3}/{r.invited:<3}  {r.contributed:>8}  {r.refused:>7}  {r.target}")
    return exitcodes.OK


def format_result_table(summary: dict) -> str:
    names = summary.get("feature_names") or [f"beta{i}" for i in range(summary["dim"])]
    mean = summary["beta_mean"]
    sd = summary.get("beta_sd") or [float("nan")] * len(mean)
    ci = summary.get("beta_ci90") or [[float("nan")] * 2] * len(mean)
    width = max(9, *(len(n) for n in names))
    lines = [f"round {summary['round_id']}: target {summary.get('target', '?')}, "
             f"n = {summary['n_total']} ({summary.get('n_public', 0)} public) from "
             f"{len(summary['sites'])} site(s), fit {summary.get('fit_method', '?')}",
             f"model {summary.get('model') or '?'}, noise {summary.get('noise') or '?'}",
             f"{'feature':<{width}}  {'mean':>10}  {'sd':>10}  {'5%':>10}  {'95%':>10}"]
    for name, m, s, (lo, hi) in zip(names, mean, sd, ci):
        lines.append(f"{name:<{width}}  {m:>10.4f}  {s:>10.4f}  {lo:>10.4f}  {hi:>10.4f}")
    info = summary.get("information") or {}
    if info.get("text"):
        lines.append(("WARNING: " if info.get("verdict") == "little" else "") + info["text"])
    return "\n".join(lines)


def format_joint_table(summary: dict) -> str:
    """A joint round's result, one line per target (docs/protocol.md "Joint rounds"):
    its private n_j (noisy) and public rows, the fit's model, the strongest coefficient
    (in units of the target's public sd), and what the data told beyond the public rows;
    a target that did not fit says why. (The per-target helpers are the console's:
    dpfed_apps.console.views, pure functions that need none of the console's packages.)"""
    from dpfed_apps.console.views import strongest_coefficient
    names = summary.get("feature_names") or []
    entries = summary.get("targets") or []
    mech = summary.get("mechanism", "laplace")
    privacy = (f"eps {summary.get('epsilon', 0):g}, delta {summary.get('delta', 0):g}"
               if mech == "gaussian" else f"eps {summary.get('epsilon', 0):g}")
    lines = [f"round {summary['round_id']}: {len(entries)} targets "
             f"({summary.get('fitted', 0)} fitted), n_x = {summary.get('n_total')} private "
             f"rows from {len(summary.get('sites', []))} site(s), {mech} ({privacy}), fit "
             f"{summary.get('fit_method', '?')}",
             f"noise per site: {summary.get('noise') or '?'}",
             "coefficients are in units of each target's public sd (y_scale)"]
    width = max([6] + [len(str(e.get("target", ""))) for e in entries])
    lines.append(f"{'target':<{width}}  {'n_j':>7}  {'public':>6}  {'model':<11}  "
                 f"{'strongest coefficient (90% CI)':<34}  information")
    little = 0
    for e in entries:
        head = f"{e.get('target', '?'):<{width}}  {e.get('n', 0):>7}  {e.get('n_public', 0):>6}"
        if e.get("status") != "fitted":
            why = e.get("error") or e.get("status", "?")
            lines.append(f"{head}  {'-':<11}  {e.get('status', '?').upper()}: {why}")
            continue
        info = e.get("information") or {}
        verdict = info.get("verdict", "")
        little += verdict == "little"
        lines.append(f"{head}  {e.get('model') or '?':<11}  {strongest_coefficient(e, names):<34}  "
                     f"{('WARNING: ' if verdict == 'little' else '') + verdict}")
    if little:
        lines.append(f"WARNING: for {little} target(s) the private data told little beyond "
                     f"{'the public rows' if summary.get('n_public') else 'the prior'}")
    return "\n".join(lines)


def result_cmd(args) -> int:
    result, code = query(args, lambda c: c.result(args.round_id))
    if code is not None:
        return code
    summary = json.loads(result.summary_json)
    joint = bool(summary.get("joint"))
    if getattr(args, "target", None):
        from dpfed_apps.console.views import target_summary
        one = target_summary(summary, args.target) if joint else None
        if one is None:
            print(f"{command_prog(args)}: round {args.round_id} has no target "
                  f"{args.target!r}" + ("" if joint else " (it is not a joint round)"),
                  file=sys.stderr)
            return exitcodes.USAGE
        summary = one
        joint = False
        if summary.get("status") != "fitted" and not args.json:
            print(f"target {args.target}: {summary.get('status')}: {summary.get('error', '')}")
            return exitcodes.OK
    if args.json:
        print(jsonsafe.dumps(summary, indent=2))
    else:
        print(format_joint_table(summary) if joint else format_result_table(summary))
    return exitcodes.OK


def register(subparsers) -> None:
    p = add_command(subparsers, "round", __doc__,
                    help="start and follow federated rounds (coordinator)", epilog=EPILOG)
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("start", help="sign round.toml's spec and start the round",
                       epilog=EPILOG)
    s.add_argument("--spec", required=True, help="round.toml (see docs/interfaces.md)")
    add_connection_args(s, signing=True)
    s.add_argument("--wait", action="store_true", help="wait until the round is DONE or FAILED")
    s.add_argument("--timeout", type=float, help="seconds to wait (default: deadline + 10 min)")
    s.add_argument("--json", action="store_true", help="print the round status as JSON")
    s.set_defaults(func=start)
    st = sub.add_parser("status", help="show a round's state, contributions and refusals",
                        epilog=EPILOG)
    st.add_argument("round_id")
    add_connection_args(st, signing=False)
    st.add_argument("--json", action="store_true", help="print the status as JSON")
    st.set_defaults(func=status_cmd)
    ls = sub.add_parser("list", help="list rounds, newest first",
                        description="List the aggregator's rounds, newest first: state, start "
                                    "time, epsilon, consents, releases and refusals.",
                        epilog=EPILOG)
    add_connection_args(ls, signing=False)
    ls.add_argument("--limit", type=int, default=50, help="at most this many rounds ")
    ls.add_argument("--before", metavar="ROUND_ID",
                    help="only rounds started before this one (the next page)")
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    ls.set_defaults(func=list_cmd)
    r = sub.add_parser("result", help="print the posterior of a finished round",
                       epilog=EPILOG)
    r.add_argument("round_id")
    add_connection_args(r, signing=False)
    r.add_argument("--json", action="store_true", help="print the whole summary JSON (a "
                                                       "joint round: one entry per target "
                                                       "under \"targets\")")
    r.add_argument("--target", metavar="NAME",
                   help="a joint round: the full coefficient table of this target only")
    r.set_defaults(func=result_cmd)
