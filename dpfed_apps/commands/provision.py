"""dpfed provision: make the federation's CA and a kit (certificate, keys, config) per party."""

from __future__ import annotations

import sys

from dpfed import exitcodes, jsonsafe
from dpfed_apps.commands import add_command

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
  dpfed provision --project project.toml --out federation/ --csr requests/hospital-a.csr
      the production path: hospital-a made its own keys (`dpfed csr`) and sent the request
      (hospital-a.csr and hospital-a.pub); its kit holds its certificate, no private key
  dpfed provision renew --out federation/ hospital-a [--csr hospital-a.csr] [--days 397]
      a new certificate for the same key (or the request's new key): federation/renewed/
  dpfed provision revoke --out federation/ hospital-a [--serial HEX]
      adds every certificate of hospital-a (or one) to federation/public/crl.pem: copy it
      to the aggregator's tls/crl.pem, which refuses revoked certificates on every call

project.toml:
  federation = "three-hospitals"
  sites = ["hospital-a", "hospital-b", "hospital-c"]
  coordinators = ["coordinator"]
  # cert_days = 397
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
    from dpfed_apps.ca import ProvisionError, load_project, load_request, provision
    if getattr(args, "action", None) == "renew":
        return run_renew(args)
    if getattr(args, "action", None) == "revoke":
        return run_revoke(args)
    if not args.project or not args.out:
        print("dpfed provision: --project and --out are required", file=sys.stderr)
        return exitcodes.USAGE
    try:
        listed = load_project(args.project)
        project = listed.with_sites(args.add_site or [])
        requests = [load_request(path) for path in args.csr or []]
        report = provision(project, args.out, requests)
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
        print(jsonsafe.dumps(report.to_dict(), indent=2))
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


def run_renew(args) -> int:
    from dpfed_apps.ca import ProvisionError, load_request, renew
    try:
        request = load_request(args.csr, need_pub=False) if args.csr else None
        from dpfed_apps.ca import DEFAULT_CERT_DAYS
        path = renew(args.out, args.name, days=args.days or DEFAULT_CERT_DAYS, request=request)
    except (ProvisionError, OSError) as exc:
        print(f"dpfed provision renew: {exc}", file=sys.stderr)
        return exitcodes.USAGE if isinstance(exc, ProvisionError) else exitcodes.ERROR
    from cryptography import x509
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    print(f"renewed {args.name}: {path} (serial {cert.serial_number:x}, valid until "
          f"{cert.not_valid_after_utc:%Y-%m-%d}); give it to {args.name}: it replaces "
          f"tls/{args.name}.pem. The old certificate stays valid until it expires unless "
          f"revoked (dpfed provision revoke {args.name} --serial OLD)")
    return exitcodes.OK


def run_revoke(args) -> int:
    from dpfed_apps.ca import ProvisionError, revoke
    try:
        serial = int(args.serial, 16) if args.serial else None
        new, path = revoke(args.out, args.name, serial=serial)
    except ValueError as exc:      # ProvisionError, or a serial that is not hex
        print(f"dpfed provision revoke: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except OSError as exc:
        print(f"dpfed provision revoke: {exc}", file=sys.stderr)
        return exitcodes.ERROR
    print(f"revoked {args.name}: {', '.join(f'{s:x}' for s in new) or 'nothing new'}; "
          f"revocation list {path}. Copy it to the aggregator's tls/crl.pem ([tls] crl of "
          "aggregator.toml): it is re-read when it changes and every call over a revoked "
          "certificate is refused (UNAUTHENTICATED)")
    return exitcodes.OK


def register(subparsers) -> None:
    p = add_command(subparsers, "provision", __doc__,
                    help="make the federation's CA and per-party kits", epilog=EPILOG)
    p.add_argument("--project", help="project.toml naming the federation's parties")
    p.add_argument("--out", help="folder for the CA and the kits (created 0700)")
    p.add_argument("--add-site", action="append", metavar="SITE_ID",
                   help="issue this site too (repeatable), with the existing CA")
    p.add_argument("--csr", action="append", metavar="FILE",
                   help="a party's certificate request from `dpfed csr` (repeatable; its .pub "
                        "next to it): that party's kit gets no private key")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    r = sub.add_parser("renew", help="a new certificate for an issued party", epilog=EPILOG)
    r.add_argument("name", help="site or coordinator id, or 'aggregator'")
    r.add_argument("--out", required=True, dest="out", help="the federation folder (its ca/)")
    r.add_argument("--csr", help="a request for a new key (dpfed csr); default: the same key")
    r.add_argument("--days", type=int, default=None, help="validity in days (default 397)")
    r.set_defaults(func=run)
    v = sub.add_parser("revoke", help="revoke a party's certificates (writes public/crl.pem)",
                       epilog=EPILOG)
    v.add_argument("name", help="site or coordinator id, or 'aggregator'")
    v.add_argument("--out", required=True, dest="out", help="the federation folder (its ca/)")
    v.add_argument("--serial", help="revoke only this certificate (hex serial)")
    v.set_defaults(func=run)
    p.add_argument("--json", action="store_true", help="print what was issued as JSON")
    p.set_defaults(func=run)
