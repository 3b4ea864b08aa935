"""The aggregator process SIGKILLed mid-round and restarted on the same state; a site that
never answers; SIGTERM. Real processes (``dpfed aggregator serve``) for the kills.

Checked: no accepted contribution is lost or counted twice across a kill (the final n and the
stored statistics are exactly what was accepted, a resend is an idempotent duplicate), a round
whose deadline passed while the aggregator was down ends FAILED naming the missing sites, and
SIGTERM exits cleanly with the round state kept.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aggregator.store import RoundStore
from dpfed.v1 import dpfed_pb2 as pb
from tests.conftest import Federation, random_statistics

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AggregatorProcess:
    """``dpfed aggregator serve`` on a fixed port over the Federation fixture's keys."""

    def __init__(self, fed: Federation, tmp_path, **extra):
        self.port = _free_port()
        raw = {**fed.raw, "listen": f"127.0.0.1:{self.port}", "skip_fit": True, **extra}
        lines = []
        for k, v in raw.items():
            if k in ("sites", "coordinators"):
                continue
            lines.append(f"{k} = {json.dumps(v)}")
        for s in raw["sites"]:
            lines.append(f'[[sites]]\nsite_id = "{s["site_id"]}"\npublic_key = "{s["public_key"]}"')
        for c in raw["coordinators"]:
            lines.append(f'[[coordinators]]\ncoordinator_id = "{c["coordinator_id"]}"\n'
                         f'public_key = "{c["public_key"]}"')
        self.config = tmp_path / "aggregator.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "dpfed_apps.cli", "aggregator", "serve",
                                      "--config", str(self.config)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                            health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                assert self.proc.poll() is None, self.proc.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "aggregator did not become healthy"
                time.sleep(0.1)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(10) == -signal.SIGKILL

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(15)


@pytest.fixture
def fed_keys(tmp_path):
    """Keys and config of a Federation, without its in-process server."""
    fed = Federation(tmp_path, max_clock_skew_s=300)
    fed.stop()
    return fed


@contextlib.contextmanager
def _aggregator(fed: Federation, tmp_path):
    """An AggregatorProcess on ``fed``'s keys, started; SIGKILLed on the way out if the test
    left it running (an assertion failed before its own stop)."""
    agg = AggregatorProcess(fed, tmp_path)
    agg.start()
    try:
        yield agg
    finally:
        if agg.proc.poll() is None:
            agg.proc.kill()


def _coordinator(agg: AggregatorProcess, fed: Federation):
    from coordinator.client import Coordinator
    return Coordinator(f"127.0.0.1:{agg.port}", fed.coordinator_key, "coord")


def _round_started(agg: AggregatorProcess, fed: Federation, spec) -> tuple:
    """Start the round ``spec`` on ``agg``: (the coordinator's client, the spec's digest)."""
    coord = _coordinator(agg, fed)
    coord.start_round(spec)
    return coord, coord.status(spec.round_id).spec_digest


def _stubs(port):
    from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    return ch, pb_grpc.AggregatorStub(ch)


def test_aggregator_killed_mid_round_loses_and_duplicates_nothing(fed_keys, tmp_path):
    fed = fed_keys
    with _aggregator(fed, tmp_path) as agg:
        coord, digest = _round_started(agg, fed, fed.spec("r1", quorum=3, deadline_s=120))
        ch, stub = _stubs(agg.port)
        stub.SendPhase(fed.consent("site-a", "r1", digest=digest), timeout=5)
        stub.SendPhase(fed.consent("site-b", "r1", digest=digest), timeout=5)
        ch.close()
        coord.close()
        agg.kill()                                   # in the consent phase: 2 of 3 consented

        agg.start()
        coord = _coordinator(agg, fed)
        status = coord.status("r1")
        assert status.state == pb.RoundStatus.CONSENT
        assert list(status.consented) == ["site-a", "site-b"] and not status.contributions
        ch, stub = _stubs(agg.port)
        stub.SendPhase(fed.consent("site-c", "r1", digest=digest), timeout=5)
        assert coord.status("r1").state == pb.RoundStatus.RELEASE
        stats = {s: random_statistics(seed=i, n=40 + i) for i, s in enumerate(fed.SITES)}
        envs = {s: fed.contribution(s, "r1", stats[s], digest=digest) for s in fed.SITES}
        for s in ("site-a", "site-b"):
            assert stub.Contribute(envs[s], timeout=5).accepted
        ch.close()
        coord.close()
        agg.kill()                                   # mid-round: 2 of quorum 3 accepted

        agg.start()                                  # same state file, same port
        coord = _coordinator(agg, fed)
        status = coord.status("r1")
        assert status.state == pb.RoundStatus.RELEASE
        assert [c.site_id for c in status.contributions] == ["site-a", "site-b"]
        ch, stub = _stubs(agg.port)
        again = stub.Contribute(envs["site-a"], timeout=5)   # a site resending after the outage
        assert again.accepted and again.duplicate
        assert stub.Contribute(envs["site-c"], timeout=5).accepted
        status = coord.wait("r1", 20, poll_s=0.1)
        assert status.state == pb.RoundStatus.DONE, status.message
        summary = json.loads(coord.result("r1").summary_json)
        assert summary["n_total"] == sum(s.n for s in stats.values())
        assert sorted(x["site_id"] for x in summary["sites"]) == list(fed.SITES)
        ch.close()
        coord.close()
        assert agg.stop() == 0                        # SIGTERM: clean exit
    store = RoundStore(tmp_path / "agg.sqlite")
    held = {c.site_id: c.statistics for c in store.contributions("r1")}
    store.close()
    assert held == {s: stats[s].to_bytes() for s in fed.SITES}   # each exactly once, unchanged


def test_deadline_passing_while_down_fails_naming_missing_sites(fed_keys, tmp_path):
    fed = fed_keys
    with _aggregator(fed, tmp_path) as agg:
        coord, digest = _round_started(agg, fed, fed.spec("r2", quorum=2, deadline_s=2.0))
        ch, stub = _stubs(agg.port)
        for s in fed.SITES:
            stub.SendPhase(fed.consent(s, "r2", digest=digest), timeout=5)
        stub.Contribute(fed.contribution("site-a", "r2", random_statistics(), digest=digest),
                        timeout=5)
        ch.close()
        coord.close()
        agg.kill()
        time.sleep(2.5)                               # the deadline passes while it is down
        agg.start()
        coord = _coordinator(agg, fed)
        status = coord.wait("r2", 10, poll_s=0.1)
        assert status.state == pb.RoundStatus.FAILED
        assert "site-b" in status.message and "site-c" in status.message
        assert [c.site_id for c in status.contributions] == ["site-a"]
        coord.close()
        assert agg.stop() == 0


def test_silent_site_does_not_block_a_round_at_quorum(federation):
    """Quorum 2 of 3: the third site never says anything. The consent phase ends at its
    deadline without it, and the two participants' releases close the round."""
    now = int(time.time() * 1000)
    federation.start_round(federation.spec("r3", quorum=2, deadline_s=60,
                                           consent_deadline_unix_ms=now + 800), consent=False)
    for s in ("site-a", "site-b"):
        federation.stub.SendPhase(federation.consent(s, "r3"))
    end = time.monotonic() + 10
    while federation.manager.status("r3").state == pb.RoundStatus.CONSENT:
        assert time.monotonic() < end
        time.sleep(0.05)
    for i, s in enumerate(("site-a", "site-b")):
        federation.stub.Contribute(federation.contribution(s, "r3", random_statistics(seed=i)))
    status = federation.coordinator.wait("r3", 60, poll_s=0.05)
    assert status.state == pb.RoundStatus.DONE
    assert list(status.consented) == ["site-a", "site-b"] and not status.dropped


def test_silent_site_below_quorum_fails_at_the_deadline_naming_it(federation):
    federation.start_round(federation.spec("r4", quorum=3, deadline_s=1.0))
    for i, s in enumerate(("site-a", "site-b")):
        federation.stub.Contribute(federation.contribution(s, "r4", random_statistics(seed=i)))
    status = federation.coordinator.wait("r4", 60, poll_s=0.05)
    assert status.state == pb.RoundStatus.FAILED
    assert "dropped: site-c" in status.message
