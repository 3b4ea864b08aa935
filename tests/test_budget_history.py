"""Issue 11, finding 2: the site's budget history, defended in depth.

A real aggregator gRPC server in this process (tests/conftest.py ``federation``) and a real
site node dialling it. What is checked: the aggregator records each site's spending and the
total it declared, and refuses a contribution beyond it (durably: also after a restart); a
site whose state_db was deleted refuses to serve until `dpfed site ledger --acknowledge-reset`
carries the aggregator's figure into the new ledger; a refusal that debited counts.
"""

from __future__ import annotations

import secrets
import threading
import time

import grpc
import numpy as np
import pytest

from dpfed import exitcodes
from dpfed_apps import cli
from dpfed.v1 import dpfed_pb2 as pb
from tests.conftest import random_statistics


def write_site(fed, tmp_path, site="site-a", total=10.0):
    """site.toml for ``site`` of ``fed``: its key, a data file matching fed.spec(), insecure."""
    folder = tmp_path / site
    (folder / "data").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = ["id,x0,x1,x2,y"]
    for i in range(300):
        x = rng.normal(size=3) * 0.2
        rows.append(f"{i},{x[0]:.4f},{x[1]:.4f},{x[2]:.4f},{x.sum() + rng.normal() * 0.1:.4f}")
    (folder / "data" / "site.csv").write_text("\n".join(rows) + "\n")
    config = folder / "site.toml"
    config.write_text(f"""
site_id = "{site}"
aggregator = "{fed.address}"
state_db = "state/ledger.sqlite"
signing_key = "{fed.tmp / (site + '.key')}"
insecure = true

[data]
path = "data/site.csv"
id_column = "id"

[policy]
trusted_coordinators = ["{fed.tmp / 'coordinator.pub'}"]
max_epsilon_per_round = 2.0
total_epsilon = {total}
min_n = 20
""")
    return config


class Running:
    """A SiteNode + SiteClient serving in a thread."""

    def __init__(self, config):
        from site_node.client import Backoff, SiteClient
        from site_node.config import load_config
        from site_node.node import SiteNode
        self.node = SiteNode(load_config(config))
        self.client = SiteClient(self.node, rpc_timeout_s=5, reconnect=Backoff(0.05, 0.2))
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.client.run()
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            self.error = exc

    def stop(self):
        self.client.stop()
        self.thread.join(10)
        self.node.ledger.close()


def wait_connected(fed, site="site-a", timeout_s=20.0):
    end = time.monotonic() + timeout_s
    while not any(s.connected for s in fed.coordinator.list_sites() if s.site_id == site):
        assert time.monotonic() < end, f"{site} never connected"
        time.sleep(0.05)


def site_spec(fed, round_id, site="site-a"):
    return fed.spec(round_id, quorum=1, sites=[site],
                    preprocessing=pb.Preprocessing(x_mean=[0.0] * 3, y_mean=0.0))


def run_round(fed, round_id, site="site-a"):
    fed.start_round(site_spec(fed, round_id, site))
    status = fed.coordinator.wait(round_id, 30, poll_s=0.05)
    assert status.state == pb.RoundStatus.DONE, status.message
    return status


def _cli(argv, capsys):
    code = cli.main(["--log-level", "ERROR", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_deleted_state_db_refuses_to_serve_until_the_reset_is_acknowledged(federation, tmp_path,
                                                                           capsys):
    fed = federation
    config = write_site(fed, tmp_path)
    site = Running(config)
    try:
        wait_connected(fed)
        run_round(fed, "r1")
        assert site.node.ledger.spent == pytest.approx(2.0)
    finally:
        site.stop()

    for f in (config.parent / "state").iterdir():    # the operator deletes the state_db
        f.unlink()
    site = Running(config)
    site.thread.join(20)
    assert not site.thread.is_alive(), "a site with a deleted ledger kept serving"
    assert type(site.error).__name__ == "LedgerMismatch"
    message = str(site.error)
    assert "epsilon 2 spent" in message and "empty" in message and "--acknowledge-reset" in message
    assert site.node.blocked and site.node.ledger.spent == 0.0
    # Every round is refused while blocked, nothing drawn or debited.
    answer = site.node.handle_round(fed.coordinator_key.sign(site_spec(fed, "r-blocked")))
    assert answer.payload_type == "dpfed.v1.Refusal" and site.node.ledger.spent == 0.0
    site.node.ledger.close()
    # The command a hospital runs says the same and exits 4 (refused).
    code, _, err = _cli(["site", "serve", "--config", str(config)], capsys)
    assert code == exitcodes.REFUSED and "--acknowledge-reset" in err and "empty" in err

    code, out, err = _cli(["site", "ledger", "--acknowledge-reset", "--config", str(config),
                           "--operator", "dr-ops"], capsys)
    assert code == exitcodes.OK, err
    assert "2 carried over" in out
    site = Running(config)
    try:
        assert site.node.ledger.spent == pytest.approx(2.0)   # continues from the aggregator's
        wait_connected(fed)
        run_round(fed, "r2")
        assert site.node.ledger.spent == pytest.approx(4.0)
        events = site.node.ledger.budget_events()
        assert [(e["kind"], e["epsilon"], e["operator"]) for e in events
                if e["kind"] == "reset_acknowledged"] == [("reset_acknowledged", 2.0, "dr-ops")]
    finally:
        site.stop()
    history = fed.manager.budgets.history("site-a")
    assert (history.spent_epsilon, history.rounds, history.declared_total_epsilon) == (4.0, 2, 10.0)


def test_new_ledger_with_a_larger_total_than_declared_refuses_to_serve(federation, tmp_path):
    """A state_db deleted before anything was spent, recreated with a larger total_epsilon:
    the aggregator knows the smaller declared total; the site refuses to serve."""
    fed = federation
    config = write_site(fed, tmp_path, total=4.0)
    site = Running(config)
    try:
        wait_connected(fed)
    finally:
        site.stop()
    for f in (config.parent / "state").iterdir():
        f.unlink()
    config.write_text(config.read_text().replace("total_epsilon = 4.0", "total_epsilon = 40.0"))
    site = Running(config)
    site.thread.join(20)
    assert not site.thread.is_alive(), "a new ledger with a larger total kept serving"
    assert type(site.error).__name__ == "LedgerMismatch" and "last declared 4" in str(site.error)
    site.node.ledger.close()
    assert fed.manager.budgets.history("site-a").declared_total_epsilon == 4.0


def _subscribe_declaring(fed, site, total):
    """Open site's round stream with a hello declaring ``total``, until it is recorded."""
    hello = fed.site_keys[site].sign(pb.SiteHello(
        site_id=site, timestamp_unix_ms=int(time.time() * 1000), nonce=secrets.token_hex(16),
        total_epsilon=total, trusted_coordinator_key_ids=[fed.coordinator_key.key_id]))
    call = fed.stub.Subscribe(hello)
    end = time.monotonic() + 10
    while fed.manager.budgets.history(site).declared_total_epsilon != total:
        assert time.monotonic() < end
        time.sleep(0.02)
    return call


def test_contribution_beyond_the_declared_total_is_refused_and_nothing_stored(federation):
    fed = federation
    stream = _subscribe_declaring(fed, "site-a", 3.0)
    stream.cancel()
    for rid in ("r1", "r2", "r3"):
        fed.start_round(fed.spec(rid, quorum=1, sites=["site-a"]))
    stats = random_statistics()
    assert fed.stub.Contribute(fed.contribution("site-a", "r1", stats), timeout=5).accepted

    def refused(round_id):
        with pytest.raises(grpc.RpcError) as info:
            fed.stub.Contribute(fed.contribution("site-a", round_id, stats), timeout=5)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = info.value.details()
        assert "cumulative epsilon to 4" in details and "total budget 3" in details, details
        assert fed.manager.store.contributions(round_id) == []
        assert not fed.manager.status(round_id).contributions

    refused("r2")
    # Durable: the aggregator's record survives a restart.
    fed.stop()
    fed.start()
    refused("r2")
    history = fed.manager.budgets.history("site-a")
    assert (history.spent_epsilon, history.rounds, history.declared_total_epsilon) == (2.0, 1, 3.0)

    # A refusal that debited (noisy n below min_n) must name the round's epsilon, and counts.
    def refusal(round_id, eps):
        return fed.site_keys["site-a"].sign(pb.Refusal(
            round_id=round_id, site_id="site-a", spec_digest=fed.spec_digest(round_id),
            reason="the released (noisy) row count is below the policy's min_n",
            timestamp_unix_ms=int(time.time() * 1000), nonce=secrets.token_hex(16),
            epsilon_spent=eps))
    with pytest.raises(grpc.RpcError) as info:
        fed.stub.Refuse(refusal("r3", 0.5), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    fed.stub.Refuse(refusal("r3", 2.0), timeout=5)
    assert fed.manager.status("r3").refusals[0].epsilon_spent == 2.0
    assert fed.manager.budgets.history("site-a").spent_epsilon == 4.0
    fed.stop()
    fed.start()
    assert fed.manager.budgets.history("site-a").spent_epsilon == 4.0


def test_site_history_is_only_for_the_site_itself(federation):
    fed = federation
    hello = fed.site_keys["site-b"].sign(pb.SiteHello(
        site_id="site-a", timestamp_unix_ms=int(time.time() * 1000), nonce=secrets.token_hex(16)))
    with pytest.raises(grpc.RpcError) as info:
        fed.stub.GetSiteHistory(hello, timeout=5)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
