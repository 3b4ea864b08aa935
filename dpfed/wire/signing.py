"""Ed25519 signatures over canonical payloads, key identifiers and key files.

The signed message is ``b"dpfed.v1\\x00" + payload_type + b"\\x00" + payload``: the domain
prefix stops a signature made for one payload type (say a Refusal) from being replayed as
another (say a Contribution) with the same bytes.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from google.protobuf.message import Message

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import canonical_bytes, parse_canonical, payload_type

_DOMAIN = b"dpfed.v1\x00"


class SignatureError(ValueError):
    """An envelope whose signature does not verify, or whose signer is not trusted."""


def key_id(public_key: Ed25519PublicKey) -> str:
    """First 16 bytes (hex) of SHA-256 of the raw 32-byte public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:32]


def _signed_bytes(type_name: str, payload: bytes) -> bytes:
    return _DOMAIN + type_name.encode("ascii") + b"\x00" + payload


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 private key with its identifier."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> "SigningKey":
        return cls(Ed25519PrivateKey.generate())

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.private_key.public_key()

    @property
    def key_id(self) -> str:
        return key_id(self.public_key)

    def sign(self, message: Message) -> pb.SignedEnvelope:
        type_name = payload_type(message)
        payload = canonical_bytes(message)
        signature = self.private_key.sign(_signed_bytes(type_name, payload))
        return pb.SignedEnvelope(payload=payload, signature=signature, key_id=self.key_id,
                                 payload_type=type_name)

    def sign_detached(self, type_name: str, data: bytes) -> bytes:
        """The signature of ``data`` as a ``type_name`` (same domain prefix as ``sign``) for
        bytes that are not a dpfed.v1 payload, e.g. an audit log's head (dpfed.audit). A
        ``type_name`` outside dpfed.v1's payload types keeps such a signature from ever
        verifying as an envelope's: ``verify`` checks the envelope's type first."""
        return self.private_key.sign(_signed_bytes(type_name, data))

    # Key files: PKCS#8 PEM private key (owner-only permissions), SubjectPublicKeyInfo PEM public key.
    def save(self, private_path: str | Path, public_path: str | Path | None = None) -> None:
        private_path = Path(private_path)
        pem = self.private_key.private_bytes(serialization.Encoding.PEM,
                                             serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption())
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        os.chmod(private_path, 0o600)
        if public_path is not None:
            Path(public_path).write_bytes(public_key_pem(self.public_key))

    @classmethod
    def load(cls, private_path: str | Path) -> "SigningKey":
        key = serialization.load_pem_private_key(Path(private_path).read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise SignatureError(f"{private_path} is not an Ed25519 private key")
        return cls(key)


def public_key_pem(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.PEM,
                                   serialization.PublicFormat.SubjectPublicKeyInfo)


def load_public_key(path_or_pem: str | Path | bytes) -> Ed25519PublicKey:
    data = path_or_pem if isinstance(path_or_pem, bytes) else Path(path_or_pem).read_bytes()
    key = serialization.load_pem_public_key(data)
    if not isinstance(key, Ed25519PublicKey):
        raise SignatureError("not an Ed25519 public key")
    return key


def verify(envelope: pb.SignedEnvelope, trusted: dict[str, Ed25519PublicKey],
           expected_type: str) -> Message:
    """Verify ``envelope`` against ``trusted`` (key id -> public key) and return the parsed
    payload. Raises SignatureError for an unknown key, a wrong payload type or a bad signature,
    and CanonicalError for a malformed payload. The bytes are verified before they are parsed."""
    if envelope.payload_type != expected_type:
        raise SignatureError(f"expected a {expected_type}, got {envelope.payload_type or 'nothing'}")
    public_key = trusted.get(envelope.key_id)
    if public_key is None:
        raise SignatureError(f"unknown signing key {envelope.key_id[:16] or '(none)'}")
    verify_signature(envelope, public_key, expected_type)
    return parse_canonical(envelope.payload, expected_type)


def verify_detached(public_key: Ed25519PublicKey, type_name: str, data: bytes,
                    signature: bytes) -> None:
    """Check a ``SigningKey.sign_detached`` signature; raises SignatureError otherwise."""
    try:
        public_key.verify(signature, _signed_bytes(type_name, data))
    except InvalidSignature:
        raise SignatureError(f"bad signature on {type_name}") from None


def verify_signature(envelope: pb.SignedEnvelope, public_key: Ed25519PublicKey,
                     type_name: str) -> None:
    """Check only that ``public_key`` signed ``envelope.payload`` as a ``type_name`` (domain
    prefix included); raises SignatureError otherwise. For callers that look the key up and
    parse the payload themselves (the aggregator's contribution hot path); ``verify`` is
    this plus the key lookup, the type check and the canonical parse."""
    try:
        public_key.verify(envelope.signature, _signed_bytes(type_name, envelope.payload))
    except InvalidSignature:
        raise SignatureError(f"bad signature on {type_name} from key {envelope.key_id[:16]}") from None
