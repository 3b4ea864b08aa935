"""Who is on the other end of a gRPC call: the dpfed identity of the peer's TLS certificate.

With mutual TLS every client presents a certificate signed by the federation's CA naming one
identity as a SAN URI (dpfed.identity): ``dpfed://site/<id>`` or ``dpfed://coordinator/<id>``.
The round manager binds it to the signing key's registered owner, so a request must carry both
the right key and the right certificate: a site holding another site's signing key (or a
coordinator's) still cannot speak for it over its own connection.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from dpfed.identity import COORDINATOR, SITE, identity_uri, parse_identity_uri


log = logging.getLogger("dpfed.aggregator")


class NoPeerIdentity(Exception):
    """A TLS peer whose certificate names no (or more than one) dpfed identity."""


class RevokedCertificate(NoPeerIdentity):
    """A TLS peer whose certificate the federation's CA has revoked (its CRL lists the serial)."""


class RevocationList:
    """The CA's X.509 CRL (``[tls] crl`` of aggregator.toml, made by `dpfed provision revoke`).

    Loaded and checked against the CA at start (a CRL of another CA, or an unreadable one,
    stops the start: fail closed). Every call's peer certificate is looked up by serial
    (peer_identity); when the file changes (a new CRL copied in) it is re-read at the next
    call, so a revocation takes effect without a restart. A changed file that does not verify
    is logged and the previous list stays in force (a revocation is never undone by a bad copy).
    """

    def __init__(self, path: str | Path, ca_cert_path: str | Path):
        from cryptography import x509
        self.path = Path(path)
        self.ca_cert = x509.load_pem_x509_certificate(Path(ca_cert_path).read_bytes())
        self._lock = threading.Lock()
        self._stamp = None
        self.serials: frozenset[int] = frozenset()
        self._load(strict=True)

    def _load(self, *, strict: bool) -> None:
        from dpfed.identity import IdentityError, load_crl
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        try:
            crl = load_crl(self.path, self.ca_cert)
        except IdentityError as exc:
            if strict:
                raise
            log.error("revocation list %s changed but is not usable (%s); the previous list "
                      "(%d revoked) stays in force", self.path, exc, len(self.serials))
            self._stamp = stamp
            return
        serials = frozenset(r.serial_number for r in crl)
        if serials != self.serials or self._stamp is None:
            log.info("revocation list %s: %d certificate(s) revoked", self.path, len(serials))
        self.serials = serials
        self._stamp = stamp

    def refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            return      # moved away mid-copy: keep the list in force
        if (st.st_mtime_ns, st.st_size, st.st_ino) != self._stamp:
            with self._lock:
                self._load(strict=False)

    def revoked(self, serial: int) -> bool:
        self.refresh()
        return serial in self.serials


@lru_cache(maxsize=1024)
def _serial_of(pem: bytes) -> int:
    from cryptography import x509
    return x509.load_pem_x509_certificate(pem).serial_number


@dataclass(frozen=True)
class PeerIdentity:
    kind: str        # "site", "coordinator" or "aggregator"
    party_id: str

    def __str__(self) -> str:
        return identity_uri(self.kind, self.party_id)


@lru_cache(maxsize=1024)
def _from_pem(pem: bytes) -> tuple[tuple[str, str], ...]:
    from cryptography import x509

    from dpfed.identity import identities_of
    return tuple(identities_of(x509.load_pem_x509_certificate(pem)))


def identity_from_auth_context(auth: dict) -> PeerIdentity | None:
    """The identity in a gRPC auth context (``context.auth_context()``); None for a plaintext
    channel. gRPC fills ``x509_subject_alternative_name`` with every SAN of the verified peer
    certificate (URIs included); the certificate itself is the fallback."""
    if b"ssl" not in auth.get("transport_security_type", []):
        return None
    sans = auth.get("x509_subject_alternative_name")
    if sans is not None:
        found = {parse_identity_uri(v.decode("utf-8", "replace")) for v in sans} - {None}
    else:
        pems = auth.get("x509_pem_cert") or []
        found = set(_from_pem(pems[0])) if pems else set()
    if len(found) != 1:
        raise NoPeerIdentity("the client certificate names " + (
            "no dpfed identity (a SAN URI dpfed://site/<id> or dpfed://coordinator/<id>); "
            "use the certificate from `dpfed provision`" if not found else
            f"several dpfed identities ({', '.join(sorted(map(str, found)))})"))
    kind, party = found.pop()
    return PeerIdentity(kind, party)


def peer_identity(context, revocation: RevocationList | None = None) -> PeerIdentity | None:
    """The identity of the peer of a servicer call (see identity_from_auth_context); with a
    ``revocation`` list, RevokedCertificate when the peer's certificate is on it."""
    auth = context.auth_context()
    peer = identity_from_auth_context(auth)
    if peer is not None and revocation is not None:
        check_revoked(auth, peer, revocation)
    return peer


def check_revoked(auth: dict, peer: PeerIdentity, revocation: RevocationList) -> None:
    pems = auth.get("x509_pem_cert") or []
    if not pems:
        raise RevokedCertificate("the peer's certificate is not available to check against "
                                 "the revocation list")
    serial = _serial_of(pems[0])
    if revocation.revoked(serial):
        raise RevokedCertificate(f"the certificate of {peer} (serial {serial:x}) is revoked by "
                                 "the federation's CA")


def site_mismatch(peer: PeerIdentity | None, site_id: str) -> str | None:
    """Why a message of ``site_id`` may not arrive over ``peer``'s connection, or None.
    ``peer`` None means a plaintext server (``insecure``): nothing to bind."""
    if peer is None or (peer.kind == SITE and peer.party_id == site_id):
        return None
    return f"message of site {site_id!r} sent over the TLS connection of {peer}"


def coordinator_mismatch(peer: PeerIdentity | None, coordinator_id: str) -> str | None:
    if peer is None or (peer.kind == COORDINATOR and peer.party_id == coordinator_id):
        return None
    return f"round spec of coordinator {coordinator_id!r} sent over the TLS connection of {peer}"


# Who may call the read-only RPCs. A round's status and result and the site list name the
# federation's members, their n, who refused and why (docs/security.md: visible to the
# aggregator and the coordinators, not to other sites). The site node never calls them (it
# learns rounds from its Subscribe stream and the outcome from its coordinator), so sites get
# none; the aggregator's own certificate is not a client. Coordinators read everything.
READERS = {"GetRound": {COORDINATOR}, "GetResult": {COORDINATOR}, "ListSites": {COORDINATOR},
           "ListRounds": {COORDINATOR}, "GetSiteSpending": {COORDINATOR}}


def read_denied(peer: PeerIdentity | None, rpc: str) -> str | None:
    """Why ``peer`` may not call the read-only ``rpc``, or None. ``peer`` None means a
    plaintext server (``insecure``): no certificate, nothing to check."""
    if peer is None or peer.kind in READERS[rpc]:
        return None
    return (f"{rpc} is for coordinators: {peer} may not read round status, results or the "
            f"site list (they name the other sites)")
