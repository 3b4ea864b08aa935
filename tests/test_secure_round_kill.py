"""Secure rounds with real processes killed (SIGKILL) mid-round and restarted.

* A site process killed in KEYS (right after its key advertisement was taken,
  DPFED_TEST_CRASH_AT=after_advertise) restarts without its secrets: it drops out, spends
  nothing, and the round finishes with the others.
* A site process killed after its masked release (after_debit: stored and debited, not yet
  sent; after_send: taken by the aggregator, acknowledgement not recorded) restarts, resends
  the stored bytes (taken once), cannot answer the unmask request, and is counted in the sum.
* The aggregator process (``dpfed aggregator serve``) killed in KEYS, RELEASE and UNMASK and
  restarted on the same store: the secagg session is rebuilt by replay, nothing is lost,
  nothing is released twice, and every ledger equals what was released.
"""

from __future__ import annotations

import signal
import subprocess
import time

import numpy as np
import pytest

from dpfed.secagg import fixedpoint as fp
from dpfed.v1 import dpfed_pb2 as pb
from site_node.ledger import PrivacyLedger
from tests.processes import site_process, stop_processes
from tests.secure_federation import EPSILON, SecureFed, SiteDriver, notice_phase
from tests.test_crash_aggregator import AggregatorProcess

pytestmark = pytest.mark.slow

FINAL = (pb.RoundStatus.DONE, pb.RoundStatus.FAILED)


def _site_process(fed, site, crash_at=None) -> subprocess.Popen:
    return site_process(fed.write_config(site), crash_at)


def _ledger(fed, site):
    with PrivacyLedger(fed.ledger_path(site)) as ledger:
        return ledger.spent, ledger.releases()


@pytest.fixture
def sites_as_processes(tmp_path):
    fed = SecureFed(tmp_path, 5)
    fed.start_aggregator()
    procs = []
    yield fed, procs
    stop_processes(procs)
    fed.stop()


def test_a_site_killed_in_keys_drops_out_and_spends_nothing(sites_as_processes):
    fed, procs = sites_as_processes
    victim = fed.sites[0]
    first = _site_process(fed, victim, "after_advertise")
    procs.append(first)
    procs += [_site_process(fed, s) for s in fed.sites[1:]]
    coordinator = fed.coordinator()
    time.sleep(1.0)
    coordinator.start_round(fed.spec(t=2, quorum=2, deadline_s=25, consent_s=15))
    assert first.wait(30) == -signal.SIGKILL, first.stderr.read().decode()[-2000:]
    assert _ledger(fed, victim) == (0.0, [])
    second = _site_process(fed, victim)            # restarted: no key state for the round
    procs.append(second)
    status = coordinator.wait("sec-1", 40, poll_s=0.1)
    assert status.state == pb.RoundStatus.DONE, status.message
    assert list(status.dropped) == [victim]
    assert [p.phase for p in status.phases] == ["CONSENT", "KEYS", "RELEASE", "UNMASK",
                                                "FITTING"]
    assert _ledger(fed, victim) == (0.0, [])
    assert fed.manager.budgets.view(victim).spent == 0
    held = fed.manager.store.contributions("sec-1")
    assert [c.site_id for c in held] == fed.sites[1:]
    for s in fed.sites[1:]:
        spent, releases = _ledger(fed, s)
        assert spent == pytest.approx(EPSILON) and [r.round_id for r in releases] == ["sec-1"]


@pytest.mark.parametrize("crash_at", ["after_debit", "after_send"])
def test_a_site_killed_after_its_masked_release_is_counted_once(sites_as_processes, crash_at):
    fed, procs = sites_as_processes
    victim = fed.sites[0]
    first = _site_process(fed, victim, crash_at)
    procs.append(first)
    procs += [_site_process(fed, s) for s in fed.sites[1:]]
    coordinator = fed.coordinator()
    time.sleep(1.0)
    coordinator.start_round(fed.spec(t=2, quorum=2, deadline_s=40, consent_s=15))
    assert first.wait(30) == -signal.SIGKILL, first.stderr.read().decode()[-2000:]
    spent, [release] = _ledger(fed, victim)
    assert spent == pytest.approx(EPSILON) and not release.acknowledged
    stored = release.envelope.SerializeToString()
    held = {c.site_id: c for c in fed.manager.store.contributions("sec-1")}
    assert (victim in held) == (crash_at == "after_send")
    second = _site_process(fed, victim)            # resends the stored masked release
    procs.append(second)
    status = coordinator.wait("sec-1", 40, poll_s=0.1)
    assert status.state == pb.RoundStatus.DONE, status.message
    assert list(status.dropped) == []
    result = fed.manager.context.rounds["sec-1"].session.result
    assert result.included == tuple(fed.sites)
    held = {c.site_id: c for c in fed.manager.store.contributions("sec-1")}
    assert sorted(held) == fed.sites
    assert held[victim].envelope == stored         # the stored bytes, taken once
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not _ledger(fed, victim)[1][0].acknowledged:
        time.sleep(0.1)
    for s in fed.sites:
        spent, releases = _ledger(fed, s)
        assert spent == pytest.approx(EPSILON) and [r.round_id for r in releases] == ["sec-1"]
        assert fed.manager.budgets.view(s).spent == pytest.approx(EPSILON)
    assert _ledger(fed, victim)[1][0].acknowledged


@pytest.mark.parametrize("kill_in", ["advertise", "release", "unmask"])
def test_the_aggregator_killed_in_keys_release_and_unmask_loses_nothing(tmp_path, kill_in):
    """K = 4, T = 2, sites driven step by step (in this process, real SiteNodes); the
    aggregator process is SIGKILLed after half the sites answered ``kill_in`` and restarted
    on the same store."""
    fed = SecureFed(tmp_path, 4)
    agg = AggregatorProcess(fed, tmp_path)
    agg.start()
    drivers = {}
    try:
        address = f"127.0.0.1:{agg.port}"
        fed.address = address
        seen = {}
        for s in fed.sites:
            fed.node(s).secure.on_release = (
                lambda rid, enc, x, s=s: seen.__setitem__(s, np.array(x, dtype=np.uint64)))
            drivers[s] = SiteDriver(fed, s, address)
        coordinator = fed.coordinator()
        coordinator.start_round(fed.spec(t=2, quorum=2, deadline_s=90))
        order = ["consent", "keys", "share_keys", "release", "confirm", "unmask"]
        notice = {"advertise": "keys"}.get(kill_in, kill_in)
        for phase in order[:order.index(notice)]:
            for d in drivers.values():
                assert d.step()[0] == phase
        pushed = {s: d.next() for s, d in drivers.items()}
        assert {notice_phase(p) for p in pushed.values()} == {notice}
        answers = {s: drivers[s].answer(p) for s, p in pushed.items()}
        for s in fed.sites[:2]:
            drivers[s].send(answers[s])
        coordinator.close()
        agg.kill()
        agg.start()                                  # same store, same port
        coordinator = fed.coordinator()
        status = coordinator.status("sec-1")
        assert status.state == {"advertise": pb.RoundStatus.KEYS,
                                "release": pb.RoundStatus.RELEASE,
                                "unmask": pb.RoundStatus.UNMASK}[kill_in]
        for d in drivers.values():
            d.reconnect(address)
        if kill_in == "release":   # a site resending its release after the outage: a duplicate
            assert drivers["site-a"].send(answers["site-a"]).duplicate

        def unmasked():
            return coordinator.status("sec-1").state in FINAL + (pb.RoundStatus.FITTING,)
        for s in fed.sites[2:]:
            assert drivers[s].next().payload == pushed[s].payload
            if not unmasked():
                drivers[s].send(answers[s])
        for phase in order[order.index(notice) + 1:]:
            for d in drivers.values():
                if unmasked():
                    break
                assert d.step()[0] == phase
        status = coordinator.wait("sec-1", 60, poll_s=0.1)
        assert status.state == pb.RoundStatus.DONE, status.message
        import json
        summary = json.loads(coordinator.result("sec-1").summary_json)
        # The sum is exactly the sites' inputs: its (noisy) n is the decoded sum's n.
        from dpfed import secure_round
        spec = fed.spec(t=2, quorum=2)
        calibration = secure_round.build(spec, fed.sites).calibration
        _, n = calibration.decode(fp.wrap_sum([seen[s] for s in fed.sites]))
        assert summary["n_total"] == max(0, int(n))
        assert sorted(c.site_id for c in status.contributions) == fed.sites
        for s in fed.sites:
            spent, releases = _ledger(fed, s)
            assert spent == pytest.approx(EPSILON) and [r.round_id for r in releases] == ["sec-1"]
    finally:
        for d in drivers.values():
            d.close()
        agg.stop()
