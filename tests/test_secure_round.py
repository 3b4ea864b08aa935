"""Secure aggregation as a round mode, end to end over real gRPC (docs/protocol.md, "Secure
rounds"): a real aggregator server, real SiteNode objects with their own data, keys and
ledgers, and real SiteClient threads or a step-by-step driver of the sites.

Checked: the round finishes and the unmasked sum is exactly the sum of the sites' fixed-point
statistics plus their noise shares; the aggregator never stores or logs an unmasked site
vector; K - t dropouts after key agreement still give the sum and one more fails cleanly;
forged, replayed and out-of-phase SendPhase messages are rejected at the RPC level in every
step; sites that drop before their release spent nothing, and every ledger equals what the
aggregator recorded as released.
"""

from __future__ import annotations

import json
import logging
import time

import grpc
import numpy as np
import pytest

from dpfed.secagg import fixedpoint as fp
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import parse_canonical
from site_node.ledger import PrivacyLedger
from tests.secure_federation import EPSILON, SecureFed, SiteDriver, notice_phase, wait_state

FINAL = (pb.RoundStatus.DONE, pb.RoundStatus.FAILED)


@pytest.fixture
def fed(tmp_path):
    f = SecureFed(tmp_path, 4)
    f.start_aggregator()
    yield f
    f.stop()


def _record_inputs(fed, sites):
    """Install the test hook of each site: (encoded statistics, input) per round."""
    seen = {}
    for s in sites:
        def hook(round_id, encoded, vector, s=s):
            seen[s] = (np.array(encoded, dtype=np.uint64), np.array(vector, dtype=np.uint64))
        fed.node(s).secure.on_release = hook
    return seen


def _spent(fed, site):
    with PrivacyLedger(fed.ledger_path(site)) as ledger:
        return ledger.spent, [r.round_id for r in ledger.releases()]


def test_secure_round_over_grpc_sums_exactly_the_sites_inputs(fed, caplog):
    caplog.set_level(logging.DEBUG)
    seen = _record_inputs(fed, fed.sites)
    fed.start_clients()
    coordinator = fed.coordinator()
    spec = fed.spec(t=3, quorum=3)
    coordinator.start_round(spec)
    status = coordinator.wait("sec-1", 40, poll_s=0.05)
    assert status.state == pb.RoundStatus.DONE, status.message
    assert [p.phase for p in status.phases] == ["CONSENT", "KEYS", "RELEASE", "UNMASK",
                                                "FITTING"]
    assert all(p.seconds > 0 for p in status.phases)
    assert sorted(seen) == fed.sites and list(status.dropped) == []
    live = fed.manager.context.rounds["sec-1"]
    result = live.session.result
    assert result.included == tuple(fed.sites)
    # The unmasked sum is exactly the sum of the sites' inputs (statistics + noise shares).
    expected = fp.wrap_sum([x for _, x in seen.values()])
    assert np.array_equal(result.vector, expected)
    # ... and its noise-free part is the sum of the sites' fixed-point statistics.
    calibration = live.secure.calibration
    noise = fp.to_signed(expected - fp.wrap_sum([e for e, _ in seen.values()]))
    assert np.any(noise != 0)
    # Each share is ~1/T of a DL draw; the sum's noise is a few grid scales, not more.
    assert np.all(np.abs(noise) < 60 * calibration.noise_vector + 1)
    upper, n = calibration.decode(expected)
    total = fed.manager.aggregated_statistics("sec-1")
    np.testing.assert_array_equal(total.upper_values(), upper)
    assert total.n == max(0, int(n))
    # The posterior knows the sum holds C = 4 shares of 1/T = 3: 4/3 of one draw.
    assert total.noise.draws("xty") == 4 and total.noise.xty[0].share == 3
    assert total.noise.full_draws("xty") == pytest.approx(4 / 3)
    summary = json.loads(coordinator.result("sec-1").summary_json)
    assert "4 shares of 1/3 draw" in summary["noise"] and summary["aggregation"] == "secure"
    assert summary["n_total"] == total.n and all(r["n"] == 0 for r in summary["sites"])
    # Every ledger equals what the aggregator recorded as released.
    for s in fed.sites:
        spent, rounds = _spent(fed, s)
        assert spent == pytest.approx(EPSILON) and rounds == ["sec-1"]
        assert fed.manager.budgets.view(s).spent == pytest.approx(EPSILON)
    # Nothing the aggregator stored or logged is an unmasked site vector.
    _assert_no_site_vector_stored(fed, "sec-1", seen)
    text = "\n".join(r.getMessage() for r in caplog.records
                     if r.name.startswith(("aggregator", "dpfed")))
    assert "sec-1" in text   # the aggregator's records were captured
    for encoded, x in seen.values():
        for vector in (encoded, x):
            big = [str(int(v)) for v in vector if 10 ** 6 < int(v) < 2 ** 63][:8]
            assert big and not any(b in text for b in big)


def _assert_no_site_vector_stored(fed, round_id, seen):
    """No blob in the aggregator's store contains any site's input or statistics vector (as
    uint64 bytes), nor a long run of them."""
    import sqlite3
    db = sqlite3.connect(fed.manager.store.path)
    blobs = []
    for table in ("contributions", "phase_messages", "consents", "rounds", "results",
                  "refusals"):
        for row in db.execute(f"SELECT * FROM {table}"):
            blobs += [v if isinstance(v, bytes) else str(v).encode() for v in row]
    db.close()
    everything = b"\n".join(blobs)
    for encoded, x in seen.values():
        for vector in (encoded, x):
            raw = np.asarray(vector, dtype="<u8").tobytes()
            assert raw[:64] not in everything
            import base64
            assert base64.b64encode(raw[:48]) not in everything


def _drivers(fed, sites=None):
    return {s: SiteDriver(fed, s) for s in (sites or fed.sites)}


def _through_keys(drivers):
    """Every driver consents, advertises and shares keys (in step order)."""
    for phase in ("consent", "keys", "share_keys"):
        for d in drivers.values():
            got, answer, _ = d.step()
            assert got == phase and answer.payload_type != "dpfed.v1.Refusal", (
                d.site, got, parse_canonical(answer.payload, answer.payload_type))


@pytest.mark.parametrize("drop", [2, 3])
def test_k_minus_t_dropouts_after_keys_still_give_the_sum_one_more_fails(tmp_path, drop):
    """K = 5, T = 2: the complete graph's Shamir threshold is t = 3, so K - t = 2 sites may drop
    out after key agreement; with 3 the round fails cleanly at the end of the release step.
    Sites that dropped before releasing spent nothing; every ledger equals what the
    aggregator recorded."""
    fed = SecureFed(tmp_path, 5)
    fed.start_aggregator()
    try:
        seen = _record_inputs(fed, fed.sites)
        drivers = _drivers(fed)
        coordinator = fed.coordinator()
        coordinator.start_round(fed.spec(t=2, quorum=2, deadline_s=8))
        _through_keys(drivers)
        live = fed.manager.context.rounds["sec-1"]
        assert live.secure.config.threshold == 3
        dropped = fed.sites[:drop]
        survivors = fed.sites[drop:]
        for s in survivors:
            got, answer, reply = drivers[s].step()
            assert got == "release" and reply.accepted
        if drop == 2:
            status = wait_state(fed.manager, "sec-1", (pb.RoundStatus.UNMASK,) + FINAL, 15)
            assert status.state == pb.RoundStatus.UNMASK, status.message
            for phase in ("confirm", "unmask"):
                for s in survivors:
                    got, _, ack = drivers[s].step()
                    assert got == phase and "recorded" in ack.message
            status = wait_state(fed.manager, "sec-1", FINAL, 15)
            assert status.state == pb.RoundStatus.DONE, status.message
            assert sorted(status.dropped) == dropped
            result = live.session.result
            assert result.included == tuple(survivors) and result.dropped == tuple(dropped)
            # The sum of the survivors' inputs, exactly: the dropouts' masks were removed.
            assert np.array_equal(result.vector, fp.wrap_sum([seen[s][1] for s in survivors]))
            assert sorted(seen) == survivors
        else:
            status = wait_state(fed.manager, "sec-1", FINAL, 15)
            assert status.state == pb.RoundStatus.FAILED
            assert "2 masked inputs < 3" in status.message, status.message
            assert "2 site(s) released and are accounted for" in status.message
        for s in dropped:   # dropped before the release: nothing debited, nothing stored
            assert _spent(fed, s) == (0.0, [])
            assert fed.manager.budgets.view(s).spent == 0
        for s in survivors:
            assert _spent(fed, s) == (pytest.approx(EPSILON), ["sec-1"])
            assert fed.manager.budgets.view(s).spent == pytest.approx(EPSILON)
        held = {c.site_id for c in fed.manager.store.contributions("sec-1")}
        assert held == set(survivors)
        for d in drivers.values():
            d.close()
    finally:
        fed.stop()


def test_a_round_that_fails_before_its_release_step_costs_no_site_anything(tmp_path):
    """K = 3, T = 2 (t = 2): two sites advertise but never share keys; the key step fails
    the round. No site drew noise that left it, none debited, nothing is recorded."""
    fed = SecureFed(tmp_path, 3)
    fed.start_aggregator()
    try:
        drivers = _drivers(fed)
        coordinator = fed.coordinator()
        coordinator.start_round(fed.spec(t=2, quorum=2, deadline_s=6))
        for phase in ("consent", "keys"):
            for d in drivers.values():
                assert d.step()[0] == phase
        assert drivers["site-a"].step()[0] == "share_keys"   # one site shares; two vanish
        status = wait_state(fed.manager, "sec-1", FINAL, 15)
        assert status.state == pb.RoundStatus.FAILED
        assert "share_keys step ended" in status.message and "no site released" in status.message
        for s in fed.sites:
            assert _spent(fed, s) == (0.0, [])
            assert fed.manager.budgets.view(s).spent == 0
        assert fed.manager.store.contributions("sec-1") == []
        for d in drivers.values():
            d.close()
    finally:
        fed.stop()


def _code(call):
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def _resigned(fed, envelope, key=None, **changes):
    """``envelope``'s message with ``changes`` and a fresh nonce, signed by ``key`` (default:
    the sender's own key)."""
    import secrets
    msg = parse_canonical(envelope.payload, envelope.payload_type)
    msg.nonce = secrets.token_hex(16)
    msg.timestamp_unix_ms = int(time.time() * 1000)
    for k, v in changes.items():
        setattr(msg, k, v)
    return (key or fed.site_keys[msg.site_id]).sign(msg)


def _tampered(body: bytes, key) -> bytes:
    """The secagg message ``body`` with its signature replaced by ``key``'s (not its
    sender's): it parses, names its sender, and fails signature verification."""
    import dataclasses

    from dpfed.secagg.keys import sign
    from dpfed.secagg.messages import parse
    msg = parse(body)
    return dataclasses.replace(msg, signature=sign(key, msg.signed_bytes())).to_bytes()


def test_forged_replayed_and_out_of_phase_messages_are_rejected_in_every_step(fed):
    from dpfed.wire.signing import SigningKey
    drivers = _drivers(fed, fed.sites[:3])
    coordinator = fed.coordinator()
    coordinator.start_round(fed.spec(t=2, quorum=2, sites=fed.sites[:3], deadline_s=30))
    stub = drivers["site-a"].stub
    for d in drivers.values():
        assert d.step()[0] == "consent"
    stranger = SigningKey.generate()

    def attacks(step, legit, other, earlier):
        """``legit``: site-a's answer for ``step``, unsent; ``other``: site-b's, unsent;
        ``earlier``: an answer of site-a to an earlier step (already taken)."""
        send = stub.Contribute if legit.payload_type.endswith("Contribution") else stub.SendPhase
        field = "masked" if send == stub.Contribute else "body"
        body = getattr(parse_canonical(legit.payload, legit.payload_type), field)
        other_body = getattr(parse_canonical(other.payload, other.payload_type), field)
        # Forged: an unregistered key, another site's key, a tampered secagg message, another
        # site's secagg message under this site's envelope.
        assert _code(lambda: send(_resigned(fed, legit, key=stranger))) == \
            grpc.StatusCode.UNAUTHENTICATED
        assert _code(lambda: send(_resigned(fed, legit, key=fed.site_keys["site-b"]))) == \
            grpc.StatusCode.PERMISSION_DENIED
        assert _code(lambda: send(_resigned(fed, legit, **{field: _tampered(body, stranger)}))) == \
            grpc.StatusCode.UNAUTHENTICATED
        assert _code(lambda: send(_resigned(fed, legit, **{field: other_body}))) == \
            grpc.StatusCode.PERMISSION_DENIED
        # Out of phase: an earlier step's message again, and every other step's phase.
        if earlier is not None:
            assert _code(lambda: stub.SendPhase(_resigned(fed, earlier))) == \
                grpc.StatusCode.FAILED_PRECONDITION
        for phase in ("advertise", "share_keys", "confirm", "unmask"):
            if phase != step:
                fake = fed.site_keys["site-a"].sign(pb.PhaseMessage(
                    round_id="sec-1", site_id="site-a", phase=phase, body=body,
                    spec_digest=fed.manager.status("sec-1").spec_digest,
                    timestamp_unix_ms=int(time.time() * 1000), nonce="%032x" % hash(phase)
                    .__abs__()))
                assert _code(lambda: stub.SendPhase(fake)) == grpc.StatusCode.FAILED_PRECONDITION
        if step != "release":
            masked = fed.site_keys["site-a"].sign(pb.Contribution(
                round_id="sec-1", site_id="site-a", masked=b"x" * 64, epsilon_spent=EPSILON,
                spec_digest=fed.manager.status("sec-1").spec_digest,
                timestamp_unix_ms=int(time.time() * 1000), nonce="ab" * 16))
            assert _code(lambda: stub.Contribute(masked)) == grpc.StatusCode.FAILED_PRECONDITION
        # Another round: same body under a round id / spec digest the aggregator does not run.
        assert _code(lambda: send(_resigned(fed, legit, round_id="sec-2"))) == \
            grpc.StatusCode.FAILED_PRECONDITION
        assert _code(lambda: send(_resigned(fed, legit, spec_digest="0" * 64))) == \
            grpc.StatusCode.FAILED_PRECONDITION
        # The legitimate message is taken; its replay (and a re-signed copy) is not.
        reply = send(legit)
        if send == stub.Contribute:
            assert reply.accepted and not reply.duplicate
            assert send(legit).duplicate       # the same release resent: idempotent
            assert _code(lambda: send(_resigned(fed, legit, **{field: other_body}))) in (
                grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ALREADY_EXISTS)
        else:
            assert _code(lambda: send(legit)) == grpc.StatusCode.ALREADY_EXISTS
            assert _code(lambda: send(_resigned(fed, legit))) == grpc.StatusCode.ALREADY_EXISTS

    earlier = None
    for step in ("keys", "share_keys", "release", "confirm", "unmask"):
        pushed = {s: d.next() for s, d in drivers.items()}
        assert {notice_phase(p) for p in pushed.values()} == {step}
        answers = {s: drivers[s].answer(p) for s, p in pushed.items()}
        attacks({"keys": "advertise"}.get(step, step), answers["site-a"], answers["site-b"],
                earlier)
        drivers["site-b"].send(answers["site-b"])
        if step == "unmask":
            # t = 2 shares of every secret arrived with site-b's answer: the round unmasked
            # and closed at once; a late answer is out of phase (and costs nothing).
            assert _code(lambda: drivers["site-c"].send(answers["site-c"])) == \
                grpc.StatusCode.FAILED_PRECONDITION
        else:
            drivers["site-c"].send(answers["site-c"])
        if step != "release":
            earlier = answers["site-a"]
        wanted = {"keys": pb.RoundStatus.KEYS, "share_keys": pb.RoundStatus.RELEASE,
                  "release": pb.RoundStatus.UNMASK, "confirm": pb.RoundStatus.UNMASK,
                  "unmask": pb.RoundStatus.DONE}[step]
        if step == "keys":
            continue   # still KEYS (share_keys next)
        status = wait_state(fed.manager, "sec-1", (wanted, pb.RoundStatus.FAILED), 10)
        assert status.state == wanted, status.message
    # Nothing rejected changed anything: every site is in the sum, each ledger holds one
    # release, and the aggregator recorded exactly those.
    assert fed.manager.context.rounds["sec-1"].session.result.included == tuple(fed.sites[:3])
    for s in fed.sites[:3]:
        assert _spent(fed, s) == (pytest.approx(EPSILON), ["sec-1"])
    for d in drivers.values():
        d.close()


@pytest.mark.parametrize("restart_in", ["advertise", "share_keys", "release", "confirm",
                                        "unmask"])
def test_aggregator_restart_in_every_step_rebuilds_the_session_by_replay(tmp_path, restart_in):
    """The aggregator (in this process) stops after half the sites answered a step and starts
    again on the same store: the secagg session is rebuilt from the stored messages, the
    sites still waited for are pushed the same notice again, and the round finishes with the
    exact sum; nothing is lost or counted twice (K = 4, T = 2)."""
    fed = SecureFed(tmp_path, 4)
    fed.start_aggregator()
    try:
        seen = _record_inputs(fed, fed.sites)
        drivers = _drivers(fed)
        fed.coordinator().start_round(fed.spec(t=2, quorum=2, deadline_s=60))
        order = ["consent", "keys", "share_keys", "release", "confirm", "unmask"]
        notice_of = {"advertise": "keys"}.get(restart_in, restart_in)
        for phase in order[:order.index(notice_of)]:
            for d in drivers.values():
                assert d.step()[0] == phase
        pushed = {s: d.next() for s, d in drivers.items()}
        assert {notice_phase(p) for p in pushed.values()} == {notice_of}
        before = {s: drivers[s].answer(p) for s, p in pushed.items()}
        for s in fed.sites[:2]:
            drivers[s].send(before[s])
        fed.server.stop(0)
        fed.start_aggregator()
        live = fed.manager.context.rounds["sec-1"]
        assert live.step == restart_in and sorted(live.answers or live.contributions) == \
            fed.sites[:2]
        for d in drivers.values():
            d.reconnect(fed.address)
        # Only the sites that had not answered are pushed the step's notice again; theirs is
        # the same message as before the restart (the session's outputs are deterministic).
        again = {}
        for s in fed.sites[2:]:
            again[s] = drivers[s].next()
            assert again[s].payload == pushed[s].payload
        for s in fed.sites[:2]:
            with pytest.raises(Exception):
                drivers[s].next(timeout=0.3)
        # A site asked again for a step it already answered (its answer never arrived) gives
        # the same answer: the same secagg body, or the same stored release.
        for s in fed.sites[2:]:
            answer = drivers[s].answer(again[s])
            field = "masked" if restart_in == "release" else "body"
            assert getattr(parse_canonical(answer.payload, answer.payload_type), field) == \
                getattr(parse_canonical(before[s].payload, before[s].payload_type), field)
            before[s] = answer
        def unmasked():   # t shares of every secret suffice: the last answers come late
            return fed.manager.status("sec-1").state in (pb.RoundStatus.FITTING,
                                                         pb.RoundStatus.DONE)
        for s in fed.sites[2:]:
            if not unmasked():
                drivers[s].send(before[s])
        for phase in order[order.index(notice_of) + 1:]:
            for d in drivers.values():
                if unmasked():
                    break
                assert d.step()[0] == phase
        status = wait_state(fed.manager, "sec-1", FINAL, 15)
        assert status.state == pb.RoundStatus.DONE, status.message
        result = fed.manager.context.rounds["sec-1"].session.result
        assert np.array_equal(result.vector, fp.wrap_sum([seen[s][1] for s in fed.sites]))
        assert [c.site_id for c in fed.manager.store.contributions("sec-1")] == fed.sites
        for s in fed.sites:
            assert _spent(fed, s) == (pytest.approx(EPSILON), ["sec-1"])
            assert fed.manager.budgets.view(s).spent == pytest.approx(EPSILON)
        for d in drivers.values():
            d.close()
    finally:
        fed.stop()


def test_the_aggregator_refuses_infeasible_secure_specs(federation):
    """Secure with one site, T above the invited sites, T + c above them, no row bound, no
    invited sites named, an invited site without a pinned key, no pinned aggregator key or
    another than the aggregator's, or secure fields on an independent round: refused at
    StartRound with the reason."""
    pins = {s: k.key_id for s, k in federation.site_keys.items()}
    base = dict(aggregation="secure", noise_threshold=2, max_site_rows=1000,
                sites=sorted(pins), site_key_ids=pins,
                aggregator_key_id=federation.aggregator_key.key_id)
    cases = [
        (dict(base, sites=["site-a"], quorum=1), "needs at least 2 sites"),
        (dict(base, sites=[]), "must name its invited sites"),
        (dict(base, site_key_ids={"site-a": pins["site-a"], "site-b": pins["site-b"]}),
         "lists no key for invited site(s) site-c"),
        (dict(base, site_key_ids={}), "lists no key for invited site(s) site-a, site-b, site-c"),
        (dict(base, noise_threshold=4), "exceeds the 3 invited site(s)"),
        (dict(base, noise_threshold=2, colluders=2), "plus colluders c = 2 exceeds"),
        (dict(base, max_site_rows=0), "max_site_rows"),
        (dict(base, noise_threshold=0), "noise_threshold T >= 1"),
        (dict(aggregation="independent", noise_threshold=2), "for secure aggregation only"),
        (dict(aggregation="pooled"), "aggregation must be one of"),
        (dict(base, site_key_ids={"site-a": "0" * 32, "site-b": "0" * 32, "site-c": "0" * 32}),
         "which is registered with key"),
        (dict(base, aggregator_key_id=""), "must pin the aggregator's identity key"),
        (dict(base, aggregator_key_id="0" * 32),
         f"but this aggregator signs with key {federation.aggregator_key.key_id}"),
    ]
    for i, (fields, reason) in enumerate(cases):
        spec = federation.spec(round_id=f"bad-{i}", **fields)
        with pytest.raises(grpc.RpcError) as info:
            federation.coordinator.stub.StartRound(
                federation.coordinator.sign_spec(spec), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason in info.value.details(), (fields, info.value.details())


def test_too_few_consents_for_T_fail_the_secure_round_before_keys(federation):
    """T = 2, quorum 1: one consent and two refusals end the consent phase with fewer
    contributions than the sum must hold; the round fails before anyone drew anything."""
    spec = federation.spec(quorum=1, aggregation="secure", noise_threshold=2,
                           max_site_rows=1000)
    federation.start_round(spec, consent=False)
    federation.stub.SendPhase(federation.consent("site-a", "r1"))
    federation.stub.Refuse(federation.refusal("site-b", "r1", "policy"))
    federation.stub.Refuse(federation.refusal("site-c", "r1", "policy"))
    status = federation.manager.status("r1")
    assert status.state == pb.RoundStatus.FAILED
    assert "no site released" in status.message
    assert federation.manager.store.contributions("r1") == []


def test_a_site_refuses_T_above_its_policy_and_never_its_rows(tmp_path):
    """policy.max_noise_threshold caps T (a site's 1/T share is a full draw only with T honest
    contributors); a site with more rows than max_site_rows consents all the same (issue 19:
    it uses all of them at release, max_site_rows only sizes the grid; a refusal would say
    n > m)."""
    fed = SecureFed(tmp_path, 3, max_noise_threshold=2, rows=120)
    node = fed.node("site-a")
    pins = {s: k.key_id for s, k in fed.site_keys.items()}
    sign = lambda spec: fed.coordinator_key.sign(  # noqa: E731
        pb.RoundSpec(**{**{f.name: v for f, v in spec.ListFields()},
                        "site_key_ids": spec.site_key_ids or pins}))
    answer = node.consent(sign(fed.spec(t=3, quorum=3)))
    refusal = parse_canonical(answer.payload, answer.payload_type)
    assert answer.payload_type == "dpfed.v1.Refusal"
    assert "exceeds this site's policy.max_noise_threshold = 2" in refusal.reason
    answer = node.consent(sign(fed.spec(round_id="sec-2", t=2, rows=100)))
    assert answer.payload_type == "dpfed.v1.PhaseMessage"
    answer = node.consent(sign(fed.spec(round_id="sec-3", t=2, rows=120)))
    assert answer.payload_type == "dpfed.v1.PhaseMessage"
    # T > 1 needs the identity keys pinned by the coordinator (else the aggregator could
    # stand in for the other participants); T = 1 does not (the own share is a full draw).
    unpinned = fed.coordinator_key.sign(fed.spec(round_id="sec-5", t=2, rows=120))
    answer = node.consent(unpinned)
    assert "must pin the sites' identity keys" in parse_canonical(
        answer.payload, answer.payload_type).reason
    answer = node.consent(fed.coordinator_key.sign(fed.spec(round_id="sec-6", t=1, rows=120)))
    assert answer.payload_type == "dpfed.v1.PhaseMessage"
    # A secure spec is never released independently, whatever a notice asks.
    answer = node.handle_round(sign(fed.spec(round_id="sec-4", t=2)))
    assert answer.payload_type == "dpfed.v1.Refusal"
    assert node.ledger.spent == 0 and node.ledger.releases() == []


def test_round_toml_accepts_the_aggregation_keys():
    from coordinator.roundspec import RoundSpecError, build_round_spec
    base = {"target": "y", "features": ["a", "b"], "epsilon": 1.0, "x_bound": 1.0,
            "y_bound": 1.0}
    spec = build_round_spec({**base, "aggregation": "secure", "noise_threshold": 3})
    assert (spec.aggregation, spec.noise_threshold, spec.max_site_rows, spec.colluders) == \
        ("secure", 3, 100_000, 0)
    assert build_round_spec(base).aggregation == ""   # "" = independent (the default)
    for bad, reason in (({"noise_threshold": 3}, "needs aggregation"),
                        ({"aggregation": "secure"}, "needs noise_threshold"),
                        ({"aggregation": "secure", "noise_threshold": 0}, ">= 1"),
                        ({"aggregation": "mixed"}, "must be one of")):
        with pytest.raises(RoundSpecError, match=reason):
            build_round_spec({**base, **bad})


def _restarted(fed, site):
    """A new SiteNode over the same files: what a restarted site process holds (its ledger,
    no in-memory key state)."""
    from site_node.config import load_config
    from site_node.node import SiteNode
    node = SiteNode(load_config(fed.write_config(site)))
    fed.nodes[site] = node
    return node


def test_a_site_restarted_before_release_drops_out_and_one_after_release_is_counted(tmp_path):
    """K = 5, T = 2 (t = 3): site-a restarts after key agreement (its secrets are gone): it
    ignores the release notice, spends nothing and is listed as dropped. site-b releases and
    then restarts: its stored masked release is resent byte for byte (a duplicate), it
    cannot confirm the survivor set nor answer an unmask request, the other holders' shares
    cover it (its signed attestation came with its masked input), and it is counted
    as released in the sum, its ledger and the aggregator's budget record."""
    fed = SecureFed(tmp_path, 5)
    fed.start_aggregator()
    try:
        seen = _record_inputs(fed, fed.sites)
        drivers = _drivers(fed)
        fed.coordinator().start_round(fed.spec(t=2, quorum=2, deadline_s=8))
        _through_keys(drivers)
        drivers["site-a"].node = _restarted(fed, "site-a")
        phase, answer, _ = drivers["site-a"].step()
        assert phase == "release" and answer is None
        for s in ("site-b", "site-c", "site-d", "site-e"):
            assert drivers[s].step()[2].accepted
        stored = fed.node("site-b").ledger.get_release("sec-1").envelope
        drivers["site-b"].node = _restarted(fed, "site-b")
        [pending] = drivers["site-b"].node.ledger.releases()
        assert pending.envelope.SerializeToString() == stored.SerializeToString()
        assert drivers["site-b"].send(drivers["site-b"].node.fresh_envelope(pending)).duplicate
        status = wait_state(fed.manager, "sec-1", (pb.RoundStatus.UNMASK,) + FINAL, 15)
        assert status.state == pb.RoundStatus.UNMASK, status.message
        phase, answer, _ = drivers["site-b"].step()
        assert phase == "confirm" and answer is None     # no secrets left: no answer
        for phase in ("confirm", "unmask"):   # quorum 3 signatures; t = 3 answers
            for s in ("site-c", "site-d", "site-e"):
                assert drivers[s].step()[0] == phase
        status = wait_state(fed.manager, "sec-1", FINAL, 15)
        assert status.state == pb.RoundStatus.DONE, status.message
        assert list(status.dropped) == ["site-a"]
        result = fed.manager.context.rounds["sec-1"].session.result
        assert result.included == ("site-b", "site-c", "site-d", "site-e")
        assert np.array_equal(result.vector,
                              fp.wrap_sum([seen[s][1] for s in result.included]))
        assert _spent(fed, "site-a") == (0.0, [])
        assert fed.manager.budgets.view("site-a").spent == 0
        for s in result.included:
            assert _spent(fed, s) == (pytest.approx(EPSILON), ["sec-1"])
            assert fed.manager.budgets.view(s).spent == pytest.approx(EPSILON)
        for d in drivers.values():
            d.close()
    finally:
        fed.stop()


def test_a_site_refuses_relayed_identity_keys_the_coordinator_did_not_sign(fed):
    """The coordinator pins the sites' key ids in the signed spec (site_key_ids, filled from
    its own records by Coordinator.start_round); a keys notice relaying another key for a
    holder is refused before anything is advertised."""
    from dpfed import secure_round
    from dpfed.wire.signing import SigningKey
    drivers = _drivers(fed, fed.sites[:3])
    fed.coordinator().start_round(fed.spec(t=2, quorum=2, sites=fed.sites[:3]))
    for d in drivers.values():
        d.step()
    pushed = drivers["site-a"].next()
    spec = fed.manager.context.rounds["sec-1"].spec
    assert dict(spec.site_key_ids) == {s: fed.site_keys[s].key_id for s in fed.sites[:3]}
    notice = parse_canonical(pushed.payload, "dpfed.v1.PhaseNotice")
    keys = secure_round.decode_keys(notice.body)
    keys["site-b"] = SigningKey.generate().public_key      # the aggregator's own key
    notice.body = secure_round.encode_keys(keys)
    from dpfed.wire.canonical import canonical_bytes
    forged = pb.SignedEnvelope(payload=canonical_bytes(notice), payload_type=pushed.payload_type)
    answer = drivers["site-a"].answer(forged)
    assert answer.payload_type == "dpfed.v1.Refusal"
    assert "site_key_ids" in parse_canonical(answer.payload, answer.payload_type).reason
    # The genuine notice is still answered.
    assert drivers["site-a"].answer(pushed).payload_type == "dpfed.v1.PhaseMessage"
    for d in drivers.values():
        d.close()


def test_the_sum_is_never_unmasked_with_fewer_than_T_plus_c_contributions(tmp_path):
    """K = 5, T = 3, c = 1 (quorum 1): a colluder knows its own share, so the sum must hold
    T + c = 4 contributions: with 3 the round fails and nothing is unmasked (the 3 releases
    are accounted for). The Shamir threshold counts c too: t = floor((5 + 1)/2) + 1 = 4 (it
    was 3, from a default 10 % corrupt fraction, before issue 19)."""
    fed = SecureFed(tmp_path, 5)
    fed.start_aggregator()
    try:
        drivers = _drivers(fed)
        fed.coordinator().start_round(fed.spec(t=3, colluders=1, quorum=1, deadline_s=6))
        _through_keys(drivers)
        live = fed.manager.context.rounds["sec-1"]
        assert (live.secure.config.min_contributors, live.secure.config.threshold) == (4, 4)
        assert (live.secure.config.colluders, live.secure.config.quorum) == (1, 4)
        for s in fed.sites[2:]:
            assert drivers[s].step()[2].accepted
        status = wait_state(fed.manager, "sec-1", FINAL, 15)
        assert status.state == pb.RoundStatus.FAILED
        assert "3 masked inputs < 4" in status.message, status.message
        assert live.session.result is None
        for s in fed.sites[2:]:
            assert fed.manager.budgets.view(s).spent == pytest.approx(EPSILON)
        for d in drivers.values():
            d.close()
    finally:
        fed.stop()
