"""The isolation attack of issue 19 against the production site path (SiteNode: consent,
policy, ledger debit, SecureSite) over real gRPC.

A real aggregator runs the round up to the confirm step; the test then plays the aggregator
that lies: it rewrites each site's pushed "confirm" notice (what the aggregator decides each
site sees) to the survivor lists of the attack, signed with the aggregator's own identity key
(a lying aggregator signs its lies: the signature is evidence, not a consistency check), and
hands them to the real SiteNodes. Before
issue 19 every honest site answered the unmask requests of this attack and one site's input
came out with a 1/T share of its noise (docs/secure_aggregation.md, "A lying aggregator")."""

from __future__ import annotations

import dataclasses
import logging

from dpfed.secagg.messages import SurvivorList, parse
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import canonical_bytes, parse_canonical
from tests.secure_federation import EPSILON, SecureFed, SiteDriver, notice_phase, wait_state


def _rewritten(notice_envelope: pb.SignedEnvelope, survivors, key) -> pb.SignedEnvelope:
    notice = parse_canonical(notice_envelope.payload, "dpfed.v1.PhaseNotice")
    genuine = parse(notice.body)
    assert isinstance(genuine, SurvivorList)
    notice.body = dataclasses.replace(genuine, survivors=tuple(sorted(survivors))
                                      ).signed_by(key).to_bytes()
    return pb.SignedEnvelope(payload=canonical_bytes(notice),
                             payload_type=notice_envelope.payload_type)


def test_isolation_attack_on_real_sites_reveals_nothing_and_says_why(tmp_path, caplog):
    fed = SecureFed(tmp_path, 5)
    fed.start_aggregator()
    drivers = {}
    try:
        drivers = {s: SiteDriver(fed, s) for s in fed.sites}
        fed.coordinator().start_round(fed.spec(t=3, quorum=3, deadline_s=30))
        for phase in ("consent", "keys", "share_keys", "release"):
            for d in drivers.values():
                got, answer, _ = d.step()
                assert got == phase and answer.payload_type != "dpfed.v1.Refusal"
        pushed = {s: d.next() for s, d in drivers.items()}
        assert {notice_phase(p) for p in pushed.values()} == {"confirm"}
        u = fed.sites[0]
        views = {u: {u}} | {w: {u, w} for w in fed.sites[1:]}
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="site_node.secure"):
            answers = {s: drivers[s].answer(_rewritten(pushed[s], views[s], fed.aggregator_key))
                       for s in fed.sites}
        # No site signed a lying survivor set, so no unmask request can ever be answered;
        # each says why in its own log (the aggregator gets no refusal: the sites released).
        assert answers == {s: None for s in fed.sites}
        reasons = [r.getMessage() for r in caplog.records]
        assert len(reasons) == 5 and all("TooFewSurvivors" in r for r in reasons), reasons
        # The genuine notice is refused too now: a site signs one survivor set per round.
        assert drivers[u].answer(pushed[u]) is None
        # Each site released once and is accounted for: the attack cost no extra budget.
        for s in fed.sites:
            ledger = fed.node(s).ledger
            assert ledger.spent == EPSILON and ledger.get_release("sec-1") is not None
        status = wait_state(fed.manager, "sec-1", (pb.RoundStatus.FAILED,), 40)
        assert status.state == pb.RoundStatus.FAILED
        assert "confirm step ended" in status.message, status.message
    finally:
        for d in drivers.values():
            d.close()
        fed.stop()


def test_later_notices_name_the_spec_by_digest_and_another_digest_is_ignored(tmp_path):
    """After "keys" a notice carries the spec's digest, not the ~100 kB spec: the site answers
    only for the spec it verified at "keys"; a notice naming another spec gets nothing."""
    fed = SecureFed(tmp_path, 3)
    fed.start_aggregator()
    drivers = {}
    try:
        drivers = {s: SiteDriver(fed, s) for s in fed.sites}
        fed.coordinator().start_round(fed.spec(t=2, quorum=2, deadline_s=30))
        for phase in ("consent", "keys"):
            for d in drivers.values():
                assert d.step()[0] == phase
        pushed = drivers["site-a"].next()
        notice = parse_canonical(pushed.payload, "dpfed.v1.PhaseNotice")
        assert notice.phase == "share_keys" and not notice.spec_envelope
        assert notice.spec_digest == fed.manager.status("sec-1").spec_digest
        notice.spec_digest = "0" * 64
        other = pb.SignedEnvelope(payload=canonical_bytes(notice),
                                  payload_type=pushed.payload_type)
        assert drivers["site-a"].answer(other) is None
        answer = drivers["site-a"].answer(pushed)
        assert answer is not None and answer.payload_type == "dpfed.v1.PhaseMessage"
    finally:
        for d in drivers.values():
            d.close()
        fed.stop()
