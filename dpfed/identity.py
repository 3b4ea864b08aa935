"""Who a party is, at run time: dpfed identities in TLS certificates, checks of a party's own
TLS files, and the reader of the CA's revocation list.

A certificate's identity is its SAN URI, ``dpfed://site/<id>``, ``dpfed://coordinator/<id>``
or ``dpfed://aggregator`` (also the subject CN). The aggregator binds it to the signing key's
registered owner (aggregator.identity), so a stolen signing key is useless without the matching
certificate and the other way round.

This is the part of the federation's PKI that running roles need (``dpfed site check``, the
serve commands, the aggregator's per-call identity and revocation checks). Issuing, signing
requests, renewing and revoking is the offline certificate authority, an application
(``dpfed_apps.ca``, ``dpfed provision``): no role imports it.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

__all__ = ["URI_SCHEME", "SITE", "COORDINATOR", "AGGREGATOR", "KINDS", "EXPIRY_WARNING_DAYS",
           "IdentityError", "identity_uri", "parse_identity_uri", "check_name", "identities_of",
           "certificate_problems", "expiry_warning", "load_crl"]

URI_SCHEME = "dpfed"
SITE, COORDINATOR, AGGREGATOR = "site", "coordinator", "aggregator"
KINDS = (SITE, COORDINATOR, AGGREGATOR)
EXPIRY_WARNING_DAYS = 30         # `dpfed site check` and the serve commands warn this early
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class IdentityError(ValueError):
    """A party name, certificate or revocation list that is not what a dpfed party needs."""


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def identity_uri(kind: str, party_id: str | None = None) -> str:
    """The SAN URI naming a party: dpfed://site/<id>, dpfed://coordinator/<id>, dpfed://aggregator."""
    if kind == AGGREGATOR:
        return f"{URI_SCHEME}://{AGGREGATOR}"
    if kind not in (SITE, COORDINATOR) or not party_id:
        raise ValueError(f"no identity URI for {kind!r} {party_id!r}")
    return f"{URI_SCHEME}://{kind}/{party_id}"


def parse_identity_uri(uri: str) -> tuple[str, str] | None:
    """(kind, party_id) of a dpfed identity URI, or None if ``uri`` is not one."""
    prefix = f"{URI_SCHEME}://"
    if not uri.startswith(prefix):
        return None
    rest = uri[len(prefix):]
    if rest == AGGREGATOR:
        return AGGREGATOR, AGGREGATOR
    kind, sep, party = rest.partition("/")
    if sep and kind in (SITE, COORDINATOR) and _NAME.match(party):
        return kind, party
    return None


def check_name(name: str, what: str, *, error: type[Exception] = IdentityError) -> str:
    """``name`` if it can name a party (it names folders and certificates), else ``error``."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise error(f"{what} {name!r} must be 1-64 characters of letters, digits, "
                    "'.', '_' or '-', starting with a letter or digit (it names "
                    "folders and certificates)")
    return name


def identities_of(cert: x509.Certificate) -> list[tuple[str, str]]:
    """The dpfed identities (kind, id) a certificate's SAN URIs name."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    found = (parse_identity_uri(u) for u in san.get_values_for_type(x509.UniformResourceIdentifier))
    return [f for f in found if f is not None]


def _public_der(key) -> bytes:
    return key.public_bytes(serialization.Encoding.DER,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def certificate_problems(tls, kind: str, party_id: str) -> list[str]:
    """What is wrong with a party's TLS files (dpfed.transport.TlsFiles): unreadable, not
    signed by the CA in the same kit, expired or not yet valid, naming another identity, or
    a key that does not belong to the certificate. Empty when all is well."""
    try:
        ca = x509.load_pem_x509_certificate(Path(tls.ca_cert).read_bytes())
        cert = x509.load_pem_x509_certificate(Path(tls.cert).read_bytes())
        key = serialization.load_pem_private_key(Path(tls.key).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        return [f"cannot read the TLS files: {exc}"]
    problems = []
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        problems.append(f"{tls.cert} is not signed by the CA in {tls.ca_cert}")
    now = now_utc()
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        problems.append(f"{tls.cert} is valid only from {cert.not_valid_before_utc:%Y-%m-%d} to "
                        f"{cert.not_valid_after_utc:%Y-%m-%d}")
    named = identities_of(cert)
    if named != [(kind, party_id)]:
        problems.append(f"{tls.cert} names {[identity_uri(*i) for i in named] or 'no dpfed identity'}, "
                        f"not {identity_uri(kind, party_id)}")
    if _public_der(key.public_key()) != _public_der(cert.public_key()):
        problems.append(f"{tls.key} is not the key of {tls.cert}")
    return problems


def expiry_warning(cert_path, *, within_days: int = EXPIRY_WARNING_DAYS,
                   now: dt.datetime | None = None) -> str | None:
    """A warning when the certificate at ``cert_path`` expires within ``within_days`` (and has
    not yet expired: that is a problem, see certificate_problems); None otherwise."""
    try:
        cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    except (OSError, ValueError):
        return None
    now = now or now_utc()
    left = cert.not_valid_after_utc - now
    if dt.timedelta(0) <= left <= dt.timedelta(days=within_days):
        return (f"{cert_path} expires on {cert.not_valid_after_utc:%Y-%m-%d} (in {left.days} "
                f"day(s)): ask the federation's CA for a renewed certificate (dpfed provision "
                f"renew) before then, or this party can no longer connect")
    return None


def load_crl(path: str | Path, ca_cert: x509.Certificate) -> x509.CertificateRevocationList:
    """The CRL at ``path``, checked against the CA (IdentityError if not signed by it)."""
    try:
        crl = x509.load_pem_x509_crl(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise IdentityError(f"{path}: not a readable PEM revocation list ({exc})") from None
    if crl.issuer != ca_cert.subject or not crl.is_signature_valid(ca_cert.public_key()):
        raise IdentityError(f"{path}: the revocation list is not signed by the federation's CA")
    return crl
