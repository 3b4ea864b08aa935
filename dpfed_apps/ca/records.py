"""The record of issued certificates, renewal and revocation (``dpfed provision renew`` and
``dpfed provision revoke``)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509

from dpfed.identity import (AGGREGATOR, COORDINATOR, SITE, identities_of, identity_uri, load_crl,
                            now_utc)
from dpfed_apps.ca.authority import CertificateAuthority, write_crl
from dpfed_apps.ca.layout import crl_path, current_cert_path, issued_dir, public_dir
from dpfed_apps.ca.project import CA_DAYS, DEFAULT_CERT_DAYS, ProvisionError
from dpfed_apps.ca.requests import Request


def record_issued(out: Path, kind: str, party_id: str, pem: bytes) -> Path:
    """Every certificate ever issued, by serial: revoking a party revokes all of them."""
    cert = x509.load_pem_x509_certificate(pem)
    folder = issued_dir(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}-{party_id}-{cert.serial_number:x}.pem"
    path.write_bytes(pem)
    return path


def _kind_of(out: Path, name: str) -> str:
    if name == AGGREGATOR:
        return AGGREGATOR
    kinds = [k for k in (SITE, COORDINATOR) if (public_dir(out, k) / f"{name}.pem").exists()]
    if not kinds:
        raise ProvisionError(f"{out}: no site or coordinator {name!r} was issued here "
                             "(public/ has no certificate of that name)")
    if len(kinds) > 1:
        raise ProvisionError(f"{name!r} is both a site and a coordinator; cannot tell which")
    return kinds[0]


def issued_certificates(out: Path, kind: str, party_id: str) -> list[x509.Certificate]:
    """Every certificate issued to the party: the record in public/issued/ and the current one
    (federations provisioned before the record existed have only the latter)."""
    certs = {}
    paths = list(issued_dir(out).glob(f"{kind}-{party_id}-*.pem")) if issued_dir(out).is_dir() else []
    current = current_cert_path(out, kind, party_id)
    if current.exists():
        paths.append(current)
    for path in paths:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        if identities_of(cert) == [(kind, party_id)]:
            certs[cert.serial_number] = cert
    return [certs[k] for k in sorted(certs)]


def renew(out: str | Path, name: str, *, days: int = DEFAULT_CERT_DAYS,
          request: Request | None = None) -> Path:
    """A new certificate for an issued party, valid ``days`` from now: for the key of its current
    certificate, or for the key of ``request`` (a new key, made at the party by ``dpfed csr``;
    it must name the same identity). Keeps the names (DNS/IP) of the current certificate.
    Writes ``out/renewed/<name>.pem`` (hand it to the party: it replaces tls/<name>.pem) and
    updates the record in public/. The old certificate stays valid until it expires unless
    revoked (``revoke(..., serial=...)``)."""
    out = Path(out)
    if not 1 <= days <= CA_DAYS:
        raise ProvisionError(f"days must be in 1..{CA_DAYS}")
    ca = CertificateAuthority.load(out / "ca")
    kind = _kind_of(out, name)
    current_path = current_cert_path(out, kind, name)
    if not current_path.exists():
        raise ProvisionError(f"{current_path}: no current certificate of {name!r} to renew")
    current = x509.load_pem_x509_certificate(current_path.read_bytes())
    if request is not None and (request.kind, request.party_id) != (kind, name):
        raise ProvisionError(f"the request names {identity_uri(request.kind, request.party_id)}, "
                             f"not {identity_uri(kind, name)}")
    key = request.tls_public_key if request is not None else current.public_key()
    san = current.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    pem = ca.issue_for_key(kind, name, key, days=days,
                           dns_names=san.get_values_for_type(x509.DNSName),
                           ip_addresses=[str(i) for i in san.get_values_for_type(x509.IPAddress)])
    record_issued(out, kind, name, current_path.read_bytes())   # the old one, if not yet recorded
    record_issued(out, kind, name, pem)
    current_path.write_bytes(pem)
    folder = out / "renewed"
    folder.mkdir(exist_ok=True)
    target = folder / f"{name}.pem"
    target.write_bytes(pem)
    return target


def revoke(out: str | Path, name: str, *, serial: int | None = None) -> tuple[list[int], Path]:
    """Revoke every certificate issued to ``name`` (or only the one with ``serial``, e.g. the one
    a renewal replaced) and re-sign ``out/public/crl.pem``. Returns the serials newly revoked
    and the CRL's path: copy it to the aggregator (its ``[tls] crl``), which re-reads it when it
    changes and refuses every call over a revoked certificate."""
    out = Path(out)
    ca = CertificateAuthority.load(out / "ca")
    kind = _kind_of(out, name)
    certs = issued_certificates(out, kind, name)
    serials = [c.serial_number for c in certs]
    if serial is not None:
        if serial not in serials:
            raise ProvisionError(f"no certificate with serial {serial:x} was issued to {name!r} "
                                 f"(issued: {', '.join(f'{s:x}' for s in serials) or 'none'})")
        serials = [serial]
    path = crl_path(out)
    revoked: dict[int, dt.datetime] = {}
    if path.exists():
        for entry in load_crl(path, ca.cert):
            revoked[entry.serial_number] = entry.revocation_date_utc
    new = [s for s in serials if s not in revoked]
    now = now_utc()
    revoked.update({s: now for s in new})
    write_crl(ca, path, revoked)
    return new, path
