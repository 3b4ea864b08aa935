"""The round's phases (docs/protocol.md): consent before anyone releases, participants fixed
when consent ends, every participant's release taken, refusals before the release phase
costing nothing, dropped participants listed, re-signed stale releases accepted, ListRounds."""

from __future__ import annotations

import json
import time

import grpc
import pytest

from dpfed.v1 import dpfed_pb2 as pb

from tests.conftest import random_statistics


def _code(call):
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def _wait_state(federation, round_id, states, timeout=10):
    end = time.monotonic() + timeout
    while True:
        status = federation.manager.status(round_id)
        if status.state in states or time.monotonic() > end:
            return status
        time.sleep(0.02)


def test_no_release_is_taken_during_consent(federation):
    federation.start_round(federation.spec(quorum=2), consent=False)
    assert federation.manager.status("r1").state == pb.RoundStatus.CONSENT
    code = _code(lambda: federation.stub.Contribute(
        federation.contribution("site-a", "r1", random_statistics())))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert federation.manager.store.contributions("r1") == []
    # Consent is recorded once; a repeat is idempotent.
    consent = federation.consent("site-a", "r1")
    federation.stub.SendPhase(consent)
    assert "already" in federation.stub.SendPhase(federation.consent("site-a", "r1")).message
    status = federation.manager.status("r1")
    assert list(status.consented) == ["site-a"] and status.state == pb.RoundStatus.CONSENT
    assert list(status.missing_sites) == ["site-b", "site-c"]


def test_every_participant_release_is_taken_beyond_the_quorum(federation):
    """Quorum 1 of 3: the round waits for all three participants (they consented, so they
    will release and debit); none is turned away because the quorum was already reached."""
    federation.start_round(federation.spec(quorum=1))
    replies = [federation.stub.Contribute(federation.contribution(s, "r1", random_statistics(seed=i)))
               for i, s in enumerate(federation.SITES)]
    assert all(r.accepted and not r.duplicate for r in replies)
    status = federation.coordinator.wait("r1", 60, poll_s=0.05)
    assert status.state == pb.RoundStatus.DONE, status.message
    assert [c.site_id for c in status.contributions] == list(federation.SITES)
    assert [p.phase for p in status.phases] == ["CONSENT", "RELEASE", "FITTING"]
    assert all(p.seconds > 0 for p in status.phases)
    summary = json.loads(federation.coordinator.result("r1").summary_json)
    assert [p["phase"] for p in summary["phases"]] == ["CONSENT", "RELEASE", "FITTING"]
    assert summary["dropped"] == []


def test_refusals_in_consent_fail_the_round_before_anyone_releases(federation):
    federation.start_round(federation.spec(quorum=2), consent=False)
    federation.stub.SendPhase(federation.consent("site-a", "r1"))
    federation.stub.Refuse(federation.refusal("site-b", "r1", "policy"))
    federation.stub.Refuse(federation.refusal("site-c", "r1", "budget"))
    status = federation.manager.status("r1")
    assert status.state == pb.RoundStatus.FAILED
    assert "no site released" in status.message
    assert federation.manager.store.contributions("r1") == []
    assert federation.manager.budgets.view("site-a").spent == 0
    # A consent-phase refusal cannot claim to have spent epsilon: nothing is drawn yet.
    federation.start_round(federation.spec(round_id="r2", quorum=1), consent=False)
    code = _code(lambda: federation.stub.Refuse(
        federation.refusal("site-a", "r2", "noisy n", epsilon_spent=2.0)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_consent_deadline_fixes_the_participants(federation):
    now = int(time.time() * 1000)
    federation.start_round(federation.spec(quorum=2, consent_deadline_unix_ms=now + 700),
                           consent=False)
    federation.stub.SendPhase(federation.consent("site-a", "r1"))
    federation.stub.SendPhase(federation.consent("site-b", "r1"))
    status = _wait_state(federation, "r1", (pb.RoundStatus.RELEASE, pb.RoundStatus.FAILED))
    assert status.state == pb.RoundStatus.RELEASE
    assert list(status.consented) == ["site-a", "site-b"]
    # site-c is too late: its consent and its release are refused; nothing is pushed to it.
    late = federation.consent("site-c", "r1")
    assert _code(lambda: federation.stub.SendPhase(late)) == grpc.StatusCode.FAILED_PRECONDITION
    assert _code(lambda: federation.stub.Contribute(federation.contribution(
        "site-c", "r1", random_statistics()))) == grpc.StatusCode.FAILED_PRECONDITION
    assert federation.manager.message_for_site("r1", "site-c") is None
    # The participants are pushed a release notice carrying the coordinator-signed spec.
    notice_env = federation.manager.message_for_site("r1", "site-a")
    assert notice_env.payload_type == "dpfed.v1.PhaseNotice" and not notice_env.signature
    notice = pb.PhaseNotice()
    from dpfed.wire.canonical import parse_canonical
    notice = parse_canonical(notice_env.payload, "dpfed.v1.PhaseNotice")
    assert notice.phase == "release" and list(notice.participants) == ["site-a", "site-b"]
    spec_env = pb.SignedEnvelope.FromString(notice.spec_envelope)
    assert spec_env.key_id == federation.coordinator_key.key_id
    for i, s in enumerate(["site-a", "site-b"]):
        federation.stub.Contribute(federation.contribution(s, "r1", random_statistics(seed=i)))
    assert federation.coordinator.wait("r1", 60, poll_s=0.05).state == pb.RoundStatus.DONE


def test_too_few_consents_by_the_deadline_fail_without_a_release(federation):
    now = int(time.time() * 1000)
    federation.start_round(federation.spec(quorum=2, consent_deadline_unix_ms=now + 500),
                           consent=False)
    federation.stub.SendPhase(federation.consent("site-a", "r1"))
    status = _wait_state(federation, "r1", (pb.RoundStatus.FAILED, pb.RoundStatus.RELEASE))
    assert status.state == pb.RoundStatus.FAILED
    assert "fewer than the quorum" in status.message and "site-b" in status.message
    assert federation.manager.message_for_site("r1", "site-a") is None


def test_a_participant_that_never_releases_is_listed_as_dropped(federation):
    federation.start_round(federation.spec(quorum=2, deadline_s=1.0))
    for i, s in enumerate(["site-a", "site-b"]):
        federation.stub.Contribute(federation.contribution(s, "r1", random_statistics(seed=i)))
    status = federation.coordinator.wait("r1", 60, poll_s=0.05)
    assert status.state == pb.RoundStatus.DONE, status.message
    assert list(status.dropped) == ["site-c"]
    summary = json.loads(federation.coordinator.result("r1").summary_json)
    assert summary["dropped"] == ["site-c"]


def test_a_resigned_release_is_a_duplicate_and_a_different_one_is_refused(federation):
    federation.start_round(federation.spec(quorum=2, sites=["site-a", "site-b"]))
    stats = random_statistics(seed=4)
    first = federation.contribution("site-a", "r1", stats)
    assert federation.stub.Contribute(first).accepted
    # Same statistics, fresh timestamp and nonce (what SiteNode.fresh_envelope sends).
    resigned = federation.contribution("site-a", "r1", stats)
    assert resigned.payload != first.payload
    reply = federation.stub.Contribute(resigned)
    assert reply.accepted and reply.duplicate
    other = federation.contribution("site-a", "r1", random_statistics(seed=5))
    assert _code(lambda: federation.stub.Contribute(other)) == grpc.StatusCode.ALREADY_EXISTS


def test_restart_in_consent_keeps_consents_and_the_consent_deadline(federation):
    now = int(time.time() * 1000)
    federation.start_round(federation.spec(quorum=1, consent_deadline_unix_ms=now + 1500),
                           consent=False)
    federation.stub.SendPhase(federation.consent("site-b", "r1"))
    federation.stop()
    federation.start()
    status = federation.manager.status("r1")
    assert status.state == pb.RoundStatus.CONSENT and list(status.consented) == ["site-b"]
    status = _wait_state(federation, "r1", (pb.RoundStatus.RELEASE, pb.RoundStatus.FAILED))
    assert status.state == pb.RoundStatus.RELEASE
    assert federation.manager.message_for_site("r1", "site-b").payload_type.endswith("PhaseNotice")
    federation.stub.Contribute(federation.contribution("site-b", "r1", random_statistics()))
    assert federation.coordinator.wait("r1", 60, poll_s=0.05).state == pb.RoundStatus.DONE


def test_list_rounds_newest_first_with_paging(federation):
    for i in range(5):
        federation.start_round(federation.spec(round_id=f"r{i}", quorum=1), consent=False)
        time.sleep(0.005)
    reply = federation.coordinator.list_rounds(limit=3)
    assert [r.round_id for r in reply.rounds] == ["r4", "r3", "r2"]
    assert all(r.state == pb.RoundStatus.CONSENT and r.invited == 3 for r in reply.rounds)
    more = federation.coordinator.list_rounds(limit=3, before="r2")
    assert [r.round_id for r in more.rounds] == ["r1", "r0"]
    assert _code(lambda: federation.coordinator.list_rounds(before="nope")) == \
        grpc.StatusCode.NOT_FOUND


def test_round_toml_consent_s_sets_the_consent_deadline():
    from coordinator.roundspec import RoundSpecError, build_round_spec
    base = {"target": "y", "features": ["a", "b"], "epsilon": 1.0, "x_bound": 1.0,
            "y_bound": 1.0, "deadline_s": 600, "sites": ["s1"]}
    spec = build_round_spec({**base, "consent_s": 30}, now_ms=1_000_000)
    assert spec.consent_deadline_unix_ms == 1_030_000
    assert build_round_spec(base, now_ms=1_000_000).consent_deadline_unix_ms == 0
    for bad in (0, -1, 600, 900):
        with pytest.raises(RoundSpecError):
            build_round_spec({**base, "consent_s": bad}, now_ms=1_000_000)
