"""The audit log a party keeps of the messages it receives and sends (issue 22).

One entry per message that crossed the wire: its direction, kind, round, phase, peer, the key
that signed it, the SHA-256 of the envelope as it crossed the wire (``message_digest``: both
ends compute the same one, so a site's log and the aggregator's can be matched entry by
entry), the spec it answers and what was decided: consent, refusal with its reason, a release
(the digest of its statistics bytes) and the epsilon. Never a data value, a row count or a
patient id: every field is copied from a message that was sent anyway, except the released
statistics and n, which are left out (docs/audit.md).

The chain. Entry ``k`` is canonical JSON (sorted keys, no whitespace) of its fields, with
``seq = k`` and ``prev`` = the hash of entry ``k - 1`` (``GENESIS`` for entry 0); its hash is
``sha256(bytes.fromhex(prev) || entry bytes)``. Entry 0 is written when the log is created and
names the party and its key. After every append (one entry at a site, one batch at the
aggregator) the *head* (party, seq, hash) is signed with the party's Ed25519 key
(dpfed.wire.signing, detached, payload type ``HEAD_TYPE``) and stored with the entries in
the same transaction. ``verify`` recomputes every hash, checks that seq runs 0, 1, 2, ...
and checks every head's signature against the party's public key: an edited, deleted,
reordered or appended entry, or a forged head, is reported with the first entry it breaks
and why, without echoing the entry's values.

What the log alone cannot show: deleting the *last* entries together with their heads
leaves a shorter chain that is still valid (so would restoring an old copy). ``verify``
catches it when given an *anchor*, a signed head kept elsewhere that names a later entry (the
site keeps the latest head in its privacy ledger's database, site_node.ledger), and
``cross_check`` against the peer's log finds every message the peer recorded that this log
lost (docs/audit.md, "What is and is not detected").

Storage: SQLite in WAL mode (``synchronous=FULL``): one transaction per append or batch, so
an entry and the head that signs it are durable together or not at all; the writer only
INSERTs, and triggers refuse UPDATE and DELETE on the log's tables (a guard against mistakes;
anyone who can write the file can drop them, which is what the chain is for).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field
from json.encoder import encode_basestring_ascii as _encode_string
from pathlib import Path
from typing import NamedTuple

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire import limits
from dpfed.wire.canonical import digest
from dpfed.wire.signing import SignatureError, SigningKey, verify_detached

__all__ = ["AuditError", "AuditLog", "Contents", "GENESIS", "HEAD_TYPE", "Head", "Problem",
           "RECEIVED", "Record", "SENT", "Verdict", "cross_check", "default_path",
           "describe", "entries", "message_digest", "read", "verify"]

SCHEMA_VERSION = 1
GENESIS = "0" * 64
#: The payload type a head's signature is made for: no dpfed.v1 envelope has this type, so a
#: head signature can never be replayed as a message's.
HEAD_TYPE = "dpfed.audit.v1.Head"

RECEIVED, SENT, LOCAL = "received", "sent", "local"
DIRECTIONS = (RECEIVED, SENT, LOCAL)

#: Every field of an entry, in display order; ``seq``, ``time_ms`` and ``prev`` are set by the
#: writer, the rest by the caller (``Record``).
FIELDS = ("seq", "time_ms", "direction", "kind", "round_id", "phase", "peer", "signer",
          "message_digest", "spec_digest", "outcome", "reason", "release_digest", "epsilon",
          "prev")

_KINDS = {"dpfed.v1.RoundSpec": "spec", "dpfed.v1.PhaseNotice": "notice",
          "dpfed.v1.PhaseMessage": "phase", "dpfed.v1.Contribution": "contribution",
          "dpfed.v1.Refusal": "refusal", "dpfed.v1.SiteHello": "hello"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS entries (
    seq   INTEGER PRIMARY KEY,
    entry BLOB NOT NULL,
    hash  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS heads (
    seq       INTEGER PRIMARY KEY,
    hash      TEXT NOT NULL,
    key_id    TEXT NOT NULL,
    signature BLOB NOT NULL,
    time_ms   INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS entries_no_update BEFORE UPDATE ON entries
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS entries_no_delete BEFORE DELETE ON entries
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS heads_no_update BEFORE UPDATE ON heads
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS heads_no_delete BEFORE DELETE ON heads
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END
"""


class AuditError(RuntimeError):
    """The audit log cannot be opened, read or written (the message says which and why)."""


def default_path(state_db: str | Path) -> Path:
    """Where a party's audit log lives by default: next to its state database,
    ``ledger.sqlite`` -> ``ledger.audit.sqlite``."""
    state_db = Path(state_db)
    return state_db.with_name(f"{state_db.stem}.audit{state_db.suffix or '.sqlite'}")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- what an entry says -------------------------------------------------------------------

class Record(NamedTuple):
    """What the caller knows of one message; the writer adds seq, time_ms and prev. (A
    NamedTuple: the aggregator copies one per site pushed to, ``_replace(peer=...)``.)"""

    direction: str
    kind: str
    round_id: str = ""
    phase: str = ""
    peer: str = ""
    signer: str = ""
    message_digest: str = ""
    spec_digest: str = ""
    outcome: str = ""
    reason: str = ""
    release_digest: str = ""
    epsilon: float | None = None


def message_digest(envelope: pb.SignedEnvelope) -> str:
    """SHA-256 (hex) of the envelope's wire bytes: protobuf's deterministic serialisation,
    which is what a dpfed client or server puts on the wire for a SignedEnvelope (scalar
    fields only), so the sender and the receiver compute the same digest."""
    return hashlib.sha256(envelope.SerializeToString(deterministic=True)).hexdigest()


def describe(direction: str, envelope: pb.SignedEnvelope, *, peer: str | None,
             message=None, phase: str = "", outcome: str = "",
             wire_digest: str | None = None, release_digest: bool = True) -> Record:
    """The Record of ``envelope`` crossing the wire in ``direction`` with ``peer`` (None: the
    site_id or coordinator_id the message names, for a party with many peers).

    ``message``: the payload, if the caller has parsed it already (a dpfed.v1 message, or
    the dict of its canonical JSON); otherwise the payload is read as plain JSON, not
    validated: the log records what arrived, the party's own checks judge it (``outcome``).
    ``phase``: the phase the message belongs to, where the message does not say (a refusal
    answers a consent or a release request); ``outcome``: what the recording party decided
    about a message it received (e.g. the aggregator's "accepted"), default: for a message
    sent, what it is (consent, release, refusal, or the secure step's phase);
    ``wire_digest``: the message digest if already computed from the received bytes;
    ``release_digest``: compute a contribution's statistics digest (the site does; the
    aggregator's entries name the message digest, which covers the statistics too).

    Only identifiers, digests, the phase, the epsilon and a refusal's reason (which the
    message carried anyway) are kept: never the statistics, n or anything from the data."""
    type_name = envelope.payload_type
    base = dict(direction=direction, signer=_clip(envelope.key_id, limits.MAX_KEY_ID_CHARS),
                message_digest=wire_digest or message_digest(envelope), outcome=outcome,
                phase=_clip(phase, 32), peer=_clip(peer or "", limits.MAX_TEXT_CHARS))
    if message is None:
        try:
            message = json.loads(envelope.payload)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            return Record(kind="malformed", **base)
    get = message.get if isinstance(message, dict) else (
        lambda name, default="": getattr(message, name, default))
    if peer is None:
        base["peer"] = _clip(get("site_id", "") or get("coordinator_id", ""), limits.MAX_ID_CHARS)
    kind = _KINDS.get(type_name, "other")
    if kind == "other":
        return Record(kind=kind, **base)
    base["round_id"] = _clip(get("round_id", ""), limits.MAX_ID_CHARS)
    if kind == "spec":
        return Record(kind=kind, spec_digest=digest(envelope.payload),
                      epsilon=_number(get("epsilon", 0.0)), **base)
    if kind == "hello":
        base["round_id"] = ""
        return Record(kind=kind, **base)
    spec_digest = _clip(get("spec_digest", ""), 64)
    if kind == "notice":
        base["phase"] = _clip(get("phase", ""), 32)
        spec_envelope = get("spec_envelope", b"")
        if spec_envelope:
            try:
                if isinstance(spec_envelope, str):
                    spec_envelope = base64.b64decode(spec_envelope)
                spec = pb.SignedEnvelope.FromString(spec_envelope)
                spec_digest = spec_digest or digest(spec.payload)
                base["signer"] = _clip(spec.key_id, limits.MAX_KEY_ID_CHARS)
            except Exception:  # noqa: BLE001 - a label only; the party judges the notice
                pass
        return Record(kind=kind, spec_digest=spec_digest, **base)
    if kind == "phase":
        base["phase"] = _clip(get("phase", ""), 32)
        if direction == SENT and not outcome:
            base["outcome"] = base["phase"]
        return Record(kind=kind, spec_digest=spec_digest, **base)
    if kind == "refusal":
        if direction == SENT and not outcome:
            base["outcome"] = "refusal"
        return Record(kind=kind, spec_digest=spec_digest, reason=_clip(get("reason", ""),
                                                                        limits.MAX_REASON_CHARS),
                      epsilon=_number(get("epsilon_spent", 0.0)), **base)
    # A contribution: the digest of its statistics bytes, or of its masked input in a secure
    # round (what the ledger and the aggregator's store hold), never the statistics or n.
    base["phase"] = base["phase"] or "release"
    if direction == SENT and not outcome:
        base["outcome"] = "release"
    released = ""
    if release_digest:
        # The noisy statistics, or a secure round's masked input (statistics empty).
        statistics = get("statistics", b"") or get("masked", b"")
        try:
            if isinstance(statistics, str):
                statistics = base64.b64decode(statistics)
            released = hashlib.sha256(statistics).hexdigest()
        except (ValueError, TypeError):
            released = ""
    return Record(kind=kind, spec_digest=spec_digest, release_digest=released,
                  epsilon=_number(get("epsilon_spent", 0.0)), **base)


def _clip(value, limit: int) -> str:
    if not isinstance(value, str):
        value = str(value)
    if len(value) <= limit and value.isprintable():   # the usual case, without the regex
        return value
    return limits.clip_text(value, limit)


def _number(value) -> float | None:
    """A finite float, or None (an entry never holds NaN or infinities)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


# -- the chain ----------------------------------------------------------------------------

def entry_bytes(seq: int, time_ms: int, record: Record, prev: str) -> bytes:
    """Canonical JSON of one entry: every field of FIELDS, sorted keys, no whitespace, ASCII
    (byte for byte ``json.dumps(..., sort_keys=True, separators=(",", ":"))``; written out
    field by field because the aggregator writes thousands per round)."""
    eps = record.epsilon
    if eps is not None and not math.isfinite(eps):
        raise ValueError("an audit entry's epsilon must be finite")
    e = _encode_string
    return (f'{{"direction":{e(record.direction)},"epsilon":'
            f'{"null" if eps is None else float.__repr__(float(eps))},'
            f'"kind":{e(record.kind)},"message_digest":{e(record.message_digest)},'
            f'"outcome":{e(record.outcome)},"peer":{e(record.peer)},"phase":{e(record.phase)},'
            f'"prev":{e(prev)},"reason":{e(record.reason)},'
            f'"release_digest":{e(record.release_digest)},"round_id":{e(record.round_id)},'
            f'"seq":{int(seq)},"signer":{e(record.signer)},"spec_digest":{e(record.spec_digest)},'
            f'"time_ms":{int(time_ms)}}}').encode("ascii")


def chain_hash(prev: str, data: bytes) -> str:
    """sha256(prev hash bytes || entry bytes), hex."""
    return hashlib.sha256(bytes.fromhex(prev) + data).hexdigest()


def head_bytes(party: str, seq: int, hash_: str) -> bytes:
    """The bytes a head's signature covers: the party the log belongs to, the seq of its
    last entry and that entry's hash."""
    return json.dumps({"party": party, "seq": seq, "hash": hash_}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True).encode("ascii")


@dataclass(frozen=True)
class Head:
    """A signed head: ``key_id`` signed (party, seq, hash)."""

    party: str
    seq: int
    hash: str
    key_id: str
    signature: bytes
    time_ms: int = 0

    def to_json(self) -> str:
        """For keeping a copy elsewhere (the site's ledger: ``verify``'s anchor)."""
        return json.dumps({"party": self.party, "seq": self.seq, "hash": self.hash,
                           "key_id": self.key_id, "signature": self.signature.hex(),
                           "time_ms": self.time_ms}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Head":
        obj = json.loads(text)
        return cls(party=str(obj["party"]), seq=int(obj["seq"]), hash=str(obj["hash"]),
                   key_id=str(obj["key_id"]), signature=bytes.fromhex(obj["signature"]),
                   time_ms=int(obj.get("time_ms", 0)))


def _connect(path: Path, timeout_s: float) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=timeout_s, isolation_level=None,
                           check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
    return conn


class AuditLog:
    """The writer of one party's audit log at ``path`` (created with its genesis entry on
    first use). ``append`` writes one entry, ``append_many`` a batch, each in one
    transaction together with a head signed by ``signing_key``; ``on_head`` is called with
    every new head after its commit (the site keeps a copy in its ledger). Raises AuditError
    when the log cannot be written: callers fail closed (they stop answering)."""

    def __init__(self, path: str | Path, *, party: str, signing_key: SigningKey,
                 on_head=None, timeout_s: float = 30.0):
        self.path = Path(path)
        self.party = party
        self.signing_key = signing_key
        self.on_head = on_head
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = _connect(self.path, timeout_s)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA.split(";\n"):
                    if statement.strip():
                        self._conn.execute(statement)
                meta = dict(self._conn.execute("SELECT key, value FROM meta"))
                if not meta:
                    self._conn.executemany("INSERT INTO meta(key, value) VALUES(?, ?)", [
                        ("schema_version", str(SCHEMA_VERSION)), ("party", party),
                        ("key_id", signing_key.key_id), ("created_unix_ms", str(_now_ms()))])
                elif meta.get("party") != party:
                    raise AuditError(f"{self.path} is the audit log of {meta.get('party')!r}, "
                                     f"not {party!r}")
                elif int(meta.get("schema_version", "0")) != SCHEMA_VERSION:
                    raise AuditError(f"{self.path}: audit log schema "
                                     f"{meta.get('schema_version')}, this dpfed knows "
                                     f"{SCHEMA_VERSION}")
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise AuditError(f"cannot open the audit log {self.path}: {exc}") from None
        except OSError as exc:
            raise AuditError(f"cannot open the audit log {self.path}: {exc}") from None
        if self.head() is None:
            self.append(Record(LOCAL, "opened", peer=party, signer=signing_key.key_id,
                               outcome="log created"))

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def head(self) -> Head | None:
        """The latest signed head, or None for an empty log."""
        row = self._conn.execute("SELECT seq, hash, key_id, signature, time_ms FROM heads "
                                 "ORDER BY seq DESC LIMIT 1").fetchone()
        return None if row is None else Head(self.party, row[0], row[1], row[2],
                                             bytes(row[3]), row[4])

    def append(self, record: Record) -> Head:
        return self.append_many([record])

    def append_many(self, records, *, time_ms: int | None = None) -> Head:
        """Append ``records`` (in order) in one transaction with one signed head; return it.
        The chain continues from the last entry in the file (read inside the transaction, so
        two processes writing one log never fork it)."""
        records = list(records)
        if not records:
            raise ValueError("nothing to append")
        for r in records:
            if r.direction not in DIRECTIONS:
                raise ValueError(f"direction must be one of {DIRECTIONS}, got {r.direction!r}")
        now = _now_ms() if time_ms is None else time_ms
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    last = self._conn.execute("SELECT seq, hash FROM entries ORDER BY seq DESC "
                                              "LIMIT 1").fetchone()
                    seq, prev = (-1, GENESIS) if last is None else last
                    rows = []
                    for record in records:
                        seq += 1
                        data = entry_bytes(seq, now, record, prev)
                        prev = chain_hash(prev, data)
                        rows.append((seq, data, prev))
                    self._conn.executemany("INSERT INTO entries(seq, entry, hash) VALUES(?, ?, ?)",
                                           rows)
                    signature = self.signing_key.sign_detached(
                        HEAD_TYPE, head_bytes(self.party, seq, prev))
                    head = Head(self.party, seq, prev, self.signing_key.key_id, signature, now)
                    self._conn.execute("INSERT INTO heads(seq, hash, key_id, signature, time_ms) "
                                       "VALUES(?, ?, ?, ?, ?)",
                                       (seq, prev, head.key_id, signature, now))
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise AuditError(f"cannot write the audit log {self.path}: {exc}") from None
        if self.on_head is not None:
            try:
                self.on_head(head)
            except (sqlite3.Error, OSError) as exc:
                raise AuditError(f"the audit log's head could not be kept: {exc}") from None
        return head


# -- reading and verifying ----------------------------------------------------------------

@dataclass
class Contents:
    """Everything in one audit log file, as stored (nothing judged yet)."""

    path: Path
    meta: dict
    rows: list = field(default_factory=list)     # (seq, entry bytes, stored hash), by seq
    heads: list = field(default_factory=list)    # Head, by seq

    @property
    def party(self) -> str:
        return self.meta.get("party", "")


def read(path: str | Path, timeout_s: float = 30.0) -> Contents:
    """Read a log without writing to it. Raises AuditError if there is none or it is not one."""
    path = Path(path)
    if not path.exists():
        raise AuditError(f"no audit log at {path}")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout_s)
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta"))
            rows = [(s, bytes(e), h) for s, e, h in
                    conn.execute("SELECT seq, entry, hash FROM entries ORDER BY seq")]
            party = meta.get("party", "")
            heads = [Head(party, s, h, k, bytes(sig), t) for s, h, k, sig, t in conn.execute(
                "SELECT seq, hash, key_id, signature, time_ms FROM heads ORDER BY seq")]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise AuditError(f"{path} is not a readable audit log: {exc}") from None
    return Contents(path, meta, rows, heads)


def entries(contents: Contents) -> list[dict]:
    """The entries as dicts (for display), in stored order. One that does not parse is shown
    as ``{"seq": <its row>, "unreadable": true}``: ``verify`` says what is wrong with it."""
    out = []
    for seq, data, _ in contents.rows:
        try:
            obj = json.loads(data)
            if not isinstance(obj, dict):
                raise ValueError
        except ValueError:
            obj = {"seq": seq, "unreadable": True}
        out.append(obj)
    return out


@dataclass(frozen=True)
class Problem:
    """Where the chain breaks first: ``seq`` (the entry or head it names), ``kind`` (edited,
    deleted, reordered, bad_signature, unsigned) and a message for people. Values of the
    entry are never quoted."""

    seq: int
    kind: str
    message: str


@dataclass(frozen=True)
class Verdict:
    ok: bool
    entries: int
    head_seq: int | None = None
    key_id: str | None = None
    problem: Problem | None = None

    def to_dict(self) -> dict:
        return {"ok": self.ok, "entries": self.entries, "head_seq": self.head_seq,
                "key_id": self.key_id,
                "problem": None if self.problem is None else asdict(self.problem)}


def _parse(data: bytes) -> dict | None:
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    if not isinstance(obj, dict) or set(obj) != set(FIELDS) or \
            not isinstance(obj["seq"], int) or not isinstance(obj["prev"], str):
        return None
    try:
        bytes.fromhex(obj["prev"])
    except ValueError:
        return None
    return obj


def verify(contents: Contents, public_keys: dict, *, anchor: Head | None = None) -> Verdict:
    """Check ``contents``: every entry's hash, the links, seq = 0, 1, 2, ... in stored order,
    and every head's signature by a key of ``public_keys`` (key id -> Ed25519PublicKey) over
    this log's party; the last head must cover the last entry. ``anchor``: a head kept
    outside the log (the site's ledger); a log that ends before it, or disagrees with it, was
    truncated or replaced. Returns the first problem found."""
    def broken(seq, kind, message):
        return Verdict(False, len(contents.rows), problem=Problem(seq, kind, message))

    party = contents.party
    parsed = [(row_seq, _parse(data), data, stored) for row_seq, data, stored in contents.rows]
    row_seqs = {row_seq for row_seq, *_ in parsed}
    inner_seqs = {e["seq"] for _, e, _, _ in parsed if e is not None}
    computed: dict[int, str] = {}
    prev = GENESIS
    for position, (row_seq, entry, data, stored) in enumerate(parsed):
        if entry is None:
            return broken(row_seq, "edited", f"entry {row_seq} was edited: it is not a valid "
                                             f"entry any more")
        # An entry moved elsewhere keeps its own hash; an edited one does not.
        if chain_hash(entry["prev"], data) != stored:
            return broken(entry["seq"], "edited",
                          f"entry {entry['seq']} was edited: its hash does not match its "
                          f"contents")
        if entry["seq"] != position or row_seq != position:
            if position in inner_seqs:
                return broken(position, "reordered",
                              f"entry {position} is out of order: entry {entry['seq']} is in "
                              f"its place")
            end = position
            while end not in inner_seqs and end < max(inner_seqs | row_seqs):
                end += 1
            missing = (f"entry {position} is" if end == position + 1 else
                       f"entries {position}-{end - 1} are")
            return broken(position, "deleted", f"{missing} missing (deleted)")
        if entry["prev"] != prev:
            return broken(position - 1, "edited",
                          f"entry {position - 1} was edited (its hash recomputed): entry "
                          f"{position}'s link to it does not match")
        prev = stored
        computed[position] = stored
    last = len(parsed) - 1
    if last < 0:
        if anchor is not None:
            return broken(0, "deleted", f"the log is empty, but a signed head kept outside it "
                                        f"names entry {anchor.seq}: it was deleted")
        return broken(0, "deleted", "the log has no entries (even its first entry is gone)")
    good_until = -1
    for head in contents.heads:
        problem = _head_problem(head, party, public_keys)
        if problem:
            return broken(head.seq, "bad_signature", f"the signed head at entry {head.seq}: "
                                                     f"{problem}")
        if head.seq > last:
            return broken(last + 1, "deleted",
                          f"a signed head names entry {head.seq}, but the log ends at entry "
                          f"{last}: entries {last + 1}-{head.seq} were deleted")
        if computed[head.seq] != head.hash:
            where = (f"entry {head.seq} was" if good_until + 1 == head.seq else
                     f"an entry between {good_until + 1} and {head.seq} was")
            return broken(good_until + 1, "edited",
                          f"{where} edited and the hashes after it recomputed: the signed "
                          f"head at entry {head.seq} does not match the chain")
        good_until = head.seq
    if good_until < last:
        return broken(good_until + 1, "unsigned",
                      f"entries {good_until + 1}-{last} are not covered by a signed head (added "
                      f"without the party's key)")
    if anchor is not None:
        problem = _head_problem(anchor, party, public_keys)
        if problem:
            return broken(anchor.seq, "bad_signature",
                          f"the head kept outside the log (entry {anchor.seq}): {problem}")
        if anchor.seq > last:
            return broken(last + 1, "deleted",
                          f"the head kept outside the log names entry {anchor.seq}, but the "
                          f"log ends at entry {last}: entries {last + 1}-{anchor.seq} were "
                          f"deleted, or the log was replaced by an older copy")
        if computed[anchor.seq] != anchor.hash:
            return broken(anchor.seq, "edited",
                          f"the head kept outside the log does not match entry {anchor.seq}: "
                          f"the log was replaced or rewritten")
    final = contents.heads[-1]
    return Verdict(True, len(parsed), head_seq=final.seq, key_id=final.key_id)


def _head_problem(head: Head, party: str, public_keys: dict) -> str | None:
    key = public_keys.get(head.key_id)
    if key is None:
        return f"signed by key {head.key_id[:16] or '(none)'}, not a key of {party!r} given"
    if head.party != party:
        return f"it names {head.party!r}, not {party!r}"
    try:
        verify_detached(key, HEAD_TYPE, head_bytes(party, head.seq, head.hash), head.signature)
    except SignatureError:
        return "its signature does not verify (forged or altered)"
    return None


def cross_check(ours: list[dict], theirs: list[dict], *, ours_peer: str | None = None,
                theirs_peer: str | None = None) -> dict:
    """Match two parties' logs by message digest: every message one recorded sending the
    other must have recorded receiving, and the other way round. ``ours``, ``theirs``:
    ``entries(...)`` of each log; ``ours_peer``/``theirs_peer`` narrow a log shared by many
    peers to the entries naming the other party as peer (the aggregator's log, by site id).
    Returns {"matched": int, "missing_in_theirs": [...], "missing_in_ours": [...]}, each
    missing message as its direction (in the log that has it), kind, round and digest.

    A message missing from the receiver's log is expected only where delivery failed (a push
    down a stream that broke; a request refused before it was read); one missing from the
    sender's log means the sender's log lost it (docs/audit.md)."""
    flip = {SENT: RECEIVED, RECEIVED: SENT}

    def keyed(log, peer):
        return {(e["direction"], e["message_digest"]): e for e in log
                if e.get("direction") in flip and e.get("message_digest")
                and (peer is None or e.get("peer") == peer)}

    def summary(e):
        return {"direction": e.get("direction"), "kind": e.get("kind"),
                "round_id": e.get("round_id"), "message_digest": e.get("message_digest")}

    mine, other = keyed(ours, ours_peer), keyed(theirs, theirs_peer)
    return {"matched": sum(1 for d, m in mine if (flip[d], m) in other),
            "missing_in_theirs": [summary(e) for (d, m), e in mine.items()
                                  if (flip[d], m) not in other],
            "missing_in_ours": [summary(e) for (d, m), e in other.items()
                                if (flip[d], m) not in mine]}
