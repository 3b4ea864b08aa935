"""What the coordinator's read-only RPCs tell about rounds and sites (issue 13: the console
shows them): a site's spending round by round (GetSiteSpending), the spec and the invited
sites in a round's status, and finished rounds read back after a restart with their
contributions (not listed as dropped)."""

from __future__ import annotations

import secrets
import time

import grpc
import pytest

from aggregator.identity import COORDINATOR, PeerIdentity
from dpfed.v1 import dpfed_pb2 as pb
from tests.conftest import random_statistics


def _code(call):
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def _finish(fed, round_id, sites=("site-a", "site-b"), refuse=()):
    fed.start_round(fed.spec(round_id, quorum=len(sites), sites=[*sites, *refuse]))
    for i, s in enumerate(sites):
        assert fed.stub.Contribute(fed.contribution(s, round_id, random_statistics(seed=i))).accepted
    for s in refuse:
        fed.stub.Refuse(fed.refusal(s, round_id, "min_n: too few rows after the noise",
                                    epsilon_spent=2.0))
    status = fed.coordinator.wait(round_id, 20, poll_s=0.05)
    assert status.state == pb.RoundStatus.DONE, status.message
    return status


def test_site_spending_lists_each_round_and_adds_up_to_the_site_list(federation):
    fed = federation
    _finish(fed, "r1", refuse=("site-c",))
    _finish(fed, "r2", sites=("site-a",))
    a = fed.stub.GetSiteSpending(pb.SiteQuery(site_id="site-a"))
    assert [(r.round_id, r.epsilon, r.refused) for r in a.rounds] == [("r1", 2.0, False),
                                                                       ("r2", 2.0, False)]
    assert a.spent_epsilon == 4.0 and all(r.received_unix_ms > 0 for r in a.rounds)
    # A refusal that debited is a spend too, marked as such.
    c = fed.stub.GetSiteSpending(pb.SiteQuery(site_id="site-c"))
    assert [(r.round_id, r.epsilon, r.refused) for r in c.rounds] == [("r1", 2.0, True)]
    listed = {s.site_id: s for s in fed.coordinator.list_sites()}
    assert (listed["site-a"].rounds, listed["site-a"].spent_epsilon) == (2, 4.0)
    assert (listed["site-c"].rounds, listed["site-b"].rounds) == (1, 1)
    assert _code(lambda: fed.stub.GetSiteSpending(pb.SiteQuery(site_id="nobody"))) == \
        grpc.StatusCode.NOT_FOUND
    assert _code(lambda: fed.stub.GetSiteSpending(pb.SiteQuery(site_id="../x"))) == \
        grpc.StatusCode.INVALID_ARGUMENT


def test_site_spending_is_hidden_from_a_coordinator_the_site_does_not_trust(federation):
    fed = federation
    hello = fed.site_keys["site-a"].sign(pb.SiteHello(
        site_id="site-a", timestamp_unix_ms=int(time.time() * 1000), nonce=secrets.token_hex(16),
        total_epsilon=10.0, trusted_coordinator_key_ids=[fed.coordinator_key.key_id]))
    call = fed.stub.Subscribe(hello)
    end = time.monotonic() + 10
    while fed.manager.budgets.history("site-a").declared_total_epsilon != 10.0:
        assert time.monotonic() < end
        time.sleep(0.02)
    call.cancel()
    _finish(fed, "r1", sites=("site-a",))
    trusted = fed.manager.site_spending("site-a", PeerIdentity(COORDINATOR, "coord"))
    assert not trusted.hidden and [r.round_id for r in trusted.rounds] == ["r1"]
    assert trusted.declared_total_epsilon == 10.0
    other = fed.manager.site_spending("site-a", PeerIdentity(COORDINATOR, "someone-else"))
    assert "does not trust" in other.hidden and not other.rounds and other.spent_epsilon == 0


def test_round_status_carries_the_spec_without_public_statistics_and_the_invited(federation):
    from dpfed.statistics import Statistics
    import numpy as np
    fed = federation
    public = Statistics(np.eye(3), np.ones(3), 3.0, 10)
    fed.start_round(fed.spec("r1", quorum=1, sites=["site-a", "site-c"], public=public))
    status = fed.coordinator.status("r1")
    assert list(status.invited) == ["site-a", "site-c"]
    assert status.spec.target == "y" and list(status.spec.feature_names) == ["x0", "x1", "x2"]
    assert status.spec.epsilon == 2.0 and status.spec.coordinator_id == "coord"
    assert status.spec.public_statistics == b""


def test_a_finished_round_read_after_a_restart_keeps_its_contributions(federation):
    fed = federation
    before = _finish(fed, "r1", refuse=("site-c",))
    fed.stop()
    fed.start()
    after = fed.coordinator.status("r1")
    assert after.state == pb.RoundStatus.DONE
    assert [(c.site_id, c.n, c.epsilon_spent, c.received_unix_ms) for c in after.contributions] \
        == [(c.site_id, c.n, c.epsilon_spent, c.received_unix_ms) for c in before.contributions]
    assert list(after.dropped) == [] and [r.site_id for r in after.refusals] == ["site-c"]
    (summary,) = fed.coordinator.list_rounds().rounds
    assert (summary.contributed, summary.refused) == (2, 1)
    # The result is still there, and the sum it was fitted on is the stored one.
    assert fed.coordinator.result("r1").dim == 3


def test_round_list_command_prints_the_rounds(federation, capsys):
    import json

    from dpfed_apps import cli
    _finish(federation, "r1")
    _finish(federation, "r2", sites=("site-a",))
    args = ["round", "list", "--aggregator", federation.address, "--insecure"]
    assert cli.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["round", "state"]
    assert [ln.split()[:2] for ln in lines[1:]] == [["r2", "DONE"], ["r1", "DONE"]]
    assert cli.main([*args, "--json", "--limit", "1"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["round_id"] for r in rows] == ["r2"] and rows[0]["contributed"] == 1
