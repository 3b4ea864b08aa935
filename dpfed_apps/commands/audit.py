"""dpfed site audit / dpfed aggregator audit: the options and the output both share.

Not a command of its own (dpfed_apps.cli lists the commands): ``add_audit_arguments`` adds the
options to each role's ``audit`` subcommand and ``show_audit`` prints the log, verifies it
(dpfed.audit.verify) and matches it with a peer's log (dpfed.audit.cross_check).
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

from dpfed import exitcodes, jsonsafe


def add_audit_arguments(parser) -> None:
    parser.add_argument("--verify", action="store_true",
                        help="recompute every hash, check the order and every signed head; exit "
                             "7 naming the first broken entry")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--round", default=None, metavar="ID",
                        help="show only the entries of this round (verification covers the "
                             "whole log)")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="show only the last N entries shown")
    parser.add_argument("--public-key", action="append", default=[], metavar="PEM",
                        help="also accept heads signed by this public key (a key used before "
                             "a rotation); repeatable")
    parser.add_argument("--against", default=None, metavar="AUDIT_LOG",
                        help="the peer's audit log (a copy of its file): match every message "
                             "by its digest; exit 7 if one side recorded receiving a message "
                             "the other did not record sending")


def _when(ms) -> str:
    try:
        when = datetime.fromtimestamp(ms / 1000, timezone.utc)
        return when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def _row(e: dict) -> str:
    if e.get("unreadable"):
        return f"{e.get('seq', '?'):>6}  (unreadable entry)"
    what = e.get("outcome") or ""
    if e.get("reason"):
        what = f"{what}: {e['reason']}" if what else e["reason"]
    eps = e.get("epsilon")
    eps = "" if eps is None else f"{eps:g}"
    return (f"{e.get('seq', '?'):>6}  {_when(e.get('time_ms'))}  {e.get('direction', ''):<8}  "
            f"{e.get('kind', ''):<12}  {e.get('round_id') or '-':<24}  {e.get('phase') or '-':<9}"
            f"  {e.get('peer', ''):<24}  {eps:>6}  {what}")


def show_audit(args, prog: str, path: Path, public_keys: dict, *, anchor=None,
               anchor_where: str = "") -> int:
    """Print the log at ``path`` (filtered by --round, --limit), with --verify check it against
    ``public_keys`` (key id -> public key; --public-key adds more) and the head ``anchor``
    kept outside it (at ``anchor_where``), with --against match it with a peer's log."""
    from dpfed import audit
    from dpfed.wire.signing import SignatureError, key_id, load_public_key

    keys = dict(public_keys)
    for pem in args.public_key:
        try:
            extra = load_public_key(pem)
        except (OSError, ValueError, SignatureError) as exc:
            print(f"{prog}: --public-key {pem}: {exc}", file=sys.stderr)
            return exitcodes.USAGE
        keys[key_id(extra)] = extra
    if args.limit is not None and args.limit < 1:
        print(f"{prog}: --limit must be >= 1", file=sys.stderr)
        return exitcodes.USAGE
    try:
        contents = audit.read(path)
    except audit.AuditError as exc:
        if anchor is not None and args.verify:
            # The log is gone, but its head is kept elsewhere: it existed and was deleted.
            verdict = audit.verify(audit.Contents(Path(path), {}), keys, anchor=anchor)
            return _report(args, prog, path, None, [], verdict, None, anchor_where)
        print(f"{prog}: {exc}", file=sys.stderr)
        return exitcodes.ERROR
    shown = audit.entries(contents)
    if args.round is not None:
        shown = [e for e in shown if e.get("round_id") == args.round]
    if args.limit is not None:
        shown = shown[-args.limit:]
    verdict = audit.verify(contents, keys, anchor=anchor) if args.verify else None
    matched = None
    if args.against:
        try:
            theirs = audit.read(args.against)
        except audit.AuditError as exc:
            print(f"{prog}: --against: {exc}", file=sys.stderr)
            return exitcodes.ERROR
        ours_all, theirs_all = audit.entries(contents), audit.entries(theirs)
        # A log shared by many peers (the aggregator's) is narrowed to the other party.
        ours_peer = theirs.party if any(e.get("peer") == theirs.party for e in ours_all) else None
        theirs_peer = contents.party if any(e.get("peer") == contents.party
                                            for e in theirs_all) else None
        matched = audit.cross_check(ours_all, theirs_all, ours_peer=ours_peer,
                                    theirs_peer=theirs_peer)
        matched["peer"] = theirs.party
    return _report(args, prog, path, contents, shown, verdict, matched, anchor_where,
                   anchor=anchor)


def _unexplained(matched: dict) -> list[dict]:
    """Messages one side recorded receiving that the other never recorded sending."""
    return [e for side in ("missing_in_theirs", "missing_in_ours") for e in matched[side]
            if e["direction"] == "received"]


def _report(args, prog, path, contents, shown, verdict, matched, anchor_where, *,
            anchor=None) -> int:
    broken = verdict is not None and not verdict.ok
    unexplained = _unexplained(matched) if matched is not None else []
    code = exitcodes.AUDIT_FAILED if broken or unexplained else exitcodes.OK
    if args.json:
        out = {"path": str(path), "party": contents.party if contents else None,
               "entries": shown}
        if verdict is not None:
            out["verify"] = verdict.to_dict()
            out["verify"]["anchor"] = None if anchor is None else {"seq": anchor.seq,
                                                                   "where": anchor_where}
        if matched is not None:
            out["against"] = matched
        print(jsonsafe.dumps(out, indent=2, sort_keys=True))
        return code
    # --verify alone prints the verdict; with --round or --limit the entries too.
    if contents is not None and (not args.verify or args.round is not None
                                 or args.limit is not None):
        print(f"audit log: {path} ({contents.party}, {len(contents.rows)} entries)")
        print(f"{'seq':>6}  {'time (UTC)':<23}  {'dir':<8}  {'kind':<12}  {'round':<24}  "
              f"{'phase':<9}  {'peer':<24}  {'eps':>6}  outcome / reason")
        for e in shown:
            print(_row(e))
    if verdict is not None:
        if verdict.ok:
            kept = (f"; the head kept in {anchor_where} (entry {anchor.seq}) matches"
                    if anchor is not None else "")
            print(f"chain intact: {verdict.entries} entries, head signed by {verdict.key_id}"
                  f"{kept}")
        else:
            p = verdict.problem
            print(f"{prog}: chain broken at entry {p.seq} ({p.kind}): {p.message}",
                  file=sys.stderr)
    if matched is not None:
        print(f"matched with {matched['peer']}'s log: {matched['matched']} message(s) in both")
        for e in matched["missing_in_theirs"]:
            print(f"  only here ({e['direction']}): {e['kind']} round {e['round_id'] or '-'} "
                  f"{e['message_digest'][:16]}")
        for e in matched["missing_in_ours"]:
            print(f"  only in {matched['peer']}'s log ({e['direction']}): {e['kind']} round "
                  f"{e['round_id'] or '-'} {e['message_digest'][:16]}")
        if unexplained:
            print(f"{prog}: {len(unexplained)} message(s) recorded as received that the other "
                  f"side never recorded sending: a log lost entries", file=sys.stderr)
    return code
