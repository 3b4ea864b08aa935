"""Who is on the other end of a gRPC call: the dpfed identity of the peer's TLS certificate.

With mutual TLS every client presents a certificate signed by the federation's CA naming one
identity as a SAN URI (dpfed.provision): ``dpfed://site/<id>`` or ``dpfed://coordinator/<id>``.
The round manager binds it to the signing key's registered owner, so a request must carry both
the right key and the right certificate: a site holding another site's signing key (or a
coordinator's) still cannot speak for it over its own connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from dpfed.provision import COORDINATOR, SITE, identity_uri, parse_identity_uri


class NoPeerIdentity(Exception):
    """A TLS peer whose certificate names no (or more than one) dpfed identity."""


@dataclass(frozen=True)
class PeerIdentity:
    kind: str        # "site", "coordinator" or "aggregator"
    party_id: str

    def __str__(self) -> str:
        return identity_uri(self.kind, self.party_id)


@lru_cache(maxsize=1024)
def _from_pem(pem: bytes) -> tuple[tuple[str, str], ...]:
    from cryptography import x509

    from dpfed.provision import identities_of
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


def peer_identity(context) -> PeerIdentity | None:
    """The identity of the peer of a servicer call (see identity_from_auth_context)."""
    return identity_from_auth_context(context.auth_context())


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
READERS = {"GetRound": {COORDINATOR}, "GetResult": {COORDINATOR}, "ListSites": {COORDINATOR}}


def read_denied(peer: PeerIdentity | None, rpc: str) -> str | None:
    """Why ``peer`` may not call the read-only ``rpc``, or None. ``peer`` None means a
    plaintext server (``insecure``): no certificate, nothing to check."""
    if peer is None or peer.kind in READERS[rpc]:
        return None
    return (f"{rpc} is for coordinators: {peer} may not read round status, results or the "
            f"site list (they name the other sites)")
