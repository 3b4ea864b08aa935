"""Where things live in the certificate authority's output folder (``dpfed provision --out DIR``):

    DIR/ca/ca.key, ca.pem         the federation CA (ECDSA P-256; key 0600, folder 0700)
    DIR/public/                   every public thing: ca.pem, crl.pem, sites/<id>.pub|.pem,
                                  coordinators/<id>.pub|.pem, aggregator.pub|.pem,
                                  issued/ (what was issued, and to whom)
    DIR/aggregator/               kit: aggregator.toml, START.md, tls/, keys/ (its signing
                                  key and the parties' *.pub)
    DIR/sites/<site_id>/          kit: site.toml, START.md, tls/, keys/
    DIR/coordinators/<id>/        kit: coordinator.toml, START.md, tls/, keys/
"""

from __future__ import annotations

from pathlib import Path

from dpfed.identity import AGGREGATOR, SITE
from dpfed.transport import TlsFiles

CRL_NAME = "crl.pem"


def kit_dir(out: Path, kind: str, party_id: str) -> Path:
    if kind == AGGREGATOR:
        return out / "aggregator"
    return out / ("sites" if kind == SITE else "coordinators") / party_id


def kit_tls(kit: Path, name: str) -> TlsFiles:
    """The TlsFiles of a kit folder (dpfed.transport)."""
    return TlsFiles(kit / "tls" / "ca.pem", kit / "tls" / f"{name}.pem", kit / "tls" / f"{name}.key")


def public_dir(out: Path, kind: str) -> Path:
    return out / "public" / ("sites" if kind == SITE else "coordinators")


def issued_dir(out: Path) -> Path:
    return out / "public" / "issued"


def current_cert_path(out: Path, kind: str, party_id: str) -> Path:
    if kind == AGGREGATOR:
        return out / "public" / "aggregator.pem"
    return public_dir(out, kind) / f"{party_id}.pem"


def aggregator_key_path(out: Path) -> Path:
    """The CA's record of the aggregator's Ed25519 identity key (it signs the aggregator's
    secure-aggregation messages): what a coordinator's ``aggregator_key`` names."""
    return out / "public" / "aggregator.pub"


def crl_path(out: Path) -> Path:
    return out / "public" / CRL_NAME
