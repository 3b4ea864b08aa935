"""dpfed csr: make this party's private keys here and a certificate request for the CA."""

from __future__ import annotations

import sys

from dpfed import exitcodes
from dpfed_apps.commands import add_command

EPILOG = """\
The production path (deploy/README.md): private keys are made where they are used and never
leave it; the federation's CA sees only the request.

examples:
  dpfed csr --site hospital-a --out hospital-a/
      hospital-a/tls/hospital-a.key      TLS key (ECDSA P-256, 0600)        stays here
      hospital-a/keys/hospital-a.key     Ed25519 signing key (0600)         stays here
      hospital-a/keys/hospital-a.pub     its public half
      hospital-a/request/hospital-a.csr  X.509 request naming dpfed://site/hospital-a
      hospital-a/request/hospital-a.pub  the signing key's public half
      Send request/ to the CA (it is public); it runs
        dpfed provision --project project.toml --out federation/ --csr hospital-a.csr
      and sends back federation/sites/hospital-a/ (certificate, CA, site.toml, no key):
      copy it over this folder.
  dpfed csr --coordinator coordinator --out coordinator/
  dpfed csr --aggregator --out aggregator/     (names come from the CA's project.toml)
  dpfed csr --site hospital-a --out hospital-a/ --reuse-key
      a request for the TLS key already in tls/hospital-a.key (renewal of the same key);
      the CA runs  dpfed provision renew hospital-a --out federation/ --csr hospital-a.csr

exit codes: 0 ok, 2 a key exists already (--force makes new ones) or bad arguments
"""


def run(args) -> int:
    from pathlib import Path

    from dpfed_apps.ca import (AGGREGATOR, COORDINATOR, SITE, ProvisionError, make_request,
                               request_for_existing_key)
    kind, name = ((SITE, args.site) if args.site else (COORDINATOR, args.coordinator)
                  if args.coordinator else (AGGREGATOR, AGGREGATOR))
    out = Path(args.out)
    try:
        if args.reuse_key:
            key = out / "tls" / f"{name}.key"
            csr = request_for_existing_key(kind, name, key, out / "request")
            print(f"wrote {csr}: a request for the key in {key}; send it to the CA")
            return exitcodes.OK
        made = make_request(kind, name, out, force=args.force)
    except (ProvisionError, OSError, ValueError) as exc:
        print(f"dpfed csr: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    keys = [str(made["tls_key"]), *([str(made["signing_key"])] if made["signing_key"] else [])]
    send = [str(made["csr"]), *([str(made["pub"])] if made["pub"] else [])]
    print(f"private keys (0600, never send them): {', '.join(keys)}")
    print(f"send to the federation's CA: {' and '.join(send)}")
    return exitcodes.OK


def register(subparsers) -> None:
    p = add_command(subparsers, "csr", __doc__,
                    help="make this party's keys and a certificate request", epilog=EPILOG)
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--site", metavar="SITE_ID")
    who.add_argument("--coordinator", metavar="COORDINATOR_ID")
    who.add_argument("--aggregator", action="store_true")
    p.add_argument("--out", required=True, help="the party's folder (tls/, keys/, request/)")
    p.add_argument("--force", action="store_true", help="replace existing private keys")
    p.add_argument("--reuse-key", action="store_true",
                   help="a request for the existing tls/NAME.key (renewal of the same key)")
    p.set_defaults(func=run)
