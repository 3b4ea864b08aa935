"""A site process SIGKILLed at the dangerous moments of a round, then restarted.

The kill is the documented test hook DPFED_TEST_CRASH_AT (dpfed/faults.py):
* after_consent: the site consented (nothing drawn, nothing debited) and the round moved to
  its release phase; on restart the site is pushed the release notice and releases once;
* after_debit: the release is debited and stored, nothing sent yet;
* after_send: the aggregator accepted it, the site never recorded the acknowledgement.
On restart the site resends the *stored* envelope (byte-identical: same noise, nonce and
signature), the aggregator ends up with exactly one contribution from it, and the ledger
never under-counts: spent == releases x epsilon == epsilon of the one release.
"""

from __future__ import annotations

import signal
import time

import pytest

from aggregator.config import config_from_dict
from aggregator.server import AggregatorServer
from coordinator.client import Coordinator
from dpfed.v1 import dpfed_pb2 as pb
from site_node.ledger import PrivacyLedger
from tests.processes import site_process as _site_process
from tests.processes import stop_processes
from tests.test_site_node import make_spec, write_site

pytestmark = pytest.mark.slow

EPSILON = 1.0


@pytest.fixture
def setup(tmp_path):
    # The aggregator runs in this process (it is the site that is killed here).
    (tmp_path / "site").mkdir()
    config_path, coordinator_key, site_key = write_site(tmp_path / "site")
    agg = AggregatorServer(config_from_dict({
        "listen": "127.0.0.1:0", "state_db": "agg.sqlite", "insecure": True, "skip_fit": True,
        "grace_s": 0.2,
        "sites": [{"site_id": "hospital-a", "public_key": "site/keys/site.pub"}],
        "coordinators": [{"coordinator_id": "coordinator",
                          "public_key": "site/keys/coord.pub"}]}, tmp_path))
    port = agg.start()
    text = config_path.read_text().replace('aggregator = "127.0.0.1:1"',
                                           f'aggregator = "127.0.0.1:{port}"')
    config_path.write_text(text)
    coordinator = Coordinator(f"127.0.0.1:{port}", coordinator_key, "coordinator")
    procs = []
    yield config_path, agg, coordinator, procs
    stop_processes(procs)
    coordinator.close()
    agg.stop(0)


def _start_round(coordinator, quorum=1):
    spec = make_spec("crash-1", epsilon=EPSILON, quorum=quorum,
                     deadline_unix_ms=int(time.time() * 1000) + 60_000)
    coordinator.start_round(spec)


@pytest.mark.parametrize("crash_at", ["after_consent", "after_debit", "after_send"])
def test_site_killed_mid_release_resends_the_stored_bytes(setup, crash_at):
    config_path, agg, coordinator, procs = setup
    _start_round(coordinator)
    first = _site_process(config_path, crash_at)
    procs.append(first)
    assert first.wait(20) == -signal.SIGKILL, first.stderr.read().decode()[-2000:]

    ledger_path = config_path.parent / "state/ledger.sqlite"
    stored_envelope = None
    with PrivacyLedger(ledger_path) as ledger:
        if crash_at == "after_consent":
            assert ledger.releases() == [] and ledger.spent == 0   # consent costs nothing
        else:
            [release] = ledger.releases()
            assert not release.acknowledged
            assert ledger.spent == pytest.approx(EPSILON)  # debited before anything left
            stored_envelope = release.envelope.SerializeToString()
    held = agg.store.contributions("crash-1")
    if crash_at in ("after_consent", "after_debit"):
        assert coordinator.status("crash-1").state == pb.RoundStatus.RELEASE
        assert held == []                                  # nothing was sent
    else:
        assert len(held) == 1 and held[0].envelope == stored_envelope

    second = _site_process(config_path, None)
    procs.append(second)
    status = coordinator.wait("crash-1", 60, poll_s=0.1)
    assert status.state == pb.RoundStatus.DONE, status.message
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:                     # the ack is recorded after the reply
        with PrivacyLedger(ledger_path) as ledger:
            if ledger.releases()[0].acknowledged:
                break
        time.sleep(0.1)
    with PrivacyLedger(ledger_path) as ledger:
        [release] = ledger.releases()
        assert release.acknowledged
        assert ledger.spent == pytest.approx(EPSILON * len(ledger.releases()))
    [held] = agg.store.contributions("crash-1")
    if stored_envelope is not None:
        assert held.envelope == stored_envelope            # byte-identical: no fresh noise
    assert status.contributions[0].n == release.n       # the stored (noisy) n, not fresh
