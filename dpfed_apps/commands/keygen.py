"""dpfed keygen: make an Ed25519 signing key pair for a site, coordinator or aggregator."""

from __future__ import annotations

import sys
from pathlib import Path

from dpfed import exitcodes
from dpfed_apps.commands import add_command

EPILOG = """\
example:
  dpfed keygen --name hospital-a --out keys/
      writes keys/hospital-a.key (private, mode 0600: keep it at the site) and
      keys/hospital-a.pub (public: register it in the aggregator's aggregator.toml)
"""


def run(args) -> int:
    from dpfed.wire.signing import SigningKey
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    private, public = out / f"{args.name}.key", out / f"{args.name}.pub"
    if private.exists() and not args.force:
        print(f"dpfed keygen: {private} exists (use --force to replace it)", file=sys.stderr)
        return exitcodes.USAGE
    key = SigningKey.generate()
    key.save(private, public)
    print(f"wrote {private} (private) and {public} (public), key id {key.key_id}")
    return exitcodes.OK


def register(subparsers) -> None:
    p = add_command(subparsers, "keygen", __doc__,
                    help="make an Ed25519 signing key pair", epilog=EPILOG)
    p.add_argument("--name", required=True, help="party name: file stem of the key files")
    p.add_argument("--out", default=".", help="directory for NAME.key and NAME.pub (default: .)")
    p.add_argument("--force", action="store_true", help="overwrite an existing key")
    p.set_defaults(func=run)
