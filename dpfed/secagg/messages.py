"""The protocol's messages: frozen dataclasses with one canonical byte encoding each.

Every message (``to_bytes``/``from_bytes``, ``parse``) is framed as

    MAGIC "DSA1" | u8 type | u8 phase | text round_id | 32-byte config digest | text sender |
    <type-specific fields> | blob signature

and the signature (Ed25519, ``keys.sign``) covers DOMAIN || everything before the signature blob.
So each signed message binds the round id, the round configuration (``protocol.RoundConfig``
digest: site list, thresholds, vector length), the phase, the message type and the sender:
a message cannot be replayed into another round or configuration, another phase, or under
another name. Messages that sites send are always signed with their identity key; messages the
aggregator sends (its sender is ``AGGREGATOR`` = "") carry a signature when the aggregator has an
identity key (``protocol.AggregatorSession(signing_key=...)``) and an empty one otherwise (the
transport's signed envelope or TLS then authenticates it). Sites check what matters inside the
aggregator's messages independently: site signatures on relayed keys, authenticated encryption
on relayed shares.

Types and phases (Bonawitz et al., CCS 2017, Figure 4, rounds 0-4):

| type | from -> to | phase | content |
|---|---|---|---|
| ``KeyAdvertisement`` | site -> agg | 0 ADVERTISE | c and s public keys, commitment to b_u |
| ``AdvertisementBundle`` | agg -> site | 1 SHARE_KEYS | the adverts of the site's holders |
| ``ShareKeys`` | site -> agg | 1 SHARE_KEYS | one ``EncryptedShare`` per neighbour |
| ``ShareDelivery`` | agg -> site | 2 MASKED_INPUT | the shares addressed to the site |
| ``MaskedInput`` | site -> agg | 2 MASKED_INPUT | y_u (uint64 little-endian) and its ``MaskAttestation`` |
| ``MaskAttestation`` | (inside ``MaskedInput``) | 2 MASKED_INPUT | the sites u masked with (signed) |
| ``SurvivorList`` | agg -> site | 3 CONSISTENCY | U3: every site whose masked input is in the sum |
| ``SurvivorSignature`` | site -> agg | 3 CONSISTENCY | the site's signature on the digest of U3 |
| ``SurvivorCertificate`` | (inside ``UnmaskRequest``) | 4 UNMASK | U3 and a quorum's signatures on it |
| ``UnmaskRequest`` | agg -> site | 4 UNMASK | the certificate, the holders' signatures and attestations |
| ``UnmaskResponse`` | site -> agg | 4 UNMASK | b-shares of survivors, s-key shares of dropouts |

Phases 3-4 are Bonawitz et al.'s ConsistencyCheck and Unmasking (section 4, active adversary),
with the counts a site relies on computed from signed lists (docs/secure_aggregation.md,
"A lying aggregator").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import ClassVar

import numpy as np

from dpfed.secagg.codec import MAX_ID_BYTES, Reader, Writer
from dpfed.secagg.errors import MalformedMessage
from dpfed.secagg.keys import DOMAIN, sign, verify
from dpfed.secagg.shamir import Share

__all__ = ["Phase", "AGGREGATOR", "MAGIC", "Message", "KeyAdvertisement",
           "AdvertisementBundle", "EncryptedShare", "ShareKeys", "ShareDelivery", "MaskedInput",
           "UnmaskRequest", "UnmaskResponse", "parse", "MESSAGE_TYPES", "SharePlaintext",
           "MaskAttestation", "SurvivorList", "SurvivorSignature", "SurvivorCertificate",
           "survivors_digest"]

MAGIC = b"DSA2"     # DSA2: consistency phase, attestations (issue 19)
AGGREGATOR = ""
DIGEST_BYTES = 32
KEY_BYTES = 32
NONCE_BYTES = 12
SIGNATURE_BYTES = 64
MAX_ITEMS = 1 << 20
MAX_CIPHERTEXT = 1024
MAX_VECTOR_BYTES = 8 * (1 << 28)
MAX_LIST_BYTES = 1 << 26


class Phase(IntEnum):
    ADVERTISE = 0
    SHARE_KEYS = 1
    MASKED_INPUT = 2
    CONSISTENCY = 3
    UNMASK = 4
    DONE = 5
    FAILED = 6


@dataclass(frozen=True, kw_only=True)
class Message:
    """Fields every message has; subclasses add theirs and define TYPE, PHASE."""

    round_id: str
    config_digest: bytes
    sender: str
    signature: bytes = b""

    TYPE: ClassVar[int] = 0
    PHASE: ClassVar[Phase] = Phase.ADVERTISE
    FROM_SITE: ClassVar[bool] = True

    # --- encoding
    def _write_body(self, w: Writer) -> None:
        raise NotImplementedError

    @classmethod
    def _read_body(cls, r: Reader) -> dict:
        raise NotImplementedError

    @classmethod
    def _complete(cls, head: dict, body: dict) -> dict:
        """The constructor's fields from what ``_read_body`` read (most messages: as read)."""
        return body

    def signed_bytes(self) -> bytes:
        """The bytes the signature covers (everything but the signature itself). Cached: every
        field is immutable, and ``dataclasses.replace`` makes a new instance."""
        cached = self.__dict__.get("_signed_bytes")
        if cached is None:
            w = Writer().fixed(MAGIC, 4).u8(self.TYPE).u8(int(self.PHASE))
            w.text(self.round_id).fixed(self.config_digest, DIGEST_BYTES).text(self.sender)
            self._write_body(w)
            cached = w.getvalue()
            object.__setattr__(self, "_signed_bytes", cached)
        return cached

    def to_bytes(self) -> bytes:
        return self.signed_bytes() + Writer().blob(self.signature).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Message":
        msg = parse(data)
        if not isinstance(msg, cls):
            raise MalformedMessage(f"expected a {cls.__name__}, got a {type(msg).__name__}")
        return msg

    # --- signatures
    def signed_by(self, identity) -> "Message":
        """A copy signed with ``identity`` (SigningKey or Ed25519PrivateKey)."""
        return replace(self, signature=sign(identity, self.signed_bytes()))

    def verify(self, public_key) -> None:
        """Raises ForgedMessage unless signed by ``public_key``."""
        verify(public_key, self.signature, self.signed_bytes())

    def __post_init__(self):
        if not isinstance(self.round_id, str) or not self.round_id:
            raise MalformedMessage("round_id must be a non-empty string")
        if len(self.round_id.encode("utf-8")) > MAX_ID_BYTES:
            raise MalformedMessage("round_id too long")
        if not isinstance(self.config_digest, bytes) or len(self.config_digest) != DIGEST_BYTES:
            raise MalformedMessage("config_digest must be 32 bytes")
        if not isinstance(self.sender, str) or len(self.sender.encode("utf-8")) > MAX_ID_BYTES:
            raise MalformedMessage("sender must be a short string")
        if self.FROM_SITE and not self.sender:
            raise MalformedMessage("a site message needs a sender")
        if not self.FROM_SITE and self.sender != AGGREGATOR:
            raise MalformedMessage("an aggregator message has the empty sender")
        if not isinstance(self.signature, bytes) or len(self.signature) not in (0, SIGNATURE_BYTES):
            raise MalformedMessage("a signature is empty or 64 bytes")


def _check_bytes(value, n, name):
    if not isinstance(value, bytes) or len(value) != n:
        raise MalformedMessage(f"{name} must be {n} bytes")


def _check_ids(ids, name):
    if not isinstance(ids, tuple) or not all(isinstance(s, str) and s for s in ids):
        raise MalformedMessage(f"{name} must be a tuple of non-empty strings")
    if list(ids) != sorted(set(ids)):
        raise MalformedMessage(f"{name} must be sorted and without duplicates")


def _write_ids(w: Writer, ids) -> None:
    w.u32(len(ids))
    for s in ids:
        w.text(s)


def _read_ids(r: Reader) -> tuple[str, ...]:
    n = r.u32()
    if n > MAX_ITEMS:
        raise MalformedMessage("too many ids")
    return tuple(r.text() for _ in range(n))


@dataclass(frozen=True, kw_only=True)
class KeyAdvertisement(Message):
    """Round 0 (AdvertiseKeys): a site's two per-round X25519 public keys and its commitment to
    its self-mask seed b_u, signed with its identity key."""

    c_public: bytes
    s_public: bytes
    self_commitment: bytes

    TYPE: ClassVar[int] = 1
    PHASE: ClassVar[Phase] = Phase.ADVERTISE

    def __post_init__(self):
        super().__post_init__()
        _check_bytes(self.c_public, KEY_BYTES, "c_public")
        _check_bytes(self.s_public, KEY_BYTES, "s_public")
        _check_bytes(self.self_commitment, DIGEST_BYTES, "self_commitment")

    def _write_body(self, w):
        w.fixed(self.c_public, KEY_BYTES).fixed(self.s_public, KEY_BYTES)
        w.fixed(self.self_commitment, DIGEST_BYTES)

    @classmethod
    def _read_body(cls, r):
        return {"c_public": r.fixed(KEY_BYTES), "s_public": r.fixed(KEY_BYTES),
                "self_commitment": r.fixed(DIGEST_BYTES)}


@dataclass(frozen=True, kw_only=True)
class AdvertisementBundle(Message):
    """Aggregator -> one site: the (site-signed) advertisements of the site's holders that
    advertised, the site's own included, sorted by sender."""

    recipient: str
    adverts: tuple[KeyAdvertisement, ...]

    TYPE: ClassVar[int] = 2
    PHASE: ClassVar[Phase] = Phase.SHARE_KEYS
    FROM_SITE: ClassVar[bool] = False

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.recipient, str) or not self.recipient:
            raise MalformedMessage("recipient must be a non-empty string")
        if not isinstance(self.adverts, tuple) or not all(
                isinstance(a, KeyAdvertisement) for a in self.adverts):
            raise MalformedMessage("adverts must be a tuple of KeyAdvertisement")

    def _write_body(self, w):
        w.text(self.recipient).u32(len(self.adverts))
        for a in self.adverts:
            w.blob(a.to_bytes())

    @classmethod
    def _read_body(cls, r):
        recipient = r.text()
        n = r.u32()
        if n > MAX_ITEMS:
            raise MalformedMessage("too many adverts")
        adverts = tuple(KeyAdvertisement.from_bytes(r.blob(4096)) for _ in range(n))
        return {"recipient": recipient, "adverts": adverts}


@dataclass(frozen=True)
class SharePlaintext:
    """What an ``EncryptedShare`` encrypts: the sender's shares (for this recipient) of its
    s-key secret and of its self-mask seed b_u."""

    sender: str
    recipient: str
    key_share: Share
    seed_share: Share

    def to_bytes(self) -> bytes:
        return (Writer().text(self.sender).text(self.recipient)
                .fixed(self.key_share.to_bytes(), Share.ENCODED_BYTES)
                .fixed(self.seed_share.to_bytes(), Share.ENCODED_BYTES).getvalue())

    @classmethod
    def from_bytes(cls, data: bytes) -> "SharePlaintext":
        r = Reader(data)
        out = cls(r.text(), r.text(), Share.read(r), Share.read(r))
        r.done()
        return out


@dataclass(frozen=True)
class EncryptedShare:
    """ChaCha20-Poly1305(key = keys.share_key(sender -> recipient), nonce, SharePlaintext,
    AAD = protocol.share_aad(...)): opaque to the aggregator, which only relays it."""

    sender: str
    recipient: str
    nonce: bytes
    ciphertext: bytes

    def __post_init__(self):
        for name in ("sender", "recipient"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v or len(v.encode("utf-8")) > MAX_ID_BYTES:
                raise MalformedMessage(f"{name} must be a short non-empty string")
        _check_bytes(self.nonce, NONCE_BYTES, "nonce")
        ct = self.ciphertext
        if not isinstance(ct, bytes) or not 16 <= len(ct) <= MAX_CIPHERTEXT:
            raise MalformedMessage("ciphertext length out of range")

    def write(self, w: Writer) -> None:
        w.text(self.sender).text(self.recipient).fixed(self.nonce, NONCE_BYTES)
        w.blob(self.ciphertext)

    @classmethod
    def read(cls, r: Reader) -> "EncryptedShare":
        return cls(r.text(), r.text(), r.fixed(NONCE_BYTES), r.blob(MAX_CIPHERTEXT))


def _write_shares(w: Writer, shares) -> None:
    w.u32(len(shares))
    for s in shares:
        s.write(w)


def _read_shares(r: Reader) -> tuple[EncryptedShare, ...]:
    n = r.u32()
    if n > MAX_ITEMS:
        raise MalformedMessage("too many shares")
    return tuple(EncryptedShare.read(r) for _ in range(n))


def _check_shares(shares):
    if not isinstance(shares, tuple) or not all(isinstance(s, EncryptedShare) for s in shares):
        raise MalformedMessage("shares must be a tuple of EncryptedShare")


@dataclass(frozen=True, kw_only=True)
class ShareKeys(Message):
    """Round 1 (ShareKeys): the sender's encrypted shares, one per neighbour, sorted by
    recipient."""

    shares: tuple[EncryptedShare, ...]

    TYPE: ClassVar[int] = 3
    PHASE: ClassVar[Phase] = Phase.SHARE_KEYS

    def __post_init__(self):
        super().__post_init__()
        _check_shares(self.shares)

    def _write_body(self, w):
        _write_shares(w, self.shares)

    @classmethod
    def _read_body(cls, r):
        return {"shares": _read_shares(r)}


@dataclass(frozen=True, kw_only=True)
class ShareDelivery(Message):
    """Aggregator -> one site: the encrypted shares addressed to it by the sites that completed
    round 1 (sorted by sender)."""

    recipient: str
    shares: tuple[EncryptedShare, ...]

    TYPE: ClassVar[int] = 4
    PHASE: ClassVar[Phase] = Phase.MASKED_INPUT
    FROM_SITE: ClassVar[bool] = False

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.recipient, str) or not self.recipient:
            raise MalformedMessage("recipient must be a non-empty string")
        _check_shares(self.shares)

    def _write_body(self, w):
        w.text(self.recipient)
        _write_shares(w, self.shares)

    @classmethod
    def _read_body(cls, r):
        return {"recipient": r.text(), "shares": _read_shares(r)}


@dataclass(frozen=True, kw_only=True)
class MaskAttestation(Message):
    """Round 2, inside the ``MaskedInput``: the sorted ids of the neighbours whose shares the
    sender received and whose pairwise masks its input carries. Signed on its own, so the
    aggregator can show it to the sender's holders without the (large) masked vector: a holder
    reveals the sender's self-mask share only if every surviving neighbour is in this list
    (``protocol.SiteSession.unmask``)."""

    masked_with: tuple[str, ...]

    TYPE: ClassVar[int] = 8
    PHASE: ClassVar[Phase] = Phase.MASKED_INPUT

    def __post_init__(self):
        super().__post_init__()
        _check_ids(self.masked_with, "masked_with")

    def _write_body(self, w):
        _write_ids(w, self.masked_with)

    @classmethod
    def _read_body(cls, r):
        return {"masked_with": _read_ids(r)}


@dataclass(frozen=True, kw_only=True)
class MaskedInput(Message):
    """Round 2 (MaskedInputCollection): y_u as little-endian uint64 bytes, and the sender's
    signed ``MaskAttestation``."""

    vector: bytes
    attestation: MaskAttestation

    TYPE: ClassVar[int] = 5
    PHASE: ClassVar[Phase] = Phase.MASKED_INPUT

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.vector, bytes) or len(self.vector) % 8 or not self.vector:
            raise MalformedMessage("vector must be a non-empty multiple of 8 bytes")
        a = self.attestation
        if not isinstance(a, MaskAttestation):
            raise MalformedMessage("a masked input carries a MaskAttestation")
        if (a.round_id, a.config_digest, a.sender) != (self.round_id, self.config_digest,
                                                       self.sender):
            raise MalformedMessage("the attestation is of another round or sender")

    @classmethod
    def of(cls, values: np.ndarray, **kw) -> "MaskedInput":
        return cls(vector=np.asarray(values, dtype="<u8").tobytes(), **kw)

    def values(self) -> np.ndarray:
        return np.frombuffer(self.vector, dtype="<u8").astype(np.uint64)

    def _write_body(self, w):
        w.blob(self.vector).blob(self.attestation.to_bytes())

    @classmethod
    def _read_body(cls, r):
        return {"vector": r.blob(MAX_VECTOR_BYTES),
                "attestation": MaskAttestation.from_bytes(r.blob(MAX_LIST_BYTES))}


def survivors_digest(round_id: str, config_digest: bytes, survivors) -> bytes:
    """SHA-256 of the survivor set U3 of one round: what every survivor signs in the
    consistency phase (one set for everyone)."""
    w = Writer().fixed(DOMAIN, len(DOMAIN)).blob(b"survivors").text(round_id)
    w.fixed(config_digest, DIGEST_BYTES)
    _write_ids(w, tuple(survivors))
    return hashlib.sha256(w.getvalue()).digest()


@dataclass(frozen=True, kw_only=True)
class SurvivorList(Message):
    """Aggregator -> each site of U3 (round 3, ConsistencyCheck): the whole survivor set U3,
    the same list for every site."""

    recipient: str
    survivors: tuple[str, ...]

    TYPE: ClassVar[int] = 9
    PHASE: ClassVar[Phase] = Phase.CONSISTENCY
    FROM_SITE: ClassVar[bool] = False

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.recipient, str) or not self.recipient:
            raise MalformedMessage("recipient must be a non-empty string")
        _check_ids(self.survivors, "survivors")

    def _write_body(self, w):
        w.text(self.recipient)
        _write_ids(w, self.survivors)

    @classmethod
    def _read_body(cls, r):
        return {"recipient": r.text(), "survivors": _read_ids(r)}


@dataclass(frozen=True, kw_only=True)
class SurvivorSignature(Message):
    """Site -> aggregator (round 3): the sender's signature (the message's own) on
    ``survivors_digest`` of the U3 it was shown. A site signs one set per round."""

    digest: bytes

    TYPE: ClassVar[int] = 10
    PHASE: ClassVar[Phase] = Phase.CONSISTENCY

    def __post_init__(self):
        super().__post_init__()
        _check_bytes(self.digest, DIGEST_BYTES, "digest")

    def _write_body(self, w):
        w.fixed(self.digest, DIGEST_BYTES)

    @classmethod
    def _read_body(cls, r):
        return {"digest": r.fixed(DIGEST_BYTES)}


def _write_messages(w: Writer, items) -> None:
    w.u32(len(items))
    for m in items:
        w.blob(m.to_bytes())


def _read_messages(r: Reader, cls) -> tuple:
    n = r.u32()
    if n > MAX_ITEMS:
        raise MalformedMessage("too many messages")
    return tuple(cls.from_bytes(r.blob(MAX_LIST_BYTES)) for _ in range(n))


def _check_messages(items, cls, name):
    if not isinstance(items, tuple) or not all(isinstance(m, cls) for m in items):
        raise MalformedMessage(f"{name} must be a tuple of {cls.__name__}")


@dataclass(frozen=True, kw_only=True)
class SurvivorCertificate(Message):
    """The survivor set U3 and the ``SurvivorSignature`` messages of a quorum of its members on
    it: one object for the whole round (built and encoded once), carried inside every
    ``UnmaskRequest``. Every confirmation must be of this round, configuration and set, so
    each is encoded as (sender, signature) alone and rebuilt on parsing (~75 bytes a
    signer instead of ~150: a quorum of 500 goes to each of 900 sites)."""

    survivors: tuple[str, ...]
    confirmations: tuple[SurvivorSignature, ...]

    TYPE: ClassVar[int] = 11
    PHASE: ClassVar[Phase] = Phase.UNMASK
    FROM_SITE: ClassVar[bool] = False

    def __post_init__(self):
        super().__post_init__()
        _check_ids(self.survivors, "survivors")
        _check_messages(self.confirmations, SurvivorSignature, "confirmations")
        d = self.digest
        if any((c.round_id, c.config_digest, c.digest) != (self.round_id, self.config_digest, d)
               or len(c.signature) != SIGNATURE_BYTES for c in self.confirmations):
            raise MalformedMessage("a certificate holds signatures on its own set only")

    @property
    def digest(self) -> bytes:
        cached = self.__dict__.get("_digest")
        if cached is None:
            cached = survivors_digest(self.round_id, self.config_digest, self.survivors)
            object.__setattr__(self, "_digest", cached)
        return cached

    def _write_body(self, w):
        _write_ids(w, self.survivors)
        w.u32(len(self.confirmations))
        for c in self.confirmations:
            w.text(c.sender).fixed(c.signature, SIGNATURE_BYTES)

    @classmethod
    def _read_body(cls, r):
        return {"survivors": _read_ids(r), "confirmations": _read_pairs(r)}

    @classmethod
    def _complete(cls, head: dict, body: dict) -> dict:
        """Rebuild each (sender, signature) as the SurvivorSignature its sender signed."""
        d = survivors_digest(head["round_id"], head["config_digest"], body["survivors"])
        full = tuple(SurvivorSignature(round_id=head["round_id"],
                                       config_digest=head["config_digest"], sender=sender,
                                       digest=d, signature=sig)
                     for sender, sig in body["confirmations"])
        return {**body, "confirmations": full}


def _read_pairs(r: Reader) -> tuple:
    n = r.u32()
    if n > MAX_ITEMS:
        raise MalformedMessage("too many signatures")
    return tuple((r.text(), r.fixed(SIGNATURE_BYTES)) for _ in range(n))


@dataclass(frozen=True, kw_only=True)
class UnmaskRequest(Message):
    """Aggregator -> one site that confirmed U3 (round 4, Unmasking): the round's
    ``SurvivorCertificate`` (U3 and a quorum's signatures on it), the signatures of the
    recipient's surviving holders not already in it, and the ``MaskAttestation`` of every
    holder of the recipient in U3. The recipient derives who survived and who dropped from
    these signed lists; nothing in it is a count the aggregator writes."""

    recipient: str
    certificate: SurvivorCertificate
    confirmations: tuple[SurvivorSignature, ...]
    attestations: tuple[MaskAttestation, ...]

    TYPE: ClassVar[int] = 6
    PHASE: ClassVar[Phase] = Phase.UNMASK
    FROM_SITE: ClassVar[bool] = False

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.recipient, str) or not self.recipient:
            raise MalformedMessage("recipient must be a non-empty string")
        if not isinstance(self.certificate, SurvivorCertificate):
            raise MalformedMessage("an unmask request carries a SurvivorCertificate")
        _check_messages(self.confirmations, SurvivorSignature, "confirmations")
        _check_messages(self.attestations, MaskAttestation, "attestations")

    @property
    def survivors(self) -> tuple[str, ...]:
        return self.certificate.survivors

    def all_confirmations(self) -> tuple[SurvivorSignature, ...]:
        return self.certificate.confirmations + self.confirmations

    def _write_body(self, w):
        w.text(self.recipient).blob(self.certificate.to_bytes())
        _write_messages(w, self.confirmations)
        _write_messages(w, self.attestations)

    @classmethod
    def _read_body(cls, r):
        return {"recipient": r.text(),
                "certificate": SurvivorCertificate.from_bytes(r.blob(MAX_VECTOR_BYTES)),
                "confirmations": _read_messages(r, SurvivorSignature),
                "attestations": _read_messages(r, MaskAttestation)}


def _write_owned(w: Writer, items) -> None:
    w.u32(len(items))
    for owner, share in items:
        w.text(owner).fixed(share.to_bytes(), Share.ENCODED_BYTES)


def _read_owned(r: Reader):
    n = r.u32()
    if n > MAX_ITEMS:
        raise MalformedMessage("too many shares")
    return tuple((r.text(), Share.read(r)) for _ in range(n))


def _check_owned(items, name):
    if not isinstance(items, tuple) or not all(
            isinstance(i, tuple) and len(i) == 2 and isinstance(i[0], str) and i[0]
            and isinstance(i[1], Share) for i in items):
        raise MalformedMessage(f"{name} must be a tuple of (site id, Share)")
    owners = [o for o, _ in items]
    if owners != sorted(set(owners)):
        raise MalformedMessage(f"{name} must be sorted by owner without duplicates")


@dataclass(frozen=True, kw_only=True)
class UnmaskResponse(Message):
    """Round 3 answer: the sender's shares of b_v for surviving v (``seed_shares``) and of the
    s-key secret of dropped v (``key_shares``); never both for one v."""

    seed_shares: tuple[tuple[str, Share], ...]
    key_shares: tuple[tuple[str, Share], ...]

    TYPE: ClassVar[int] = 7
    PHASE: ClassVar[Phase] = Phase.UNMASK

    def __post_init__(self):
        super().__post_init__()
        _check_owned(self.seed_shares, "seed_shares")
        _check_owned(self.key_shares, "key_shares")
        if {o for o, _ in self.seed_shares} & {o for o, _ in self.key_shares}:
            raise MalformedMessage("both shares of one site in one response")

    def _write_body(self, w):
        _write_owned(w, self.seed_shares)
        _write_owned(w, self.key_shares)

    @classmethod
    def _read_body(cls, r):
        return {"seed_shares": _read_owned(r), "key_shares": _read_owned(r)}


MESSAGE_TYPES = {cls.TYPE: cls for cls in (KeyAdvertisement, AdvertisementBundle, ShareKeys,
                                           ShareDelivery, MaskedInput, UnmaskRequest,
                                           UnmaskResponse, MaskAttestation, SurvivorList,
                                           SurvivorSignature, SurvivorCertificate)}


def parse(data: bytes) -> Message:
    """Any message from its bytes; ``MalformedMessage`` for anything else."""
    r = Reader(data)
    if r.fixed(4) != MAGIC:
        raise MalformedMessage("not a secure-aggregation message (bad magic)")
    cls = MESSAGE_TYPES.get(r.u8())
    if cls is None:
        raise MalformedMessage("unknown message type")
    phase = r.u8()
    if phase != cls.PHASE:
        raise MalformedMessage(f"a {cls.__name__} belongs to phase {int(cls.PHASE)}, not {phase}")
    head = {"round_id": r.text(), "config_digest": r.fixed(DIGEST_BYTES), "sender": r.text()}
    body = cls._complete(head, cls._read_body(r))
    signature = r.blob(SIGNATURE_BYTES)
    r.done()
    return cls(**head, **body, signature=signature)
