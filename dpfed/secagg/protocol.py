"""State machines of one secure-aggregation round, without transport (Bonawitz et al., CCS 2017,
Figure 4, with the sparse graph of Bell et al., CCS 2020).

``RoundConfig`` is the public description of a round that every party must agree on (round id,
sorted site ids, vector length, graph degree k, Shamir threshold t, the minimum number of
contributions ``min_contributors`` = T + c, and the noise threshold T each site's share is
calibrated for); its SHA-256 digest is bound into every message and key, so sites that were
shown different parameters (say a larger T, i.e. smaller noise shares) cannot complete a round
together.
One ``SiteSession`` per site per round and one ``AggregatorSession`` per round exchange the
messages of ``dpfed.secagg.messages``:

    phase 0  site.advertise()                 -> KeyAdvertisement      -> agg.receive()
             agg.close_advertisements()       -> {site: AdvertisementBundle}      (U1)
    phase 1  site.share_keys(bundle)          -> ShareKeys             -> agg.receive()
             agg.close_share_keys()           -> {site: ShareDelivery}            (U2)
    phase 2  site.masked_input(delivery, x)   -> MaskedInput           -> agg.receive()
             agg.close_masked_inputs()        -> {site: UnmaskRequest}            (U3)
    phase 3  site.unmask(request)             -> UnmaskResponse        -> agg.receive()
             agg.finish()                     -> AggregateResult (sum over U3, mod 2^64)

U1 ⊇ U2 ⊇ U3 are the sites that completed phases 0, 1, 2; when to stop waiting and ``close``
a phase is the caller's (transport's) decision. x is the site's encoded statistics *plus its
distributed-noise share* (``fixedpoint.encode``, ``dlaplace.noise_share``, ``add_signed``).

Refusals (``dpfed.secagg.errors``): every received message is checked, in order, for parse errors
(``MalformedMessage``), round id and configuration digest (``WrongRound``), a second message from
the same sender in its phase (``ReplayedMessage``), the phase (``OutOfPhase``), the sender's
membership of the round and of the current participant set (``UnknownSender``), the signature
(``ForgedMessage``) and its content. A refused message changes nothing. ``TooFewSurvivors`` and
``UnsafeRequest`` (and ``ReconstructionError`` at the aggregator) are final: the session moves to
``Phase.FAILED`` and refuses everything after (``AbortedRound``).

What a site enforces on its own, whatever the aggregator does:
- relayed keys are signed by their owners (its own advert must come back unaltered);
- relayed shares are authenticated (ChaCha20-Poly1305 under a key only sender and recipient
  know, AAD = round id, configuration, sender, recipient);
- at least t of its holders are still in the round before it shares and before it masks;
- it answers one unmasking request per round, listing each neighbour either as a survivor
  (seed share revealed) or as dropped (key share revealed), never both; it refuses a request that
  names it as dropped (it sent its input) or claims fewer than ``min_contributors`` inputs.
What it cannot check alone: that the aggregator tells every site the same survivor set (a
consistency round with signed survivor lists, Bonawitz et al. section 6.2, would add that); the
threshold rule t > (k + 1 + c)/2 (``graph``, "semi_malicious") is what keeps an inconsistent
aggregator from obtaining both secrets of one site.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from dpfed.secagg.codec import MAX_ID_BYTES, Writer
from dpfed.secagg.errors import (AbortedRound, ForgedMessage, MalformedMessage, OutOfPhase,
                                 ParameterError, ReconstructionError, ReplayedMessage,
                                 SecAggError, TooFewSurvivors, UnknownSender, UnsafeRequest,
                                 WrongRound)
from dpfed.secagg.graph import (GraphParameters, NeighbourGraph, choose_graph_parameters)
from dpfed.secagg.keys import (DOMAIN, RoundKeys, identity_private_key, mask_seed, private_bytes,
                               private_from_bytes, public_bytes, share_key)
from dpfed.secagg.masks import commit_self_seed, expand, mask_input, new_self_seed, self_mask
from dpfed.secagg.messages import (AGGREGATOR, AdvertisementBundle, KeyAdvertisement,
                                   MaskAttestation, MaskedInput, Message, Phase, ShareDelivery,
                                   ShareKeys, SharePlaintext, EncryptedShare,
                                   SurvivorCertificate, SurvivorList, SurvivorSignature,
                                   UnmaskRequest, UnmaskResponse, parse,
                                   survivors_digest)
from dpfed.secagg.shamir import Share, reconstruct, split

__all__ = ["RoundConfig", "SiteSession", "AggregatorSession", "AggregateResult", "Phase",
           "share_aad", "MAX_VECTOR_LENGTH"]

MAX_VECTOR_LENGTH = 1 << 28


@dataclass(frozen=True)
class RoundConfig:
    """Public parameters of one round; every party derives the same ``digest`` and graph."""

    round_id: str
    site_ids: tuple[str, ...]
    vector_length: int
    degree: int
    threshold: int
    min_contributors: int
    noise_threshold: int
    #: c, the colluding sites the round tolerates (the spec's ``colluders``).
    colluders: int = 0
    #: c_k, the most colluders among one site's holders (c for the complete graph).
    corrupt_holders: int = 0
    #: Public randomness of the graph: the digest of the coordinator-signed spec, so the
    #: aggregator cannot grind graphs (empty: the config digest alone, as in unit tests).
    seed: bytes = b""

    def __post_init__(self):
        ids = self.site_ids
        if not isinstance(self.round_id, str) or not self.round_id \
                or len(self.round_id.encode("utf-8")) > MAX_ID_BYTES:
            raise ParameterError("round_id must be a short non-empty string")
        if not isinstance(ids, tuple) or not all(
                isinstance(s, str) and s and len(s.encode("utf-8")) <= MAX_ID_BYTES for s in ids):
            raise ParameterError("site_ids must be a tuple of short non-empty strings")
        if list(ids) != sorted(set(ids)) or len(ids) < 2:
            raise ParameterError("site_ids must be sorted, distinct and at least 2")
        if not (isinstance(self.vector_length, int)
                and 1 <= self.vector_length <= MAX_VECTOR_LENGTH):
            raise ParameterError("vector_length out of range")
        if not (isinstance(self.threshold, int) and 1 <= self.threshold <= self.degree + 1):
            raise ParameterError("threshold must be in [1, degree + 1]")
        if not (isinstance(self.min_contributors, int) and 1 <= self.min_contributors <= len(ids)):
            raise ParameterError("min_contributors must be in [1, number of sites]")
        if not (isinstance(self.noise_threshold, int)
                and 1 <= self.noise_threshold <= self.min_contributors):
            raise ParameterError("noise_threshold T must be in [1, min_contributors]: the sum "
                                 "must hold at least T noise shares")
        if not (isinstance(self.colluders, int) and 0 <= self.colluders < len(ids)):
            raise ParameterError("colluders c must be in [0, number of sites)")
        if not (isinstance(self.corrupt_holders, int)
                and 0 <= self.corrupt_holders <= min(self.colluders, self.degree + 1)):
            raise ParameterError("corrupt_holders must be in [0, min(c, degree + 1)]")
        if self.threshold <= self.corrupt_holders:
            raise ParameterError(f"the Shamir threshold t = {self.threshold} must exceed the "
                                 f"{self.corrupt_holders} colluding holders a site may have")
        if self.noise_threshold + self.corrupt_holders > self.degree + 1:
            raise ParameterError(
                f"T = {self.noise_threshold} plus c_k = {self.corrupt_holders} colluding holders "
                f"exceeds the {self.degree + 1} holders of a site: with the sparse graph a site's "
                f"own neighbourhood must hold T honest survivors (RoundConfig.holder_floor)")
        if not isinstance(self.seed, bytes) or len(self.seed) > 64:
            raise ParameterError("seed must be at most 64 bytes")
        object.__setattr__(self, "_digest", hashlib.sha256(DOMAIN + self.to_bytes()).digest())
        object.__setattr__(self, "_graph", NeighbourGraph(ids, self.degree,
                                                          self.seed or self._digest))

    @classmethod
    def create(cls, round_id: str, site_ids, vector_length: int, *, min_contributors: int,
               noise_threshold: int | None = None, dropout_fraction: float = 0.1,
               corrupt_fraction: float = 0.1, adversary: str = "semi_malicious",
               colluders: int | None = None, seed: bytes = b"",
               **graph_options) -> "RoundConfig":
        """Degree and threshold from ``graph.choose_graph_parameters``; ``noise_threshold`` T
        (the shares that make one full draw) defaults to ``min_contributors`` (T + c with c
        colluders allowed: pass T explicitly). ``colluders`` c (the spec's): the Shamir
        threshold and the graph count exactly c corrupt sites; without it, floor(corrupt_fraction
        K) (unit tests and benchmarks)."""
        ids = tuple(sorted(site_ids))
        p: GraphParameters = choose_graph_parameters(
            len(ids), dropout_fraction=dropout_fraction, corrupt_fraction=corrupt_fraction,
            adversary=adversary, corrupt_sites=colluders, **graph_options)
        c = colluders if colluders is not None else int(corrupt_fraction * len(ids) + 1e-12)
        return cls(round_id, ids, vector_length, p.degree, p.threshold, min_contributors,
                   min_contributors if noise_threshold is None else noise_threshold,
                   c, p.corrupt_holders, bytes(seed))

    def to_bytes(self) -> bytes:
        w = Writer().fixed(b"DSC2", 4).text(self.round_id).u32(len(self.site_ids))
        for s in self.site_ids:
            w.text(s)
        return (w.u64(self.vector_length).u32(self.degree).u32(self.threshold)
                .u32(self.min_contributors).u32(self.noise_threshold).u32(self.colluders)
                .u32(self.corrupt_holders).blob(self.seed).getvalue())

    @property
    def digest(self) -> bytes:
        return self._digest

    @property
    def quorum(self) -> int:
        """Signatures on one survivor set a site needs before it reveals any share:
        floor((K + c)/2) + 1. Each honest site signs one set, so two different sets would
        need 2 (quorum - c) > K - c honest signers: at most one set can reach the quorum
        (docs/secure_aggregation.md, "A lying aggregator")."""
        return (len(self.site_ids) + self.colluders) // 2 + 1

    @property
    def survivor_floor(self) -> int:
        """Fewest masked inputs (|U3|) that are ever unmasked: max(min_contributors, T + c,
        Shamir threshold t, quorum)."""
        return max(self.min_contributors, self.noise_threshold + self.colluders,
                   self.threshold, self.quorum)

    @property
    def holder_floor(self) -> int:
        """Fewest survivors among one site's holders (itself included) for it to take part in
        unmasking: max(t, T + c_k). With at most c_k colluding holders, at least T honest
        survivors whose masks are tied to this site's then share every sum its input is in."""
        return max(self.threshold, self.noise_threshold + self.corrupt_holders)

    def graph(self) -> NeighbourGraph:
        return self._graph


def share_aad(round_id: str, config_digest: bytes, sender: str, recipient: str) -> bytes:
    """Associated data of an encrypted share: binds round, configuration, phase and pair."""
    return (Writer().fixed(DOMAIN, len(DOMAIN)).blob(b"share").text(round_id)
            .blob(config_digest).u8(int(Phase.SHARE_KEYS)).text(sender).text(recipient)
            .getvalue())


def _as_message(message) -> Message:
    if isinstance(message, Message):
        return message
    if isinstance(message, (bytes, bytearray, memoryview)):
        return parse(bytes(message))
    raise MalformedMessage(f"expected a message or bytes, got {type(message).__name__}")


def _fingerprint(msg: Message) -> bytes:
    return hashlib.sha256(msg.to_bytes()).digest()


class _Session:
    """Shared bookkeeping: the phase and the final-failure rule."""

    config: RoundConfig
    phase: Phase

    def _fail(self, exc: SecAggError):
        self.phase = Phase.FAILED
        raise exc

    def _check_alive(self):
        if self.phase == Phase.FAILED:
            raise AbortedRound("this session has failed and refuses further messages")

    def _check_round(self, msg: Message):
        if msg.round_id != self.config.round_id or msg.config_digest != self.config.digest:
            raise WrongRound(f"message for round {msg.round_id!r} / another configuration")


class SiteSession(_Session):
    """One site's side of one round.

    ``identity``: the site's Ed25519 identity key (``dpfed.wire.signing.SigningKey`` or
    ``Ed25519PrivateKey``); ``site_keys``: the identity public keys of the round's sites (at
    least of this site's neighbours); ``aggregator_key``: if given, every aggregator message must
    carry the aggregator's valid signature."""

    def __init__(self, config: RoundConfig, site_id: str, identity,
                 site_keys: Mapping[str, Ed25519PublicKey], *,
                 aggregator_key: Ed25519PublicKey | None = None):
        if site_id not in config.site_ids:
            raise UnknownSender(f"{site_id!r} is not a site of this round")
        self.config = config
        self.site_id = site_id
        self._identity = identity_private_key(identity)
        self._site_keys = dict(site_keys)
        self._aggregator_key = aggregator_key
        self._graph = config.graph()
        self._keys = RoundKeys.generate()
        self._seed = new_self_seed()
        self.phase = Phase.ADVERTISE
        self.advert: KeyAdvertisement | None = None
        self._accepted: set[bytes] = set()
        self._adverts: dict[str, KeyAdvertisement] = {}
        self._own_shares: tuple[Share, Share] | None = None
        self._received: dict[str, SharePlaintext] = {}
        self._survivors: tuple[str, ...] = ()
        self._signed_digest = b""
        self._index = self._graph.index(site_id)

    # ------------------------------------------------------------------ helpers
    def _head(self) -> dict:
        return {"round_id": self.config.round_id, "config_digest": self.config.digest,
                "sender": self.site_id}

    def _receive(self, message, cls, expected: Phase):
        self._check_alive()
        msg = _as_message(message)
        fp = _fingerprint(msg)
        if fp in self._accepted:
            raise ReplayedMessage(f"this {type(msg).__name__} was already accepted")
        self._check_round(msg)
        if not isinstance(msg, cls) or self.phase != expected:
            raise OutOfPhase(f"site {self.site_id} is in phase {self.phase.name}; "
                             f"got a {type(msg).__name__}")
        if msg.recipient != self.site_id:
            raise ForgedMessage(f"message addressed to {msg.recipient!r}, not {self.site_id!r}")
        if self._aggregator_key is not None:
            msg.verify(self._aggregator_key)
        return msg, fp

    # ------------------------------------------------------------------ phase 0
    def advertise(self) -> KeyAdvertisement:
        """Phase 0: the signed advertisement of this round's two public keys."""
        self._check_alive()
        if self.phase != Phase.ADVERTISE:
            raise OutOfPhase("keys are advertised once, in phase ADVERTISE")
        commitment = commit_self_seed(self._seed, round_id=self.config.round_id,
                                      config_digest=self.config.digest, site_id=self.site_id)
        self.advert = KeyAdvertisement(**self._head(), c_public=self._keys.c_public,
                                       s_public=self._keys.s_public,
                                       self_commitment=commitment).signed_by(self._identity)
        self.phase = Phase.SHARE_KEYS
        return self.advert

    # ------------------------------------------------------------------ phase 1
    def share_keys(self, bundle) -> ShareKeys:
        """Phase 1: check the relayed adverts, Shamir-share the s-key secret and b_u among the
        holders that advertised, encrypt each share for its holder."""
        msg, fp = self._receive(bundle, AdvertisementBundle, Phase.SHARE_KEYS)
        holders = set(self._graph.holders(self.site_id))
        seen: dict[str, KeyAdvertisement] = {}
        for a in msg.adverts:
            self._check_round(a)
            if a.sender not in holders:
                raise UnknownSender(f"advert from {a.sender!r}, not a neighbour")
            if a.sender in seen:
                raise ReplayedMessage(f"two adverts from {a.sender!r}")
            key = self._site_keys.get(a.sender)
            if key is None:
                raise UnknownSender(f"no identity key for {a.sender!r}")
            a.verify(key)
            seen[a.sender] = a
        if seen.get(self.site_id) != self.advert:
            raise ForgedMessage("this site's own advertisement is missing or altered")
        t = self.config.threshold
        if len(seen) < t:
            self._fail(TooFewSurvivors(f"{len(seen)} holders advertised, threshold is {t}"))
        available = sorted(seen)
        indices = [self._graph.index(h) for h in available]
        key_shares = split(private_bytes(self._keys.s_private), t, indices)
        seed_shares = split(self._seed, t, indices)
        out, own = [], None
        for h, ks, ss in zip(available, key_shares, seed_shares):
            if h == self.site_id:
                own = (ks, ss)
                continue
            k = share_key(self._keys.c_private, seen[h].c_public, round_id=self.config.round_id,
                          config_digest=self.config.digest, sender=self.site_id, recipient=h)
            nonce = os.urandom(12)
            ct = ChaCha20Poly1305(k).encrypt(
                nonce, SharePlaintext(self.site_id, h, ks, ss).to_bytes(),
                share_aad(self.config.round_id, self.config.digest, self.site_id, h))
            out.append(EncryptedShare(self.site_id, h, nonce, ct))
        reply = ShareKeys(**self._head(), shares=tuple(out)).signed_by(self._identity)
        self._adverts, self._own_shares = seen, own
        self._accepted.add(fp)
        self.phase = Phase.MASKED_INPUT
        return reply

    # ------------------------------------------------------------------ phase 2
    def masked_input(self, delivery, x) -> MaskedInput:
        """Phase 2: decrypt the neighbours' shares, then send
        y = x + PRG(b_u) + sum_v sign(u, v) PRG(s_uv) over the neighbours that shared."""
        msg, fp = self._receive(delivery, ShareDelivery, Phase.MASKED_INPUT)
        x = np.asarray(x)
        if x.dtype != np.uint64 or x.shape != (self.config.vector_length,):
            raise ParameterError(f"x must be a uint64 vector of length {self.config.vector_length}")
        received: dict[str, SharePlaintext] = {}
        for es in msg.shares:
            if es.recipient != self.site_id:
                raise ForgedMessage("a share addressed to another site")
            if es.sender == self.site_id or es.sender not in self._adverts:
                raise UnknownSender(f"a share from {es.sender!r}, not an advertised neighbour")
            if es.sender in received:
                raise ReplayedMessage(f"two shares from {es.sender!r}")
            k = share_key(self._keys.c_private, self._adverts[es.sender].c_public,
                          round_id=self.config.round_id, config_digest=self.config.digest,
                          sender=es.sender, recipient=self.site_id)
            try:
                plain = ChaCha20Poly1305(k).decrypt(
                    es.nonce, es.ciphertext,
                    share_aad(self.config.round_id, self.config.digest, es.sender, self.site_id))
            except InvalidTag:
                raise ForgedMessage(f"share from {es.sender!r} fails authentication") from None
            p = SharePlaintext.from_bytes(plain)
            if (p.sender, p.recipient) != (es.sender, self.site_id) \
                    or p.key_share.index != self._index or p.seed_share.index != self._index:
                raise ForgedMessage(f"share from {es.sender!r} has the wrong content")
            received[es.sender] = p
        t = self.config.threshold
        if len(received) + 1 < t:
            self._fail(TooFewSurvivors(f"{len(received) + 1} holders completed key sharing, "
                                       f"threshold is {t}"))
        seeds = {v: mask_seed(self._keys.s_private, self._adverts[v].s_public,
                              round_id=self.config.round_id, config_digest=self.config.digest,
                              me=self.site_id, other=v) for v in received}
        y = mask_input(x, self._seed, seeds, self.site_id)
        attestation = MaskAttestation(**self._head(), masked_with=tuple(sorted(received))
                                      ).signed_by(self._identity)
        reply = MaskedInput.of(y, **self._head(), attestation=attestation
                               ).signed_by(self._identity)
        self._received = received
        self._accepted.add(fp)
        self.phase = Phase.CONSISTENCY
        return reply

    # ------------------------------------------------------------------ phase 3
    def confirm(self, survivor_list) -> SurvivorSignature:
        """Phase 3 (ConsistencyCheck): sign the survivor set U3 the aggregator shows, once,
        after checking it from this site's own knowledge: it names this site, holds at least
        ``survivor_floor`` sites and ``holder_floor`` of this site's holders, and every
        surviving neighbour is one this site masked with. Nothing secret leaves here."""
        msg, fp = self._receive(survivor_list, SurvivorList, Phase.CONSISTENCY)
        u3 = set(msg.survivors)
        cfg = self.config
        if not u3 <= set(cfg.site_ids):
            self._fail(UnsafeRequest("the survivor set names sites outside the round"))
        if self.site_id not in u3:
            self._fail(UnsafeRequest("this site sent its masked input but is not in the "
                                     "survivor set"))
        if len(u3) < cfg.survivor_floor:
            self._fail(TooFewSurvivors(f"a survivor set of {len(u3)}; at least "
                                       f"{cfg.survivor_floor} are required"))
        mine = u3 & set(self._graph.holders(self.site_id))
        if len(mine) < cfg.holder_floor:
            self._fail(TooFewSurvivors(f"{len(mine)} of this site's holders survive; at least "
                                       f"{cfg.holder_floor} are required"))
        unmasked = (mine - {self.site_id}) - set(self._received)
        if unmasked:
            self._fail(UnsafeRequest("the survivor set names neighbours this site did not mask "
                                     "with"))
        self._survivors = tuple(sorted(u3))
        self._signed_digest = survivors_digest(cfg.round_id, cfg.digest, self._survivors)
        reply = SurvivorSignature(**self._head(), digest=self._signed_digest
                                  ).signed_by(self._identity)
        self._accepted.add(fp)
        self.phase = Phase.UNMASK
        return reply

    # ------------------------------------------------------------------ phase 4
    def unmask(self, request) -> UnmaskResponse:
        """Phase 4: reveal seed shares of survivors and key shares of dropouts (never both),
        only for the survivor set this site signed and only after verifying, from signed
        lists alone: ``quorum`` distinct survivors signed that same set, and every surviving
        holder whose self-mask share this site reveals attested masking with all of its
        surviving neighbours."""
        msg, fp = self._receive(request, UnmaskRequest, Phase.UNMASK)
        cfg = self.config
        if msg.survivors != self._survivors:
            self._fail(UnsafeRequest("the unmask request names another survivor set than the "
                                     "one this site signed"))
        u3 = set(self._survivors)
        self._check_round(msg.certificate)
        signers = {self.site_id}
        for c in msg.all_confirmations():
            self._check_round(c)
            if c.sender not in u3 or c.digest != self._signed_digest:
                self._fail(UnsafeRequest("a confirmation of another set or by a non-survivor"))
            key = self._site_keys.get(c.sender)
            if key is None:
                self._fail(UnknownSender(f"no identity key for {c.sender!r}"))
            try:
                c.verify(key)
            except ForgedMessage as exc:
                self._fail(exc)
            signers.add(c.sender)
        if len(signers) < cfg.quorum:
            self._fail(TooFewSurvivors(f"{len(signers)} survivors signed the survivor set; "
                                       f"the quorum is {cfg.quorum}"))
        attested: dict[str, MaskAttestation] = {}
        for a in msg.attestations:
            self._check_round(a)
            key = self._site_keys.get(a.sender)
            if a.sender in attested or key is None:
                self._fail(UnsafeRequest("a duplicate attestation or one of an unknown site"))
            try:
                a.verify(key)
            except ForgedMessage as exc:
                self._fail(exc)
            attested[a.sender] = a
        revealed = sorted(u3 & (set(self._received) | {self.site_id}))
        for w in revealed:
            if w == self.site_id:
                continue
            a = attested.get(w)
            if a is None or not (u3 & set(self._graph.neighbours(w))) <= set(a.masked_with):
                self._fail(UnsafeRequest(f"no attestation that survivor {w!r} masked with all "
                                         "of its surviving neighbours"))
        seed_shares = tuple((v, self._own_shares[1] if v == self.site_id
                             else self._received[v].seed_share) for v in revealed)
        key_shares = tuple((v, self._received[v].key_share)
                           for v in sorted(set(self._received) - u3))
        reply = UnmaskResponse(**self._head(), seed_shares=seed_shares,
                               key_shares=key_shares).signed_by(self._identity)
        self._accepted.add(fp)
        self.phase = Phase.DONE
        return reply


@dataclass(frozen=True)
class AggregateResult:
    """The unmasked sum (mod 2^64) of the masked inputs of ``included`` (U3). ``dropped``
    completed key sharing but sent no input; their pairwise masks were removed."""

    round_id: str
    vector: np.ndarray = field(repr=False)
    included: tuple[str, ...]
    dropped: tuple[str, ...]


class AggregatorSession(_Session):
    """The aggregator's side of one round (module docstring). ``site_keys``: identity public keys
    of all the round's sites; ``signing_key``: the aggregator's identity (optional) to sign its
    messages."""

    def __init__(self, config: RoundConfig, site_keys: Mapping[str, Ed25519PublicKey], *,
                 signing_key=None):
        missing = [s for s in config.site_ids if s not in site_keys]
        if missing:
            raise ParameterError(f"no identity key for {', '.join(missing)}")
        self.config = config
        self._site_keys = {s: site_keys[s] for s in config.site_ids}
        self._signing_key = None if signing_key is None else identity_private_key(signing_key)
        self._graph = config.graph()
        self.phase = Phase.ADVERTISE
        self._store: dict[Phase, dict[str, Message]] = {p: {} for p in (
            Phase.ADVERTISE, Phase.SHARE_KEYS, Phase.MASKED_INPUT, Phase.CONSISTENCY,
            Phase.UNMASK)}
        self._survivors: tuple[str, ...] = ()
        self._survivors_digest = b""
        self._participants: dict[Phase, set[str]] = {Phase.ADVERTISE: set(config.site_ids)}
        self._requests: dict[str, UnmaskRequest] = {}
        self._seed_shares: dict[str, dict[str, Share]] = {}
        self._key_shares: dict[str, dict[str, Share]] = {}
        self._dropped: set[str] = set()
        self._absent: set[str] = set()
        self._outputs: dict[str, Message] = {}
        self.result: AggregateResult | None = None

    # ------------------------------------------------------------------ helpers
    def _head(self) -> dict:
        return {"round_id": self.config.round_id, "config_digest": self.config.digest,
                "sender": AGGREGATOR}

    def _sign(self, msg: Message) -> Message:
        return msg if self._signing_key is None else msg.signed_by(self._signing_key)

    def _floor(self) -> int:
        return self.config.survivor_floor

    def current_set(self) -> frozenset[str]:
        """The sites that may send a message in the current phase (U0 = all sites, U1, U2,
        U3); empty once the session is done or failed."""
        return frozenset(self._participants.get(self.phase, ()))

    def outputs(self) -> dict[str, Message]:
        """What the last ``close_*`` returned, per site (the messages of the current phase's
        recipients): the bundles, deliveries or unmask requests; empty in ADVERTISE."""
        return dict(self._outputs)

    @property
    def released(self) -> tuple[str, ...]:
        """Sites whose masked input was accepted (to be accounted as released)."""
        return tuple(sorted(self._store[Phase.MASKED_INPUT]))

    # ------------------------------------------------------------------ receiving
    def receive(self, message) -> Message:
        """Accept one site message of the current phase (refusals: module docstring)."""
        return self.record(self.check(message))

    def check(self, message) -> Message:
        """Every check ``receive`` makes, without changing anything: the parsed message if
        ``receive`` would accept it now, else the refusal. With ``record`` it lets a caller
        store the message durably between the checks and the state change (the gRPC round
        keeps every accepted message in its store before counting it)."""
        self._check_alive()
        msg = _as_message(message)
        self._check_round(msg)
        if not msg.FROM_SITE:
            raise OutOfPhase(f"a {type(msg).__name__} is sent by the aggregator, not to it")
        if msg.sender not in self._site_keys:
            raise UnknownSender(f"{msg.sender!r} is not a site of this round")
        if msg.sender in self._store[msg.PHASE]:
            raise ReplayedMessage(f"a second {type(msg).__name__} from {msg.sender!r}")
        if msg.PHASE != self.phase:
            raise OutOfPhase(f"the round is in phase {self.phase.name}; got a "
                             f"{type(msg).__name__}")
        if msg.sender not in self._participants[self.phase]:
            raise UnknownSender(f"{msg.sender!r} is no longer in the round")
        msg.verify(self._site_keys[msg.sender])
        getattr(self, f"_accept_{type(msg).__name__}")(msg)
        return msg

    def record(self, msg: Message) -> Message:
        """Record a message that ``check`` accepted; the phase and the sender's slot are checked
        again (the session may have moved on since)."""
        self._check_alive()
        if msg.sender in self._store[msg.PHASE]:
            raise ReplayedMessage(f"a second {type(msg).__name__} from {msg.sender!r}")
        if msg.PHASE != self.phase:
            raise OutOfPhase(f"the round is in phase {self.phase.name}; got a "
                             f"{type(msg).__name__}")
        apply = getattr(self, f"_apply_{type(msg).__name__}", None)
        if apply is not None:
            apply(msg)
        self._store[msg.PHASE][msg.sender] = msg
        return msg

    def _accept_KeyAdvertisement(self, msg: KeyAdvertisement) -> None:
        pass

    def _accept_ShareKeys(self, msg: ShareKeys) -> None:
        u1 = self._participants[Phase.SHARE_KEYS]
        expected = set(self._graph.neighbours(msg.sender)) & u1
        recipients = [es.recipient for es in msg.shares]
        if any(es.sender != msg.sender for es in msg.shares):
            raise ForgedMessage("a share whose sender is not the message's sender")
        if len(set(recipients)) != len(recipients) or set(recipients) != expected:
            raise MalformedMessage("shares must go once to each neighbour that advertised")

    def _accept_MaskedInput(self, msg: MaskedInput) -> None:
        if len(msg.vector) != 8 * self.config.vector_length:
            raise MalformedMessage(f"a masked input has {self.config.vector_length} entries")
        msg.attestation.verify(self._site_keys[msg.sender])
        allowed = set(self._graph.neighbours(msg.sender)) & self._participants[Phase.MASKED_INPUT]
        if not set(msg.attestation.masked_with) <= allowed:
            raise MalformedMessage("the attestation names sites that did not share keys with "
                                   "the sender")

    def _accept_SurvivorSignature(self, msg: SurvivorSignature) -> None:
        if msg.digest != self._survivors_digest:
            raise MalformedMessage("a signature on another survivor set")

    def _accept_UnmaskResponse(self, msg: UnmaskResponse) -> None:
        index = self._graph.index(msg.sender)
        u3 = set(self._survivors)
        mine = set(self._store[Phase.MASKED_INPUT][msg.sender].attestation.masked_with)
        if not {o for o, _ in msg.seed_shares} <= (mine | {msg.sender}) & u3 \
                or not {o for o, _ in msg.key_shares} <= mine - u3:
            raise MalformedMessage("shares for sites the request did not name, or of the "
                                   "wrong kind")
        if any(s.index != index for _, s in (*msg.seed_shares, *msg.key_shares)):
            raise ForgedMessage("a share whose index is not the sender's")

    def _apply_UnmaskResponse(self, msg: UnmaskResponse) -> None:
        for owner, s in msg.seed_shares:
            self._seed_shares.setdefault(owner, {})[msg.sender] = s
        for owner, s in msg.key_shares:
            self._key_shares.setdefault(owner, {})[msg.sender] = s

    # ------------------------------------------------------------------ closing phases
    def close_advertisements(self) -> dict[str, AdvertisementBundle]:
        """End phase 0: U1 = the sites that advertised; each gets its holders' adverts."""
        self._check_alive()
        if self.phase != Phase.ADVERTISE:
            raise OutOfPhase("not in phase ADVERTISE")
        adverts = self._store[Phase.ADVERTISE]
        u1 = set(adverts)
        if len(u1) < self._floor():
            self._fail(TooFewSurvivors(f"{len(u1)} sites advertised keys; {self._floor()} "
                                       "needed"))
        out = {}
        for u in sorted(u1):
            mine = tuple(adverts[h] for h in self._graph.holders(u) if h in u1)
            out[u] = self._sign(AdvertisementBundle(**self._head(), recipient=u, adverts=mine))
        self._participants[Phase.SHARE_KEYS] = u1
        self.phase = Phase.SHARE_KEYS
        self._outputs = out
        return out

    def close_share_keys(self) -> dict[str, ShareDelivery]:
        """End phase 1: U2 = the sites that shared; each gets the shares addressed to it."""
        self._check_alive()
        if self.phase != Phase.SHARE_KEYS:
            raise OutOfPhase("not in phase SHARE_KEYS")
        msgs = self._store[Phase.SHARE_KEYS]
        u2 = set(msgs)
        if len(u2) < self._floor():
            self._fail(TooFewSurvivors(f"{len(u2)} sites shared keys; {self._floor()} needed"))
        inbox: dict[str, list[EncryptedShare]] = {v: [] for v in u2}
        for u in sorted(u2):
            for es in msgs[u].shares:
                if es.recipient in inbox:
                    inbox[es.recipient].append(es)
        out = {v: self._sign(ShareDelivery(**self._head(), recipient=v, shares=tuple(inbox[v])))
               for v in sorted(u2)}
        self._participants[Phase.MASKED_INPUT] = u2
        self.phase = Phase.MASKED_INPUT
        self._outputs = out
        return out

    def close_masked_inputs(self) -> dict[str, SurvivorList]:
        """End phase 2: U3 = the sites whose masked input arrived; each gets the same signed
        list of U3 to confirm. Refuses (final, nothing revealed) if |U3| is below the
        ``survivor_floor``."""
        self._check_alive()
        if self.phase != Phase.MASKED_INPUT:
            raise OutOfPhase("not in phase MASKED_INPUT")
        u3 = set(self._store[Phase.MASKED_INPUT])
        if len(u3) < self._floor():
            self._fail(TooFewSurvivors(f"{len(u3)} masked inputs < {self._floor()}: nothing "
                                       "is unmasked"))
        self._survivors = tuple(sorted(u3))
        self._survivors_digest = survivors_digest(self.config.round_id, self.config.digest,
                                                  self._survivors)
        out = {r: self._sign(SurvivorList(**self._head(), recipient=r,
                                          survivors=self._survivors)) for r in self._survivors}
        self._participants[Phase.CONSISTENCY] = u3
        self.phase = Phase.CONSISTENCY
        self._outputs = out
        return out

    def close_consistency(self) -> dict[str, UnmaskRequest]:
        """End phase 3: U4 = the survivors that signed U3. Refuses (final) with fewer than the
        quorum, or if a needed secret would have fewer than t holders among U4. Each signer
        gets U3, the quorum's signatures and the attestations of its surviving holders."""
        self._check_alive()
        if self.phase != Phase.CONSISTENCY:
            raise OutOfPhase("not in phase CONSISTENCY")
        signed = self._store[Phase.CONSISTENCY]
        u4 = set(signed)
        cfg, t = self.config, self.config.threshold
        if len(u4) < cfg.quorum:
            self._fail(TooFewSurvivors(f"{len(u4)} survivors confirmed the survivor set; the "
                                       f"quorum is {cfg.quorum}"))
        u3 = set(self._survivors)
        inputs = self._store[Phase.MASKED_INPUT]
        masked_with = {u: set(inputs[u].attestation.masked_with) for u in u3}
        dropped = {v for u in u3 for v in masked_with[u]} - u3
        for owner in sorted(u3):
            alive = len({h for h in self._graph.holders(owner) if h in u4
                         and (h == owner or owner in masked_with[h])})
            if alive < t:
                self._fail(TooFewSurvivors(f"only {alive} confirmed holders of {owner!r}'s "
                                           f"self-mask; threshold {t}"))
        for v in sorted(dropped):
            alive = len({h for h in self._graph.neighbours(v) if h in u4
                         and v in masked_with[h]})
            if alive < t:
                self._fail(TooFewSurvivors(f"only {alive} confirmed holders of {v!r}'s mask "
                                           f"key; threshold {t}"))
        # One certificate for everyone (encoded once): U3 and a quorum of signatures on it,
        # which is all a site needs besides its surviving holders' attestations.
        certificate = self._sign(SurvivorCertificate(
            **self._head(), survivors=self._survivors,
            confirmations=tuple(signed[s] for s in sorted(u4)[:cfg.quorum])))
        out = {}
        for r in sorted(u4):
            holders = set(self._graph.holders(r))
            att = tuple(inputs[w].attestation for w in sorted(u3 & holders) if w != r)
            out[r] = self._sign(UnmaskRequest(**self._head(), recipient=r,
                                              certificate=certificate, confirmations=(),
                                              attestations=att))
        self._requests = out
        self._dropped = dropped
        self._absent = set(self._participants[Phase.MASKED_INPUT]) - u3
        self._masked_with = masked_with
        self._participants[Phase.UNMASK] = u4
        self.phase = Phase.UNMASK
        self._outputs = out
        return out

    def ready(self) -> bool:
        """Whether every needed secret has at least t shares."""
        if self.phase != Phase.UNMASK:
            return False
        t = self.config.threshold
        return (all(len(self._seed_shares.get(u, {})) >= t for u in self._survivors)
                and all(len(self._key_shares.get(v, {})) >= t for v in self._dropped))

    def _reconstruct(self, shares: dict[str, Share]) -> bytes:
        chosen = sorted(shares.values(), key=lambda s: s.index)[:self.config.threshold]
        return reconstruct(chosen, self.config.threshold, max_index=len(self.config.site_ids),
                           verify_extra=False)

    def finish(self) -> AggregateResult:
        """End phase 3: reconstruct b_u of survivors and the s-keys of dropouts, remove every
        mask, return the sum. ``TooFewSurvivors`` (not final) while shares are missing; a
        secret that does not match its public commitment is a final ``ReconstructionError``."""
        self._check_alive()
        if self.phase != Phase.UNMASK:
            raise OutOfPhase("not in phase UNMASK")
        if not self.ready():
            raise TooFewSurvivors("not enough unmasking responses yet")
        L = self.config.vector_length
        adverts = self._store[Phase.ADVERTISE]
        u3 = set(self._survivors)
        inputs = self._store[Phase.MASKED_INPUT]
        total = np.zeros(L, dtype=np.uint64)
        for u in sorted(u3):
            total += inputs[u].values()
        try:
            for u in sorted(u3):
                seed = self._reconstruct(self._seed_shares[u])
                if commit_self_seed(seed, round_id=self.config.round_id,
                                    config_digest=self.config.digest, site_id=u) \
                        != adverts[u].self_commitment:
                    raise ReconstructionError(f"the self-mask seed of {u!r} does not match its "
                                              "commitment")
                total -= self_mask(seed, L)
            for v in sorted(self._dropped):
                private = private_from_bytes(self._reconstruct(self._key_shares[v]))
                if public_bytes(private) != adverts[v].s_public:
                    raise ReconstructionError(f"the mask key of {v!r} does not match its "
                                              "advertised public key")
                for w in self._graph.neighbours(v):
                    if w not in u3 or v not in self._masked_with[w]:
                        continue        # only inputs that carry the pair mask
                    seed = mask_seed(private, adverts[w].s_public, round_id=self.config.round_id,
                                     config_digest=self.config.digest, me=v, other=w)
                    m = expand(seed, L, purpose="pair")
                    if w < v:       # w added +PRG(s_wv)
                        total -= m
                    else:           # w added -PRG(s_wv)
                        total += m
        except ReconstructionError as exc:
            self._fail(exc)
        self.result = AggregateResult(self.config.round_id, total, tuple(sorted(u3)),
                                      tuple(sorted(self._absent)))
        self.phase = Phase.DONE
        return self.result
