"""The federation's certificate authority: its key and certificate, issuing party certificates,
signing the revocation list; and files with owner-only permissions.

TLS keys and the CA are ECDSA P-256: every TLS stack (gRPC's BoringSSL included) accepts it for
certificates and handshakes. Ed25519 stays for payload signatures (dpfed.wire.signing): the
signature on a release outlives the connection that carried it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dpfed.identity import AGGREGATOR, identity_uri, now_utc
from dpfed_apps.ca.project import CA_DAYS, ProvisionError

BACKDATE = dt.timedelta(minutes=5)  # tolerate small clock differences between parties
CRL_NEXT_UPDATE_DAYS = 30


# ---------------------------------------------------------------------------------------------
# files with owner-only permissions


def make_private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 from the start (no window where it is world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)


def private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


# ---------------------------------------------------------------------------------------------
# the certificate authority


@dataclass(frozen=True)
class _PublicOnly:
    """Stands in for a key pair in ``issue_for_key``: only the public half is ever needed."""
    key: object

    def public_key(self):
        return self.key


@dataclass(frozen=True)
class CertificateAuthority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def federation(self) -> str:
        return self.cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value

    @classmethod
    def create(cls, federation: str) -> "CertificateAuthority":
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, federation),
                          x509.NameAttribute(NameOID.COMMON_NAME, f"{federation} dpfed CA")])
        now = now_utc()
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (x509.CertificateBuilder()
                .subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - BACKDATE).not_valid_after(now + dt.timedelta(days=CA_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, key_cert_sign=True,
                                             crl_sign=True, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(ski, critical=False)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    def save(self, folder: Path) -> None:
        make_private_dir(folder)
        write_private(folder / "ca.key", private_pem(self.key))
        (folder / "ca.pem").write_bytes(cert_pem(self.cert))

    @classmethod
    def load(cls, folder: Path) -> "CertificateAuthority":
        key_path, cert_path = folder / "ca.key", folder / "ca.pem"
        if not key_path.exists() or not cert_path.exists():
            raise ProvisionError(f"{folder}: the CA is incomplete (need ca.key and ca.pem); "
                                 "restore it from backup rather than making a new one, or every "
                                 "issued certificate stops working")
        mode = stat.S_IMODE(key_path.stat().st_mode)
        if mode & 0o077:
            raise ProvisionError(f"{key_path} is readable by others (mode {mode:o}); "
                                 f"run `chmod 600 {key_path}` and check who copied it")
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        if not isinstance(key, ec.EllipticCurvePrivateKey) or (
                key.public_key().public_numbers() != cert.public_key().public_numbers()):
            raise ProvisionError(f"{folder}: ca.key does not belong to ca.pem")
        return cls(key, cert)

    def issue(self, kind: str, party_id: str, *, days: int, dns_names=(), ip_addresses=()):
        """A TLS key and certificate for one party; returns (key PEM, certificate PEM).
        The central (demo) path: the CA generates the key. In production the party makes its
        own key and a certificate request (``make_request``), and ``issue_for_key`` signs it."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = self.issue_for_key(kind, party_id, key.public_key(), days=days,
                                  dns_names=dns_names, ip_addresses=ip_addresses)
        return private_pem(key), cert

    def issue_for_key(self, kind: str, party_id: str, public_key, *, days: int, dns_names=(),
                      ip_addresses=()) -> bytes:
        """The certificate (PEM) of ``public_key`` (an ECDSA P-256 public key) for one party."""
        if not isinstance(public_key, ec.EllipticCurvePublicKey) or \
                not isinstance(public_key.curve, ec.SECP256R1):
            raise ProvisionError("the TLS key must be ECDSA P-256 (what `dpfed csr` makes)")
        key = _PublicOnly(public_key)
        uri = identity_uri(kind, party_id)
        names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri)]
        names += [x509.DNSName(h) for h in dns_names]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        # The aggregator is the only server; sites and coordinators only dial out.
        usage = ExtendedKeyUsageOID.SERVER_AUTH if kind == AGGREGATOR else ExtendedKeyUsageOID.CLIENT_AUTH
        now = now_utc()
        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, self.federation),
                             x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, kind),
                             x509.NameAttribute(NameOID.COMMON_NAME, party_id)])
        cert = (x509.CertificateBuilder()
                .subject_name(subject).issuer_name(self.cert.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - BACKDATE).not_valid_after(now + dt.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, key_cert_sign=False,
                                             crl_sign=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                               critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    self.key.public_key()), critical=False)
                .sign(self.key, hashes.SHA256()))
        return cert_pem(cert)


def write_crl(ca: CertificateAuthority, path: Path,
              revoked: dict[int, dt.datetime]) -> x509.CertificateRevocationList:
    """An X.509 CRL signed by the CA listing ``revoked`` (serial -> revocation time). The
    aggregator reads it with dpfed.identity.load_crl."""
    now = now_utc()
    builder = (x509.CertificateRevocationListBuilder()
               .issuer_name(ca.cert.subject)
               .last_update(now - BACKDATE)
               .next_update(now + dt.timedelta(days=CRL_NEXT_UPDATE_DAYS)))
    for serial, when in sorted(revoked.items()):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when).build())
    crl = builder.sign(ca.key, hashes.SHA256())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
    os.replace(tmp, path)
    return crl
