"""Durable state of the aggregator's rounds in SQLite.

WAL journal, one transaction per state change, so a crash leaves either the old or the new
state and a restart can carry on (contributions arriving together share one transaction:
group commit, below): specs are kept as the coordinator-signed envelope bytes
(re-sent unchanged to sites, which verify the signature themselves), contributions as the
site-signed envelope bytes (their statistics are read back out of them: stored once, see
``contributions``), every accepted nonce, refusals, round status and results.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from aggregator.contribution_wire import envelope_statistics

SCHEMA = """
CREATE TABLE IF NOT EXISTS rounds (
    round_id        TEXT PRIMARY KEY,
    spec_envelope   BLOB NOT NULL,     -- serialized SignedEnvelope of the RoundSpec
    spec_digest     TEXT NOT NULL,
    dim             INTEGER NOT NULL,
    quorum          INTEGER NOT NULL,
    deadline_ms     INTEGER NOT NULL,
    invited         TEXT NOT NULL,     -- JSON list of site ids resolved at start
    state           TEXT NOT NULL,     -- CONSENT, RELEASE, FITTING, DONE, FAILED (OPEN: legacy)
    message         TEXT NOT NULL DEFAULT '',
    started_ms      INTEGER NOT NULL,
    round_s         REAL NOT NULL DEFAULT 0,
    fit_s           REAL NOT NULL DEFAULT 0,
    participants    TEXT NOT NULL DEFAULT '',    -- JSON list, set when consent ends ('' before)
    phases          TEXT NOT NULL DEFAULT '[]',  -- JSON [[phase, started_ms, seconds], ...]
    -- Secure aggregation: the step the round is in (advertise, share_keys, release, unmask;
    -- '' for independent rounds and before KEYS) and when that step ends.
    secure_step     TEXT NOT NULL DEFAULT '',
    phase_deadline_ms INTEGER NOT NULL DEFAULT 0
);
-- Consent phase: the signed PhaseMessage of each site that consented.
CREATE TABLE IF NOT EXISTS consents (
    round_id        TEXT NOT NULL,
    site_id         TEXT NOT NULL,
    envelope        BLOB NOT NULL,
    received_ms     INTEGER NOT NULL,
    PRIMARY KEY (round_id, site_id)
);
-- Secure aggregation: every accepted signed PhaseMessage of the key and unmasking steps
-- (phase advertise, share_keys, unmask), as received. With the masked contributions they are
-- everything the aggregator's secagg session consumed: a restart rebuilds it by replaying them.
CREATE TABLE IF NOT EXISTS phase_messages (
    round_id        TEXT NOT NULL,
    site_id         TEXT NOT NULL,
    phase           TEXT NOT NULL,
    envelope        BLOB NOT NULL,
    received_ms     INTEGER NOT NULL,
    PRIMARY KEY (round_id, site_id, phase)
);
CREATE TABLE IF NOT EXISTS contributions (
    round_id        TEXT NOT NULL,
    site_id         TEXT NOT NULL,
    envelope        BLOB NOT NULL,     -- serialized SignedEnvelope, as received
    statistics      BLOB NOT NULL,     -- empty: read from the envelope (a copy in older rows)
    n               INTEGER NOT NULL,
    epsilon         REAL NOT NULL,
    received_ms     INTEGER NOT NULL,
    PRIMARY KEY (round_id, site_id)
);
CREATE TABLE IF NOT EXISTS nonces (
    key_id          TEXT NOT NULL,
    nonce           TEXT NOT NULL,
    timestamp_ms    INTEGER NOT NULL,
    PRIMARY KEY (key_id, nonce)
);
CREATE TABLE IF NOT EXISTS refusals (
    round_id        TEXT NOT NULL,
    site_id         TEXT NOT NULL,
    reason          TEXT NOT NULL,
    envelope        BLOB NOT NULL,
    received_ms     INTEGER NOT NULL,
    PRIMARY KEY (round_id, site_id)
);
-- What each site declared in its signed SiteHello (Subscribe): its total budget and the key
-- ids of the coordinators it trusts. A row is added only when the declaration changes, so
-- the table is the history of the site's declarations; the last row per site is current.
CREATE TABLE IF NOT EXISTS site_declarations (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    site_id         TEXT NOT NULL,
    total_epsilon   REAL NOT NULL,     -- 0: not declared (an older site)
    trusted_key_ids TEXT NOT NULL,     -- JSON list of coordinator key ids
    hello           BLOB NOT NULL,     -- the signed SiteHello envelope, as received
    received_ms     INTEGER NOT NULL
);
-- A site's spending round by round (GetSiteSpending) without a pass over every contribution.
CREATE INDEX IF NOT EXISTS contributions_by_site ON contributions (site_id);
CREATE TABLE IF NOT EXISTS results (
    round_id        TEXT PRIMARY KEY,
    summary_json    TEXT NOT NULL,
    beta_draws      BLOB NOT NULL,     -- little-endian float64, draws x dim
    draws           INTEGER NOT NULL,
    dim             INTEGER NOT NULL
);
"""

#: PRAGMA user_version of the stores this module writes: 1 = a contribution's statistics are
#: read from its envelope (0: older stores, with a copy in contributions.statistics).
SCHEMA_VERSION = 1


@dataclass
class StoredRound:
    round_id: str
    spec_envelope: bytes
    spec_digest: str
    dim: int
    quorum: int
    deadline_ms: int
    invited: list[str]
    state: str
    message: str
    started_ms: int
    round_s: float
    fit_s: float
    # Sites selected when consent ended (None before; every invited site for legacy rounds).
    participants: list[str] | None = None
    # [[phase, started_ms, seconds (0 while running)], ...]
    phases: list = field(default_factory=list)
    # Secure aggregation: the current step ('' otherwise) and when it ends.
    secure_step: str = ""
    phase_deadline_ms: int = 0


_ROUND_COLUMNS = ("round_id, spec_envelope, spec_digest, dim, quorum, deadline_ms, invited, "
                  "state, message, started_ms, round_s, fit_s, participants, phases, "
                  "secure_step, phase_deadline_ms")


def _round_row(row) -> StoredRound:
    participants = json.loads(row[12]) if row[12] else None
    return StoredRound(*row[:6], json.loads(row[6]), *row[7:12], participants,
                       json.loads(row[13]), row[14], int(row[15]))


@dataclass(frozen=True)
class StoredContribution:
    round_id: str
    site_id: str
    envelope: bytes
    statistics: bytes
    n: int
    epsilon: float
    received_ms: int


@dataclass(eq=False)
class _Pending:
    """One caller's statements waiting for a group commit, and the future that says how it
    went (None once committed, or the caller's own error)."""
    statements: list[tuple[str, tuple]]
    future: Future = field(default_factory=Future)
    error: BaseException | None = None


@dataclass(frozen=True)
class StoredResult:
    round_id: str
    summary_json: str
    beta_draws: bytes
    draws: int
    dim: int


class RoundStore:
    """All SQL lives here. Thread-safe: one connection behind a lock (SQLite serialises
    writers anyway, and the statements are short)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._lock = threading.Lock()
        self._group = threading.Condition()      # guards _queue and _stopping
        self._queue: list[_Pending] = []
        self._stopping = False
        self._writer: threading.Thread | None = None
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: the WAL is fsynced at every commit, so an acknowledged contribution survives
        # a power loss too. NORMAL would not: the site, told "accepted", never resends, and
        # the round would wait for a release the aggregator no longer has while the site's
        # ledger has spent its epsilon. The fsync (about 3.5 ms here) is paid once per group
        # commit, not per contribution (_group_tx; docs/benchmarks.md, "Round latency").
        self._db.execute("PRAGMA synchronous=FULL")
        # A store written by a newer aggregator may keep what this one would misread: refused.
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            self._db.close()
            raise RuntimeError(f"{self.path}: round store version {version}, this aggregator "
                               f"reads up to {SCHEMA_VERSION}")
        self._db.executescript(SCHEMA)
        # refusals.epsilon (the epsilon a site debited although it refused: Refusal.
        # epsilon_spent), added to stores created before it.
        if "epsilon" not in {r[1] for r in self._db.execute("PRAGMA table_info(refusals)")}:
            self._db.execute("ALTER TABLE refusals ADD COLUMN epsilon REAL NOT NULL DEFAULT 0")
        # rounds.participants and rounds.phases, added to stores created before phases; their
        # OPEN rounds are recovered as RELEASE with every invited site selected.
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(rounds)")}
        if "participants" not in columns:
            self._db.execute("ALTER TABLE rounds ADD COLUMN participants TEXT NOT NULL DEFAULT ''")
        if "phases" not in columns:
            self._db.execute("ALTER TABLE rounds ADD COLUMN phases TEXT NOT NULL DEFAULT '[]'")
        # rounds.secure_step and rounds.phase_deadline_ms (secure aggregation), likewise.
        if "secure_step" not in columns:
            self._db.execute("ALTER TABLE rounds ADD COLUMN secure_step TEXT NOT NULL DEFAULT ''")
        if "phase_deadline_ms" not in columns:
            self._db.execute("ALTER TABLE rounds ADD COLUMN phase_deadline_ms INTEGER NOT NULL "
                             "DEFAULT 0")
        # Version 1: contributions.statistics is written empty (the envelope holds them);
        # rows of version 0 keep their copy and are read as before.
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        """Commit what is queued, stop the group-commit writer and close the database."""
        with self._group:
            self._stopping = True
            self._group.notify_all()
        if self._writer is not None:
            self._writer.join()
        with self._lock:
            self._db.close()

    def _tx(self, statements: list[tuple[str, tuple]]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    self._db.execute(sql, params)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def submit_group(self, statements: list[tuple[str, tuple]]) -> Future:
        """Queue ``statements`` for the next group commit; the returned future is done (None,
        or this caller's error) once they are committed all-or-nothing.

        Group commit: a writer thread commits everything queued so far in one transaction,
        each caller's statements inside their own SAVEPOINT, so one caller's failure (say a
        duplicate nonce) rolls back only its own statements and is handed to that caller
        alone. Same guarantee as ``_tx`` for every caller, but one commit (one fsync of the
        WAL) for the whole batch instead of one each. Callers may wait on the future from a
        thread (``_group_tx``) or from an event loop (aggregator.service)."""
        item = _Pending(statements)
        with self._group:
            if self._stopping:
                raise RuntimeError("the round store is closed")
            self._queue.append(item)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="store-writer",
                                                daemon=True)
                self._writer.start()
            self._group.notify_all()
        return item.future

    def _group_tx(self, statements: list[tuple[str, tuple]]) -> None:
        """``submit_group`` and wait: returns once committed, or raises this caller's error."""
        self.submit_group(statements).result()

    def _write_loop(self) -> None:
        while True:
            with self._group:
                while not self._queue and not self._stopping:
                    self._group.wait()
                if not self._queue:
                    return                       # stopping, and nothing left to commit
                batch, self._queue = self._queue, []
            try:
                self._commit_batch(batch)
            except BaseException as exc:  # noqa: BLE001 - every waiter must hear of it
                for item in batch:
                    item.error = item.error or exc
            for item in batch:
                if item.error is None:
                    item.future.set_result(None)
                else:
                    item.future.set_exception(item.error)

    def _commit_batch(self, batch: list[_Pending]) -> None:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except BaseException as exc:
                for item in batch:
                    item.error = exc
                return
            for item in batch:
                self._db.execute("SAVEPOINT contribution")
                try:
                    for sql, params in item.statements:
                        self._db.execute(sql, params)
                except BaseException as exc:  # noqa: BLE001 - handed to its own caller
                    self._db.execute("ROLLBACK TO contribution")
                    item.error = exc
                self._db.execute("RELEASE contribution")
            try:
                self._db.execute("COMMIT")
            except BaseException as exc:
                self._db.execute("ROLLBACK")
                for item in batch:
                    item.error = item.error or exc

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # ---- rounds ----
    def insert_round(self, r: StoredRound) -> None:
        self._tx([(f"INSERT INTO rounds ({_ROUND_COLUMNS}) VALUES "
                   f"(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                   (r.round_id, r.spec_envelope, r.spec_digest, r.dim, r.quorum, r.deadline_ms,
                    json.dumps(r.invited), r.state, r.message, r.started_ms, r.round_s, r.fit_s,
                    "" if r.participants is None else json.dumps(sorted(r.participants)),
                    json.dumps(r.phases), r.secure_step, r.phase_deadline_ms))])

    def set_state(self, round_id: str, state: str, message: str = "", *,
                  round_s: float | None = None, fit_s: float | None = None,
                  participants: list[str] | None = None, phases: list | None = None,
                  secure_step: str | None = None, phase_deadline_ms: int | None = None) -> None:
        sets, params = ["state = ?", "message = ?"], [state, message]
        if secure_step is not None:
            sets.append("secure_step = ?")
            params.append(secure_step)
        if phase_deadline_ms is not None:
            sets.append("phase_deadline_ms = ?")
            params.append(int(phase_deadline_ms))
        if participants is not None:
            sets.append("participants = ?")
            params.append(json.dumps(sorted(participants)))
        if phases is not None:
            sets.append("phases = ?")
            params.append(json.dumps(phases))
        if round_s is not None:
            sets.append("round_s = ?")
            params.append(round_s)
        if fit_s is not None:
            sets.append("fit_s = ?")
            params.append(fit_s)
        self._tx([(f"UPDATE rounds SET {', '.join(sets)} WHERE round_id = ?",
                   (*params, round_id))])

    def rounds(self, states: tuple[str, ...] | None = None) -> list[StoredRound]:
        sql = f"SELECT {_ROUND_COLUMNS} FROM rounds"
        params: tuple = ()
        if states:
            sql += f" WHERE state IN ({','.join('?' * len(states))})"
            params = states
        return [_round_row(row) for row in self._query(sql + " ORDER BY started_ms", params)]

    def get_round(self, round_id: str) -> StoredRound | None:
        rows = self._query(f"SELECT {_ROUND_COLUMNS} FROM rounds WHERE round_id = ?",
                           (round_id,))
        return _round_row(rows[0]) if rows else None

    # ---- consents ----
    def insert_consent(self, round_id: str, site_id: str, envelope: bytes, received_ms: int,
                       key_id: str, nonce: str, timestamp_ms: int) -> None:
        self._tx([
            ("INSERT INTO nonces VALUES (?,?,?)", (key_id, nonce, timestamp_ms)),
            ("INSERT INTO consents VALUES (?,?,?,?)", (round_id, site_id, envelope, received_ms)),
        ])

    def insert_consent_later(self, round_id: str, site_id: str, envelope: bytes,
                             received_ms: int, key_id: str, nonce: str, timestamp_ms: int
                             ) -> Future:
        """``insert_consent`` in the next group commit (``submit_group``): the consent and its
        nonce, both or neither; the future is done once committed."""
        return self.submit_group([
            ("INSERT INTO nonces VALUES (?,?,?)", (key_id, nonce, timestamp_ms)),
            ("INSERT INTO consents VALUES (?,?,?,?)", (round_id, site_id, envelope, received_ms)),
        ])

    def consents(self, round_id: str) -> dict[str, int]:
        return dict(self._query("SELECT site_id, received_ms FROM consents WHERE round_id = ?",
                                (round_id,)))

    # ---- secure aggregation: the messages of the key and unmasking steps ----
    def insert_phase_message_later(self, round_id: str, site_id: str, phase: str,
                                   envelope: bytes, received_ms: int, key_id: str, nonce: str,
                                   timestamp_ms: int) -> Future:
        """A signed PhaseMessage and its nonce, both or neither, in the next group commit;
        the future is done once committed (many sites answer a step at once)."""
        return self.submit_group([
            ("INSERT INTO nonces VALUES (?,?,?)", (key_id, nonce, timestamp_ms)),
            ("INSERT INTO phase_messages VALUES (?,?,?,?,?)",
             (round_id, site_id, phase, envelope, received_ms)),
        ])

    def phase_messages(self, round_id: str, phase: str) -> list[tuple[str, bytes, int]]:
        """(site id, envelope, received ms) of every stored ``phase`` message of a round."""
        return [tuple(r) for r in self._query(
            "SELECT site_id, envelope, received_ms FROM phase_messages WHERE round_id = ? AND "
            "phase = ? ORDER BY site_id", (round_id, phase))]

    # ---- contributions, refusals, nonces ----
    def insert_contribution(self, c: StoredContribution, key_id: str, nonce: str,
                            timestamp_ms: int) -> None:
        """The contribution and its nonce: both or neither, committed when this returns
        (with other contributions arriving at the same time: ``_group_tx``)."""
        self._group_tx(self._contribution_statements(c, key_id, nonce, timestamp_ms))

    def insert_contribution_later(self, c: StoredContribution, key_id: str, nonce: str,
                                  timestamp_ms: int) -> Future:
        """``insert_contribution`` without waiting: the future is done once committed."""
        return self.submit_group(self._contribution_statements(c, key_id, nonce, timestamp_ms))

    @staticmethod
    def _contribution_statements(c: StoredContribution, key_id: str, nonce: str,
                                 timestamp_ms: int) -> list[tuple[str, tuple]]:
        # The statistics column stays empty: ``c.statistics`` is inside ``c.envelope`` (the
        # signed payload it was decoded from), and writing it twice cost the group commit
        # 17 of the 40 kB a contribution at d = 64 (docs/benchmarks.md, sixth session).
        return [
            ("INSERT INTO nonces VALUES (?,?,?)", (key_id, nonce, timestamp_ms)),
            ("INSERT INTO contributions VALUES (?,?,?,?,?,?,?)",
             (c.round_id, c.site_id, c.envelope, b"", c.n, c.epsilon, c.received_ms)),
        ]

    def contributions(self, round_id: str) -> list[StoredContribution]:
        """A round's contributions, each with its statistics: decoded from its envelope
        (``contribution_wire.envelope_statistics``; an envelope that does not decode raises,
        so a damaged row stops a recovery instead of dropping a release), or, for rows
        written before the envelope was the only copy, the copy in the statistics column."""
        return [StoredContribution(round_id_, site_id, envelope,
                                   statistics or envelope_statistics(envelope), *rest)
                for round_id_, site_id, envelope, statistics, *rest in self._query(
                    "SELECT * FROM contributions WHERE round_id = ? ORDER BY site_id",
                    (round_id,))]

    def contribution_rows(self, round_id: str) -> list[tuple[str, int, float, int]]:
        """(site id, n, epsilon, received ms) of a round's contributions, without their bytes
        (the status of a finished round loaded from the store)."""
        return [tuple(r) for r in self._query(
            "SELECT site_id, n, epsilon, received_ms FROM contributions WHERE round_id = ? "
            "ORDER BY site_id", (round_id,))]

    def contribution_counts(self) -> dict[str, int]:
        """round id -> number of its stored contributions."""
        return dict(self._query("SELECT round_id, COUNT(*) FROM contributions GROUP BY round_id"))

    def insert_refusal(self, round_id: str, site_id: str, reason: str, envelope: bytes,
                       received_ms: int, key_id: str, nonce: str, timestamp_ms: int,
                       epsilon: float = 0.0) -> None:
        self._tx([
            ("INSERT INTO nonces VALUES (?,?,?)", (key_id, nonce, timestamp_ms)),
            ("INSERT INTO refusals (round_id, site_id, reason, envelope, received_ms, epsilon) "
             "VALUES (?,?,?,?,?,?)", (round_id, site_id, reason, envelope, received_ms, epsilon)),
        ])

    def refusals(self, round_id: str) -> list[tuple[str, str]]:
        return [tuple(r) for r in self._query(
            "SELECT site_id, reason FROM refusals WHERE round_id = ? ORDER BY site_id",
            (round_id,))]

    def refusal_epsilons(self, round_id: str) -> dict[str, float]:
        return dict(self._query("SELECT site_id, epsilon FROM refusals WHERE round_id = ? "
                                "AND epsilon > 0", (round_id,)))

    # ---- the sites' budget history ----
    def site_spending(self) -> dict[str, tuple[float, int, int]]:
        """site id -> (epsilon spent, rounds, last received ms) over every accepted
        contribution and every refusal that debited (Refusal.epsilon_spent), in any round."""
        rows = self._query(
            "SELECT site_id, SUM(epsilon), COUNT(*), MAX(received_ms) FROM ("
            " SELECT site_id, epsilon, received_ms FROM contributions UNION ALL"
            " SELECT site_id, epsilon, received_ms FROM refusals WHERE epsilon > 0)"
            " GROUP BY site_id")
        return {r[0]: (float(r[1]), int(r[2]), int(r[3])) for r in rows}

    def site_rounds(self, site_id: str) -> list[tuple[str, float, int, bool]]:
        """(round id, epsilon, received ms, refused) of every accepted contribution of
        ``site_id`` and every refusal of it that debited, oldest first (what site_spending
        sums for that site)."""
        rows = self._query(
            "SELECT round_id, epsilon, received_ms, 0 FROM contributions WHERE site_id = ? "
            "UNION ALL SELECT round_id, epsilon, received_ms, 1 FROM refusals "
            "WHERE site_id = ? AND epsilon > 0 ORDER BY 3, 1", (site_id, site_id))
        return [(r[0], float(r[1]), int(r[2]), bool(r[3])) for r in rows]

    def insert_declaration(self, site_id: str, total_epsilon: float, trusted_key_ids: list[str],
                           hello: bytes, received_ms: int) -> None:
        self._tx([("INSERT INTO site_declarations (site_id, total_epsilon, trusted_key_ids, "
                   "hello, received_ms) VALUES (?,?,?,?,?)",
                   (site_id, total_epsilon, json.dumps(sorted(trusted_key_ids)), hello,
                    received_ms))])

    def declarations(self) -> dict[str, tuple[float, list[str]]]:
        """site id -> (declared total, trusted coordinator key ids): each site's last one."""
        rows = self._query("SELECT site_id, total_epsilon, trusted_key_ids FROM site_declarations "
                           "WHERE id IN (SELECT MAX(id) FROM site_declarations GROUP BY site_id)")
        return {r[0]: (float(r[1]), json.loads(r[2])) for r in rows}

    def insert_nonce(self, key_id: str, nonce: str, timestamp_ms: int) -> None:
        self._tx([("INSERT INTO nonces VALUES (?,?,?)", (key_id, nonce, timestamp_ms))])

    def nonces_since(self, min_timestamp_ms: int) -> list[tuple[str, str]]:
        return [tuple(r) for r in self._query(
            "SELECT key_id, nonce FROM nonces WHERE timestamp_ms >= ?", (min_timestamp_ms,))]

    def prune_nonces(self, before_ms: int) -> None:
        """Nonces older than the clock-skew window can go: their timestamps are refused."""
        self._tx([("DELETE FROM nonces WHERE timestamp_ms < ?", (before_ms,))])

    # ---- results ----
    def finish_round(self, res: StoredResult, fit_s: float, message: str = "",
                     phases: list | None = None) -> None:
        self._tx([
            ("INSERT OR REPLACE INTO results VALUES (?,?,?,?,?)",
             (res.round_id, res.summary_json, res.beta_draws, res.draws, res.dim)),
            ("UPDATE rounds SET state = 'DONE', message = ?, fit_s = ?, "
             "phases = COALESCE(?, phases) WHERE round_id = ?",
             (message, fit_s, None if phases is None else json.dumps(phases), res.round_id)),
        ])

    def get_result(self, round_id: str) -> StoredResult | None:
        rows = self._query("SELECT * FROM results WHERE round_id = ?", (round_id,))
        return StoredResult(*rows[0]) if rows else None
