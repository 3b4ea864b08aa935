"""dpfed provision: make the federation's CA and a kit (certificate, keys, config) per party."""

from __future__ import annotations

import argparse
import json
import sys

from dpfed import exitcodes

EPILOG = """\
example:
  dpfed provision --project project.toml --out federation/
      federation/ca/             the CA (ca.key is 0600: keep it offline, back it up)
      federation/aggregator/     kit for the aggregator: aggregator.toml, START.md, tls/, keys/
      federation/sites/<id>/     kit per site: site.toml, START.md, tls/, keys/
      federation/coordinators/<id>/  kit per coordinator: coordinator.toml, START.md, tls/, keys/
      federation/public/         CA certificate, issued certificates and public keys
  dpfed provision --project project.toml --out federation/ --add-site hospital-d
      issues one more site with the same CA; existing kits stay byte-identical, the
      aggregator kit gets keys/hospital-d.pub and add-sites/hospital-d.toml to append

project.toml:
  federation = "three-hospitals"
  sites = ["hospital-a", "hospital-b", "hospital-c"]
  coordinators = ["coordinator"]
  # cert_days = 825
  [aggregator]
  address = "aggregator.example.org:50051"   # what sites and coordinators dial
  # listen = "0.0.0.0:50051"
  # hostnames = ["localhost"]                 # DNS names in the certificate (plus address's)
  # ip_addresses = ["127.0.0.1"]
  # [site_policy]                             # defaults for the sites' [policy] tables
  # max_epsilon_per_round = 2.0
  # total_epsilon = 10.0

Kits hold private keys (0600, folders 0700): hand each one over a secure channel only to
its party. Parties already issued are never issued again (see public/).

exit codes: 0 ok, 2 invalid project.toml or output folder, 1 other error
"""


def run(args) -> int:
    from dpfed.provision import ProvisionError, load_project, provision
    try:
        listed = load_project(args.project)
        project = listed.with_sites(args.add_site or [])
        report = provision(project, args.out)
    except ProvisionError as exc:
        print(f"dpfed provision: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except OSError as exc:
        print(f"dpfed provision: {exc}", file=sys.stderr)
        return exitcodes.ERROR
    missing = [s for s in (args.add_site or []) if s not in listed.sites]
    if missing:
        print(f"note: add {', '.join(missing)} to the sites of {args.project} so it stays the "
              "record of the federation", file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return exitcodes.OK
    print(f"{'created' if report.ca == 'created' else 'reused'} CA {report.out / 'ca'}")
    for kind, party, path in report.created:
        print(f"issued {kind} {party}: kit {path}")
    if report.existing:
        print("already issued (unchanged): " + ", ".join(f"{k} {i}" for k, i in report.existing))
    for path in report.additions:
        print(f"added {path}")
    if report.additions:
        print("register new parties at the aggregator: append its add-sites/*.toml (and "
              "add-coordinators/*.toml) to aggregator.toml and restart it")
    return exitcodes.OK


def register(subparsers) -> None:
    p = subparsers.add_parser("provision", help="make the federation's CA and per-party kits",
                              description=__doc__.splitlines()[0].split(": ", 1)[1],
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--project", required=True, help="project.toml naming the federation's parties")
    p.add_argument("--out", required=True, help="folder for the CA and the kits (created 0700)")
    p.add_argument("--add-site", action="append", metavar="SITE_ID",
                   help="issue this site too (repeatable), with the existing CA")
    p.add_argument("--json", action="store_true", help="print what was issued as JSON")
    p.set_defaults(func=run)
