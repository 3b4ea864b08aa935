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
    live = fed.manager._rounds["sec-1"]
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
    assert "4 shares of 1/3 draw" in summary["noise"]
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
