"""dpfed site: what a hospital runs (its site node, its privacy ledger, a check of its kit).

examples:
    dpfed site serve  --config site.toml   dial out to the aggregator and answer rounds
    dpfed site ledger --config site.toml   show the privacy budget and every release
    dpfed site ledger --acknowledge-reset --config site.toml
                                           a lost ledger: continue from the aggregator's record
    dpfed site ledger --raise-total --config site.toml
                                           record a raise of policy.total_epsilon (who, when)
    dpfed site check  --config site.toml   validate config, keys and data; releases nothing
    dpfed site audit  --config site.toml --verify
                                           show the audit log and check its chain and signatures
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from datetime import datetime, timezone

from dpfed import exitcodes, jsonsafe
from dpfed_apps.commands import add_command
from dpfed_apps.commands.audit import add_audit_arguments, show_audit

log = logging.getLogger("dpfed.site")


def register(subparsers) -> None:
    parser = add_command(subparsers, "site", __doc__, help="run a hospital's site node",
                         epilog=__doc__.split("\n\n", 1)[1])
    sub = parser.add_subparsers(dest="site_command", metavar="SUBCOMMAND")

    serve = sub.add_parser(
        "serve", help="connect to the aggregator and answer rounds",
        description="Dial out to the aggregator (no inbound port), answer round specs signed by a "
                    "trusted coordinator within this site's policy, and reconnect with backoff.",
        epilog="example:\n  dpfed site serve --config site.toml\n"
               "      logs every round received, refused (with the reason) or released (n, epsilon,\n"
               "      remaining budget); stop with Ctrl-C or SIGTERM.")
    serve.add_argument("--config", required=True, help="site.toml")
    serve.add_argument("--insecure", action="store_true",
                       help="plaintext gRPC without certificates, even if site.toml has [tls] "
                            "(local tests only)")
    serve.set_defaults(func=cmd_serve)

    ledger = sub.add_parser(
        "ledger", help="show the privacy ledger (spent, remaining, releases)",
        epilog="examples:\n  dpfed site ledger --config site.toml\n"
               "  dpfed site ledger --config site.toml --json   # for monitoring scripts")
    ledger.add_argument("--config", required=True, help="site.toml")
    ledger.add_argument("--json", action="store_true", help="machine-readable output")
    action = ledger.add_mutually_exclusive_group()
    action.add_argument("--acknowledge-reset", action="store_true",
                        help="the state_db was lost: ask the aggregator how much epsilon it "
                             "recorded for this site and carry that into this ledger (the "
                             "budget continues from there); dials the aggregator")
    action.add_argument("--raise-total", action="store_true",
                        help="record the larger policy.total_epsilon of site.toml as the "
                             "ledger's total (kept with --operator and the time)")
    ledger.add_argument("--operator", default=None,
                        help="who is doing this, recorded in the ledger (default user@host)")
    ledger.set_defaults(func=cmd_ledger)

    check = sub.add_parser(
        "check", help="validate config, keys and data without releasing",
        epilog="examples:\n  dpfed site check --config site.toml\n"
               "      exit 0 when the config, keys and data file are usable; 2 with the reason "
               "otherwise.\n      Nothing is released and nothing is debited.\n"
               "  dpfed site check --config site.toml --target Drug_1047_IC50 --features "
               "TP53_mut,BRAF_mut\n"
               "      also how many rows a round with these columns would use, how many it "
               "would leave out\n      and why (by reason and column), and which columns no "
               "round can use; counts only,\n      for this site's eyes: they are never sent\n"
               "  dpfed site check --config site.toml --json   # one JSON object")
    check.add_argument("--config", required=True, help="site.toml")
    check.add_argument("--target", default=None,
                       help="a round's target (its name in round specs; data.columns maps it): "
                            "count the rows a round with it would use; default: a round using "
                            "every usable column")
    check.add_argument("--features", default=None,
                       help="comma-separated features of that round (with --target; default "
                            "every other usable column)")
    check.add_argument("--column-names", action="store_true",
                       help="name every column by its header cell; by default a column that "
                            "site.toml or --target/--features does not name is shown by "
                            "position (in a file without a header row those cells are a "
                            "patient's values)")
    check.add_argument("--json", action="store_true", help="one JSON object on stdout")
    check.set_defaults(func=cmd_check)

    audit = sub.add_parser(
        "audit", help="show and verify the audit log (every request received, answer sent)",
        description="Show the site's audit log: every request the site received and every answer "
                    "it sent (time, direction, kind, round, phase, peer, outcome or reason, "
                    "epsilon, message digest), hash-chained and signed by the site's key. No "
                    "data value, row count or patient id is in it (docs/audit.md).",
        epilog="examples:\n  dpfed site audit --config site.toml\n"
               "  dpfed site audit --config site.toml --verify\n"
               "      exit 0 and 'chain intact: N entries, head signed by <key id>'; exit 7 and "
               "the first\n      edited, deleted or reordered entry, or forged head, otherwise\n"
               "  dpfed site audit --config site.toml --round r-42 --json\n"
               "  dpfed site audit --config site.toml --verify --against aggregator.audit.sqlite\n"
               "      also match every message with the aggregator's log (same message digests)")
    add_audit_arguments(audit)
    audit.add_argument("--config", required=True, help="site.toml")
    audit.set_defaults(func=cmd_audit)

    parser.set_defaults(func=lambda args: (parser.print_help(), exitcodes.USAGE)[1])


def _load(path, *, insecure: bool = False):
    from site_node.config import ConfigError, load_config

    try:
        return load_config(path, insecure=insecure), None
    except ConfigError as exc:
        return None, str(exc)


def cmd_serve(args) -> int:
    from dpfed.audit import AuditError
    from site_node.client import SiteClient
    from site_node.ledger import BudgetRaise, LedgerError
    from site_node.node import LedgerMismatch, SiteNode

    config, error = _load(args.config, insecure=args.insecure)
    if error:
        print(f"dpfed site serve: {error}", file=sys.stderr)
        return exitcodes.USAGE
    if config.tls is None:
        from dpfed.transport import warn_plaintext
        warn_plaintext("site serve")
    else:
        # An expired or mismatched certificate would only show as failed handshakes and
        # PERMISSION_DENIED from the aggregator; say so before dialling.
        from dpfed.identity import certificate_problems
        problems = certificate_problems(config.tls, "site", config.site_id)
        if problems:
            print(f"dpfed site serve: [tls]: {'; '.join(problems)}", file=sys.stderr)
            return exitcodes.USAGE
        from dpfed.identity import expiry_warning
        warning = expiry_warning(config.tls.cert)
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
    try:
        node = SiteNode(config)
    except BudgetRaise as exc:
        print(f"dpfed site serve: {exc}", file=sys.stderr)
        return exitcodes.REFUSED
    except (LedgerError, AuditError) as exc:
        print(f"dpfed site serve: {exc}", file=sys.stderr)
        return exitcodes.ERROR
    except (OSError, ValueError) as exc:  # unreadable key files
        print(f"dpfed site serve: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    log.info("site %s: privacy budget: %s%s", config.site_id, node.ledger.budget_text(),
             f"; per patient epsilon {node.ledger.patient_epsilon:g}"
             + (f", delta {node.ledger.patient_delta:g}" if node.ledger.patient_delta else "")
             if node.ledger.patient_epsilon is not None else "")
    client = SiteClient(node)
    # SIGTERM (systemd, docker stop) stops as cleanly as Ctrl-C.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: client.stop())
    try:
        client.run()
    except KeyboardInterrupt:
        client.stop()
        return exitcodes.INTERRUPTED
    except LedgerMismatch as exc:
        print(f"dpfed site serve: {exc}", file=sys.stderr)
        return exitcodes.REFUSED
    except AuditError as exc:   # fail closed: the site answers nothing it cannot record
        print(f"dpfed site serve: {exc}; the site stopped answering (nothing more was sent)",
              file=sys.stderr)
        return exitcodes.ERROR
    return exitcodes.OK


def _operator(args) -> str:
    if args.operator:
        return args.operator
    import getpass
    import socket
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def cmd_acknowledge_reset(args) -> int:
    """Ask the aggregator for its record of this site (GetSiteHistory, a signed hello over the
    site's own TLS identity) and carry it into the ledger (PrivacyLedger.acknowledge_reset)."""
    import grpc

    from dpfed.transport import client_channel
    from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
    from site_node.ledger import LedgerError
    from site_node.node import SiteNode

    config, error = _load(args.config)
    if error:
        print(f"dpfed site ledger: {error}", file=sys.stderr)
        return exitcodes.USAGE
    try:
        node = SiteNode(config)
    except LedgerError as exc:
        print(f"dpfed site ledger: {exc}", file=sys.stderr)
        return exitcodes.REFUSED
    except (OSError, ValueError) as exc:
        print(f"dpfed site ledger: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    try:
        with client_channel(config.aggregator, config.tls, server_name=config.server_name) as ch:
            history = pb_grpc.AggregatorStub(ch).GetSiteHistory(node.hello(), timeout=30)
    except grpc.RpcError as exc:
        print(f"dpfed site ledger: the aggregator {config.aggregator} did not give this site's "
              f"record ({exc.code().name}: {exc.details()}); nothing changed", file=sys.stderr)
        node.ledger.close()
        return exitcodes.UNAVAILABLE
    before = node.ledger.spent
    carried = node.ledger.acknowledge_reset(
        aggregator_spent=history.spent_epsilon, aggregator_rounds=history.rounds,
        aggregator_total=history.declared_total_epsilon, operator=_operator(args))
    print(f"reset acknowledged by {_operator(args)}: the aggregator records epsilon "
          f"{history.spent_epsilon:g} spent over {history.rounds} round(s); the ledger had "
          f"{before:g}, {carried:g} carried over; now spent {node.ledger.spent:g} of "
          f"{node.ledger.total_epsilon:g}")
    node.ledger.close()
    return exitcodes.OK


def _ledger_config(args, missing: str):
    """(config, None) for a site whose ledger exists, else (None, exit code) after saying why;
    reads the ledger only, never dials."""
    config, error = _load(args.config, insecure=True)
    if error:
        print(f"dpfed site ledger: {error}", file=sys.stderr)
        return None, exitcodes.USAGE
    if not config.state_db.exists():
        print(f"dpfed site ledger: no ledger yet at {config.state_db}{missing}", file=sys.stderr)
        return None, exitcodes.ERROR
    return config, None


def cmd_raise_total(args) -> int:
    from site_node.ledger import LedgerError, PrivacyLedger

    config, code = _ledger_config(args, ": nothing to raise")
    if config is None:
        return code
    new = config.policy.total_epsilon
    new_patient = config.policy.patient_epsilon
    new_delta = config.policy.patient_delta
    done = []
    try:
        with PrivacyLedger(config.state_db, site_id=config.site_id) as ledger:
            # The per-patient budget (policy.patient_epsilon) is raised the same way, when the
            # config's is larger than the ledger's.
            stored_patient = ledger.patient_epsilon
            if new_patient is not None and stored_patient is not None and \
                    new_patient > stored_patient:
                old = ledger.raise_patient_budget(new_patient, operator=_operator(args))
                done.append(f"per-patient budget raised from {old:g} to {new_patient:g}")
            # policy.patient_delta: a larger delta, or a delta added to a pure budget.
            stored_delta = ledger.patient_delta
            if new_delta is not None and ledger.patient_epsilon is not None and \
                    (stored_delta is None or new_delta > stored_delta):
                old = ledger.raise_patient_delta(new_delta, operator=_operator(args))
                done.append(f"per-patient delta raised from "
                            f"{'none (pure eps)' if old is None else format(old, 'g')} to "
                            f"{new_delta:g}")
            if new is not None and (not done or (ledger.total_epsilon is not None
                                                 and new > ledger.total_epsilon)):
                old = ledger.raise_total(new, operator=_operator(args))
                done.append(f"total budget raised from {old:g} to {new:g}")
    except LedgerError as exc:
        print(f"dpfed site ledger: {exc}", file=sys.stderr)
        return exitcodes.REFUSED
    if not done:
        print("dpfed site ledger: nothing to raise (site.toml sets no larger budget)",
              file=sys.stderr)
        return exitcodes.REFUSED
    print(f"{'; '.join(done)} by {_operator(args)} (recorded in {config.state_db})")
    return exitcodes.OK


def cmd_ledger(args) -> int:
    from site_node.ledger import LedgerError, PrivacyLedger

    if getattr(args, "acknowledge_reset", False):
        return cmd_acknowledge_reset(args)
    if getattr(args, "raise_total", False):
        return cmd_raise_total(args)
    config, code = _ledger_config(args, " (nothing released)")
    if config is None:
        return code
    try:
        with PrivacyLedger(config.state_db) as ledger:
            summary = ledger.summary()
    except LedgerError as exc:
        print(f"dpfed site ledger: {exc}", file=sys.stderr)
        return exitcodes.ERROR
    if args.json:
        print(jsonsafe.dumps(summary, indent=2, sort_keys=True))
        return exitcodes.OK
    total = summary["total_epsilon"]
    print(f"site:      {summary['site_id']}")
    print(f"ledger:    {summary['path']}")
    print(f"budget:    epsilon {total:g}" if total is not None else
          "budget:    no site-wide cap" if summary.get("patients") else "budget:    (not set)")
    print(f"spent:     {summary['spent_epsilon']:g}")
    if summary["remaining_epsilon"] is not None:
        print(f"remaining: {summary['remaining_epsilon']:g}")
    _print_patients(summary.get("patients"))
    configured = config.policy.total_epsilon
    if total is not None and configured is not None and configured > total:
        print(f"note: site.toml says total_epsilon = {config.policy.total_epsilon:g}, more than "
              f"the ledger's {total:g}: the site will not start until the raise is recorded "
              f"(dpfed site ledger --raise-total)")
    elif total is not None and configured is not None and configured < total:
        print(f"note: site.toml says total_epsilon = {config.policy.total_epsilon:g}; the "
              f"ledger's total is lowered to it when the site starts")
    for e in summary.get("budget_events", []):
        when = datetime.fromtimestamp(e["created_unix_ms"] / 1000, timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%SZ")
        change = (f"{e['old_total']:g} -> {e['new_total']:g}" if e["old_total"] is not None
                  and e["new_total"] != e["old_total"] else f"{e['new_total']:g}")
        carried = f", carried epsilon {e['epsilon']:g}" if e["epsilon"] else ""
        by = f" by {e['operator']}" if e["operator"] else ""
        what = ("per-patient delta (0: pure eps)" if e["kind"].startswith("patient_delta")
                else "per patient" if e["kind"].startswith("patient_") else "total")
        print(f"  {when}  budget {e['kind']}: {what} {change}{carried}{by} ({e['note']})")
    print(f"releases:  {len(summary['releases'])}")
    for r in summary["releases"]:
        when = datetime.fromtimestamp(r["created_unix_ms"] / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
        state = ("acknowledged" if r["acknowledged"] else
                 f"rejected: {r['last_error']}" if r["last_error"] else
                 "sent, unacknowledged" if r["sent"] else "stored, not sent")
        if r.get("refused"):
            state = "refused after the draw (noisy n below min_n)"
        print(f"  {when}  round {r['round_id']}  epsilon {r['epsilon']:g}  n {r['n']}  "
              f"{r['neighbouring']}  {state}")
    return exitcodes.OK


def _print_patients(patients) -> None:
    """The per-patient budget as a histogram of remaining budget: counts only, never a patient
    (site_node.ledger.PrivacyLedger.patient_summary)."""
    if not patients:
        return
    if patients.get("budget_delta") is not None:
        # (eps, delta): each history composed by dpfed.accounting (eps at the budget's delta);
        # admission is the Renyi filter at the ledger's fixed order.
        print(f"per patient: (epsilon {patients['budget_epsilon']:g}, delta "
              f"{patients['budget_delta']:g}) each, Renyi filter at order "
              f"{patients['renyi_order']:g}, {patients['patients']} patient(s) seen; largest "
              f"composed epsilon at delta {patients['budget_delta']:g}: "
              f"{patients['max_spent_epsilon']:.4g}")
    else:
        print(f"per patient: epsilon {patients['budget_epsilon']:g} each, "
              f"{patients['patients']} patient(s) seen")
    if patients["charged_to_every_patient_epsilon"]:
        print(f"  charged to every patient (releases without per-patient records): epsilon "
              f"{patients['charged_to_every_patient_epsilon']:g}")
    for b in patients["histogram"]:
        if b["remaining_to"] == 0:
            print(f"  no budget left: {b['patients']}")
        else:
            print(f"  left ({b['remaining_from']:g}, {b['remaining_to']:g}]: {b['patients']}")


PLACEHOLDER_HOSTS = ("example.org", "example.com", "example.net", "example", "invalid",
                     "change-me", "changeme")


def _check_aggregator_address(config) -> tuple[list[str], list[str]]:
    """(problems, addresses): the aggregator's host must resolve; a placeholder host such as
    aggregator.example.org (the kit's template) gets a warning on stderr."""
    import socket
    host, _, port = config.aggregator.rpartition(":")
    host = host.strip("[]")
    labels = host.lower().split(".")
    if any(".".join(labels[i:]) in PLACEHOLDER_HOSTS for i in range(len(labels))) or \
            "change-me" in host.lower():
        print(f"warning: aggregator = {config.aggregator!r} looks like a placeholder, not your "
              "federation's aggregator; set the address you were given", file=sys.stderr)
    try:
        addresses = sorted({a[4][0] for a in socket.getaddrinfo(host, int(port) if
                                                                port.isdigit() else None)})
    except (socket.gaierror, UnicodeError, OSError) as exc:
        return [f"aggregator {config.aggregator}: the host {host!r} does not resolve ({exc})"], []
    return [], addresses


def _effective_settings(config) -> dict:
    """Every setting the node will use: key -> (value, set in site.toml). An unknown key never
    gets here: loading the config rejects it."""
    import dataclasses

    def plain(value):
        if isinstance(value, tuple):
            return [str(v) for v in value]
        if isinstance(value, dict):
            return dict(value)
        if value is not None and not isinstance(value, (bool, int, float, list)):
            return str(value)
        return value

    settings = {}
    for key in ("site_id", "aggregator", "server_name", "state_db", "signing_key"):
        settings[key] = (plain(getattr(config, key)), key in config.explicit)
    settings["insecure"] = (config.tls is None, "insecure" in config.explicit)
    if config.tls is not None:
        for f in dataclasses.fields(config.tls):
            settings[f"tls.{f.name}"] = (plain(getattr(config.tls, f.name)), True)
    for table, value in (("data", config.data), ("policy", config.policy)):
        for f in dataclasses.fields(value):
            settings[f"{table}.{f.name}"] = (plain(getattr(value, f.name)),
                                             f"{table}.{f.name}" in config.explicit)
    return settings


def _settings_lines(config, settings: dict) -> list[str]:
    """The effective settings, defaults marked (default)."""
    lines = ["effective settings (site.toml and defaults):"]
    lines += [f"  {key} = {json.dumps(value)}{'' if explicit else '  (default)'}"
              for key, (value, explicit) in settings.items()]
    if config.data.id_column:
        lines.append(f"  (the id column {config.data.id_column!r} is never a feature or target, "
                     "whatever allowed_features says)")
    return lines


def _rows_lines(audit: dict) -> list[str]:
    """The row audit of ``site_node.gaps.file_audit`` for people: rows used, rows left out by
    reason and column, unusable columns. Counts and column labels only."""
    plan = audit["round"]
    if plan:
        what = (f"a round with target {plan['target']!r} and {len(plan['features'])} "
                f"feature(s)")
    else:
        what = (f"a round using every usable column ({audit['columns_used']}; give --target "
                f"and --features for one round's columns)")
    lines = [f"rows {what}: {audit['usable_rows']} of {audit['rows']} usable, "
             f"{audit['left_out_rows']} left out"]
    for entry in audit["left_out"]:
        where = ", ".join(f"{c} {k}" for c, k in entry["columns"].items())
        lines.append(f"    {entry['reason']:<15} {entry['rows']:>6} row(s)"
                     + (f"  ({where})" if where else ""))
    if audit["left_out_rows"]:
        lines.append("  (a row with a gap is left out of the round on its own: no refusal, no "
                     "privacy cost under add/remove;\n   these counts are for this site's "
                     "eyes only and are never sent)")
    if audit["unusable_columns"]:
        lines.append("unusable columns: " + ", ".join(f"{u['column']} ({u['why']})"
                                                      for u in audit["unusable_columns"]))
    if audit["unnamed_columns"]:
        lines.append("  (columns that site.toml or --target/--features do not name are shown "
                     "by position; --column-names names them)")
    return lines


def cmd_check(args) -> int:
    from dpfed.wire.signing import SigningKey
    from site_node.data import DataError, describe
    from site_node.gaps import file_audit
    from site_node.policy import trusted_keys

    config, error = _load(args.config)
    if error:
        if args.json:
            print(jsonsafe.dumps({"ok": False, "problems": [error]}, indent=2, sort_keys=True))
        print(f"dpfed site check: {error}", file=sys.stderr)
        return exitcodes.USAGE
    if args.features and not args.target:
        print("dpfed site check: --features needs --target (the round's target)", file=sys.stderr)
        return exitcodes.USAGE
    problems, lines = [], []
    report: dict = {"config": str(args.config)}
    try:
        key = SigningKey.load(config.signing_key)
        lines.append(f"signing key: {config.signing_key} (key id {key.key_id})")
        report["signing_key"] = {"path": str(config.signing_key), "key_id": key.key_id}
    except (OSError, ValueError) as exc:
        problems.append(f"signing_key {config.signing_key}: {exc}")
    if config.tls is not None:
        from dpfed.identity import certificate_problems
        tls_problems = certificate_problems(config.tls, "site", config.site_id)
        problems += [f"[tls]: {p}" for p in tls_problems]
        if not tls_problems:
            lines.append(f"tls: {config.tls.cert} (dpfed://site/{config.site_id}, signed by "
                         f"{config.tls.ca_cert})")
            report["tls"] = {"cert": str(config.tls.cert), "ca_cert": str(config.tls.ca_cert)}
            from dpfed.identity import expiry_warning
            warning = expiry_warning(config.tls.cert)
            if warning:
                print(f"warning: {warning}", file=sys.stderr)
    else:
        lines.append("tls: none (insecure = true: plaintext, local tests only)")
        report["tls"] = None
    try:
        keys = trusted_keys(config.policy.trusted_coordinators)
        lines.append(f"trusted coordinators: {', '.join(k[:16] for k in keys)}")
        report["trusted_coordinators"] = list(keys)
    except (OSError, ValueError) as exc:
        problems.append(f"policy.trusted_coordinators: {exc}")
    described = None
    try:
        info = describe(config.data)
        lines.append(f"data: {info['path']} ({info['format']}), {info['rows']} rows, "
                     f"{len(info['columns'])} columns")
        report["data"] = {"path": info["path"], "format": info["format"], "rows": info["rows"],
                          "columns": len(info["columns"])}
        mapped = [c for c in config.data.columns.values() if c not in info["columns"]]
        if mapped:
            problems.append(f"data.columns maps to column(s) not in the file: {mapped}")
    except DataError as exc:
        described = str(exc)
        problems.append(described)
    try:
        features = ([f.strip() for f in args.features.split(",") if f.strip()]
                    if args.features else None)
        audit = file_audit(config.data, target=args.target, features=features,
                           policy=config.policy, name_columns=args.column_names)
        lines += _rows_lines(audit)
        report.setdefault("data", {}).update(audit)
    except DataError as exc:
        if str(exc) != described:
            problems.append(str(exc))
    address_problems, addresses = _check_aggregator_address(config)
    problems += address_problems
    if addresses:
        lines.append(f"aggregator: {config.aggregator} resolves to {', '.join(addresses)}")
    report["aggregator"] = {"address": config.aggregator, "resolves_to": addresses}
    settings = _effective_settings(config)
    lines += _settings_lines(config, settings)
    report["settings"] = {k: {"value": v, "default": not explicit}
                          for k, (v, explicit) in settings.items()}
    if config.state_db.exists():
        from site_node.ledger import LedgerError, PrivacyLedger
        try:
            with PrivacyLedger(config.state_db) as ledger:
                cap = ("no site-wide cap" if ledger.total_epsilon is None
                       else f"{ledger.total_epsilon:g}")
                lines.append(f"ledger: {config.state_db}: spent {ledger.spent:g} of {cap}")
                report["ledger"] = {"path": str(config.state_db), "spent_epsilon": ledger.spent,
                                    "total_epsilon": ledger.total_epsilon}
                if ledger.total_epsilon is not None and \
                        config.policy.total_epsilon is not None and \
                        config.policy.total_epsilon > ledger.total_epsilon:
                    problems.append(f"policy.total_epsilon = {config.policy.total_epsilon:g} is "
                                    f"larger than the ledger's {ledger.total_epsilon:g}: the "
                                    f"site will not start until `dpfed site ledger "
                                    f"--raise-total` records the raise")
        except (LedgerError, TypeError) as exc:
            problems.append(f"state_db: {exc}")
    else:
        lines.append(f"ledger: {config.state_db} (created on first serve)")
        report["ledger"] = {"path": str(config.state_db), "spent_epsilon": None,
                            "total_epsilon": None}
    report["problems"] = problems
    report["ok"] = not problems
    if args.json:
        print(jsonsafe.dumps(report, indent=2, sort_keys=True))
        return exitcodes.USAGE if problems else exitcodes.OK
    print("\n".join(lines))
    for p in problems:
        print(f"problem: {p}", file=sys.stderr)
    if problems:
        return exitcodes.USAGE
    print("ok: nothing was released")
    return exitcodes.OK


def cmd_audit(args) -> int:
    """``dpfed site audit``: the site's audit log, its key from site.toml's signing_key and
    the head its privacy ledger keeps (dpfed_apps.commands.audit.show_audit)."""
    from dpfed.audit import Head
    from dpfed.wire.signing import SigningKey
    from site_node.ledger import LedgerError, PrivacyLedger

    config, error = _load(args.config, insecure=True)
    if error:
        print(f"dpfed site audit: {error}", file=sys.stderr)
        return exitcodes.USAGE
    try:
        key = SigningKey.load(config.signing_key)
    except (OSError, ValueError) as exc:
        print(f"dpfed site audit: signing_key {config.signing_key}: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    anchor = None
    if config.state_db.exists():
        try:
            with PrivacyLedger(config.state_db) as ledger:
                kept = ledger.audit_head()
            anchor = Head.from_json(kept) if kept else None
        except (LedgerError, ValueError, KeyError) as exc:
            print(f"dpfed site audit: the ledger's copy of the audit head is unreadable: {exc}",
                  file=sys.stderr)
            return exitcodes.AUDIT_FAILED if args.verify else exitcodes.ERROR
    return show_audit(args, "dpfed site audit", config.audit_path, {key.key_id: key.public_key},
                      anchor=anchor, anchor_where=f"the privacy ledger {config.state_db}")
