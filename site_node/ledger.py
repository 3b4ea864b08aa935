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

Per-patient budgets (schema 4; issue 23 part 1; docs/method.md section 13): every debit also
carries its privacy *event* in the accountant's terms (``dpfed.accounting``; PureDP today) and
a *scope*: ``included`` (it is charged to the patients listed for it in ``inclusions``, the
patients whose rows the release used) or ``all`` (it is charged to every patient, present or
future: the releases of a ledger migrated from schema 3, which kept no record of who was in
them, a debit carried over by ``acknowledge_reset``, and any release made without per-patient
accounting). Patients are ledger keys, HMAC-SHA256 of their id under the site's secret key
(site_node.patients), never ids. ``record_release`` with ``patients=`` re-checks every included
patient's filter and writes the debit, the inclusions and the stored release in the same
transaction as ever. The per-patient budget belongs to the ledger like the total: written on
first use, lowered by the config for good, raised only by ``raise_total`` (recorded). So is
its delta (meta ``patient_delta``, with the Renyi order ``patient_alpha`` fixed when it is
first written; ``raise_patient_delta``): an (eps, delta) budget admits Gaussian releases
(event Gaussian(mu)) through the individual Renyi filter (site_node.patients).

Durability: WAL journal with ``synchronous=FULL``, so a committed debit survives power loss.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dpfed.accounting import PrivacyEvent, PureDP
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import parse_canonical
from site_node.patients import (PatientBudget, PatientHasher, PatientKeyError, event_from_json,
                                event_to_json, key_path_for)

log = logging.getLogger(__name__)

# 2: releases.neighbouring (the relation each release was made under). A version-1 ledger is
# migrated on open; its releases were all made under replace-one (the only mechanism then).
# 3: budget_events (who changed the total, or acknowledged a reset, and when). Created by
# CREATE TABLE IF NOT EXISTS on open; a version-2 ledger is migrated by setting the version.
# 4: per-patient budgets: debits.event and debits.scope, patients, inclusions. A version-3
# ledger is migrated on open: its debits become scope 'all' (charged to every patient).
SCHEMA_VERSION = 4
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
-- event: the accountant event (site_node.patients.event_to_json, NULL: PureDP(epsilon), as
-- every debit of schema <= 3). scope: 'included' (charged to the patients in inclusions) or
-- 'all' (charged to every patient, present or future).
CREATE TABLE IF NOT EXISTS debits (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    round_id        TEXT NOT NULL,
    epsilon         REAL NOT NULL CHECK (epsilon > 0),
    reason          TEXT NOT NULL,
    created_unix_ms INTEGER NOT NULL,
    event           TEXT,
    scope           TEXT NOT NULL DEFAULT 'all' CHECK (scope IN ('all', 'included'))
);
-- Every patient a per-patient release has seen (a candidate, included or left out by the
-- filter), by ledger key (HMAC-SHA256 of the id under the site's secret key, never the id).
CREATE TABLE IF NOT EXISTS patients (
    patient            TEXT PRIMARY KEY,
    first_seen_unix_ms INTEGER NOT NULL
) WITHOUT ROWID;
-- Which patients a debit of scope 'included' is charged to: one row per patient per release.
CREATE TABLE IF NOT EXISTS inclusions (
    patient  TEXT NOT NULL,
    debit_id INTEGER NOT NULL REFERENCES debits(id),
    PRIMARY KEY (patient, debit_id)
) WITHOUT ROWID;
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
    """The config's total_epsilon (or patient_epsilon) is larger than the ledger's: not
    honoured until recorded."""


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
                 total_epsilon: float | None = None, patient_epsilon: float | None = None,
                 patient_delta: float | None = None, timeout_s: float = 30.0):
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
            if int(self._meta("schema_version")) == 3:
                self._migrate_3_to_4()
            if int(self._meta("schema_version")) != SCHEMA_VERSION:
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
            if patient_epsilon is not None:
                fresh = self._meta("patient_epsilon") is None
                self._settle_patient_budget(float(patient_epsilon))
                self._settle_patient_delta(None if patient_delta is None
                                           else float(patient_delta), fresh=fresh)
            elif patient_delta is not None:
                raise LedgerError("a per-patient delta needs a per-patient epsilon")
        self._hasher: PatientHasher | None = None

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

    def _migrate_3_to_4(self) -> None:
        """Add debits.event and debits.scope (patients and inclusions were created above),
        inside the opening transaction. A version-3 ledger kept no record of who was in its
        releases, so every earlier debit becomes scope 'all': charged to every patient,
        present or future (the conservative reading; docs/method.md section 13)."""
        columns = {r[1] for r in self._conn.execute("PRAGMA table_info(debits)")}
        if "event" not in columns:
            self._conn.execute("ALTER TABLE debits ADD COLUMN event TEXT")
        if "scope" not in columns:
            self._conn.execute("ALTER TABLE debits ADD COLUMN scope TEXT NOT NULL DEFAULT 'all' "
                               "CHECK (scope IN ('all', 'included'))")
        self._set_meta("schema_version", "4")
        log.info("privacy ledger %s: schema migrated from 3 to 4 (per-patient records); its "
                 "earlier releases are charged to every patient", self.path)

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

    def _settle_patient_budget(self, configured: float) -> None:
        """As ``_settle_total`` for the per-patient budget (meta ``patient_epsilon``)."""
        stored = self._meta("patient_epsilon")
        if stored is None:
            self._set_meta("patient_epsilon", repr(configured))
            self._event("patient_created", None, configured,
                        note="first use (policy.patient_epsilon)")
            return
        stored_f = float(stored)
        if configured > stored_f + _BUDGET_SLACK:
            raise BudgetRaise(
                f"policy.patient_epsilon = {configured:g} in the config is larger than the "
                f"per-patient budget {stored_f:g} recorded in the privacy ledger {self.path}. A "
                f"budget is never raised silently: set patient_epsilon back to {stored_f:g}, or "
                f"record the raise with `dpfed site ledger --raise-total --config <site.toml>`")
        elif configured < stored_f:
            self._set_meta("patient_epsilon", repr(configured))
            self._event("patient_lowered", stored_f, configured,
                        note="policy.patient_epsilon lowered")
            log.warning("config patient_epsilon=%g lowers the ledger's per-patient budget from "
                        "%g (permanent)", configured, stored_f)

    def _settle_patient_delta(self, configured: float | None, *, fresh: bool) -> None:
        """The delta of the per-patient budget (meta ``patient_delta``; None: pure eps). Like
        the budget itself it is written on first use and only lowered silently: a smaller
        delta, or none (pure eps: a Gaussian release is then never admitted again), is a
        tightening and recorded; a larger one, or a delta added to a pure budget that already
        has patients, raises BudgetRaise until recorded with ``raise_patient_delta``. The
        filter's Renyi order (meta ``patient_alpha``, site_node.patients.renyi_order) is fixed
        when the delta is first written and never changed: the filter needs one order for the
        whole history (Feldman & Zrnic 2021)."""
        stored = self._meta("patient_delta")
        if stored is None:
            if configured is None:
                return
            has_records = self._conn.execute("SELECT EXISTS(SELECT 1 FROM patients)").fetchone()[0]
            if not fresh and has_records:
                raise BudgetRaise(
                    f"policy.patient_delta = {configured:g} turns the pure per-patient budget "
                    f"of the privacy ledger {self.path} into an (eps, delta) budget, which is "
                    f"weaker. A budget is never loosened silently: remove patient_delta, or "
                    f"record the change with `dpfed site ledger --raise-total --config "
                    f"<site.toml>`")
            self._set_patient_delta(configured)
            self._event("patient_delta_created", None, configured,
                        note="first use (policy.patient_delta)")
            return
        stored_f = float(stored)
        if configured is None:
            self._conn.execute("DELETE FROM meta WHERE key = 'patient_delta'")
            self._event("patient_delta_lowered", stored_f, 0.0,
                        note="policy.patient_delta removed: pure eps per patient")
            log.warning("the config has no patient_delta: the ledger's per-patient budget is "
                        "pure eps from now on (permanent; Gaussian releases are not admitted)")
        elif configured > stored_f * (1 + 1e-12):
            raise BudgetRaise(
                f"policy.patient_delta = {configured:g} in the config is larger than the "
                f"per-patient delta {stored_f:g} recorded in the privacy ledger {self.path}. A "
                f"budget is never raised silently: set patient_delta back to {stored_f:g}, or "
                f"record the raise with `dpfed site ledger --raise-total --config <site.toml>`")
        elif configured < stored_f:
            self._set_meta("patient_delta", repr(configured))
            self._event("patient_delta_lowered", stored_f, configured,
                        note="policy.patient_delta lowered")

    def _set_patient_delta(self, delta: float) -> None:
        from site_node.patients import renyi_order
        if self._meta("patient_alpha") is None:
            eps = self.patient_epsilon
            self._set_meta("patient_alpha", repr(float(renyi_order(eps, delta))))
        self._set_meta("patient_delta", repr(float(delta)))

    @property
    def patient_epsilon(self) -> float | None:
        value = self._meta("patient_epsilon")
        return None if value is None else float(value)

    @property
    def patient_delta(self) -> float | None:
        """The per-patient delta (None: a pure-eps per-patient budget, or none at all)."""
        value = self._meta("patient_delta")
        return None if value is None else float(value)

    def patient_budget(self) -> PatientBudget | None:
        """The ledger's per-patient budget: pure eps, or (eps, delta) with the Renyi order
        fixed when the delta was first written; None without one."""
        eps = self.patient_epsilon
        if eps is None:
            return None
        delta = self.patient_delta
        if delta is None:
            return PatientBudget(eps)
        return PatientBudget(eps, delta, float(self._meta("patient_alpha")))

    def raise_patient_delta(self, new_delta: float, *, operator: str, note: str = "") -> float | None:
        """Record an explicit raise of the per-patient delta (or a delta added to a pure
        budget), with who and when. Returns the old delta (None: it was pure); LedgerError if
        it is not a raise."""
        with self._transaction():
            if self.patient_epsilon is None:
                raise LedgerError(f"{self.path}: no per-patient budget recorded yet")
            old = self.patient_delta
            if not 0 < new_delta < 1 or (old is not None and not new_delta > old):
                raise LedgerError(f"patient_delta {new_delta:g} is not a raise of the ledger's "
                                  f"{'pure budget' if old is None else format(old, 'g')}")
            self._set_patient_delta(float(new_delta))
            self._event("patient_delta_raised", old, float(new_delta), operator=operator,
                        note=note or "dpfed site ledger --raise-total")
        log.warning("privacy ledger %s: per-patient delta RAISED from %s to %g by %s",
                    self.path, old, new_delta, operator)
        return old

    def raise_patient_budget(self, new_epsilon: float, *, operator: str, note: str = "") -> float:
        """Record an explicit raise of the per-patient budget (who and when). Returns the old
        one; LedgerError if it is not a raise."""
        with self._transaction():
            old = self.patient_epsilon
            if old is None:
                raise LedgerError(f"{self.path}: no per-patient budget recorded yet")
            if not new_epsilon > old + _BUDGET_SLACK:
                raise LedgerError(f"patient_epsilon {new_epsilon:g} is not larger than the "
                                  f"ledger's {old:g}: nothing to raise")
            self._set_meta("patient_epsilon", repr(float(new_epsilon)))
            self._event("patient_raised", old, float(new_epsilon), operator=operator,
                        note=note or "dpfed site ledger --raise-total")
        log.warning("privacy ledger %s: per-patient budget RAISED from %g to %g by %s",
                    self.path, old, new_epsilon, operator)
        return old

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

    # -- patients ------------------------------------------------------------------------
    def patient_hasher(self) -> PatientHasher:
        """The site's patient key (site_node.patients), beside the ledger file. Created (mode
        0600) only while the ledger has no per-patient record; afterwards it must be the key
        the ledger's records were made with (its fingerprint is kept in meta): a lost or
        replaced key raises PatientKeyError instead of giving every patient a new budget."""
        if self._hasher is None:
            with self._transaction():
                fingerprint = self._meta("patient_key_fingerprint")
                has_records = self._conn.execute(
                    "SELECT EXISTS(SELECT 1 FROM patients)").fetchone()[0]
                try:
                    hasher = PatientHasher.load_or_create(
                        key_path_for(self.path), create=fingerprint is None and not has_records)
                except (PatientKeyError, OSError) as exc:
                    raise LedgerError(str(exc)) from None
                if fingerprint is None:
                    self._set_meta("patient_key_fingerprint", hasher.fingerprint())
                elif fingerprint != hasher.fingerprint():
                    raise LedgerError(f"the patient key {key_path_for(self.path)} is not the "
                                      f"one the privacy ledger {self.path} was kept with: "
                                      f"restore the state directory's backup")
            self._hasher = hasher
        return self._hasher

    def _all_scope_events(self) -> list[PrivacyEvent]:
        return [event_from_json(ev, eps) for eps, ev in self._conn.execute(
            "SELECT epsilon, event FROM debits WHERE scope = 'all' ORDER BY id")]

    def _fill_wanted(self, patients) -> None:
        """The temporary table ``wanted`` holds ``patients`` (each once, in sorted order), for
        the queries of ``_histories``, ``_pure_spent`` and ``_renyi_spent`` to join the
        inclusions against, inside the caller's transaction; each caller empties it again
        (``DELETE FROM temp.wanted``) after its query."""
        self._conn.execute("CREATE TEMP TABLE IF NOT EXISTS wanted(patient TEXT PRIMARY KEY) "
                           "WITHOUT ROWID")
        self._conn.execute("DELETE FROM temp.wanted")
        self._conn.executemany("INSERT OR IGNORE INTO temp.wanted(patient) VALUES(?)",
                               ((p,) for p in sorted(patients)))

    def _histories(self, patients) -> dict[str, list[PrivacyEvent]]:
        """Each patient's events: the debits of scope 'all' and those that included them."""
        common = self._all_scope_events()
        out = {p: list(common) for p in patients}
        self._fill_wanted(out)
        events: dict[int, PrivacyEvent] = {}
        for patient, debit_id, eps, ev in self._conn.execute(
                "SELECT i.patient, d.id, d.epsilon, d.event FROM inclusions i "
                "JOIN temp.wanted w ON w.patient = i.patient JOIN debits d ON d.id = i.debit_id "
                "ORDER BY d.id"):
            if debit_id not in events:
                events[debit_id] = event_from_json(ev, eps)
            out[patient].append(events[debit_id])
        self._conn.execute("DELETE FROM temp.wanted")
        return out

    def _only_pure(self) -> bool:
        """Whether every debit is a pure-eps event (then a history is its sum of epsilons)."""
        return not self._conn.execute(
            "SELECT EXISTS(SELECT 1 FROM debits WHERE event IS NOT NULL "
            "AND json_extract(event, '$.kind') != 'pure')").fetchone()[0]

    def _pure_spent(self, patients) -> dict[str, float]:
        """Each patient's pure-eps spend, summed in SQL (``_histories`` when every event is
        PureDP, as a sum: the same rule, ``PatientBudget.admits_pure``, for 1e5 patients)."""
        common = float(self._conn.execute("SELECT COALESCE(SUM(epsilon), 0) FROM debits "
                                          "WHERE scope = 'all'").fetchone()[0])
        out = dict.fromkeys(patients, common)
        self._fill_wanted(out)
        for patient, spent in self._conn.execute(
                "SELECT i.patient, SUM(d.epsilon) FROM inclusions i "
                "JOIN temp.wanted w ON w.patient = i.patient JOIN debits d ON d.id = i.debit_id "
                "GROUP BY i.patient"):
            out[patient] = common + float(spent)
        self._conn.execute("DELETE FROM temp.wanted")
        return out

    def _renyi_spent(self, patients, alpha: float) -> dict[str, float]:
        """Each patient's Renyi divergence at order ``alpha`` (the (eps, delta) filter's
        state), summed in SQL: every debit's eps_alpha is computed once from its event
        (``dpfed.accounting.rdp``), kept in a temporary table, and summed per patient over
        their inclusions, plus the debits of scope 'all'. The same figure as summing
        ``rdp`` over ``_histories`` (up to float summation order), without building every
        patient's history in Python (1e5 patients a release)."""
        from dpfed.accounting import rdp
        common = []
        per_debit = []
        for debit_id, eps, ev, scope in self._conn.execute(
                "SELECT id, epsilon, event, scope FROM debits"):
            r = rdp(event_from_json(ev, eps), alpha)
            (common.append(r) if scope == "all" else per_debit.append((debit_id, r)))
        base = math.fsum(common)
        out = dict.fromkeys(patients, base)
        self._conn.execute("CREATE TEMP TABLE IF NOT EXISTS debit_rdp(id INTEGER PRIMARY KEY, "
                           "r REAL NOT NULL)")
        self._conn.execute("DELETE FROM temp.debit_rdp")
        self._conn.executemany("INSERT INTO temp.debit_rdp(id, r) VALUES(?, ?)", per_debit)
        self._fill_wanted(out)
        for patient, spent in self._conn.execute(
                "SELECT i.patient, SUM(r.r) FROM inclusions i "
                "JOIN temp.wanted w ON w.patient = i.patient "
                "JOIN temp.debit_rdp r ON r.id = i.debit_id GROUP BY i.patient"):
            out[patient] = math.fsum([base, float(spent)])
        self._conn.execute("DELETE FROM temp.wanted")
        self._conn.execute("DELETE FROM temp.debit_rdp")
        return out

    def _admitted(self, patients, event: PrivacyEvent, budget: PatientBudget) -> list[bool]:
        """The filter for each patient, inside the caller's transaction."""
        if budget.delta is None and isinstance(event, PureDP) and self._only_pure():
            spent = self._pure_spent(patients)
            return [budget.admits_pure(spent[p], event) for p in patients]
        if budget.delta is not None:   # the Renyi filter: its state summed in SQL
            spent = self._renyi_spent(patients, budget.alpha)
            return [budget.admits_renyi(spent[p], event) for p in patients]
        histories = self._histories(patients)
        return [budget.admits(histories[p], event) for p in patients]

    def patient_histories(self, patients) -> dict[str, list[PrivacyEvent]]:
        """Each patient's history of events (for a replay through dpfed.accounting)."""
        with self._transaction():
            return self._histories(list(patients))

    def admitted(self, patients, event: PrivacyEvent, budget: PatientBudget) -> list[bool]:
        """For each patient (ledger key), whether their own history admits ``event`` under
        ``budget`` (the individual filter; ``record_release`` checks it again)."""
        patients = list(patients)
        with self._transaction():
            return self._admitted(patients, event, budget)

    def all_patient_histories(self) -> dict[str, list[PrivacyEvent]]:
        """Every known patient's history (``dpfed site ledger``'s histogram, the replay test)."""
        with self._transaction():
            common = self._all_scope_events()
            out = {p: list(common) for (p,) in self._conn.execute(
                "SELECT patient FROM patients ORDER BY patient")}
            events: dict[int, PrivacyEvent] = {}
            for patient, debit_id, eps, ev in self._conn.execute(
                    "SELECT i.patient, d.id, d.epsilon, d.event FROM inclusions i "
                    "JOIN debits d ON d.id = i.debit_id ORDER BY d.id"):
                if debit_id not in events:
                    events[debit_id] = event_from_json(ev, eps)
                out.setdefault(patient, list(common)).append(events[debit_id])
        return out

    def included_in(self, round_id: str) -> set[str]:
        """The patients (ledger keys) the release of ``round_id`` was charged to."""
        return {p for (p,) in self._conn.execute(
            "SELECT i.patient FROM inclusions i JOIN debits d ON d.id = i.debit_id "
            "WHERE d.round_id = ? AND d.reason = 'release'", (round_id,))}

    def patient_summary(self, bins: int = 4) -> dict | None:
        """How many patients have how much of their budget left: counts per bin, never a key.
        None without a per-patient budget. Bins: nothing left (below the slack), then
        ``bins`` equal parts of the budget, (lo, hi]."""
        budget = self.patient_budget()
        if budget is None:
            return None
        with self._transaction():
            pure = budget.delta is None and self._only_pure()
            if pure:   # sums in SQL: the same figures as budget.remaining of each history
                common = float(self._conn.execute(
                    "SELECT COALESCE(SUM(epsilon), 0) FROM debits WHERE scope = 'all'"
                ).fetchone()[0])
                remaining = [max(0.0, budget.epsilon - common - float(spent)) for _, spent in
                             self._conn.execute(
                                 "SELECT p.patient, COALESCE(SUM(d.epsilon), 0) FROM patients p "
                                 "LEFT JOIN inclusions i ON i.patient = p.patient "
                                 "LEFT JOIN debits d ON d.id = i.debit_id GROUP BY p.patient")]
        if not pure:
            # Each patient's history composed by the site's accountant (dpfed.accounting:
            # for (eps, delta), eps at the budget's delta); identical histories once.
            cache: dict = {}
            remaining = []
            for h in self.all_patient_histories().values():
                key = tuple(h)
                if key not in cache:
                    cache[key] = budget.remaining(h)
                remaining.append(cache[key])
        edges = [budget.epsilon * k / bins for k in range(bins + 1)]
        counts = [0] * (bins + 1)
        for r in remaining:
            if r <= _BUDGET_SLACK:
                counts[0] += 1
                continue
            k = min(bins, max(1, int(-(-r * bins // budget.epsilon))))  # ceil: (lo, hi]
            counts[k] += 1
        histogram = [{"remaining_from": 0.0, "remaining_to": 0.0, "patients": counts[0]}]
        histogram += [{"remaining_from": edges[k - 1], "remaining_to": edges[k],
                       "patients": counts[k]} for k in range(1, bins + 1)]
        common = math.fsum(e.epsilon for e in self._all_scope_events()
                           if isinstance(e, PureDP))
        out = {"budget_epsilon": budget.epsilon, "patients": len(remaining),
               "charged_to_every_patient_epsilon": common, "histogram": histogram}
        if budget.delta is not None:
            # (eps, delta): the remaining figures are eps - (composed eps at this delta).
            out.update(budget_delta=budget.delta, renyi_order=budget.alpha,
                       max_spent_epsilon=max((budget.epsilon - r for r in remaining),
                                             default=0.0))
        return out

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

    def budget_text(self) -> str:
        """The site-wide budget for log lines: "remaining R of T" or "no site-wide cap"."""
        total = self.total_epsilon
        if total is None:
            return f"no site-wide cap (spent {self._spent():g})"
        return f"remaining budget {self.remaining:g} of {total:g}"

    def can_spend(self, epsilon: float) -> bool:
        """Whether the site-wide cap allows ``epsilon`` (no cap, with a per-patient budget
        only: True; neither: False)."""
        total = self.total_epsilon
        if total is None:
            return self.patient_epsilon is not None
        return self._spent() + epsilon <= total + _BUDGET_SLACK

    # -- releases ------------------------------------------------------------------------
    def record_release(self, *, round_id: str, spec_digest: str, epsilon: float, n: int,
                       envelope: pb.SignedEnvelope, neighbouring: str = "add_remove",
                       patients: list[str] | None = None, seen=(),
                       event: PrivacyEvent | None = None,
                       patient_budget: PatientBudget | None = None) -> RecordResult:
        """Debit ``epsilon`` and store the signed release, atomically, before it is sent.

        If a release for ``round_id`` already exists for the same spec, that stored release is
        returned (``fresh=False``) and nothing is debited: the caller must send the stored
        bytes and discard its own fresh noise, which has not left the site. Raises
        RoundConflict for a different spec and BudgetExhausted when the budget does not cover
        ``epsilon``; in both cases nothing is written. ``neighbouring`` is the relation the
        release was made under ("add_remove" or "replace_one"), shown by ``dpfed site ledger``.

        Per-patient accounting: ``patients`` (ledger keys, each at most once) are the patients
        whose rows the release used; ``seen`` the other candidates of the release (recorded as
        known patients, charged nothing). The debit is then of scope 'included', charged with
        ``event`` (default PureDP(epsilon)) to exactly those patients, after every one of them
        is checked again against ``patient_budget`` inside this transaction (another process
        may have spent since the filter ran): if one no longer admits it, BudgetExhausted and
        nothing is written. Without ``patients`` the debit is charged to every patient.
        """
        if not (epsilon > 0):
            raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
        if neighbouring not in ("add_remove", "replace_one"):
            raise ValueError(f"unknown neighbouring relation {neighbouring!r}")
        if patients is not None:
            patients = list(patients)
            if patient_budget is None:
                raise ValueError("a release charged to its patients needs their budget")
            if len(set(patients)) != len(patients):
                raise ValueError("contribution bounding: a patient appears twice in one release")
        event = event or PureDP(float(epsilon))
        blob = envelope.SerializeToString()
        with self._transaction() as conn:
            existing = self._get(round_id)
            if existing is not None:
                if existing.spec_digest != spec_digest:
                    raise RoundConflict(f"round {round_id} was already answered for spec "
                                        f"{existing.spec_digest[:12]}, not {spec_digest[:12]}")
                return RecordResult(existing, fresh=False)
            total = self.total_epsilon
            if total is None and patients is None:
                raise LedgerError(f"{self.path}: no total budget recorded")
            spent = self._spent()
            if total is not None and spent + epsilon > total + _BUDGET_SLACK:
                raise BudgetExhausted(f"epsilon {epsilon:g} exceeds the remaining budget "
                                      f"{max(0.0, total - spent):g} (spent {spent:g} of {total:g})")
            if patients is not None:
                if not all(self._admitted(patients, event, patient_budget)):
                    # Fixed text: it may be sent in a Refusal (no count, no key).
                    raise BudgetExhausted("a patient's remaining budget no longer covers this "
                                          "release (spent concurrently); nothing recorded")
            now = _now_ms()
            debit_id = self._debit(conn, round_id, float(epsilon), now, event=event,
                                   scope="all" if patients is None else "included")
            if patients is not None:
                # In key order: B-tree inserts at the end of a page, not all over the file.
                conn.executemany("INSERT OR IGNORE INTO patients(patient, first_seen_unix_ms) "
                                 "VALUES(?, ?)", ((p, now) for p in sorted([*patients, *seen])))
                conn.executemany("INSERT INTO inclusions(patient, debit_id) VALUES(?, ?)",
                                 ((p, debit_id) for p in sorted(patients)))
            self._store(conn, round_id, spec_digest, float(epsilon), int(n), blob, now,
                        neighbouring)
            stored = self._get(round_id)
        return RecordResult(stored, fresh=True)

    # The two writes of record_release, separate so a test can crash between them.
    def _debit(self, conn, round_id: str, epsilon: float, now: int, *,
               event: PrivacyEvent | None = None, scope: str = "all") -> int:
        cur = conn.execute("INSERT INTO debits(round_id, epsilon, reason, created_unix_ms, "
                           "event, scope) VALUES(?, ?, 'release', ?, ?, ?)",
                           (round_id, epsilon, now,
                            event_to_json(event or PureDP(epsilon)), scope))
        return cur.lastrowid

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
            # Per-patient budget: counts of patients per remaining-budget bin, never a key.
            "patients": self.patient_summary(),
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
