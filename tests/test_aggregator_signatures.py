"""The aggregator's signature on its secure-aggregation messages (issue 19, item 7), end to end
over real gRPC with real SiteNodes (tests/secure_federation.py).

The aggregator signs every secagg message it sends with its identity key (aggregator.toml
``signing_key``; the CA issues it in the aggregator's kit). The coordinator pins that key's id
in the signed spec from its own record (``aggregator_key_id``); the "keys" notice relays the
public key, a site refuses the round when it is not the pinned one (before advertising
anything), and from then on refuses every notice body that does not carry the aggregator's
valid signature. Checked here: an unsigned and a wrongly signed (another key) aggregator message
in every later step is refused by a real SiteNode (the test rewrites the pushed notice's body,
as tests/test_secure_round_lying.py does); a keys notice relaying another aggregator key, or
none, or a spec that pins none, is refused; an aggregator without a signing key (or with
another than the spec pins) refuses a secure StartRound, and one restarted without its key
fails its open secure round saying why. The coordinator's side is in
tests/test_coordinator_pins.py.
"""

from __future__ import annotations

import dataclasses
import logging

import grpc
import pytest

from dpfed import secure_round
from dpfed.secagg.messages import AGGREGATOR, parse
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import canonical_bytes, parse_canonical
from dpfed.wire.signing import SigningKey, key_id
from site_node import secure as site_secure
from tests.secure_federation import EPSILON, SecureFed, SiteDriver, notice_phase, wait_state

ORDER = ["consent", "keys", "share_keys", "release", "confirm", "unmask"]


@pytest.fixture
def fed(tmp_path):
    f = SecureFed(tmp_path, 4)
    f.start_aggregator()
    drivers = {}
    f.drivers = drivers
    yield f
    for d in drivers.values():
        d.close()
    f.stop()


def _start(fed, upto: str) -> dict[str, pb.SignedEnvelope]:
    """Start a round (K = 4, T = 2), answer every step before ``upto`` for every site, and
    return each site's pushed ``upto`` notice, unanswered."""
    fed.drivers.update({s: SiteDriver(fed, s) for s in fed.sites})
    fed.coordinator().start_round(fed.spec(t=2, quorum=2, deadline_s=60))
    for phase in ORDER[:ORDER.index(upto)]:
        for d in fed.drivers.values():
            got, answer, _ = d.step()
            assert got == phase and answer.payload_type != "dpfed.v1.Refusal"
    pushed = {s: d.next() for s, d in fed.drivers.items()}
    assert {notice_phase(p) for p in pushed.values()} == {upto}
    return pushed


def _with_body(envelope: pb.SignedEnvelope, body: bytes = None, **fields) -> pb.SignedEnvelope:
    """The pushed notice ``envelope`` with another body (or other fields): what an aggregator,
    or anyone on its side of the TLS channel, could push instead."""
    notice = parse_canonical(envelope.payload, "dpfed.v1.PhaseNotice")
    if body is not None:
        notice.body = body
    for name, value in fields.items():
        setattr(notice, name, value)
    return pb.SignedEnvelope(payload=canonical_bytes(notice), payload_type=envelope.payload_type)


def _reason(answer: pb.SignedEnvelope) -> str:
    assert answer is not None and answer.payload_type == "dpfed.v1.Refusal", answer
    return parse_canonical(answer.payload, answer.payload_type).reason


@pytest.mark.parametrize("forgery", ["unsigned", "another key"])
@pytest.mark.parametrize("step", ["share_keys", "release", "confirm", "unmask"])
def test_an_aggregator_message_without_its_valid_signature_is_refused_by_the_site(
        fed, step, forgery, caplog):
    """site-a's pushed notice of ``step`` carries the genuine secagg message with its
    signature removed, or re-signed by another key than the pinned aggregator key. Before its
    release the site refuses the round (nothing drawn, nothing debited); after it, it answers
    nothing and says why in its own log, and the genuine, signed notice is still answered."""
    pushed = _start(fed, step)
    site = "site-a"
    genuine = parse(parse_canonical(pushed[site].payload, "dpfed.v1.PhaseNotice").body)
    assert genuine.sender == AGGREGATOR
    genuine.verify(fed.aggregator_key.public_key)      # the aggregator signs what it sends
    forged = dataclasses.replace(genuine, signature=b"") if forgery == "unsigned" else \
        genuine.signed_by(SigningKey.generate())
    driver = fed.drivers[site]
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="site_node.secure"):
        answer = driver.answer(_with_body(pushed[site], forged.to_bytes()))
    if step in ("share_keys", "release"):
        assert "ForgedMessage" in _reason(answer)
        assert fed.node(site).ledger.spent == 0 and fed.node(site).ledger.releases() == []
        return
    assert answer is None
    assert any("ForgedMessage" in r.getMessage() for r in caplog.records), caplog.text
    assert fed.node(site).ledger.spent == pytest.approx(EPSILON)   # released once, before
    answer = driver.answer(pushed[site])
    assert answer is not None and answer.payload_type == "dpfed.v1.PhaseMessage"


def test_the_keys_notice_relays_the_pinned_aggregator_key_and_a_site_refuses_another(fed):
    """The genuine keys notice relays the aggregator's key under its secagg sender id, the
    key the coordinator pinned. Another aggregator key, or none, is refused before the site
    advertises anything (fixed reasons); the genuine notice is still answered."""
    pushed = _start(fed, "keys")
    spec = fed.manager.context.rounds["sec-1"].spec
    assert spec.aggregator_key_id == fed.aggregator_key.key_id
    site, driver = "site-a", fed.drivers["site-a"]
    notice = parse_canonical(pushed[site].payload, "dpfed.v1.PhaseNotice")
    keys = secure_round.decode_keys(notice.body)
    assert key_id(keys[AGGREGATOR]) == spec.aggregator_key_id
    substituted = secure_round.encode_keys({**keys, AGGREGATOR: SigningKey.generate().public_key})
    assert _reason(driver.answer(_with_body(pushed[site], substituted))) == \
        site_secure.WRONG_AGGREGATOR_KEY
    missing = secure_round.encode_keys({s: k for s, k in keys.items() if s != AGGREGATOR})
    assert _reason(driver.answer(_with_body(pushed[site], missing))) == \
        site_secure.NO_AGGREGATOR_KEY
    # A spec (validly signed by the coordinator) that pins no aggregator key: refused too.
    unpinned = pb.RoundSpec()
    unpinned.CopyFrom(spec)
    unpinned.aggregator_key_id = ""
    envelope = fed.coordinator_key.sign(unpinned).SerializeToString()
    assert _reason(driver.answer(_with_body(pushed[site], spec_envelope=envelope))) == \
        site_secure.NO_AGGREGATOR_PIN
    assert fed.node(site).ledger.spent == 0
    answer = driver.answer(pushed[site])
    assert answer.payload_type == "dpfed.v1.PhaseMessage"
    assert parse_canonical(answer.payload, answer.payload_type).phase == "advertise"


def test_an_aggregator_without_a_signing_key_refuses_secure_rounds(tmp_path):
    """No signing_key in aggregator.toml: StartRound of a secure spec is refused with the
    reason (FAILED_PRECONDITION), nothing is stored; an independent round still starts. With
    a key, a spec pinning another aggregator key is refused (INVALID_ARGUMENT)."""
    fed = SecureFed(tmp_path, 3)
    fed.raw.pop("signing_key")
    fed.start_aggregator()
    try:
        with fed.coordinator() as coordinator:
            with pytest.raises(grpc.RpcError) as info:
                coordinator.start_round(fed.spec(t=2, quorum=2))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "no signing key (signing_key in aggregator.toml)" in info.value.details()
            assert fed.manager.list_rounds(0, "").rounds == []
            independent = fed.spec(round_id="indep", aggregation="", noise_threshold=0,
                                   max_site_rows=0, sites=[])
            assert coordinator.start_round(independent).round_id == "indep"
    finally:
        fed.stop()
    (tmp_path / "with-key").mkdir()
    fed = SecureFed(tmp_path / "with-key", 3)
    fed.start_aggregator()
    try:
        with fed.coordinator() as coordinator:
            coordinator.aggregator_record = SigningKey.generate().key_id
            with pytest.raises(grpc.RpcError) as info:
                coordinator.start_round(fed.spec(t=2, quorum=2))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"this aggregator signs with key {fed.aggregator_key.key_id}" in \
                info.value.details()
    finally:
        fed.stop()


def test_an_aggregator_restarted_without_its_key_fails_the_open_secure_round(fed):
    """The round is in KEYS; the aggregator restarts without signing_key: the session cannot
    be rebuilt (it could not sign), so the round fails saying why; nobody drew anything."""
    _start(fed, "keys")
    fed.server.stop(0)
    fed.raw.pop("signing_key")
    fed.start_aggregator()
    status = wait_state(fed.manager, "sec-1", (pb.RoundStatus.FAILED,), 10)
    assert status.state == pb.RoundStatus.FAILED
    assert "no signing key" in status.message, status.message
    for s in fed.sites:
        assert fed.node(s).ledger.spent == 0


def test_a_finished_round_s_sum_is_rebuilt_without_the_key(fed):
    """A secure round that finished is read back after a restart without signing_key: its
    sum is rebuilt by replay, which sends nothing, so it needs no key."""
    fed.start_clients()
    fed.coordinator().start_round(fed.spec(t=2, quorum=2))
    status = wait_state(fed.manager, "sec-1", (pb.RoundStatus.DONE, pb.RoundStatus.FAILED), 30)
    assert status.state == pb.RoundStatus.DONE, status.message
    before = fed.manager.aggregated_statistics("sec-1")
    fed.stop()
    fed.raw.pop("signing_key")
    fed.start_aggregator()
    after = fed.manager.aggregated_statistics("sec-1")
    assert after.n == before.n and (after.xtx == before.xtx).all()


def test_aggregator_config_signing_key(tmp_path):
    """aggregator.toml signing_key: a path relative to the file; a missing file, a file that
    is not an Ed25519 private key, or a misspelt key are configuration errors (exit 2)."""
    from aggregator.config import ConfigError, config_from_dict
    from aggregator.server import AggregatorServer

    fed = SecureFed(tmp_path, 2)
    config = config_from_dict(fed.raw, tmp_path)
    assert config.signing_key == tmp_path / "aggregator.key"
    assert config_from_dict({k: v for k, v in fed.raw.items() if k != "signing_key"},
                            tmp_path).signing_key is None
    with pytest.raises(ConfigError, match="does not exist"):
        config_from_dict({**fed.raw, "signing_key": "nowhere.key"}, tmp_path)
    with pytest.raises(ConfigError, match="signing_key must be the path"):
        config_from_dict({**fed.raw, "signing_key": 3}, tmp_path)
    with pytest.raises(ConfigError, match=r"did you mean 'signing_key'"):
        config_from_dict({**fed.raw, "signing_keys": "aggregator.key"}, tmp_path)
    (tmp_path / "not-a-key.key").write_text("hello")
    with pytest.raises(ConfigError, match="not an Ed25519 private key"):
        AggregatorServer(config_from_dict({**fed.raw, "signing_key": "not-a-key.key"}, tmp_path))
    assert AggregatorServer(config).signing_key.key_id == fed.aggregator_key.key_id
