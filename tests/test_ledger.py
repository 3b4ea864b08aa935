"""The privacy ledger: atomic debit + store, replay of stored bytes, durability, no overspend."""

from __future__ import annotations

import multiprocessing as mp
import threading

import pytest

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.signing import SigningKey
from site_node.ledger import BudgetExhausted, PrivacyLedger, RoundConflict

KEY = SigningKey.generate()


def envelope(round_id: str, noise: float = 0.0) -> pb.SignedEnvelope:
    return KEY.sign(pb.Contribution(round_id=round_id, site_id="s", statistics=b"x" * 8,
                                    n=50, epsilon_spent=1.0, spec_digest="d" * 64,
                                    timestamp_unix_ms=1, nonce=repr(noise)))


def record(ledger, round_id, eps=1.0, digest="d" * 64, noise=0.0):
    return ledger.record_release(round_id=round_id, spec_digest=digest, epsilon=eps, n=50,
                                 envelope=envelope(round_id, noise))


def test_record_debits_and_stores(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.sqlite", site_id="s", total_epsilon=3.0)
    result = record(ledger, "r1", 1.0)
    assert result.fresh
    assert ledger.spent == pytest.approx(1.0)
    assert ledger.remaining == pytest.approx(2.0)
    assert ledger.get_release("r1").envelope.SerializeToString() == envelope("r1").SerializeToString()


def test_wal_and_full_sync(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.sqlite", site_id="s", total_epsilon=3.0)
    assert ledger._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert ledger._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_repeat_returns_identical_bytes_and_does_not_debit(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.sqlite", site_id="s", total_epsilon=3.0)
    first = record(ledger, "r1", noise=1.0)
    again = record(ledger, "r1", noise=2.0)  # a second release attempt with different noise
    assert not again.fresh
    assert again.release.envelope.SerializeToString() == first.release.envelope.SerializeToString()
    assert again.release.envelope.payload == envelope("r1", 1.0).payload
    assert ledger.spent == pytest.approx(1.0)


def test_same_round_different_spec_is_refused(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.sqlite", site_id="s", total_epsilon=3.0)
    record(ledger, "r1")
    with pytest.raises(RoundConflict):
        record(ledger, "r1", digest="e" * 64)
    assert ledger.spent == pytest.approx(1.0)


class _CrashingLedger(PrivacyLedger):
    """Fails after the debit is written, before the release is stored."""

    def _store(self, *args, **kwargs):
        raise RuntimeError("power cut")


def test_crash_between_debit_and_store_leaves_neither(tmp_path):
    path = tmp_path / "l.sqlite"
    crashing = _CrashingLedger(path, site_id="s", total_epsilon=3.0)
    with pytest.raises(RuntimeError, match="power cut"):
        record(crashing, "r1")
    crashing.close()
    ledger = PrivacyLedger(path, site_id="s", total_epsilon=3.0)
    assert ledger.spent == 0.0
    assert ledger.get_release("r1") is None
    assert ledger._conn.execute("SELECT COUNT(*) FROM debits").fetchone()[0] == 0
    # and the ledger is usable afterwards (the failed transaction released its lock)
    assert record(ledger, "r1").fresh


def test_survives_reopen(tmp_path):
    path = tmp_path / "l.sqlite"
    with PrivacyLedger(path, site_id="s", total_epsilon=3.0) as ledger:
        record(ledger, "r1", 1.5)
        ledger.mark_acknowledged("r1")
    with PrivacyLedger(path, site_id="s", total_epsilon=3.0) as ledger:
        assert ledger.spent == pytest.approx(1.5)
        stored = ledger.get_release("r1")
        assert stored.acknowledged
        assert stored.envelope.payload == envelope("r1").payload
        assert ledger.unacknowledged() == []


def test_budget_exhaustion_refuses_and_writes_nothing(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.sqlite", site_id="s", total_epsilon=2.0)
    record(ledger, "r1", 1.5)
    with pytest.raises(BudgetExhausted):
        record(ledger, "r2", 1.0)
    assert ledger.spent == pytest.approx(1.5)
    assert ledger.get_release("r2") is None


def test_budget_fits_exactly_despite_float_sums(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.sqlite", site_id="s", total_epsilon=1.0)
    for i in range(10):
        record(ledger, f"r{i}", 0.1)
    with pytest.raises(BudgetExhausted):
        record(ledger, "r10", 0.1)


def test_total_increase_in_config_refuses_to_open_until_recorded(tmp_path):
    """Issue 11, finding 2 (c): a larger total_epsilon in the config stops the ledger (and
    the site) from opening; only an explicit raise, kept with who and when, changes it."""
    from site_node.ledger import LedgerError
    path = tmp_path / "l.sqlite"
    with PrivacyLedger(path, site_id="s", total_epsilon=2.0) as ledger:
        record(ledger, "r1", 2.0)
    with pytest.raises(LedgerError, match="--raise-total"):
        PrivacyLedger(path, site_id="s", total_epsilon=100.0)
    with PrivacyLedger(path, site_id="s") as ledger:
        assert ledger.total_epsilon == 2.0 and ledger.remaining == 0.0
        with pytest.raises(LedgerError, match="nothing to raise"):
            ledger.raise_total(2.0, operator="ops@hospital")
        assert ledger.raise_total(100.0, operator="ops@hospital") == 2.0
    with PrivacyLedger(path, site_id="s", total_epsilon=100.0) as ledger:
        assert ledger.total_epsilon == 100.0
        raised = [e for e in ledger.budget_events() if e["kind"] == "raised"]
        assert [(e["old_total"], e["new_total"], e["operator"]) for e in raised] == [
            (2.0, 100.0, "ops@hospital")] and raised[0]["created_unix_ms"] > 0
        record(ledger, "r2", 1.0)


def test_total_decrease_in_config_tightens_for_good(tmp_path):
    from site_node.ledger import LedgerError
    path = tmp_path / "l.sqlite"
    with PrivacyLedger(path, site_id="s", total_epsilon=5.0):
        pass
    with PrivacyLedger(path, site_id="s", total_epsilon=3.0) as ledger:
        assert ledger.total_epsilon == 3.0
        assert [e["kind"] for e in ledger.budget_events()] == ["created", "lowered"]
    with pytest.raises(LedgerError, match="--raise-total"):   # going back up is a raise
        PrivacyLedger(path, site_id="s", total_epsilon=5.0)
    with PrivacyLedger(path, site_id="s") as ledger:
        assert ledger.total_epsilon == 3.0


def test_acknowledge_reset_continues_from_the_larger_figure(tmp_path):
    with PrivacyLedger(tmp_path / "l.sqlite", site_id="s", total_epsilon=10.0) as ledger:
        record(ledger, "r1", 1.0)
        # The aggregator knows less than the ledger: nothing carried, nothing lowered.
        assert ledger.acknowledge_reset(aggregator_spent=0.5, operator="op") == 0.0
        assert ledger.spent == pytest.approx(1.0)
        assert ledger.acknowledge_reset(aggregator_spent=4.0, aggregator_rounds=2,
                                        aggregator_total=8.0, operator="op") == pytest.approx(3.0)
        assert ledger.spent == pytest.approx(4.0) and ledger.total_epsilon == 8.0
        kinds = [e["kind"] for e in ledger.budget_events()]
        assert kinds == ["created", "reset_acknowledged", "reset_acknowledged", "lowered"]


def test_ledger_belongs_to_one_site(tmp_path):
    path = tmp_path / "l.sqlite"
    PrivacyLedger(path, site_id="a", total_epsilon=1.0).close()
    with pytest.raises(Exception, match="ledger of site 'a'"):
        PrivacyLedger(path, site_id="b", total_epsilon=1.0)


def test_unacknowledged_and_rejected(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.sqlite", site_id="s", total_epsilon=5.0)
    for r in ("r1", "r2", "r3"):
        record(ledger, r)
    ledger.mark_acknowledged("r1")
    ledger.mark_rejected("r3", "stale timestamp")
    assert [r.round_id for r in ledger.unacknowledged()] == ["r2"]
    summary = ledger.summary()
    assert summary["spent_epsilon"] == pytest.approx(3.0)
    assert {r["round_id"]: r["last_error"] for r in summary["releases"]}["r3"] == "stale timestamp"


def test_threads_racing_cannot_overspend(tmp_path):
    path = tmp_path / "l.sqlite"
    PrivacyLedger(path, site_id="s", total_epsilon=5.0).close()
    outcomes = []

    def worker(i):
        ledger = PrivacyLedger(path, site_id="s")
        try:
            record(ledger, f"r{i}", 1.0)
            outcomes.append("ok")
        except BudgetExhausted:
            outcomes.append("refused")
        finally:
            ledger.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("ok") == 5
    with PrivacyLedger(path) as ledger:
        assert ledger.spent == pytest.approx(5.0)


def _process_worker(path, start, i, results):
    ledger = PrivacyLedger(path, site_id="s")
    start.wait()
    spent_ok = 0
    for k in range(4):
        try:
            # Half the workers also race on the same round id: at most one release for it.
            round_id = "shared" if k == 0 else f"p{i}-{k}"
            if record(ledger, round_id, 0.5).fresh:
                spent_ok += 1
        except BudgetExhausted:
            pass
    results.put(spent_ok)
    ledger.close()


def test_processes_racing_cannot_overspend(tmp_path):
    path = str(tmp_path / "l.sqlite")
    PrivacyLedger(path, site_id="s", total_epsilon=4.0).close()
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    results = ctx.Queue()
    procs = [ctx.Process(target=_process_worker, args=(path, start, i, results)) for i in range(6)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    fresh = sum(results.get(timeout=5) for _ in procs)
    with PrivacyLedger(path) as ledger:
        assert ledger.spent == pytest.approx(4.0)
        assert fresh == 8  # 4.0 / 0.5: every fresh release was debited, none beyond the total
        debited_rounds = [r[0] for r in ledger._conn.execute("SELECT round_id FROM debits")]
        assert debited_rounds.count("shared") == 1


def test_ledger_records_the_neighbouring_relation_of_each_release(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.sqlite", site_id="s", total_epsilon=5.0)
    ledger.record_release(round_id="a", spec_digest="d" * 64, epsilon=1.0, n=10,
                          envelope=envelope("a"), neighbouring="add_remove")
    ledger.record_release(round_id="b", spec_digest="d" * 64, epsilon=1.0, n=10,
                          envelope=envelope("b"), neighbouring="replace_one")
    assert [r.neighbouring for r in ledger.releases()] == ["add_remove", "replace_one"]
    assert [r["neighbouring"] for r in ledger.summary()["releases"]] == ["add_remove",
                                                                         "replace_one"]
    with pytest.raises(ValueError, match="neighbouring"):
        ledger.record_release(round_id="c", spec_digest="d" * 64, epsilon=1.0, n=10,
                              envelope=envelope("c"), neighbouring="bounded")
    assert ledger.spent == pytest.approx(2.0)
    ledger.close()
    reopened = PrivacyLedger(tmp_path / "l.sqlite")
    assert reopened.get_release("a").neighbouring == "add_remove"


def _version_1_ledger(path):
    """A ledger file exactly as schema version 1 wrote it (no releases.neighbouring)."""
    import sqlite3
    conn = sqlite3.connect(str(path))
    conn.executescript("""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE releases (
    round_id TEXT PRIMARY KEY, spec_digest TEXT NOT NULL,
    epsilon REAL NOT NULL CHECK (epsilon > 0), n INTEGER NOT NULL, envelope BLOB NOT NULL,
    created_unix_ms INTEGER NOT NULL, sent INTEGER NOT NULL DEFAULT 0,
    acknowledged INTEGER NOT NULL DEFAULT 0, last_error TEXT);
CREATE TABLE debits (id INTEGER PRIMARY KEY AUTOINCREMENT, round_id TEXT NOT NULL,
    epsilon REAL NOT NULL CHECK (epsilon > 0), reason TEXT NOT NULL,
    created_unix_ms INTEGER NOT NULL);
INSERT INTO meta VALUES ('schema_version', '1'), ('site_id', 's'), ('total_epsilon', '5.0');
INSERT INTO debits(round_id, epsilon, reason, created_unix_ms) VALUES ('old', 1.5, 'release', 1);
""")
    conn.execute("INSERT INTO releases(round_id, spec_digest, epsilon, n, envelope, "
                 "created_unix_ms, acknowledged) VALUES ('old', ?, 1.5, 57, ?, 1, 1)",
                 ("d" * 64, envelope("old").SerializeToString()))
    conn.commit()
    conn.close()


def test_version_1_ledger_is_migrated_keeping_budget_and_releases(tmp_path):
    path = tmp_path / "old.sqlite"
    _version_1_ledger(path)
    ledger = PrivacyLedger(path, site_id="s", total_epsilon=5.0)
    assert ledger._meta("schema_version") == "4"   # 1 -> 2 -> 3 (budget_events) -> 4
    old = ledger.get_release("old")
    # Every version-1 release was made under replace-one (n exact): recorded as such.
    assert old.neighbouring == "replace_one" and old.n == 57 and old.acknowledged
    assert old.envelope.SerializeToString() == envelope("old").SerializeToString()
    assert ledger.spent == pytest.approx(1.5) and ledger.total_epsilon == 5.0
    ledger.record_release(round_id="new", spec_digest="d" * 64, epsilon=1.0, n=10,
                          envelope=envelope("new"), neighbouring="add_remove")
    ledger.close()
    again = PrivacyLedger(path, site_id="s")  # opening a migrated ledger again: no-op
    assert [(r.round_id, r.neighbouring) for r in again.releases()] == [
        ("old", "replace_one"), ("new", "add_remove")]
    assert again.spent == pytest.approx(2.5)


def test_ledger_of_an_unknown_future_schema_is_refused(tmp_path):
    from site_node.ledger import LedgerError
    path = tmp_path / "future.sqlite"
    PrivacyLedger(path, site_id="s", total_epsilon=1.0).close()
    import sqlite3
    conn = sqlite3.connect(str(path))
    conn.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="schema 5"):
        PrivacyLedger(path, site_id="s")
