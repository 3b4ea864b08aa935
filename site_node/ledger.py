"""The site's privacy ledger: its epsilon budget and every release it has made, in SQLite.

"Re-releasing is re-spending" (method.md section 6): answering one round twice with fresh
noise lets an observer average the noise away. So the ledger keeps the *signed envelope* of
every release, keyed by round id, and

* debits epsilon and stores the release IN ONE TRANSACTION, before the release leaves the
  site (``record_release``): a crash either leaves both or neither;
* takes SQLite's write lock up front (``BEGIN IMMEDIATE``) so two processes sharing the state
  file cannot both read "enough budget left" and both spend it;
* hands a repeated request for the same round the stored bytes back, never fresh noise, and
  refuses outright when the same round id comes back with a different spec.

The total budget belongs to the state file, not to the data file or the config: it is written
on first use, and the config can only ever *lower* it silently. A config whose
``total_epsilon`` is larger than the stored value stops the site at start (``BudgetRaise``)
until the operator records the raise with ``dpfed site ledger --raise-total`` (``raise_total``:
who and when, in ``budget_events``); a smaller one permanently lowers the stored value,
because tightening is always safe. Re-registering the data or changing the data path changes
nothing here. Deleting the state file does reset it locally; the aggregator's record of the
site's spending catches that (site_node.client checks it before serving, and
``acknowledge_reset`` carries the aggregator's figure into a new ledger; docs/security.md,
"Budget history").

Durability: WAL journal with ``synchronous=FULL``, so a committed debit survives power loss.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import parse_canonical

log = logging.getLogger(__name__)

# 2: releases.neighbouring (the relation each release was made under). A version-1 ledger is
# migrated on open; its releases were all made under replace-one (the only mechanism then).
# 3: budget_events (who changed the total, or acknowledged a reset, and when). Created by
# CREATE TABLE IF NOT EXISTS on open; a version-2 ledger is migrated by setting the version.
SCHEMA_VERSION = 3
# Floating-point slack on the budget check: 10 rounds of eps=0.1 must fit in a total of 1.0.
_BUDGET_SLACK = 1e-9

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
-- One row per release ever made. The envelope is the exact signed Contribution that left
-- (or will leave) the site: it is the only answer this site will ever give for round_id.
-- (Or a signed Refusal: a release drawn, debited and then refused because its noisy n was
-- below min_n, in site_node.node: from then on the refusal is the answer for round_id.)
-- n is the released n (noisy under add_remove).
CREATE TABLE IF NOT EXISTS releases (
    round_id        TEXT PRIMARY KEY,
    spec_digest     TEXT NOT NULL,
    epsilon         REAL NOT NULL CHECK (epsilon > 0),
    n               INTEGER NOT NULL,
    envelope        BLOB NOT NULL,
    created_unix_ms INTEGER NOT NULL,
    sent            INTEGER NOT NULL DEFAULT 0,
    acknowledged    INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    neighbouring    TEXT NOT NULL DEFAULT 'replace_one'
);
-- The debit journal: spent = SUM(epsilon). Separate from releases so that other privacy
-- costs (e.g. a DP estimate of a scale, method.md section 4) can be charged here too.
CREATE TABLE IF NOT EXISTS debits (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    round_id        TEXT NOT NULL,
    epsilon         REAL NOT NULL CHECK (epsilon > 0),
    reason          TEXT NOT NULL,
    created_unix_ms INTEGER NOT NULL
);
-- Every change of the total budget and every acknowledged reset, with who and when:
-- kind = created | lowered | raised | reset_acknowledged. epsilon: for reset_acknowledged the
-- debit carried over from the aggregator's record.
CREATE TABLE IF NOT EXISTS budget_events (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    kind            TEXT NOT NULL,
    old_total       REAL,
    new_total       REAL,
    epsilon         REAL NOT NULL DEFAULT 0,
    operator        TEXT NOT NULL DEFAULT '',
    note            TEXT NOT NULL DEFAULT '',
    created_unix_ms INTEGER NOT NULL
)
"""


class LedgerError(RuntimeError):
    """The state file is unusable or belongs to another site."""


class BudgetExhausted(LedgerError):
    """Recording this release would take the site over its total epsilon."""


class RoundConflict(LedgerError):
    """A release for this round id already exists, answering a different spec."""


class BudgetRaise(LedgerError):
    """The config's total_epsilon is larger than the ledger's: not honoured until recorded."""


class LedgerMismatch(LedgerError):
    """The aggregator records more spending (or a lower declared total) for this site than its
    ledger knows: the state_db was deleted, replaced or restored from an old backup. The site
    serves no round until the ledger is restored or the reset acknowledged
    (site_node.node.SiteNode.check_history raises it; site_node.client stops on it)."""


@dataclass(frozen=True)
class StoredRelease:
    round_id: str
    spec_digest: str
    epsilon: float
    n: int
    envelope: pb.SignedEnvelope
    created_unix_ms: int
    sent: bool
    acknowledged: bool
    last_error: str | None
    neighbouring: str = "replace_one"

    @property
    def is_refusal(self) -> bool:
        """A release drawn and debited, then refused (noisy n below min_n): the stored answer
        is a signed Refusal, not a Contribution."""
        return self.envelope.payload_type == "dpfed.v1.Refusal"


@dataclass(frozen=True)
class RecordResult:
    release: StoredRelease
    fresh: bool   # False: an earlier release for this round was returned instead


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class PrivacyLedger:
    """The privacy ledger in ``db_path`` (created on first use)."""

    def __init__(self, db_path: str | Path, *, site_id: str | None = None,
                 total_epsilon: float | None = None, timeout_s: float = 30.0):
        self.path = Path(db_path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so the transaction boundaries
        # (and the BEGIN IMMEDIATE write lock) are exactly where the code says.
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None,
                                     check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
        with self._transaction():
            # One statement at a time: executescript() would COMMIT our transaction.
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._conn.execute(statement)
            version = self._meta("schema_version")
            if version is None:
                self._set_meta("schema_version", str(SCHEMA_VERSION))
            elif int(version) == 1:
                self._migrate_1_to_2()
            if int(self._meta("schema_version")) == 2:
                self._set_meta("schema_version", "3")   # budget_events: created above
            elif int(self._meta("schema_version")) != SCHEMA_VERSION:
                raise LedgerError(f"{self.path}: ledger schema {version}, this dpfed knows {SCHEMA_VERSION}")
            if site_id is not None:
                stored_site = self._meta("site_id")
                if stored_site is None:
                    self._set_meta("site_id", site_id)
                elif stored_site != site_id:
                    raise LedgerError(f"{self.path} is the ledger of site {stored_site!r}, "
                                      f"not {site_id!r}")
            if total_epsilon is not None:
                self._settle_total(float(total_epsilon))

    def _migrate_1_to_2(self) -> None:
        """Add releases.neighbouring, inside the opening transaction (all or nothing). Every
        version-1 release was made under replace-one: the column's default says so."""
        columns = {r[1] for r in self._conn.execute("PRAGMA table_info(releases)")}
        if "neighbouring" not in columns:
            self._conn.execute("ALTER TABLE releases ADD COLUMN neighbouring TEXT NOT NULL "
                               "DEFAULT 'replace_one'")
        self._set_meta("schema_version", "2")
        log.info("privacy ledger %s: schema migrated from 1 to 2 (releases.neighbouring; "
                 "earlier releases recorded as replace_one)", self.path)

    # -- transactions --------------------------------------------------------------------
    class _Tx:
        def __init__(self, conn, lock):
            self.conn, self.lock = conn, lock

        def __enter__(self):
            # The thread lock keeps two threads' transactions on this one connection apart;
            # IMMEDIATE takes SQLite's write lock now, so the budget read and the debit that
            # follows are serialised against every other process using this file.
            self.lock.acquire()
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except BaseException:
                self.lock.release()
                raise
            return self.conn

        def __exit__(self, exc_type, exc, tb):
            try:
                self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
            finally:
                self.lock.release()
            return False

    def _transaction(self):
        return self._Tx(self._conn, self._lock)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- meta ----------------------------------------------------------------------------
    def _meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def _set_meta(self, key: str, value: str) -> None:
        self._conn.execute("INSERT INTO meta(key, value) VALUES(?, ?) "
                           "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    def _event(self, kind: str, old_total, new_total, *, epsilon: float = 0.0,
               operator: str = "", note: str = "") -> None:
        self._conn.execute("INSERT INTO budget_events(kind, old_total, new_total, epsilon, "
                           "operator, note, created_unix_ms) VALUES(?, ?, ?, ?, ?, ?, ?)",
                           (kind, old_total, new_total, float(epsilon), operator, note, _now_ms()))

    def _settle_total(self, configured: float) -> None:
        stored = self._meta("total_epsilon")
        if stored is None:
            self._set_meta("total_epsilon", repr(configured))
            self._event("created", None, configured, note="first use (policy.total_epsilon)")
            log.info("privacy ledger %s: total budget set to epsilon=%g", self.path, configured)
            return
        stored_f = float(stored)
        if configured > stored_f + _BUDGET_SLACK:
            raise BudgetRaise(
                f"policy.total_epsilon = {configured:g} in the config is larger than the total "
                f"{stored_f:g} recorded in the privacy ledger {self.path}. A budget is never "
                f"raised silently: set total_epsilon back to {stored_f:g}, or record the raise "
                f"with `dpfed site ledger --raise-total --config <site.toml>` (kept in the "
                f"ledger with who and when)")
        elif configured < stored_f:
            self._set_meta("total_epsilon", repr(configured))
            self._event("lowered", stored_f, configured, note="policy.total_epsilon lowered")
            log.warning("config total_epsilon=%g lowers the ledger's budget from %g (permanent)",
                        configured, stored_f)

    def raise_total(self, new_total: float, *, operator: str, note: str = "") -> float:
        """Record an explicit raise of the total budget to ``new_total`` (the operator's
        decision, kept with who and when). Returns the old total. Raises LedgerError if
        ``new_total`` is not larger than the stored total (lowering needs no command)."""
        with self._transaction():
            old = self.total_epsilon
            if old is None:
                raise LedgerError(f"{self.path}: no total budget recorded yet (start the site "
                                  f"once, or nothing to raise)")
            if not new_total > old + _BUDGET_SLACK:
                raise LedgerError(f"total_epsilon {new_total:g} is not larger than the ledger's "
                                  f"{old:g}: nothing to raise")
            self._set_meta("total_epsilon", repr(float(new_total)))
            self._event("raised", old, float(new_total), operator=operator,
                        note=note or "dpfed site ledger --raise-total")
        log.warning("privacy ledger %s: total budget RAISED from %g to %g by %s", self.path, old,
                    new_total, operator)
        return old

    def acknowledge_reset(self, *, aggregator_spent: float, aggregator_rounds: int = 0,
                          aggregator_total: float = 0.0, operator: str) -> float:
        """Carry the aggregator's record of this site's spending into this ledger: debit the
        difference if it is more than the ledger knows (so the budget continues from the
        larger figure, never the smaller), lower the total to the aggregator's last declared
        total if that is smaller, and record who and when. Returns the epsilon debited."""
        with self._transaction() as conn:
            spent = self._spent()
            carried = max(0.0, float(aggregator_spent) - spent)
            if carried > 0:
                conn.execute("INSERT INTO debits(round_id, epsilon, reason, created_unix_ms) "
                             "VALUES('(reset)', ?, 'reset acknowledged: aggregator record', ?)",
                             (carried, _now_ms()))
            total = self.total_epsilon
            self._event("reset_acknowledged", total, total, epsilon=carried, operator=operator,
                        note=f"aggregator records epsilon {aggregator_spent:g} spent over "
                             f"{aggregator_rounds} round(s), declared total "
                             f"{aggregator_total:g}; this ledger had {spent:g}")
            if aggregator_total > 0 and total is not None and total > aggregator_total:
                self._set_meta("total_epsilon", repr(float(aggregator_total)))
                self._event("lowered", total, float(aggregator_total), operator=operator,
                            note="reset: a new ledger does not raise the total the aggregator "
                                 "last saw declared")
        return carried

    def budget_events(self) -> list[dict]:
        rows = self._conn.execute("SELECT kind, old_total, new_total, epsilon, operator, note, "
                                  "created_unix_ms FROM budget_events ORDER BY id").fetchall()
        return [dict(zip(("kind", "old_total", "new_total", "epsilon", "operator", "note",
                          "created_unix_ms"), r)) for r in rows]

    def total_explicitly_raised(self) -> bool:
        """Whether the current total was set by an explicit raise (``raise_total``)."""
        row = self._conn.execute("SELECT kind FROM budget_events WHERE kind IN "
                                 "('created', 'lowered', 'raised') ORDER BY id DESC "
                                 "LIMIT 1").fetchone()
        return row is not None and row[0] == "raised"

    # -- budget --------------------------------------------------------------------------
    @property
    def total_epsilon(self) -> float | None:
        value = self._meta("total_epsilon")
        return None if value is None else float(value)

    def _spent(self) -> float:
        return float(self._conn.execute("SELECT COALESCE(SUM(epsilon), 0) FROM debits").fetchone()[0])

    @property
    def spent(self) -> float:
        return self._spent()

    @property
    def remaining(self) -> float:
        total = self.total_epsilon
        if total is None:
            return 0.0
        return max(0.0, total - self._spent())

    def can_spend(self, epsilon: float) -> bool:
        total = self.total_epsilon
        return total is not None and self._spent() + epsilon <= total + _BUDGET_SLACK

    # -- releases ------------------------------------------------------------------------
    def record_release(self, *, round_id: str, spec_digest: str, epsilon: float, n: int,
                       envelope: pb.SignedEnvelope, neighbouring: str = "add_remove"
                       ) -> RecordResult:
        """Debit ``epsilon`` and store the signed release, atomically, before it is sent.

        If a release for ``round_id`` already exists for the same spec, that stored release is
        returned (``fresh=False``) and nothing is debited: the caller must send the stored
        bytes and discard its own fresh noise, which has not left the site. Raises
        RoundConflict for a different spec and BudgetExhausted when the budget does not cover
        ``epsilon``; in both cases nothing is written. ``neighbouring`` is the relation the
        release was made under ("add_remove" or "replace_one"), shown by ``dpfed site ledger``.
        """
        if not (epsilon > 0):
            raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
        if neighbouring not in ("add_remove", "replace_one"):
            raise ValueError(f"unknown neighbouring relation {neighbouring!r}")
        blob = envelope.SerializeToString()
        with self._transaction() as conn:
            existing = self._get(round_id)
            if existing is not None:
                if existing.spec_digest != spec_digest:
                    raise RoundConflict(f"round {round_id} was already answered for spec "
                                        f"{existing.spec_digest[:12]}, not {spec_digest[:12]}")
                return RecordResult(existing, fresh=False)
            total = self.total_epsilon
            if total is None:
                raise LedgerError(f"{self.path}: no total budget recorded")
            spent = self._spent()
            if spent + epsilon > total + _BUDGET_SLACK:
                raise BudgetExhausted(f"epsilon {epsilon:g} exceeds the remaining budget "
                                      f"{max(0.0, total - spent):g} (spent {spent:g} of {total:g})")
            now = _now_ms()
            self._debit(conn, round_id, float(epsilon), now)
            self._store(conn, round_id, spec_digest, float(epsilon), int(n), blob, now,
                        neighbouring)
            stored = self._get(round_id)
        return RecordResult(stored, fresh=True)

    # The two writes of record_release, separate so a test can crash between them.
    def _debit(self, conn, round_id: str, epsilon: float, now: int) -> None:
        conn.execute("INSERT INTO debits(round_id, epsilon, reason, created_unix_ms) "
                     "VALUES(?, ?, 'release', ?)", (round_id, epsilon, now))

    def _store(self, conn, round_id, spec_digest, epsilon, n, blob, now,
               neighbouring="add_remove") -> None:
        conn.execute("INSERT INTO releases(round_id, spec_digest, epsilon, n, envelope, "
                     "created_unix_ms, neighbouring) VALUES(?, ?, ?, ?, ?, ?, ?)",
                     (round_id, spec_digest, epsilon, n, blob, now, neighbouring))

    def _get(self, round_id: str) -> StoredRelease | None:
        row = self._conn.execute(
            "SELECT round_id, spec_digest, epsilon, n, envelope, created_unix_ms, sent, "
            "acknowledged, last_error, neighbouring FROM releases WHERE round_id = ?",
            (round_id,)).fetchone()
        return None if row is None else _row_to_release(row)

    def get_release(self, round_id: str) -> StoredRelease | None:
        return self._get(round_id)

    def releases(self) -> list[StoredRelease]:
        rows = self._conn.execute(
            "SELECT round_id, spec_digest, epsilon, n, envelope, created_unix_ms, sent, "
            "acknowledged, last_error, neighbouring FROM releases "
            "ORDER BY created_unix_ms, round_id").fetchall()
        return [_row_to_release(r) for r in rows]

    def unacknowledged(self) -> list[StoredRelease]:
        """Releases debited and stored but not (known to be) received by the aggregator and not
        explicitly rejected by it: they are resent, byte for byte, on startup. A refusal after
        a drawn release (``is_refusal``) is not: it is sent when the round is pushed again."""
        return [r for r in self.releases()
                if not r.acknowledged and r.last_error is None and not r.is_refusal]

    def replace_envelope(self, round_id: str, envelope: pb.SignedEnvelope) -> StoredRelease:
        """Store ``envelope`` as the release of ``round_id`` in place of the stored one: only a
        re-signing of the *same* answer (same payload type, and for a Contribution the same
        statistics bytes, n, epsilon and spec digest; for a Refusal the same reason and
        epsilon), with a fresh timestamp and nonce because the stored envelope grew older
        than the aggregator's clock-skew window. Nothing is debited; any other change raises
        LedgerError (fresh noise must never replace a stored release)."""
        with self._transaction() as conn:
            old = self._get(round_id)
            if old is None:
                raise LedgerError(f"no stored release for round {round_id}")
            if not _same_answer(old.envelope, envelope):
                raise LedgerError(f"round {round_id}: the new envelope is not a re-signing of "
                                  f"the stored answer; refusing to replace it")
            conn.execute("UPDATE releases SET envelope = ? WHERE round_id = ?",
                         (envelope.SerializeToString(), round_id))
            return self._get(round_id)

    def mark_sent(self, round_id: str) -> None:
        with self._transaction() as conn:
            conn.execute("UPDATE releases SET sent = 1 WHERE round_id = ?", (round_id,))

    def mark_acknowledged(self, round_id: str) -> None:
        with self._transaction() as conn:
            conn.execute("UPDATE releases SET sent = 1, acknowledged = 1, last_error = NULL "
                         "WHERE round_id = ?", (round_id,))

    def mark_rejected(self, round_id: str, message: str) -> None:
        """The aggregator answered but did not accept; keep the reason, stop resending."""
        with self._transaction() as conn:
            conn.execute("UPDATE releases SET sent = 1, last_error = ? WHERE round_id = ?",
                         (message or "rejected", round_id))

    # -- the audit log's anchor (dpfed.audit, docs/audit.md) ------------------------------
    def record_audit_head(self, seq: int, head: str) -> None:
        """Keep the audit log's latest signed head (``head``: dpfed.audit.Head.to_json) here
        too, outside the log: a log later found to end before it was truncated or replaced.
        An older head never replaces a newer one."""
        with self._transaction():
            stored = self._meta("audit_head_seq")
            if stored is None or int(stored) < seq:
                self._set_meta("audit_head_seq", str(int(seq)))
                self._set_meta("audit_head", head)

    def audit_head(self) -> str | None:
        """The audit head kept by ``record_audit_head``, or None."""
        return self._meta("audit_head")

    def summary(self) -> dict:
        """Everything ``dpfed site ledger`` shows (no private data: epsilons, n, flags)."""
        total = self.total_epsilon
        spent = self._spent()
        return {
            "path": str(self.path),
            "site_id": self._meta("site_id"),
            "total_epsilon": total,
            "spent_epsilon": spent,
            "remaining_epsilon": None if total is None else max(0.0, total - spent),
            "budget_events": self.budget_events(),
            "releases": [{"round_id": r.round_id, "spec_digest": r.spec_digest,
                          "epsilon": r.epsilon, "n": r.n, "created_unix_ms": r.created_unix_ms,
                          "neighbouring": r.neighbouring,
                          "refused": r.is_refusal,
                          "sent": r.sent, "acknowledged": r.acknowledged,
                          "last_error": r.last_error} for r in self.releases()],
        }


def _row_to_release(row) -> StoredRelease:
    env = pb.SignedEnvelope()
    env.ParseFromString(row[4])
    return StoredRelease(round_id=row[0], spec_digest=row[1], epsilon=float(row[2]), n=int(row[3]),
                         envelope=env, created_unix_ms=int(row[5]), sent=bool(row[6]),
                         acknowledged=bool(row[7]), last_error=row[8], neighbouring=row[9])


# Fields a re-signed answer may change (site_node.node.SiteNode.fresh_envelope).
_RESIGNABLE = ("timestamp_unix_ms", "nonce")


def _same_answer(old: pb.SignedEnvelope, new: pb.SignedEnvelope) -> bool:
    """Whether ``new`` carries the same answer as ``old``, differing only in its timestamp,
    nonce and signature."""
    if old.payload_type != new.payload_type or old.key_id != new.key_id:
        return False
    try:
        a = parse_canonical(old.payload, old.payload_type)
        b = parse_canonical(new.payload, new.payload_type)
    except Exception:  # noqa: BLE001 - anything unparsable is not the same answer
        return False
    for f in _RESIGNABLE:
        a.ClearField(f)
        b.ClearField(f)
    return a == b
