"""dpfed sites: list the sites registered at the aggregator and whether they are connected."""

from __future__ import annotations

import time

from dpfed import exitcodes, jsonsafe
from dpfed_apps.commands import add_command
from dpfed_apps.commands.round import add_connection_args, query

EPILOG = """\
example:
  dpfed sites list --aggregator 127.0.0.1:50051 --insecure
  dpfed sites list --config coordinator.toml --json
"""


def list_cmd(args) -> int:
    sites, code = query(args, lambda c: c.list_sites())
    if code is not None:
        return code
    # A site that does not trust this coordinator is listed by id only, with why (hidden).
    rows = [{"site_id": s.site_id, "hidden": s.hidden} if s.hidden else
            {"site_id": s.site_id, "key_id": s.key_id, "connected": s.connected,
             "last_seen_unix_ms": s.last_seen_unix_ms, "spent_epsilon": s.spent_epsilon,
             "declared_total_epsilon": s.declared_total_epsilon} for s in sites]
    if args.json:
        print(jsonsafe.dumps(rows, indent=2))
        return exitcodes.OK
    width = max([7, *(len(r["site_id"]) for r in rows)])
    print(f"{'site':<{width}}  {'connected':<9}  {'last seen':<20}  {'epsilon spent/total':<20}  "
          f"key id")
    for r in rows:
        if r.get("hidden"):
            print(f"{r['site_id']:<{width}}  ({r['hidden']})")
            continue
        seen = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["last_seen_unix_ms"] / 1000))
                if r["last_seen_unix_ms"] else "never")
        budget = (f"{r['spent_epsilon']:g}/{r['declared_total_epsilon']:g}"
                  if r["declared_total_epsilon"] else f"{r['spent_epsilon']:g}/?")
        print(f"{r['site_id']:<{width}}  {'yes' if r['connected'] else 'no':<9}  {seen:<20}  "
              f"{budget:<20}  {r['key_id'][:16]}")
    return exitcodes.OK


def register(subparsers) -> None:
    p = add_command(subparsers, "sites", __doc__,
                    help="list registered sites and their connections", epilog=EPILOG)
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="list sites", epilog=EPILOG)
    add_connection_args(ls, signing=False)
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=list_cmd)
