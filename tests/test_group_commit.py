"""Group commit of contributions: concurrent contributions share SQLite transactions, yet
each is durable before its caller returns, fails alone, and the round neither closes nor
fails while one is being committed."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from aggregator.store import RoundStore, StoredRound
from dpfed.v1 import dpfed_pb2 as pb

from tests.conftest import random_statistics
from tests.test_aggregator_rounds import stored_contribution_of


def _store(tmp_path) -> RoundStore:
    store = RoundStore(tmp_path / "g.sqlite")
    store.insert_round(StoredRound("r1", b"env", "dig", 3, 2, 123, ["a"], "OPEN", "", 5, 0.0, 0.0))
    return store


def test_concurrent_inserts_are_all_durable_and_a_failure_stays_with_its_caller(tmp_path):
    store = _store(tmp_path)
    store.insert_nonce("key-dup", "n-dup", 1)
    start = threading.Barrier(41)
    batches: list[int] = []
    real_commit = store._commit_batch

    def commit(batch):
        if not batches:   # hold the first commit until everyone else has queued behind it
            for _ in range(1000):
                if len(store._queue) >= 40 - len(batch):
                    break
                time.sleep(0.01)
        batches.append(len(batch))
        real_commit(batch)

    store._commit_batch = commit
    errors: dict[int, BaseException] = {}

    def insert(i: int) -> None:
        start.wait()
        nonce = ("key-dup", "n-dup") if i == 7 else (f"key-{i}", f"n-{i}")
        try:
            store.insert_contribution(stored_contribution_of("r1", f"s{i:02d}", i), *nonce, 1)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertions
            errors[i] = exc

    threads = [threading.Thread(target=insert, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    start.wait()
    for t in threads:
        t.join()
    assert list(errors) == [7] and isinstance(errors[7], sqlite3.IntegrityError)
    # The writer took whatever was queued (possibly all 40 at once); anything queued while
    # its first commit was held went into the second: at most two commits for 40 callers.
    assert sum(batches) == 40 and len(batches) <= 2
    store.close()
    again = RoundStore(tmp_path / "g.sqlite")   # what a restart sees
    assert [c.site_id for c in again.contributions("r1")] == [f"s{i:02d}" for i in range(40) if i != 7]
    assert len(again.nonces_since(0)) == 40     # 39 new + the pre-existing duplicate


def test_round_waits_for_contributions_being_stored(federation, monkeypatch):
    """A deadline that passes while a contribution is being committed is decided once it is
    durable (here: quorum reached, so the round is fitted, not failed, and site-c, which
    never released, is listed as dropped); meanwhile the site's retry is told to retry."""
    manager = federation.manager
    federation.start_round(federation.spec(quorum=2))
    stats = random_statistics(seed=1)
    assert federation.stub.Contribute(federation.contribution("site-a", "r1", stats)).accepted
    entered, release = threading.Event(), threading.Event()
    real = manager.store.insert_contribution_later

    def slow_insert(*args, **kwargs):
        entered.set()
        assert release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(manager.store, "insert_contribution_later", slow_insert)
    envelope = federation.contribution("site-b", "r1", stats)
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.setdefault(
        "reply", manager.contribute(envelope)))
    worker.start()
    assert entered.wait(10)
    from aggregator.rounds import Rejected
    with pytest.raises(Rejected) as info:             # the same site, still being stored
        manager.contribute(envelope)
    assert info.value.code == "UNAVAILABLE"
    manager.transitions.on_deadline("r1")              # deadline passes mid-commit
    assert manager.status("r1").state == pb.RoundStatus.RELEASE
    release.set()
    worker.join(10)
    assert outcome["reply"].accepted and not outcome["reply"].duplicate
    status = federation.coordinator.wait("r1", 60, poll_s=0.05)
    assert status.state == pb.RoundStatus.DONE, status.message
    assert [c.site_id for c in status.contributions] == ["site-a", "site-b"]
    assert list(status.dropped) == ["site-c"]


def test_a_failed_commit_frees_the_slot_and_the_deadline_then_applies(federation, monkeypatch):
    manager = federation.manager
    federation.start_round(federation.spec(quorum=2))
    stats = random_statistics(seed=2)
    entered, release = threading.Event(), threading.Event()

    def failing_insert(*args, **kwargs):
        entered.set()
        assert release.wait(10)
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(manager.store, "insert_contribution_later", failing_insert)
    envelope = federation.contribution("site-a", "r1", stats)
    outcome = {}

    def run():
        try:
            manager.contribute(envelope)
        except BaseException as exc:  # noqa: BLE001
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    assert entered.wait(10)
    manager.transitions.on_deadline("r1")
    assert manager.status("r1").state == pb.RoundStatus.RELEASE
    release.set()
    worker.join(10)
    assert isinstance(outcome["error"], sqlite3.OperationalError)
    status = manager.status("r1")
    assert status.state == pb.RoundStatus.FAILED and "deadline passed with 0" in status.message
    assert list(status.contributions) == []


def test_concurrent_consents_share_commits(federation):
    """Consents arriving together are committed together (one SQLite transaction for many,
    not one each), and every one of them is durable and counted."""
    manager = federation.manager
    federation.start_round(federation.spec(quorum=2), consent=False)
    batches: list[int] = []
    real_commit = manager.store._commit_batch

    def commit(batch):
        if not batches:   # hold the first commit until the others have queued behind it
            for _ in range(500):
                if len(manager.store._queue) >= 2:
                    break
                time.sleep(0.01)
        batches.append(len(batch))
        real_commit(batch)

    manager.store._commit_batch = commit
    envelopes = [federation.consent(site, "r1") for site in federation.SITES]
    start = threading.Barrier(len(envelopes))
    replies = {}

    def send(env):
        start.wait()
        replies[env.key_id] = manager.send_phase(env)

    threads = [threading.Thread(target=send, args=(e,)) for e in envelopes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert [r.message for r in replies.values()] == ["consent recorded"] * len(envelopes)
    assert sum(batches) == len(envelopes) and len(batches) < len(envelopes)
    assert sorted(manager.store.consents("r1")) == sorted(federation.SITES)
    status = manager.status("r1")
    assert status.state == pb.RoundStatus.RELEASE
    assert sorted(status.consented) == sorted(federation.SITES)


def test_consent_deadline_waits_for_consents_being_stored(federation, monkeypatch):
    """The consent deadline passing while a consent is being committed is carried out once
    it is durable: the site answered "consent recorded" is a participant; a retry meanwhile
    waits for it and is answered as a duplicate; the release phase then gets its own deadline (not the consent's)."""
    manager = federation.manager
    federation.start_round(federation.spec(quorum=2), consent=False)
    federation.stub.SendPhase(federation.consent("site-a", "r1"))
    entered, release = threading.Event(), threading.Event()
    real = manager.store.insert_consent_later

    def slow_insert(*args, **kwargs):
        entered.set()
        assert release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(manager.store, "insert_consent_later", slow_insert)
    envelope = federation.consent("site-b", "r1")
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.setdefault(
        "reply", manager.send_phase(envelope)))
    worker.start()
    assert entered.wait(10)
    resend = threading.Thread(target=lambda: outcome.setdefault(
        "resend", manager.send_phase(federation.consent("site-b", "r1"))))
    resend.start()                                      # waits for the first commit
    manager.transitions.on_deadline("r1", "CONSENT", "")  # consent deadline passes mid-commit
    assert manager.status("r1").state == pb.RoundStatus.CONSENT
    assert "resend" not in outcome
    release.set()
    worker.join(10)
    resend.join(10)
    assert outcome["reply"].message == "consent recorded"
    assert outcome["resend"].message == "consent already recorded"
    status = manager.status("r1")
    assert status.state == pb.RoundStatus.RELEASE, status.message
    assert list(status.consented) == ["site-a", "site-b"]
    assert not manager.context.rounds["r1"].deadline_due
