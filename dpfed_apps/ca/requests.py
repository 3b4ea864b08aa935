"""Certificate requests: the party makes its own keys, the CA signs (the production path).

``dpfed csr`` runs ``make_request`` at the party; the CA reads what it receives with
``load_request`` and signs it (``dpfed provision --csr``, ``dpfed provision renew --csr``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dpfed.identity import AGGREGATOR, KINDS, identity_uri, parse_identity_uri
from dpfed.wire.signing import SigningKey, load_public_key, public_key_pem
from dpfed_apps.ca.authority import make_private_dir, private_pem, write_private
from dpfed_apps.ca.project import ProvisionError, party_name

CSR_SUFFIX = ".csr"


@dataclass(frozen=True)
class Request:
    """A party's certificate request as the CA receives it: the X.509 CSR (signed with the
    party's TLS key, naming its dpfed identity) and the public half of its Ed25519 signing key.
    Neither private key is in it."""

    kind: str
    party_id: str
    csr: x509.CertificateSigningRequest
    signing_public_pem: bytes

    @property
    def tls_public_key(self):
        return self.csr.public_key()


def make_request(kind: str, party_id: str, folder: str | Path, *, force: bool = False) -> dict:
    """At the party: its TLS key (ECDSA P-256) and Ed25519 signing key, made here and never sent,
    plus the request to send to the CA. Writes, in ``folder`` (a kit-shaped folder):

        tls/<id>.key            TLS private key (0600)          stays here
        keys/<id>.key, .pub     Ed25519 signing key (0600), public half (the aggregator's
                                signs its secure-aggregation messages)
        request/<id>.csr        X.509 CSR naming dpfed://<kind>/<id>   send to the CA
        request/<id>.pub        the signing key's public half           send to the CA
    """
    if kind not in KINDS:
        raise ProvisionError(f"kind must be one of {', '.join(KINDS)}")
    party_id = AGGREGATOR if kind == AGGREGATOR else party_name(party_id, f"{kind} id")
    folder = Path(folder)
    tls_key_path = folder / "tls" / f"{party_id}.key"
    sign_key_path = folder / "keys" / f"{party_id}.key"
    for path in (tls_key_path, sign_key_path):
        if path.exists() and not force:
            raise ProvisionError(f"{path} exists: a request for the key already there is "
                                 "`dpfed csr ... --reuse-key`; --force makes new keys")
    make_private_dir(folder)
    for sub in ("tls", "keys", "request"):
        make_private_dir(folder / sub)
    key = ec.generate_private_key(ec.SECP256R1())
    write_private(tls_key_path, private_pem(key))
    csr_path = write_csr(kind, party_id, key, folder / "request")
    signing = SigningKey.generate()
    signing.save(sign_key_path, folder / "keys" / f"{party_id}.pub")
    pub = folder / "request" / f"{party_id}.pub"
    pub.write_bytes(public_key_pem(signing.public_key))
    return {"tls_key": tls_key_path, "signing_key": sign_key_path, "csr": csr_path, "pub": pub}


def write_csr(kind: str, party_id: str, key, folder: Path) -> Path:
    """``folder/<id>.csr``: a CSR for ``key`` (a private key: the CSR is signed with it, which
    proves to the CA that the requester holds it) naming dpfed://<kind>/<id>."""
    uri = identity_uri(kind, party_id)
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, kind),
                                    x509.NameAttribute(NameOID.COMMON_NAME, party_id)]))
           .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]),
                          critical=False)
           .sign(key, hashes.SHA256()))
    path = folder / f"{party_id}{CSR_SUFFIX}"
    path.write_bytes(csr.public_bytes(serialization.Encoding.PEM))
    return path


def request_for_existing_key(kind: str, party_id: str, tls_key_path: str | Path,
                             folder: str | Path) -> Path:
    """A CSR for a TLS key the party already has (renewing the certificate of the same key)."""
    key = serialization.load_pem_private_key(Path(tls_key_path).read_bytes(), password=None)
    make_private_dir(Path(folder))
    return write_csr(kind, AGGREGATOR if kind == AGGREGATOR else party_id, key, Path(folder))


def load_request(csr_path: str | Path, pub_path: str | Path | None = None,
                 *, need_pub: bool = True) -> Request:
    """Read and check a request: the CSR's signature (proof that the requester holds the key),
    exactly one dpfed identity, an ECDSA P-256 key; and the Ed25519 public key next to it
    (``<id>.pub``, or ``pub_path``)."""
    csr_path = Path(csr_path)
    try:
        csr = x509.load_pem_x509_csr(csr_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ProvisionError(f"{csr_path}: not a PEM certificate request ({exc})") from None
    if not csr.is_signature_valid:
        raise ProvisionError(f"{csr_path}: the request's signature does not verify (it was not "
                             "signed with the key it asks a certificate for)")
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        found = [parse_identity_uri(u) for u in san.get_values_for_type(x509.UniformResourceIdentifier)]
    except x509.ExtensionNotFound:
        found = []
    found = [f for f in found if f is not None]
    if len(found) != 1:
        raise ProvisionError(f"{csr_path}: the request must name exactly one dpfed identity "
                             f"(dpfed://site/<id>, ...), it names {len(found)}")
    kind, party_id = found[0]
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ProvisionError(f"{csr_path}: the TLS key must be ECDSA P-256")
    pub = b""
    if need_pub:
        pub_path = Path(pub_path) if pub_path else csr_path.with_name(f"{party_id}.pub")
        try:
            pub = pub_path.read_bytes()
            load_public_key(pub)
        except (OSError, ValueError) as exc:
            raise ProvisionError(f"{pub_path}: the signing key's public half is missing or "
                                 f"unreadable ({exc}); send it with the request") from None
    return Request(kind, party_id, csr, pub)
