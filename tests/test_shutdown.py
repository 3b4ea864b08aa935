"""SIGTERM, with a call in flight. Real processes (``dpfed aggregator serve``, ``dpfed site
serve``); the call is held in flight by the documented test hook
DPFED_TEST_HOLD_CONTRIBUTE / HoldFirstCall (dpfed/faults.py), so nothing depends on
timing.

Checked: the aggregator finishes a Contribute that was running when SIGTERM came (accepted,
and durable: there after a restart), refuses every new call with UNAVAILABLE from then on
(nothing of a refused call is stored), and exits 0; the site, sent SIGTERM while its
Contribute is running, records the aggregator's acknowledgement and exits 0 with a consistent
ledger (one release, acknowledged, spent == its epsilon).
"""

from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aggregator.server import CONTRIBUTE_METHOD
from aggregator.store import RoundStore
from dpfed.faults import HOLD_ENV, HoldFirstCall
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
from tests.conftest import random_statistics
from tests.test_crash_aggregator import AggregatorProcess, fed_keys  # noqa: F401 - fixture

pytestmark = pytest.mark.slow


def _wait_for(condition, what: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def _refused(port: int) -> bool:
    """True once a new connection's call is refused with UNAVAILABLE (server stopped).

    Between SIGTERM and that, a call may still be answered (the signal is not yet handled) or
    end CANCELLED: gRPC cancels a call that reaches it while it is shutting down, before the
    listener is closed. CANCELLED is "no answer" for every client (site_node/client.py
    RETRYABLE), never a verdict."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        try:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), exc
            return exc.code() == grpc.StatusCode.UNAVAILABLE
    return False


def test_sigterm_finishes_the_call_in_flight_and_refuses_new_ones(fed_keys, tmp_path,  # noqa: F811
                                                                  monkeypatch):
    from coordinator.client import Coordinator
    fed = fed_keys
    hold = tmp_path / "hold"
    hold.mkdir()
    monkeypatch.setenv(HOLD_ENV, str(hold))
    agg = AggregatorProcess(fed, tmp_path, grace_s=30)   # grace far longer than the hold
    agg.start()
    try:
        with Coordinator(f"127.0.0.1:{agg.port}", fed.coordinator_key, "coord") as coord:
            coord.start_round(fed.spec("r1", quorum=3, deadline_s=300))
            digest = coord.status("r1").spec_digest
        envs = {s: fed.contribution(s, "r1", random_statistics(seed=i, n=40 + i), digest=digest)
                for i, s in enumerate(fed.SITES)}
        channel = grpc.insecure_channel(f"127.0.0.1:{agg.port}")
        stub = pb_grpc.AggregatorStub(channel)
        for s in fed.SITES:   # consent phase first: releases are taken in the release phase
            stub.SendPhase(fed.consent(s, "r1", digest=digest), timeout=5)
        outcome: queue.Queue = queue.Queue()

        def in_flight():
            try:
                outcome.put(stub.Contribute(envs["site-a"], timeout=60))
            except grpc.RpcError as exc:  # pragma: no cover - reported by the assert below
                outcome.put(exc)
        threading.Thread(target=in_flight, daemon=True).start()
        _wait_for((hold / "arrived").exists, "the Contribute to reach the server")

        agg.proc.send_signal(signal.SIGTERM)
        _wait_for(lambda: _refused(agg.port), "the server to refuse new connections")
        # New calls after SIGTERM: over a new connection and over the one carrying the call
        # in flight (which got GOAWAY), a contribution and a query alike.
        with grpc.insecure_channel(f"127.0.0.1:{agg.port}") as fresh:
            for s in (pb_grpc.AggregatorStub(fresh), stub):
                for call in (lambda: s.Contribute(envs["site-b"], timeout=5),
                             lambda: s.GetRound(pb.RoundQuery(round_id="r1"), timeout=5)):
                    with pytest.raises(grpc.RpcError) as err:
                        call()
                    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert agg.proc.poll() is None                   # still draining the held call

        (hold / "release").touch()
        reply = outcome.get(timeout=30)
        assert isinstance(reply, pb.ContributeReply), reply
        assert reply.accepted and not reply.duplicate
        assert agg.proc.wait(30) == 0                    # clean exit once the call finished
        channel.close()
    finally:
        if agg.proc.poll() is None:
            agg.proc.kill()

    store = RoundStore(tmp_path / "agg.sqlite")          # durable: committed before the reply
    held = {c.site_id: c.envelope for c in store.contributions("r1")}
    store.close()
    assert held == {"site-a": envs["site-a"].SerializeToString()}   # site-b's was refused

    monkeypatch.delenv(HOLD_ENV)
    agg.start()                                          # restart on the same state
    try:
        with Coordinator(f"127.0.0.1:{agg.port}", fed.coordinator_key, "coord") as coord:
            status = coord.status("r1")
            assert status.state == pb.RoundStatus.RELEASE
            assert [c.site_id for c in status.contributions] == ["site-a"]
            ch = grpc.insecure_channel(f"127.0.0.1:{agg.port}")
            stub = pb_grpc.AggregatorStub(ch)
            # The refused call consumed nothing (not its nonce): the same bytes are accepted.
            assert stub.Contribute(envs["site-b"], timeout=5).accepted
            assert stub.Contribute(envs["site-a"], timeout=5).duplicate
            ch.close()
        assert agg.stop() == 0
    finally:
        if agg.proc.poll() is None:
            agg.proc.kill()


def test_site_sigterm_mid_contribute_records_the_ack_and_exits_0(tmp_path):
    from aggregator.config import config_from_dict
    from aggregator.server import AggregatorServer
    from coordinator.client import Coordinator
    from site_node.ledger import PrivacyLedger
    from tests.processes import site_process
    from tests.test_crash_site import EPSILON
    from tests.test_site_node import make_spec, write_site

    (tmp_path / "site").mkdir()
    config_path, coordinator_key, _ = write_site(tmp_path / "site")
    hold = HoldFirstCall(CONTRIBUTE_METHOD)
    agg = AggregatorServer(config_from_dict({
        "listen": "127.0.0.1:0", "state_db": "agg.sqlite", "insecure": True, "skip_fit": True,
        "grace_s": 0.2,
        "sites": [{"site_id": "hospital-a", "public_key": "site/keys/site.pub"}],
        "coordinators": [{"coordinator_id": "coordinator",
                          "public_key": "site/keys/coord.pub"}]}, tmp_path),
        interceptors=[hold])
    port = agg.start()
    config_path.write_text(config_path.read_text().replace(
        'aggregator = "127.0.0.1:1"', f'aggregator = "127.0.0.1:{port}"'))
    site = None
    try:
        with Coordinator(f"127.0.0.1:{port}", coordinator_key, "coordinator") as coord:
            coord.start_round(make_spec("stop-1", epsilon=EPSILON, quorum=1,
                                        deadline_unix_ms=int(time.time() * 1000) + 60_000))
            site = site_process(config_path, None)
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=lambda: [lines.put(x) for x in site.stderr], daemon=True).start()
            assert hold.arrived.wait(20), "the site's Contribute never reached the aggregator"

            site.send_signal(signal.SIGTERM)
            end = time.monotonic() + 20
            while b"stopping" not in lines.get(timeout=max(0.1, end - time.monotonic())):
                pass                                     # the site has taken the signal
            hold.release()                               # only now does the reply go out
            assert site.wait(20) == 0
            status = coord.wait("stop-1", 10, poll_s=0.05)
            assert status.state == pb.RoundStatus.DONE, status.message
    finally:
        hold.release()
        if site is not None and site.poll() is None:
            site.kill()
        agg.stop(0)

    with PrivacyLedger(config_path.parent / "state/ledger.sqlite") as ledger:
        [release] = ledger.releases()
        assert release.acknowledged                      # the reply was recorded before exit
        assert ledger.spent == pytest.approx(EPSILON)
        assert ledger.unacknowledged() == []


_POOL_SCRIPT = """
import os, sys, time
from pathlib import Path
if __name__ == "__main__":
    from aggregator import joint_fit
    from aggregator.config import config_from_dict
    from aggregator.server import AggregatorServer
    here = Path(sys.argv[1])
    agg = AggregatorServer(config_from_dict({"listen": "127.0.0.1:0", "state_db": "agg.sqlite",
                                             "insecure": True, "sites": [],
                                             "coordinators": []}, here))
    agg.start()
    pool = joint_fit._executor(2)
    list(pool.map(abs, range(4)))          # the fork server and both workers are up
    print(os.getpid(), flush=True)
    agg.stop()
    os._exit(0)                            # as `dpfed aggregator serve` leaves
"""


def _processes_naming(text: str) -> list[int]:
    import os
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if text.encode() in fh.read():
                    found.append(int(pid))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.skipif(not __import__("os").path.isdir("/proc"), reason="needs /proc")
def test_a_stopped_aggregator_leaves_no_joint_fit_process(tmp_path):
    """The joint fit's process pool (fork server + workers) ends with AggregatorServer.stop,
    even when the process then leaves by os._exit (which skips atexit): no process started by
    it is left behind as an orphan."""
    import sys
    script = tmp_path / "pool_then_exit.py"
    script.write_text(_POOL_SCRIPT)
    # Output to a file, not a pipe: an orphan would hold a pipe open and make run() wait.
    with open(tmp_path / "out.txt", "w") as out:
        done = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=tmp_path,
                              stdout=out, stderr=subprocess.STDOUT, timeout=300)
    assert done.returncode == 0, (tmp_path / "out.txt").read_text()[-2000:]
    end = time.monotonic() + 10
    while _processes_naming(str(tmp_path)) and time.monotonic() < end:
        time.sleep(0.1)
    assert _processes_naming(str(tmp_path)) == []
