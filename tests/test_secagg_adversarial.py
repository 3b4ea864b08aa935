"""Both state machines refuse forged, replayed, out-of-phase, wrong-round, unknown-sender and
malformed messages in every phase, and a refused message changes nothing: the round still
completes with the exact sum afterwards. A tampered encrypted share fails authentication, and a
site never reveals both secrets of one site."""

import dataclasses

import numpy as np
import pytest

from dpfed.secagg import csprng
from dpfed.secagg import fixedpoint as fp
from dpfed.secagg.errors import (AbortedRound, ForgedMessage, MalformedMessage, OutOfPhase,
                                 ParameterError,
                                 ReplayedMessage, TooFewSurvivors, UnknownSender, UnsafeRequest,
                                 WrongRound)
from dpfed.secagg.messages import (AdvertisementBundle, EncryptedShare, KeyAdvertisement,
                                   MaskAttestation, MaskedInput, Phase, ShareDelivery,
                                   ShareKeys, SurvivorCertificate, SurvivorList,
                                   SurvivorSignature, UnmaskRequest, survivors_digest,
                                   UnmaskResponse)
from dpfed.secagg.protocol import AggregatorSession, RoundConfig, SiteSession
from dpfed.wire.signing import SigningKey

IDS = ("s0", "s1", "s2", "s3")
L = 8
MALLORY = SigningKey.generate()


class Round:
    """A 4-site round driven by hand. ``s0`` is the site under test; it is delayed, so the
    aggregator has everybody else's message of the current phase and s0's is ``pending``."""

    def __init__(self, round_id, idents, agg_key, x):
        self.cfg = RoundConfig.create(round_id, IDS, L, min_contributors=2,
                                      adversary="semi_honest")
        self.idents, self.agg_key, self.x = idents, agg_key, x
        self.public = {s: k.public_key for s, k in idents.items()}
        self.sites = {s: SiteSession(self.cfg, s, idents[s], self.public,
                                     aggregator_key=agg_key.public_key) for s in IDS}
        self.agg = AggregatorSession(self.cfg, self.public, signing_key=agg_key)
        self.to_site = {}          # the aggregator's last message to each site
        self.pending = None        # s0's message of the current phase, not yet delivered
        self._collect(lambda s: self.sites[s].advertise())

    def _collect(self, make):
        for s in IDS[1:]:
            self.agg.receive(make(s).to_bytes())
        self.pending = make("s0")

    def deliver_pending(self):
        if self.pending is not None:
            self.agg.receive(self.pending)
            self.pending = None

    def advance(self):
        """Deliver s0's pending message, close the phase and collect the next one."""
        self.deliver_pending()
        phase = self.agg.phase
        if phase == Phase.ADVERTISE:
            self.to_site = self.agg.close_advertisements()
            self._collect(lambda s: self.sites[s].share_keys(self.to_site[s]))
        elif phase == Phase.SHARE_KEYS:
            self.to_site = self.agg.close_share_keys()
            self._collect(lambda s: self.sites[s].masked_input(self.to_site[s], self.x[s]))
        elif phase == Phase.MASKED_INPUT:
            self.to_site = self.agg.close_masked_inputs()
            self._collect(lambda s: self.sites[s].confirm(self.to_site[s]))
        elif phase == Phase.CONSISTENCY:
            self.to_site = self.agg.close_consistency()
            self._collect(lambda s: self.sites[s].unmask(self.to_site[s]))
        return self

    def head(self, sender):
        return {"round_id": self.cfg.round_id, "config_digest": self.cfg.digest,
                "sender": sender}


@pytest.fixture(scope="module")
def keys():
    return {s: SigningKey.generate() for s in IDS}, SigningKey.generate()


def _masked(r, values, masked_with=("s1", "s2", "s3")):
    """A correctly signed MaskedInput of s0 with its attestation (content chosen by the test)."""
    h, key = r.head("s0"), r.idents["s0"]
    att = MaskAttestation(**h, masked_with=masked_with).signed_by(key)
    return MaskedInput.of(values, **h, attestation=att).signed_by(key)


def _round(keys, phase, round_id="round-7"):
    idents, agg_key = keys
    x = {s: csprng.random_u64(L) for s in IDS}
    r = Round(round_id, idents, agg_key, x)
    for _ in range(int(phase)):
        r.advance()
    return r


def _finish(r):
    """Complete the round honestly and check the sum: refusals changed nothing."""
    while r.agg.phase != Phase.UNMASK:
        r.advance()
    r.deliver_pending()
    res = r.agg.finish()
    assert np.array_equal(res.vector, fp.wrap_sum(r.x.values()))


PHASES = [Phase.ADVERTISE, Phase.SHARE_KEYS, Phase.MASKED_INPUT, Phase.CONSISTENCY,
          Phase.UNMASK]


def _next_phase_message(r, phase):
    """A correctly signed s0 message of the phase after ``phase`` (never legitimately sent)."""
    h = r.head("s0")
    nxt = {Phase.ADVERTISE: ShareKeys(**h, shares=()),
           Phase.SHARE_KEYS: _masked(r, np.zeros(L, np.uint64)),
           Phase.MASKED_INPUT: UnmaskResponse(**h, seed_shares=(), key_shares=()),
           Phase.CONSISTENCY: UnmaskResponse(**h, seed_shares=(), key_shares=())}[phase]
    return nxt.signed_by(r.idents["s0"])


# ====================================================================== aggregator side

@pytest.mark.parametrize("phase", PHASES)
def test_aggregator_rejects_forged_messages(keys, phase):
    r = _round(keys, phase)
    with pytest.raises(ForgedMessage):                         # signed by the wrong key
        r.agg.receive(r.pending.signed_by(MALLORY))
    sig = r.pending.signature
    with pytest.raises(ForgedMessage):                         # a flipped signature bit
        r.agg.receive(dataclasses.replace(r.pending, signature=bytes([sig[0] ^ 1]) + sig[1:]))
    with pytest.raises(ForgedMessage):                         # content changed after signing
        r.agg.receive(_tamper(r.pending))
    _finish(r)


def _tamper(msg):
    """The same message with one content field changed and the old signature kept."""
    if isinstance(msg, KeyAdvertisement):
        return dataclasses.replace(msg, c_public=bytes(range(32)))
    if isinstance(msg, ShareKeys):
        es = msg.shares[0]
        return dataclasses.replace(msg, shares=(dataclasses.replace(
            es, ciphertext=bytes([es.ciphertext[0] ^ 1]) + es.ciphertext[1:]), *msg.shares[1:]))
    if isinstance(msg, MaskedInput):
        return dataclasses.replace(msg, vector=bytes([msg.vector[0] ^ 1]) + msg.vector[1:])
    if isinstance(msg, SurvivorSignature):
        return dataclasses.replace(msg, digest=bytes([msg.digest[0] ^ 1]) + msg.digest[1:])
    owner, share = msg.seed_shares[0]
    changed = type(share)(share.index, (share.value + 1) % 2 ** 500)
    return dataclasses.replace(msg, seed_shares=((owner, changed), *msg.seed_shares[1:]))


@pytest.mark.parametrize("phase", PHASES)
def test_aggregator_rejects_replays(keys, phase):
    r = _round(keys, phase)
    msg = r.pending
    r.deliver_pending()
    with pytest.raises(ReplayedMessage):                       # the same message twice
        r.agg.receive(msg)
    with pytest.raises(ReplayedMessage):                       # a re-signed second message
        r.agg.receive(dataclasses.replace(msg, signature=b"").signed_by(r.idents["s0"]))
    if phase != Phase.ADVERTISE:                               # an earlier phase's message
        with pytest.raises(ReplayedMessage):
            r.agg.receive(r.sites["s1"].advert)
    _finish(r)


@pytest.mark.parametrize("phase", PHASES)
def test_aggregator_rejects_messages_from_a_previous_round(keys, phase):
    old = _round(keys, phase, round_id="round-6")              # same sites, same keys
    r = _round(keys, phase)
    with pytest.raises(WrongRound):
        r.agg.receive(old.pending)
    _finish(r)


@pytest.mark.parametrize("phase", PHASES)
def test_aggregator_rejects_out_of_phase_messages(keys, phase):
    r = _round(keys, phase)
    if phase == Phase.UNMASK:                                  # the last phase: after the end
        late = r.pending
        r.pending = None
        r.agg.finish()                                         # s1..s3's shares suffice
        with pytest.raises(OutOfPhase):
            r.agg.receive(late)
        return
    with pytest.raises(OutOfPhase):
        r.agg.receive(_next_phase_message(r, phase))
    if phase != Phase.ADVERTISE:
        with pytest.raises(OutOfPhase):                        # an aggregator-to-site message
            r.agg.receive(next(iter(r.to_site.values())))
    _finish(r)


@pytest.mark.parametrize("phase", PHASES)
def test_aggregator_rejects_unknown_senders(keys, phase):
    r = _round(keys, phase)
    extra = {}
    if isinstance(r.pending, MaskedInput):                     # its attestation names mallory
        extra["attestation"] = dataclasses.replace(r.pending.attestation, sender="mallory")
    forged = dataclasses.replace(r.pending, sender="mallory", signature=b"",
                                 **extra).signed_by(MALLORY)
    with pytest.raises(UnknownSender):
        r.agg.receive(forged)
    _finish(r)


def test_aggregator_rejects_sites_that_left_the_round(keys):
    idents, agg_key = keys
    x = {s: csprng.random_u64(L) for s in IDS}
    r = Round("round-8", idents, agg_key, x)
    # s0 never advertises: U1 = {s1, s2, s3}; its later messages come from outside the round
    r.to_site = r.agg.close_advertisements()
    assert "s0" not in r.to_site
    late = ShareKeys(**r.head("s0"), shares=()).signed_by(idents["s0"])
    with pytest.raises(UnknownSender, match="no longer"):
        r.agg.receive(late)


@pytest.mark.parametrize("phase", PHASES)
def test_aggregator_rejects_malformed_bytes(keys, phase):
    r = _round(keys, phase)
    data = r.pending.to_bytes()
    for bad in (data[:-3], data + b"!", b"DSA1" + data[4:5] + b"\x07" + data[6:], b"\x00" * 9):
        with pytest.raises(MalformedMessage):
            r.agg.receive(bad)
    _finish(r)


def test_aggregator_rejects_bad_contents(keys):
    r = _round(keys, Phase.SHARE_KEYS)
    idents = r.idents
    partial = dataclasses.replace(r.pending, shares=r.pending.shares[:-1], signature=b"")
    with pytest.raises(MalformedMessage, match="each neighbour"):
        r.agg.receive(partial.signed_by(idents["s0"]))
    r.advance()
    short = _masked(r, np.zeros(L - 1, np.uint64))
    with pytest.raises(MalformedMessage):
        r.agg.receive(short)
    # an attestation naming a site that never shared keys with s0 ("s0" itself)
    odd = _masked(r, np.zeros(L, np.uint64), masked_with=("s0", "s1"))
    with pytest.raises(MalformedMessage, match="attestation"):
        r.agg.receive(odd)
    r.advance()
    # a confirmation of another survivor set
    other = SurvivorSignature(**r.head("s0"), digest=bytes(32)).signed_by(idents["s0"])
    with pytest.raises(MalformedMessage, match="another survivor set"):
        r.agg.receive(other)
    r.advance()
    # a response revealing a *key* share of a survivor (the request asked for seed shares)
    resp = r.pending
    owner, share = resp.seed_shares[0]
    bad = dataclasses.replace(resp, seed_shares=resp.seed_shares[1:],
                              key_shares=((owner, share),), signature=b"")
    with pytest.raises(MalformedMessage):
        r.agg.receive(bad.signed_by(idents["s0"]))
    _finish(r)


# ====================================================================== site side

def _s0_input(r):
    """The aggregator message s0 is waiting for in the current round state."""
    return r.to_site["s0"]


def _site_round(keys, phase):
    """s0 has sent its message of ``phase - 1`` and waits for the aggregator's message that
    opens ``phase`` (phase in SHARE_KEYS, MASKED_INPUT, UNMASK)."""
    r = _round(keys, Phase(int(phase) - 1))
    r.deliver_pending()
    closer = {Phase.SHARE_KEYS: r.agg.close_advertisements,
              Phase.MASKED_INPUT: r.agg.close_share_keys,
              Phase.CONSISTENCY: r.agg.close_masked_inputs,
              Phase.UNMASK: r.agg.close_consistency}[phase]
    r.to_site = closer()
    return r


def _site_call(r, phase, msg):
    s0 = r.sites["s0"]
    if phase == Phase.SHARE_KEYS:
        return s0.share_keys(msg)
    if phase == Phase.MASKED_INPUT:
        return s0.masked_input(msg, r.x["s0"])
    if phase == Phase.CONSISTENCY:
        return s0.confirm(msg)
    return s0.unmask(msg)


SITE_PHASES = [Phase.SHARE_KEYS, Phase.MASKED_INPUT, Phase.CONSISTENCY, Phase.UNMASK]


def _resign(r, msg, key=None):
    return dataclasses.replace(msg, signature=b"").signed_by(key or r.agg_key)


def _with_survivors(r, req, survivors):
    """``req`` naming another survivor set: the aggregator's certificate for that set, with
    the sites' signatures (on the set they did sign) carried over, re-signed by it."""
    d = survivors_digest(r.cfg.round_id, r.cfg.digest, survivors)
    moved = tuple(dataclasses.replace(c, digest=d) for c in req.certificate.confirmations)
    return dataclasses.replace(req, certificate=_resign(r, dataclasses.replace(
        req.certificate, survivors=survivors, confirmations=moved)))


@pytest.mark.parametrize("phase", SITE_PHASES)
def test_site_rejects_forged_aggregator_messages(keys, phase):
    r = _site_round(keys, phase)
    msg = _s0_input(r)
    with pytest.raises(ForgedMessage):                    # not signed by the aggregator
        _site_call(r, phase, _resign(r, msg, MALLORY))
    with pytest.raises(ForgedMessage):                    # unsigned
        _site_call(r, phase, dataclasses.replace(msg, signature=b""))
    with pytest.raises(ForgedMessage):                    # addressed to another site
        _site_call(r, phase, r.to_site["s1"])
    assert _site_call(r, phase, msg) is not None          # the genuine one still works


def test_site_rejects_substituted_keys(keys):
    r = _site_round(keys, Phase.SHARE_KEYS)
    bundle = _s0_input(r)
    adverts = list(bundle.adverts)
    i = next(j for j, a in enumerate(adverts) if a.sender == "s1")
    # the aggregator replaces s1's keys with its own: s1's signature no longer verifies
    fake = dataclasses.replace(adverts[i], c_public=bytes(range(32)))
    with pytest.raises(ForgedMessage):
        r.sites["s0"].share_keys(_resign(r, dataclasses.replace(
            bundle, adverts=tuple(adverts[:i] + [fake] + adverts[i + 1:]))))
    # ... or s0's own advert (which it knows)
    j = next(j for j, a in enumerate(adverts) if a.sender == "s0")
    other = r.sites["s1"].advert
    own_fake = dataclasses.replace(other, sender="s0", signature=b"").signed_by(r.idents["s0"])
    with pytest.raises(ForgedMessage, match="own"):
        r.sites["s0"].share_keys(_resign(r, dataclasses.replace(
            bundle, adverts=tuple(adverts[:j] + [own_fake] + adverts[j + 1:]))))
    r.sites["s0"].share_keys(bundle)


def test_tampered_or_misdirected_encrypted_shares_fail_authentication(keys):
    r = _site_round(keys, Phase.MASKED_INPUT)
    delivery = _s0_input(r)
    es = delivery.shares[0]
    flipped = dataclasses.replace(es, ciphertext=bytes([es.ciphertext[0] ^ 1]) + es.ciphertext[1:])
    with pytest.raises(ForgedMessage, match="authentication"):
        r.sites["s0"].masked_input(_resign(r, dataclasses.replace(
            delivery, shares=(flipped, *delivery.shares[1:]))), r.x["s0"])
    # a share s1 encrypted for s2, relabelled for s0
    to_s2 = next(e for e in r.to_site["s2"].shares if e.sender == "s1")
    moved = EncryptedShare("s1", "s0", to_s2.nonce, to_s2.ciphertext)
    others = tuple(e for e in delivery.shares if e.sender != "s1")
    with pytest.raises(ForgedMessage):
        r.sites["s0"].masked_input(_resign(r, dataclasses.replace(
            delivery, shares=tuple(sorted((moved, *others), key=lambda e: e.sender)))),
            r.x["s0"])
    assert r.sites["s0"].masked_input(delivery, r.x["s0"]) is not None


@pytest.mark.parametrize("phase", SITE_PHASES)
def test_site_rejects_replays(keys, phase):
    r = _site_round(keys, phase)
    msg = _s0_input(r)
    _site_call(r, phase, msg)
    with pytest.raises(ReplayedMessage):
        _site_call(r, phase, msg)


@pytest.mark.parametrize("phase", SITE_PHASES)
def test_site_rejects_messages_from_a_previous_round(keys, phase):
    # round-6 and round-7 have the same sites and keys; round-6's message to s0 is genuinely
    # signed by the same aggregator key, but bound to round-6's id and configuration
    old = _round(keys, Phase(int(phase) - 1), round_id="round-6")
    old.deliver_pending()
    stale = {Phase.SHARE_KEYS: old.agg.close_advertisements,
             Phase.MASKED_INPUT: old.agg.close_share_keys,
             Phase.CONSISTENCY: old.agg.close_masked_inputs,
             Phase.UNMASK: old.agg.close_consistency}[phase]()["s0"]
    r = _site_round(keys, phase)
    with pytest.raises(WrongRound):
        _site_call(r, phase, stale)
    with pytest.raises(WrongRound):
        _site_call(r, phase, _resign(r, dataclasses.replace(
            _s0_input(r), config_digest=bytes(32))))


@pytest.mark.parametrize("phase", SITE_PHASES)
def test_site_rejects_out_of_phase_messages(keys, phase):
    r = _site_round(keys, phase)
    h = r.head("")
    wrong = {Phase.SHARE_KEYS: ShareDelivery(**h, recipient="s0", shares=()),
             Phase.MASKED_INPUT: UnmaskRequest(**h, recipient="s0", certificate=SurvivorCertificate(
                 **h, survivors=("s0",), confirmations=()), confirmations=(), attestations=()),
             Phase.CONSISTENCY: ShareDelivery(**h, recipient="s0", shares=()),
             Phase.UNMASK: SurvivorList(**h, recipient="s0", survivors=IDS[:3])}[phase]
    with pytest.raises(OutOfPhase):
        _site_call(r, phase, _resign(r, wrong))
    with pytest.raises(OutOfPhase):                       # a site message is not for a site
        _site_call(r, phase, r.sites["s1"].advert)
    if phase == Phase.SHARE_KEYS:
        with pytest.raises(OutOfPhase):
            r.sites["s0"].advertise()
    _site_call(r, phase, _s0_input(r))


@pytest.mark.parametrize("phase", SITE_PHASES)
def test_site_rejects_unknown_sites(keys, phase):
    r = _site_round(keys, phase)
    msg = _s0_input(r)
    h = r.head("mallory")
    if phase == Phase.SHARE_KEYS:
        stranger = KeyAdvertisement(**h, c_public=bytes(range(32)), s_public=bytes(range(32)),
                                    self_commitment=bytes(32)).signed_by(MALLORY)
        bad = dataclasses.replace(msg, adverts=(*msg.adverts, stranger))
    elif phase == Phase.MASKED_INPUT:
        es = EncryptedShare("mallory", "s0", bytes(12), bytes(80))
        bad = dataclasses.replace(msg, shares=(*msg.shares, es))
    elif phase == Phase.CONSISTENCY:
        bad = dataclasses.replace(msg, survivors=tuple(sorted((*msg.survivors, "mallory"))))
        with pytest.raises(UnsafeRequest, match="outside the round"):
            _site_call(r, phase, _resign(r, bad))
        return
    else:
        stranger = SurvivorSignature(**h, digest=msg.all_confirmations()[0].digest
                                     ).signed_by(MALLORY)
        bad = dataclasses.replace(msg, confirmations=(*msg.confirmations, stranger))
        with pytest.raises(UnsafeRequest, match="non-survivor"):
            _site_call(r, phase, _resign(r, bad))
        return
    with pytest.raises(UnknownSender):
        _site_call(r, phase, _resign(r, bad))
    _site_call(r, phase, msg)


@pytest.mark.parametrize("phase", SITE_PHASES)
def test_site_rejects_malformed_bytes(keys, phase):
    r = _site_round(keys, phase)
    data = _s0_input(r).to_bytes()
    for bad in (data[:-1], data + b"\x00", b"nonsense", 17):
        with pytest.raises(MalformedMessage):
            _site_call(r, phase, bad)
    # an aggregator message claiming a non-empty sender does not even parse
    at = 6 + 4 + len(r.cfg.round_id.encode()) + 32          # the empty sender's length field
    assert data[at:at + 4] == bytes(4)
    with pytest.raises(MalformedMessage, match="empty sender"):
        _site_call(r, phase, data[:at] + b"\x01\x00\x00\x00x" + data[at + 4:])
    _site_call(r, phase, data)


# ====================================================================== never both secrets

def test_site_never_reveals_both_secrets_of_one_site(keys):
    r = _site_round(keys, Phase.UNMASK)
    req = _s0_input(r)
    s0 = r.sites["s0"]
    # another survivor set than the one s0 signed (s1 "dropped": its key share would go)
    other = _with_survivors(r, req, tuple(s for s in req.survivors if s != "s1"))
    with pytest.raises(UnsafeRequest, match="another survivor set"):
        s0.unmask(_resign(r, other))
    assert s0.phase == Phase.FAILED
    with pytest.raises(AbortedRound):
        s0.unmask(req)


def test_site_refuses_to_be_declared_dropped_or_to_answer_twice(keys):
    r2 = _site_round(keys, Phase.CONSISTENCY)
    lst = _s0_input(r2)
    with pytest.raises(UnsafeRequest, match="not in the survivor set"):
        r2.sites["s0"].confirm(_resign(r2, dataclasses.replace(
            lst, survivors=tuple(s for s in lst.survivors if s != "s0"))))
    r = _site_round(keys, Phase.UNMASK)
    req = _s0_input(r)
    s0 = r.sites["s0"]
    resp = s0.unmask(req)
    assert {o for o, _ in resp.seed_shares} == set(req.survivors) and resp.key_shares == ()
    # a second request, now claiming s1 dropped (asking for its key share), is never answered
    second = _with_survivors(r, req, tuple(s for s in req.survivors if s != "s1"))
    with pytest.raises(OutOfPhase):
        s0.unmask(_resign(r, second))


def test_site_refuses_too_few_survivors_or_confirmations(keys):
    r = _site_round(keys, Phase.CONSISTENCY)
    lst = _s0_input(r)
    with pytest.raises(TooFewSurvivors):            # {s0, s1} < quorum 3 of 4
        r.sites["s0"].confirm(_resign(r, dataclasses.replace(lst, survivors=("s0", "s1"))))
    assert r.sites["s0"].phase == Phase.FAILED
    r = _site_round(keys, Phase.UNMASK)
    req = _s0_input(r)
    # only one other survivor's signature: below the quorum of 3, whatever the list says
    with pytest.raises(TooFewSurvivors, match="quorum"):
        r.sites["s0"].unmask(_resign(r, dataclasses.replace(
            req, certificate=_resign(r, dataclasses.replace(
                req.certificate, confirmations=req.certificate.confirmations[:1])),
            confirmations=())))
    assert r.sites["s0"].phase == Phase.FAILED


def test_site_refuses_a_forged_confirmation_or_missing_attestation(keys):
    r = _site_round(keys, Phase.UNMASK)
    req = _s0_input(r)
    c = next(c for c in req.all_confirmations() if c.sender != "s0")
    forged = dataclasses.replace(c, signature=b"").signed_by(MALLORY)
    with pytest.raises(ForgedMessage):
        r.sites["s0"].unmask(_resign(r, dataclasses.replace(
            req, confirmations=(), certificate=_resign(r, dataclasses.replace(
                req.certificate, confirmations=tuple(
                    forged if x is c else x for x in req.all_confirmations()))))))
    r = _site_round(keys, Phase.UNMASK)
    req = _s0_input(r)
    with pytest.raises(UnsafeRequest, match="attestation"):
        r.sites["s0"].unmask(_resign(r, dataclasses.replace(
            req, attestations=req.attestations[1:])))
    r = _site_round(keys, Phase.UNMASK)
    req = _s0_input(r)
    # s1 attests masking with fewer neighbours than survived: s0 keeps s1's self-mask share
    small = MaskAttestation(**r.head("s1"), masked_with=("s2",)).signed_by(r.idents["s1"])
    att = tuple(small if a.sender == "s1" else a for a in req.attestations)
    with pytest.raises(UnsafeRequest, match="'s1'"):
        r.sites["s0"].unmask(_resign(r, dataclasses.replace(req, attestations=att)))


def test_sites_shown_different_parameters_cannot_complete_a_round(keys):
    idents, _ = keys
    honest = RoundConfig.create("round-9", IDS, L, min_contributors=4, noise_threshold=4)
    weaker = RoundConfig.create("round-9", IDS, L, min_contributors=4, noise_threshold=2)
    public = {s: k.public_key for s, k in idents.items()}
    agg = AggregatorSession(honest, public)
    fooled = SiteSession(weaker, "s0", idents["s0"], public)   # told T = 2: larger shares
    with pytest.raises(WrongRound):
        agg.receive(fooled.advertise())
    with pytest.raises(ParameterError, match="noise_threshold"):
        RoundConfig.create("round-9", IDS, L, min_contributors=2, noise_threshold=3)
