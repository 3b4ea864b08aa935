"""Per-round key pairs, pairwise key agreement and identity signatures (Bonawitz et al., CCS 2017).

Each site generates, for every round, two fresh X25519 key pairs (Bonawitz et al., section 4,
"AdvertiseKeys": (c_u^PK, c_u^SK) and (s_u^PK, s_u^SK)):

- the **c-key** agrees the symmetric keys that encrypt the Shamir shares a site sends to each
  neighbour through the aggregator (``share_key``; directed, so u->v and v->u differ);
- the **s-key** agrees the pairwise mask seeds s_uv = s_vu (``mask_seed``; symmetric).

The two public keys are advertised in a message signed with the site's long-term Ed25519
identity key (``messages.KeyAdvertisement``): the signature is what stops the aggregator, which
relays every key, from substituting its own keys and reading the shares (the "malicious server"
variant of Bonawitz et al., section 6.2, signs the advertised keys the same way).

Key agreement is X25519 (RFC 7748) followed by HKDF-SHA256 (RFC 5869) with no salt and the info
string DOMAIN || purpose || round id || configuration digest || first id || second id
(length-prefixed, ``codec.Writer``): distinct keys for distinct purposes, rounds, configurations
and pairs, so a key never serves twice. X25519 rejects low-order peer keys (an all-zero shared
secret); this surfaces as ``ForgedMessage``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from dpfed.secagg.codec import Writer
from dpfed.secagg.errors import ForgedMessage, MalformedMessage

__all__ = ["DOMAIN", "RoundKeys", "public_bytes", "private_bytes", "private_from_bytes",
           "agree", "mask_seed", "share_key", "sign", "verify", "identity_private_key"]

#: Domain separation prefix of everything this package signs, hashes or derives.
DOMAIN = b"dpfed.secagg.v1\x00"
KEY_BYTES = 32


def public_bytes(key) -> bytes:
    """Raw 32 bytes of an X25519 public key (or of the public half of a private key)."""
    if isinstance(key, X25519PrivateKey):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def private_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())


def private_from_bytes(raw: bytes) -> X25519PrivateKey:
    if len(raw) != KEY_BYTES:
        raise MalformedMessage("an X25519 private key is 32 bytes")
    return X25519PrivateKey.from_private_bytes(raw)


@dataclass(frozen=True)
class RoundKeys:
    """One site's two per-round X25519 key pairs (never reused across rounds)."""

    c_private: X25519PrivateKey
    s_private: X25519PrivateKey

    @classmethod
    def generate(cls) -> "RoundKeys":
        return cls(X25519PrivateKey.generate(), X25519PrivateKey.generate())

    @property
    def c_public(self) -> bytes:
        return public_bytes(self.c_private)

    @property
    def s_public(self) -> bytes:
        return public_bytes(self.s_private)


def agree(private: X25519PrivateKey, peer_public: bytes, *, purpose: bytes, round_id: str,
          config_digest: bytes, first: str, second: str) -> bytes:
    """32 bytes: HKDF-SHA256(X25519(private, peer_public), info = DOMAIN, purpose, round id,
    configuration digest, first, second). Raises ForgedMessage for a low-order peer key."""
    if len(peer_public) != KEY_BYTES:
        raise MalformedMessage("an X25519 public key is 32 bytes")
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
    except ValueError:
        raise ForgedMessage("X25519 agreement with a low-order public key") from None
    info = (Writer().fixed(DOMAIN, len(DOMAIN)).blob(purpose).text(round_id)
            .blob(config_digest).text(first).text(second).getvalue())
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def mask_seed(s_private: X25519PrivateKey, peer_s_public: bytes, *, round_id: str,
              config_digest: bytes, me: str, other: str) -> bytes:
    """The pairwise mask seed s_uv (= s_vu): the pair enters the KDF in sorted order."""
    first, second = sorted((me, other))
    return agree(s_private, peer_s_public, purpose=b"pairwise-mask", round_id=round_id,
                 config_digest=config_digest, first=first, second=second)


def share_key(c_private: X25519PrivateKey, peer_c_public: bytes, *, round_id: str,
              config_digest: bytes, sender: str, recipient: str) -> bytes:
    """The ChaCha20-Poly1305 key of the shares ``sender`` encrypts for ``recipient`` (directed:
    the reverse direction gets another key)."""
    return agree(c_private, peer_c_public, purpose=b"share-encryption", round_id=round_id,
                 config_digest=config_digest, first=sender, second=recipient)


def identity_private_key(identity) -> Ed25519PrivateKey:
    """An Ed25519 private key from a ``dpfed.wire.signing.SigningKey`` or the key itself."""
    key = getattr(identity, "private_key", identity)
    if not isinstance(key, Ed25519PrivateKey):
        raise TypeError("an identity must be a SigningKey or an Ed25519PrivateKey")
    return key


def sign(identity, data: bytes) -> bytes:
    """Ed25519 signature of DOMAIN || data with a site's (or the aggregator's) identity key."""
    return identity_private_key(identity).sign(DOMAIN + data)


def verify(public_key: Ed25519PublicKey, signature: bytes, data: bytes) -> None:
    """Raises ForgedMessage unless ``signature`` is ``public_key``'s over DOMAIN || data."""
    try:
        public_key.verify(bytes(signature), DOMAIN + data)
    except InvalidSignature:
        raise ForgedMessage("signature does not verify") from None
