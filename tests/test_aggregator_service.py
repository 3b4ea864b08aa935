"""The aggregator over real gRPC on 127.0.0.1: a whole round, every kind of rejection (and
that none of them touches the round), deadlines, refusals, subscription and restart."""

from __future__ import annotations

import json
import math
import secrets
import threading
import time
from fractions import Fraction

import grpc
import numpy as np
import pytest

from dpfed.statistics import Statistics
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.signing import SigningKey

from tests.conftest import public_statistics, random_statistics


def _code(call):
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def _exact_sum(parts):
    """Reference sum in exact rational arithmetic, rounded once (what math.fsum promises)."""
    d = parts[0].dim
    xtx = np.array([[float(sum(Fraction(p.xtx[i, j]) for p in parts)) for j in range(d)]
                    for i in range(d)])
    xty = np.array([float(sum(Fraction(p.xty[i]) for p in parts)) for i in range(d)])
    yty = float(sum(Fraction(p.yty) for p in parts))
    return Statistics(xtx, xty, yty, sum(p.n for p in parts))


def test_round_quorum_fit_result_and_exact_sum(federation):
    public = public_statistics(seed=9, n=10)
    federation.start_round(federation.spec(quorum=3, public=public))
    releases = {s: random_statistics(seed=i, n=40 + i) for i, s in enumerate(federation.SITES)}
    for site, stats in releases.items():
        reply = federation.stub.Contribute(federation.contribution(site, "r1", stats))
        assert reply.accepted and not reply.duplicate
    status = federation.coordinator.wait("r1", 60, poll_s=0.05)
    assert status.state == pb.RoundStatus.DONE, status.message
    assert [c.site_id for c in status.contributions] == list(federation.SITES)
    expected = _exact_sum([*releases.values(), public])
    assert federation.manager.aggregated_statistics("r1") == expected
    result = federation.coordinator.result("r1")
    summary = json.loads(result.summary_json)
    assert summary["n_total"] == sum(s.n for s in releases.values()) + 10
    assert summary["n_public"] == 10
    assert [s["site_id"] for s in summary["sites"]] == list(federation.SITES)
    assert summary["dim"] == 3 and len(summary["beta_mean"]) == 3
    assert {"round_s", "fit_s"} <= set(summary["timings"])
    draws = np.frombuffer(result.beta_draws, "<f8").reshape(result.draws, result.dim)
    assert draws.shape == (200, 3)


def test_rejections_leave_the_round_untouched(federation):
    federation.start_round(federation.spec(quorum=3))
    stats = random_statistics(seed=1)
    good = federation.contribution("site-a", "r1", stats)
    assert federation.stub.Contribute(good).accepted
    before = federation.manager.aggregated_statistics("r1")
    C = grpc.StatusCode
    stranger = SigningKey.generate()
    bad_sig = pb.SignedEnvelope()
    bad_sig.CopyFrom(federation.contribution("site-b", "r1", stats))
    bad_sig.signature = bytes(64)
    replay = federation.contribution("site-b", "r1", stats)
    federation.manager.auth.nonces.add((replay.key_id, json.loads(replay.payload)["nonce"]))
    nan_stats = stats.to_bytes()[:-8] + np.array([math.nan]).astype("<f8").tobytes()
    cases = {
        "unknown key": (federation.contribution("site-b", "r1", stats, key=stranger),
                        C.UNAUTHENTICATED),
        "bad signature": (bad_sig, C.UNAUTHENTICATED),
        "wrong site for key": (federation.contribution("site-b", "r1", stats,
                                                       key=federation.site_keys["site-c"]),
                               C.PERMISSION_DENIED),
        "stale timestamp": (federation.contribution(
            "site-b", "r1", stats, timestamp_unix_ms=int(time.time() * 1000) - 3_600_000),
            C.UNAUTHENTICATED),
        "unknown round": (federation.contribution("site-b", "nope", stats, digest="00" * 32),
                          C.FAILED_PRECONDITION),
        "stale spec digest": (federation.contribution("site-b", "r1", stats, digest="ab" * 32),
                              C.FAILED_PRECONDITION),
        "replayed nonce": (replay, C.ALREADY_EXISTS),
        "second different contribution": (
            federation.contribution("site-a", "r1", random_statistics(seed=2)), C.ALREADY_EXISTS),
        "dimension mismatch": (federation.contribution("site-b", "r1", random_statistics(d=4)),
                               C.INVALID_ARGUMENT),
        "n mismatch": (federation.contribution("site-b", "r1", stats, n=stats.n + 1),
                       C.INVALID_ARGUMENT),
        "non-finite statistics": (federation.contribution("site-b", "r1", stats,
                                                          statistics=nan_stats),
                                  C.INVALID_ARGUMENT),
        "garbage statistics": (federation.contribution("site-b", "r1", stats,
                                                       statistics=b"junk"), C.INVALID_ARGUMENT),
        "wrong epsilon": (federation.contribution("site-b", "r1", stats, epsilon_spent=1.0),
                          C.INVALID_ARGUMENT),
        "not a contribution": (federation.site_keys["site-b"].sign(
            pb.Refusal(round_id="r1", site_id="site-b")), C.UNAUTHENTICATED),
    }
    for name, (envelope, code) in cases.items():
        assert _code(lambda: federation.stub.Contribute(envelope)) == code, name
        assert federation.manager.aggregated_statistics("r1") == before, name
    status = federation.manager.status("r1")
    assert [c.site_id for c in status.contributions] == ["site-a"]
    assert status.state == pb.RoundStatus.RELEASE
    # The identical envelope again is an idempotent duplicate.
    reply = federation.stub.Contribute(good)
    assert reply.accepted and reply.duplicate
    assert federation.manager.aggregated_statistics("r1") == before


def test_not_invited_and_closed_round(federation):
    federation.start_round(federation.spec(quorum=1, sites=["site-a"]))
    stats = random_statistics()
    assert _code(lambda: federation.stub.Contribute(
        federation.contribution("site-b", "r1", stats))) == grpc.StatusCode.PERMISSION_DENIED
    federation.stub.Contribute(federation.contribution("site-a", "r1", stats))
    federation.coordinator.wait("r1", 60, poll_s=0.05)
    before = federation.manager.aggregated_statistics("r1")
    federation.raw  # closed round: even an invited site cannot add to it
    assert _code(lambda: federation.stub.Contribute(
        federation.contribution("site-a", "r1", random_statistics(seed=3)))) in (
        grpc.StatusCode.FAILED_PRECONDITION,)
    assert federation.manager.aggregated_statistics("r1") == before


def test_start_round_checks_key_and_spec(federation):
    C = grpc.StatusCode
    site_signed = federation.site_keys["site-a"].sign(federation.spec())
    assert _code(lambda: federation.stub.StartRound(site_signed)) == C.UNAUTHENTICATED
    for bad in [federation.spec(quorum=4), federation.spec(epsilon=0.0),
                federation.spec(x_bound=-1.0), federation.spec(budget_split=[0.5, 0.5]),
                federation.spec(sites=["site-z"]), federation.spec(deadline_s=-5),
                federation.spec(public=random_statistics(d=2)),
                # a release-like value is not the exact statistics of any rows
                federation.spec(public=random_statistics(seed=9, n=10))]:
        assert _code(lambda: federation.start_round(bad)) == C.INVALID_ARGUMENT
    federation.start_round(federation.spec())
    assert _code(lambda: federation.start_round(federation.spec())) == C.ALREADY_EXISTS
    assert _code(lambda: federation.coordinator.result("r1")) == C.FAILED_PRECONDITION
    assert _code(lambda: federation.coordinator.status("zzz")) == C.NOT_FOUND


def test_deadline_without_quorum_fails_naming_missing_sites(federation):
    federation.start_round(federation.spec(quorum=2, deadline_s=0.6))
    federation.stub.Contribute(federation.contribution("site-a", "r1", random_statistics()))
    status = federation.coordinator.wait("r1", 60, poll_s=0.05)
    assert status.state == pb.RoundStatus.FAILED
    assert "site-b" in status.message and "site-c" in status.message
    assert list(status.dropped) == ["site-b", "site-c"]
    assert list(status.consented) == ["site-a", "site-b", "site-c"]


def test_refusal_is_recorded_and_shown(federation):
    federation.start_round(federation.spec(quorum=2))
    digest = federation.spec_digest("r1")
    refusal = federation.site_keys["site-b"].sign(pb.Refusal(
        round_id="r1", site_id="site-b", spec_digest=digest, reason="budget exhausted",
        timestamp_unix_ms=int(time.time() * 1000), nonce=secrets.token_hex(16)))
    federation.stub.Refuse(refusal)
    status = federation.coordinator.status("r1")
    assert [(r.site_id, r.reason) for r in status.refusals] == [("site-b", "budget exhausted")]
    assert status.state == pb.RoundStatus.RELEASE
    refusal_c = federation.site_keys["site-c"].sign(pb.Refusal(
        round_id="r1", site_id="site-c", spec_digest=digest, reason="policy",
        timestamp_unix_ms=int(time.time() * 1000), nonce=secrets.token_hex(16)))
    federation.stub.Refuse(refusal_c)
    status = federation.coordinator.status("r1")
    assert status.state == pb.RoundStatus.FAILED and "unreachable" in status.message


def _hello(federation, site):
    return federation.site_keys[site].sign(pb.SiteHello(
        site_id=site, timestamp_unix_ms=int(time.time() * 1000), nonce=secrets.token_hex(16)))


def test_subscribe_streams_signed_specs(federation):
    federation.start_round(federation.spec(round_id="r-before", sites=["site-a", "site-b"]),
                           consent=False)
    stream = federation.stub.Subscribe(_hello(federation, "site-a"))
    received = []

    def read():
        for env in stream:
            received.append(env)
            if len(received) == 2:
                return
    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.3)
    federation.start_round(federation.spec(round_id="r-after", sites=["site-a", "site-b"]),
                           consent=False)
    federation.start_round(federation.spec(round_id="r-other", sites=["site-b", "site-c"]),
                           consent=False)
    reader.join(5)
    stream.cancel()
    from dpfed.wire.signing import verify
    trusted = {federation.coordinator_key.key_id: federation.coordinator_key.public_key}
    ids = [verify(env, trusted, "dpfed.v1.RoundSpec").round_id for env in received]
    assert ids == ["r-before", "r-after"]
    sites = {s.site_id: s for s in federation.coordinator.list_sites()}
    assert sites["site-a"].last_seen_unix_ms > 0


def test_subscribe_rejects_unknown_key_and_replayed_hello(federation):
    hello = _hello(federation, "site-a")
    federation.manager.hello(hello)  # consumes the nonce
    assert _code(lambda: next(federation.stub.Subscribe(hello))) == grpc.StatusCode.ALREADY_EXISTS
    stranger = SigningKey.generate().sign(pb.SiteHello(
        site_id="site-a", timestamp_unix_ms=int(time.time() * 1000), nonce="aa" * 16))
    assert _code(lambda: next(federation.stub.Subscribe(stranger))) == \
        grpc.StatusCode.UNAUTHENTICATED


def test_restart_keeps_contributions_and_status(federation):
    federation.start_round(federation.spec(quorum=2, sites=["site-a", "site-b"]))
    first = federation.contribution("site-a", "r1", random_statistics(seed=1))
    federation.stub.Contribute(first)
    expected = federation.manager.expected_noise("r1")
    federation.stop()
    federation.start()
    status = federation.coordinator.status("r1")
    assert status.state == pb.RoundStatus.RELEASE
    assert [c.site_id for c in status.contributions] == ["site-a"]
    # The noise each stored contribution declared is read back: one draw so far.
    assert federation.manager.aggregated_statistics("r1").noise == expected
    # The replayed nonce is still known; the identical envelope is still a duplicate.
    assert federation.stub.Contribute(first).duplicate
    federation.stub.Contribute(federation.contribution("site-b", "r1", random_statistics(seed=2)))
    assert federation.coordinator.wait("r1", 60, poll_s=0.05).state == pb.RoundStatus.DONE
    federation.stop()
    federation.start()
    assert federation.coordinator.status("r1").state == pb.RoundStatus.DONE
    assert json.loads(federation.coordinator.result("r1").summary_json)["n_total"] == 100
    assert federation.manager.aggregated_statistics("r1").noise == expected + expected


def test_health_service_serves(federation):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    stub = health_pb2_grpc.HealthStub(federation.channel)
    reply = stub.Check(health_pb2.HealthCheckRequest(service="dpfed.v1.Aggregator"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("method", ["StartRound", "Contribute", "Refuse", "GetRound",
                                    "Subscribe"])
def test_bytes_that_are_no_message_get_invalid_argument(federation, method):
    """Not a protobuf message at all: a clear INVALID_ARGUMENT naming the expected type, not
    UNKNOWN (grpc.aio's answer when its own deserializer fails); the round is untouched."""
    federation.start_round(federation.spec("r1"))
    before = federation.manager.aggregated_statistics("r1")
    path = f"/dpfed.v1.Aggregator/{method}"
    call = (federation.channel.unary_stream if method == "Subscribe"
            else federation.channel.unary_unary)(path)
    with pytest.raises(grpc.RpcError) as err:
        reply = call(b"\xff\xff\xff", timeout=5)
        if method == "Subscribe":
            next(reply)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not a valid dpfed.v1." in err.value.details()
    assert federation.manager.aggregated_statistics("r1") == before


def test_a_failed_commit_answers_unavailable_and_the_resend_is_accepted(federation,
                                                                       monkeypatch):
    """The disk refuses one group commit: the site hears UNAVAILABLE ("retry"), nothing is
    counted or remembered (nonce included), the server keeps serving, and the same bytes
    resent are accepted once."""
    import sqlite3
    federation.start_round(federation.spec("r1", quorum=2))
    store = federation.manager.store
    real, failed = store._commit_batch, []

    def fail_once(batch):
        if not failed:
            failed.append(len(batch))
            raise sqlite3.OperationalError("disk I/O error")
        return real(batch)

    monkeypatch.setattr(store, "_commit_batch", fail_once)
    envelope = federation.contribution("site-a", "r1", random_statistics(seed=5))
    with pytest.raises(grpc.RpcError) as err:
        federation.stub.Contribute(envelope, timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "could not store" in err.value.details() and "disk I/O error" in err.value.details()
    assert list(federation.manager.status("r1").contributions) == []
    reply = federation.stub.Contribute(envelope, timeout=10)
    assert reply.accepted and not reply.duplicate
    assert [c.site_id for c in federation.manager.status("r1").contributions] == ["site-a"]


def test_a_contribution_whose_caller_gave_up_is_still_stored_and_counted(federation,
                                                                          monkeypatch):
    """The site's deadline passes while its contribution is being committed: the commit is
    not cancelled with the call; the contribution is durable and counted, and the site's
    resend is answered as a duplicate."""
    federation.start_round(federation.spec("r1", quorum=2))
    store = federation.manager.store
    real, entered, release = store._commit_batch, threading.Event(), threading.Event()

    def held(batch):
        entered.set()
        assert release.wait(20)
        return real(batch)

    monkeypatch.setattr(store, "_commit_batch", held)
    envelope = federation.contribution("site-a", "r1", random_statistics(seed=6))
    call = federation.stub.Contribute.future(envelope, timeout=0.5)
    assert entered.wait(10)
    with pytest.raises(grpc.RpcError) as err:
        call.result()
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    release.set()
    end = time.monotonic() + 10
    while not federation.manager.status("r1").contributions:
        assert time.monotonic() < end, "the contribution was never counted"
        time.sleep(0.02)
    assert federation.stub.Contribute(envelope, timeout=10).duplicate
    assert [c.site_id for c in store.contributions("r1")] == ["site-a"]


def _unsigned_noise_variant(federation, site, stats, noise):
    """A signed contribution of ``site`` whose noise field is ``noise`` (None: field absent)."""
    env = federation.contribution(site, "r1", stats)
    from dpfed.wire.canonical import parse_canonical
    c = parse_canonical(env.payload, "dpfed.v1.Contribution")
    c.ClearField("noise")
    if noise is not None:
        c.noise.CopyFrom(noise)
        c.noise.SetInParent()
    return federation.site_keys[site].sign(c)


def test_contribution_noise_must_match_the_spec(federation, monkeypatch):
    """A contribution whose declared noise differs from what the spec implies (other
    relation, other Sxx rule, other split, exact, missing, malformed) is rejected and leaves
    the round untouched; the honest one is accepted, and the total handed to the fit carries
    the sum of the accepted descriptions (K draws) -- public statistics add none."""
    from dpfed import noise as dpnoise
    from dpfed.sensitivity import expected_noise
    from aggregator import aggregate

    public = public_statistics(seed=9, n=10)
    spec = federation.spec(quorum=3, public=public)
    federation.start_round(spec)
    expected = expected_noise(3, spec.epsilon, spec.x_bound, spec.y_bound,
                              tuple(spec.budget_split))
    assert federation.manager.expected_noise("r1") == expected
    stats = random_statistics(seed=1)
    wrong = {
        "replace_one": expected_noise(3, spec.epsilon, spec.x_bound, spec.y_bound,
                                      (0.35, 0.6, 0.05), neighbouring="replace_one"),
        "paper rule": expected_noise(3, spec.epsilon, spec.x_bound, spec.y_bound,
                                     tuple(spec.budget_split), xtx_sensitivity="paper"),
        "other split": expected_noise(3, spec.epsilon, spec.x_bound, spec.y_bound,
                                      (0.3, 0.6, 0.05, 0.05)),
        "two draws": expected + expected,
        "exact": dpnoise.EXACT,
    }
    before = federation.manager.aggregated_statistics("r1")
    for name, noise in wrong.items():
        env = _unsigned_noise_variant(federation, "site-a", stats, dpnoise.to_proto(noise))
        with pytest.raises(grpc.RpcError) as info:
            federation.stub.Contribute(env)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert "noise description" in info.value.details(), name
    missing = _unsigned_noise_variant(federation, "site-a", stats, None)
    with pytest.raises(grpc.RpcError) as info:
        federation.stub.Contribute(missing)
    assert "declares no noise description" in info.value.details()
    bad_law = dpnoise.to_proto(expected)
    bad_law.xty[0].law = "cauchy"
    with pytest.raises(grpc.RpcError) as info:
        federation.stub.Contribute(_unsigned_noise_variant(federation, "site-a", stats, bad_law))
    assert "invalid noise description" in info.value.details()
    assert federation.manager.aggregated_statistics("r1") == before
    assert federation.manager.status("r1").contributions == []

    fitted = []
    real_fit = aggregate.fit
    monkeypatch.setattr(aggregate, "fit", lambda total, *a, **kw: (fitted.append(total),
                                                            real_fit(total, *a))[1])
    for i, site in enumerate(federation.SITES):
        assert federation.stub.Contribute(
            federation.contribution(site, "r1", random_statistics(seed=i))).accepted
    status = federation.coordinator.wait("r1", 60, poll_s=0.05)
    assert status.state == pb.RoundStatus.DONE, status.message
    total = federation.manager.aggregated_statistics("r1")
    assert total.noise == expected + expected + expected
    assert total.noise.draws("xty") == 3 and total.noise.draws("n") == 3
    assert [t.noise for t in fitted] == [expected + expected + expected]
