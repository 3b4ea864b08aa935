"""The aggregator's audit log (issue 22): what it receives from and sends to sites and
coordinators, in one dpfed.audit log signed with its key (aggregator.toml ``signing_key``).

What is recorded (docs/audit.md): every signed request that can change a round, as received
with the aggregator's verdict as the outcome (StartRound: a coordinator's spec, "started";
SendPhase: a consent or a secure step's message; Contribute: "accepted", "duplicate";
Refuse; any of them "rejected <gRPC code>"), and every message pushed down a site's round
stream (the spec asking for consent, the phase notices), as sent. Each entry names the
peer (the site_id or coordinator_id the message names) and the SHA-256 of the envelope's
wire bytes: the digest the site computes of the same message, so the two logs match entry
by entry (dpfed.audit.cross_check, ``dpfed site audit --against``). The read-only calls
(GetRound, ListRounds, GetResult, ...) and the hellos that open a stream are not recorded.

How it stays cheap at 1000 sites (docs/benchmarks.md, "Audit log"): a gRPC handler only puts
(what, the request's raw bytes, the outcome) on a queue; the writer thread turns what
gathered in ``interval_s`` into entries (the digest of the raw bytes; the fields from the
payload's JSON, a contribution's statistics cut out before parsing) and appends them in one
SQLite transaction with one signed head (dpfed.audit.AuditLog.append_many). A spec or
notice pushed to every site is described once (cached by its digest).

Fail closed: when the log cannot be written the writer stops, says why, and every audited
call is refused UNAVAILABLE until the aggregator is restarted with a writable log. The entries
of the last ``interval_s`` are not yet durable when a reply leaves: a crash can lose them (a
crash can also lose a reply); the sites' logs still hold those messages, and a cross-check
names them (docs/audit.md, "What is and is not detected").
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import queue
import threading
import time
from collections import OrderedDict
from pathlib import Path

import grpc

from dpfed.audit import RECEIVED, SENT, AuditError, AuditLog, Record, describe
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire import limits

log = logging.getLogger(__name__)

PARTY = "aggregator"
#: The unary calls recorded as received (with their outcome).
RECEIVED_CALLS = frozenset({"StartRound", "SendPhase", "Contribute", "Refuse"})
#: The stream whose pushes are recorded as sent.
PUSH_STREAM = "Subscribe"

# The big base64 fields of a contribution (its statistics, or a secure round's masked input):
# the log never keeps them, so they are cut out before the payload's JSON is parsed.
_BULK_KEYS = (b'"statistics":"', b'"masked":"')
_STOP = object()
# raw_decode: a third of json.loads's time on a 300-byte consent (no encoding sniffing).
_DECODER = json.JSONDecoder()


def _light_payload(payload: bytes) -> dict | None:
    """A payload's JSON without a contribution's bulk fields (a 23 kB base64 string at
    d = 64), or None if it is not a JSON object."""
    for key in _BULK_KEYS:
        cut = payload.find(key)
        if cut >= 0:
            end = payload.find(b'"', cut + len(key))
            if end > 0:
                payload = payload[:cut + len(key)] + payload[end:]
    try:
        obj = _DECODER.raw_decode(payload.decode("utf-8"))[0]
    except ValueError:    # UnicodeDecodeError and JSONDecodeError too
        return None
    return obj if isinstance(obj, dict) else None


class AuditTrail:
    """The aggregator's batching writer of its audit log at ``path``."""

    #: How long the writer lets a batch gather (docs/benchmarks.md, "Audit log").
    INTERVAL_S = 0.1

    def __init__(self, path: str | Path, *, signing_key, interval_s: float | None = None,
                 max_batch: int = 5000):
        self.log = AuditLog(path, party=PARTY, signing_key=signing_key)
        self.path = self.log.path
        self.interval_s = self.INTERVAL_S if interval_s is None else interval_s
        self.max_batch = max_batch
        # Why the log cannot be written (then every audited call is refused), or None.
        self.failed: str | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        # Pushed envelopes: the same spec object goes to every site (by id, the object held
        # so its id is not reused), equal notices are described once (by digest).
        self._digests: OrderedDict = OrderedDict()
        self._records: OrderedDict = OrderedDict()
        self._last_push = None
        # The writer thread's CPU time and batches so far (docs/benchmarks.md, "Audit log").
        self.cpu_s = 0.0
        self.batches = 0
        self._thread = threading.Thread(target=self._run, name="aggregator-audit", daemon=True)
        self._thread.start()

    # -- called by the gRPC handlers (the event loop): a queue put, nothing else -------------
    def received(self, what: str, data: bytes, outcome: str) -> None:
        self._queue.put((RECEIVED, what, data, outcome))

    def sent(self, envelope: pb.SignedEnvelope, peer: str) -> None:
        self._queue.put((SENT, peer, envelope, ""))

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything queued before this call is committed (or dropped after a
        failure); False on timeout."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)
        self.log.close()

    # -- the writer thread ---------------------------------------------------------------------
    def _run(self) -> None:
        last = 0.0
        while True:
            first = self._queue.get()
            wait = self.interval_s - (time.monotonic() - last)
            if wait > 0 and first is not _STOP:
                time.sleep(wait)        # let a batch gather: one transaction, one signature
            items = [first]
            while len(items) < self.max_batch:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            started = time.thread_time()
            stop = any(i is _STOP for i in items)
            waiting = [i for i in items if isinstance(i, threading.Event)]
            records = [self._record(i) for i in items if isinstance(i, tuple)]
            if records and self.failed is None:
                try:
                    self.log.append_many(records)
                except (AuditError, ValueError) as exc:
                    self.failed = str(exc)
                    log.error("%s. The aggregator refuses every round message from now on "
                              "(fail closed) until it is restarted with a writable audit log",
                              exc)
            last = time.monotonic()
            self.cpu_s += time.thread_time() - started
            self.batches += 1
            for event in waiting:
                event.set()
            if stop:
                return

    def _record(self, item) -> Record:
        direction, who, payload, outcome = item
        if direction == RECEIVED:
            digest = hashlib.sha256(payload).hexdigest()
            try:
                envelope = pb.SignedEnvelope.FromString(payload)
            except Exception:  # noqa: BLE001 - not an envelope: recorded as such
                return Record(RECEIVED, "malformed", outcome=outcome, message_digest=digest)
            message = _light_payload(envelope.payload)
            if message is None:
                return Record(RECEIVED, "malformed", outcome=outcome, message_digest=digest,
                              signer=limits.clip_text(envelope.key_id, limits.MAX_KEY_ID_CHARS))
            return describe(RECEIVED, envelope, peer=None, message=message, outcome=outcome,
                            wire_digest=digest, release_digest=False)
        envelope = payload
        digest = self._push_digest(envelope)
        record = self._records.get(digest)
        if record is None:
            phase = "consent" if envelope.payload_type == "dpfed.v1.RoundSpec" else ""
            record = describe(SENT, envelope, peer="", wire_digest=digest, phase=phase,
                              outcome="pushed")
            self._remember(self._records, digest, record)
        return record._replace(peer=who)

    def _push_digest(self, envelope: pb.SignedEnvelope) -> str:
        """The message digest of a pushed envelope. The spec is one object pushed to every
        site (known by id; the object is held, so its id is not reused); a notice is a new
        object per site with the same bytes, so the last one's fields are compared (a
        memcmp) before its 15 kB (1000 participants) are serialised and hashed again."""
        cached = self._digests.get(id(envelope))
        if cached is not None and cached[0] is envelope:
            return cached[1]
        fields = (envelope.payload_type, envelope.key_id, envelope.signature, envelope.payload)
        last = self._last_push
        if last is not None and last[0] == fields:
            return last[1]
        digest = hashlib.sha256(envelope.SerializeToString(deterministic=True)).hexdigest()
        self._remember(self._digests, id(envelope), (envelope, digest))
        self._last_push = (fields, digest)
        return digest

    @staticmethod
    def _remember(cache: OrderedDict, key, value, size: int = 64) -> None:
        cache[key] = value
        if len(cache) > size:
            cache.popitem(last=False)


# -- the hook: gRPC handlers taking raw request bytes (aggregator.service.add_to_server) ------

def _outcome(reply) -> str:
    if isinstance(reply, pb.ContributeReply):
        return ("accepted" if reply.accepted else "duplicate" if reply.duplicate
                else "not accepted")
    if isinstance(reply, pb.RoundStatus):
        return "started"
    return "accepted"


def _code(context) -> str:
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - only a label
        code = None
    return getattr(code, "name", None) or (str(code) if code is not None else "error")


def _hello_site(data: bytes) -> str:
    """The site_id a Subscribe's hello names (checked by the round manager before any push)."""
    try:
        hello = _light_payload(pb.SignedEnvelope.FromString(data).payload) or {}
    except Exception:  # noqa: BLE001 - a label only
        return ""
    return limits.clip_text(str(hello.get("site_id", "")), limits.MAX_ID_CHARS)


async def _refuse_if_failed(trail: AuditTrail, context) -> None:
    if trail.failed is not None:
        await context.abort(grpc.StatusCode.UNAVAILABLE,
                            limits.clip_text(f"the aggregator's audit log cannot be written "
                                             f"({trail.failed}): it takes no round message "
                                             f"until it is restarted"))


def audited(trail: AuditTrail | None, what: str, handler, server_streaming: bool):
    """``handler`` (a gRPC method handler taking the raw request bytes) recording what it
    receives or pushes in ``trail``; ``handler`` itself for calls that are not recorded."""
    if trail is None:
        return handler
    if server_streaming:
        if what != PUSH_STREAM:
            return handler

        async def stream(data: bytes, context):
            await _refuse_if_failed(trail, context)
            site = _hello_site(data)
            async for reply in handler(data, context):
                trail.sent(reply, site)
                yield reply
        return stream
    if what not in RECEIVED_CALLS:
        return handler

    async def unary(data: bytes, context):
        await _refuse_if_failed(trail, context)
        try:
            reply = await handler(data, context)
        except asyncio.CancelledError:
            trail.received(what, data, "cancelled")
            raise
        except Exception:
            trail.received(what, data, f"rejected {_code(context)}")
            raise
        trail.received(what, data, _outcome(reply))
        return reply
    return unary
