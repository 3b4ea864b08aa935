"""Fuzzing the gRPC surface of a real aggregator (benchmarks/fuzz.py with a small budget, and
a hypothesis property over every Contribution field). Every call must end with a status that
is an answer (never UNKNOWN: an exception escaping a servicer), the round must hold exactly the
accepted contributions with their exact sum, and the health check must still say SERVING.
The bigger run: ``python benchmarks/fuzz.py --inputs 20000``."""

from __future__ import annotations

import base64
import json
import logging
import secrets
import time

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz import ANSWERS, check_outcome, health_status, prepare, resign
from dpfed.v1 import dpfed_pb2 as pb
from tests.conftest import Federation, random_statistics

FUZZ_INPUTS = 600


@pytest.fixture
def quiet_federation(tmp_path):
    logging.getLogger("aggregator").setLevel(logging.ERROR)
    fed = Federation(tmp_path, max_clock_skew_s=300)
    yield fed
    logging.getLogger("aggregator").setLevel(logging.NOTSET)
    fed.stop()


def test_fuzz_every_rpc_of_a_real_aggregator(quiet_federation, capsys):
    fuzzer, baseline = prepare(quiet_federation, seed=7)
    fuzzer.run(FUZZ_INPUTS)
    report = fuzzer.report()
    with capsys.disabled():
        print(f"\n[fuzz] {report['inputs']} inputs over {len(report['by_rpc'])} RPCs: "
              + json.dumps(report["by_rpc"], sort_keys=True))
    assert report["inputs"] == FUZZ_INPUTS
    assert all(sum(c.values()) > 0 for c in report["by_rpc"].values())  # every RPC was hit
    assert check_outcome(fuzzer, quiet_federation.manager, baseline) == []
    fuzzer.close()


_text = st.one_of(st.text(max_size=40), st.text(min_size=120, max_size=300),
                  st.sampled_from(["r1", "site-b", "", "\x00", "a" * 129]))
_fields = st.fixed_dictionaries({
    "round_id": _text, "site_id": st.one_of(st.just("site-b"), _text),
    "n": st.one_of(st.integers(0, 2**64 - 1), st.just(50)),
    "epsilon_spent": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(2.0)),
    "nonce": st.one_of(st.just(None), _text), "spec_digest": st.one_of(st.just(None), _text),
    "statistics": st.one_of(st.just(None), st.binary(max_size=200)),
    "timestamp_unix_ms": st.one_of(st.just(None), st.integers(-2**63, 2**63 - 1)),
})


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(fields=_fields)
def test_any_signed_contribution_is_answered_and_leaves_the_round_untouched(quiet_federation,
                                                                           fields):
    fed = quiet_federation
    if "r1" not in fed.manager.context.rounds:
        fed.start_round(fed.spec("r1", quorum=3, deadline_s=3600))
        fed.stub.Contribute(fed.contribution("site-a", "r1", random_statistics(seed=5)))
    before = fed.manager.aggregated_statistics("r1")
    held = [c.site_id for c in fed.manager.status("r1").contributions]
    c = pb.Contribution(round_id=fields["round_id"], site_id=fields["site_id"], n=fields["n"],
                        statistics=(fields["statistics"] if fields["statistics"] is not None
                                    else random_statistics(seed=6).to_bytes()),
                        nonce=fields["nonce"] if fields["nonce"] is not None
                        else secrets.token_hex(16),
                        spec_digest=fields["spec_digest"] if fields["spec_digest"] is not None
                        else fed.spec_digest("r1"),
                        timestamp_unix_ms=fields["timestamp_unix_ms"]
                        if fields["timestamp_unix_ms"] is not None else int(time.time() * 1000))
    if fields["epsilon_spent"] == fields["epsilon_spent"] and abs(fields["epsilon_spent"]) != float("inf"):
        c.epsilon_spent = fields["epsilon_spent"]
        from dpfed.wire.canonical import canonical_bytes
        payload = canonical_bytes(c)
    else:  # JSON has no NaN/inf: spell them the way proto3 JSON does, by hand
        from dpfed.wire.canonical import canonical_bytes
        obj = json.loads(canonical_bytes(c))
        obj["epsilon_spent"] = str(fields["epsilon_spent"]).replace("inf", "Infinity").replace("nan", "NaN")
        payload = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    env = resign(fed.site_keys["site-b"], "dpfed.v1.Contribution", payload)
    try:
        reply = fed.stub.Contribute(env, timeout=10)
        code = "OK"
    except grpc.RpcError as exc:
        code = exc.code().name
        assert len(exc.details() or "") <= 1024
    assert code in ANSWERS
    if code != "OK":
        assert fed.manager.aggregated_statistics("r1") == before
        assert [x.site_id for x in fed.manager.status("r1").contributions] == held
    else:  # only a well-formed contribution from site-b can be accepted, once
        assert reply.accepted and c.site_id == "site-b" and c.round_id == "r1"
    assert health_status(fed.address) == "SERVING"
