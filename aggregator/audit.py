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

How it stays cheap at 1000 sites (docs/benchmarks.md, "Audit log"): a gRPC handler only
appends (what, the request's raw bytes, the outcome) to a list; a push is serialised by the
hook itself (gRPC then sends those bytes as they are: no second serialisation), and its bytes
appended. Every ``interval_s`` a sender thread hashes those bytes (the exact bytes received or
sent) and passes them to a writer *process*, which turns them into entries (the fields from
the payload's JSON, a contribution's statistics cut out before parsing) and appends them in
one SQLite transaction with one signed head (dpfed.audit.AuditLog.append_many). A spec or
notice pushed to every site is serialised and hashed once here and described once there. In a
thread of the aggregator's own process the same work held the GIL the event loop needs and
cost about 5 % of a 1000-site round; in its own process it costs the loop a list append per
message.

Fail closed: when the log cannot be written, or the writer process dies, every audited call
is refused UNAVAILABLE until the aggregator is restarted with a writable log; an aggregator
whose log cannot be opened does not start. The entries
of the last ``interval_s`` are not yet durable when a reply leaves: a crash can lose them (a
crash can also lose a reply); the sites' logs still hold those messages, and a cross-check
names them (docs/audit.md, "What is and is not detected").
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from multiprocessing.connection import Connection
from pathlib import Path

from dpfed.audit import RECEIVED, SENT, AuditError, AuditLog, Record, describe
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire import limits

log = logging.getLogger(__name__)

PARTY = "aggregator"
#: The unary calls recorded as received (with their outcome).
RECEIVED_CALLS = frozenset({"StartRound", "SendPhase", "Contribute", "Refuse"})
#: The stream whose pushes are recorded as sent.
PUSH_STREAM = "Subscribe"

# The big base64 fields (a contribution's statistics or masked input, a secure step's body:
# up to 45 kB at 1000 sites): the log never keeps them, so the writer cuts them out before
# it parses a payload's JSON. In canonical JSON a raw '"key":"' is a key:
# inside a string every quote is escaped.
_BULK_KEYS = (b'"statistics":"', b'"masked":"', b'"body":"')
# raw_decode: a third of json.loads's time on a 300-byte consent (no encoding sniffing).
_DECODER = json.JSONDecoder()


def _cut_bulk(payload: bytes) -> bytes:
    """A payload without its bulk fields (their values emptied): the log never keeps them,
    and they are most of a 23 kB contribution at d = 64."""
    for key in _BULK_KEYS:
        cut = payload.find(key)
        if cut >= 0:
            end = payload.find(b'"', cut + len(key))
            if end > 0:
                payload = payload[:cut + len(key)] + payload[end:]
    return payload


def _light_payload(payload: bytes) -> dict | None:
    """A payload's JSON without its bulk fields, or None if it is not a JSON object."""
    try:
        obj = _DECODER.raw_decode(_cut_bulk(payload).decode("utf-8"))[0]
    except ValueError:    # UnicodeDecodeError and JSONDecodeError too
        return None
    return obj if isinstance(obj, dict) else None


class AuditTrail:
    """The aggregator's audit log at ``path``, written by a process of its own.

    Describing, hashing, chaining and storing the 4000 entries of a 1000-site round takes
    0.15-0.2 CPU-s; in a thread of the aggregator's process that work held the GIL the event
    loop needs and cost 5-13 % of the round (docs/benchmarks.md, "Audit log"). So the
    handlers append (what, raw bytes, outcome) to a list (nothing else on the event loop; a
    push's bytes are the ones gRPC sends, ``push``); a sender thread here, every
    ``interval_s``, hashes those bytes (hashlib releases the GIL) and sends the batch, bytes
    and digests, in one write to the writer process, which parses and describes them (a
    contribution's statistics and a secure step's body cut out first) and appends them in one
    transaction with one signed head. Nothing is parsed, cut or serialised again here: for
    secure rounds, whose every step pushes each site a notice of its own, that was most of
    this process's share of the cost.

    The writer is ``python -m aggregator.audit`` (a fresh interpreter, this one's sys.path;
    about 0.3 s to import, overlapped with the rest of the aggregator's start), talking over
    two inherited pipes: not multiprocessing, whose children re-import the parent's
    ``__main__`` (``python -m dpfed_apps`` would start a second command line there), and no
    forked copy of a process that runs gRPC's threads. It ignores SIGINT and SIGTERM (a Ctrl-C or a
    service stop reaches the whole process group): it ends when the aggregator says so, after
    committing what it was sent, or when the pipe closes because the aggregator is gone.

    ``signing_key``: the path of the aggregator's Ed25519 key (the writer loads it).
    ``ready`` waits for the writer and raises AuditError when the log cannot be opened
    (the constructor does not wait). If the writer later fails (or dies), ``failed`` says why
    and every audited call is refused (``audited``)."""

    #: How long a batch gathers (docs/benchmarks.md, "Audit log").
    INTERVAL_S = 0.1
    #: Pushed envelopes remembered (their digests here, their descriptions in the writer).
    PUSH_CACHE = 256

    def __init__(self, path: str | Path, *, signing_key: str | Path,
                 interval_s: float | None = None, start_timeout_s: float = 60.0):
        self.path = Path(path)
        self.interval_s = self.INTERVAL_S if interval_s is None else interval_s
        # Why the log cannot be written (then every audited call is refused), or None.
        self.failed: str | None = None
        # The writer's CPU time since it was ready and its batches, reported when it stops
        # (docs/benchmarks.md).
        self.cpu_s: float | None = None
        self.batches: int | None = None
        # ... and this process's sender thread's (hashing, cutting, pickling is not counted).
        self.sender_cpu_s = 0.0
        self._pending: list = []
        self._pushed: OrderedDict = OrderedDict()      # digests whose bytes the writer has
        self._last_push = None          # (bytes, digest) of the last push hashed (sender)
        self._last_object = None        # (envelope, bytes) last serialised by ``push``
        self._flushes: dict[int, threading.Event] = {}
        self._tokens = itertools.count()
        self._wake = threading.Event()
        self._stopping = False
        batches_r, batches_w = os.pipe()
        status_r, status_w = os.pipe()
        env = dict(os.environ)
        # The same modules as this process, wherever it was started from.
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in sys.path if p)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "aggregator.audit", str(self.path), str(signing_key),
                 str(batches_r), str(status_w), str(self.PUSH_CACHE)],
                pass_fds=(batches_r, status_w), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, env=env)
        except OSError as exc:
            for fd in (batches_r, batches_w, status_r, status_w):
                os.close(fd)
            raise AuditError(f"cannot start the audit log writer: {exc}") from None
        os.close(batches_r)
        os.close(status_w)
        self._send = Connection(batches_w, readable=False)
        self._status = Connection(status_r, writable=False)
        self._start_timeout_s = start_timeout_s
        self._monitor = self._sender = None

    def ready(self) -> None:
        """Wait until the writer has opened the log; AuditError if it cannot (fail closed:
        the aggregator does not start). Then the sender and the status threads run."""
        try:
            ready = self._status.poll(self._start_timeout_s) and self._status.recv()
        except (EOFError, OSError):
            ready = None
        if not ready or ready[0] != "ready":
            self._send.close()
            self._status.close()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            raise AuditError(ready[1] if ready and ready[0] == "failed" else
                             f"the audit log writer for {self.path} did not start (exit code "
                             f"{self.process.returncode})")
        self._monitor = threading.Thread(target=self._watch, name="aggregator-audit-status",
                                         daemon=True)
        self._monitor.start()
        self._sender = threading.Thread(target=self._run, name="aggregator-audit-send",
                                        daemon=True)
        self._sender.start()

    # -- called by the gRPC handlers (the event loop): a list append, nothing else ------------
    def received(self, what: str, data: bytes, outcome: str) -> None:
        self._pending.append(("r", what, data, outcome))

    def push(self, envelope: pb.SignedEnvelope, peer: str) -> bytes:
        """``envelope``'s wire bytes, recorded as pushed to ``peer``: the stream hook yields
        these bytes and gRPC sends them as they are (no response serializer), so the digest
        is that of the exact bytes sent. The spec is one object pushed to every site: it is
        serialised once (the object is held, so ``is`` cannot match a new one)."""
        last = self._last_object
        if last is not None and last[0] is envelope:
            data = last[1]
        else:
            data = envelope.SerializeToString()
            self._last_object = (envelope, data)
        self._pending.append(("s", peer, data))
        return data

    def sent(self, message: bytes | pb.SignedEnvelope, peer: str) -> None:
        """Record ``message`` (its wire bytes, or an envelope: serialised by the sender
        thread) as pushed to ``peer``."""
        self._pending.append(("s", peer, message))

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything queued before this call is committed (or dropped after a
        failure); False on timeout or when the writer is gone."""
        token = next(self._tokens)
        done = self._flushes[token] = threading.Event()
        if self.failed is None:
            self._pending.append(("f", token))
            self._wake.set()
        else:
            done.set()
        return done.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Commit what is queued and stop the writer."""
        self._stopping = True
        if self._sender is None:        # never ready: nothing was sent
            self._send.close()
        else:
            self._wake.set()
            self._sender.join(timeout)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self._monitor is not None:
            self._monitor.join(timeout)
        self._status.close()

    # -- the sender thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            stopping = self._stopping
            items, self._pending = self._pending, []
            started = time.thread_time()
            batch = [self._prepare(item) for item in items]
            self.sender_cpu_s += time.thread_time() - started
            try:
                if batch:
                    self._send.send(batch)
                if stopping:
                    self._send.send(None)
            except (OSError, ValueError):    # the writer is gone: _watch says so
                for item in items:
                    if item[0] == "f":
                        self._flushes.pop(item[1], threading.Event()).set()
            if stopping:
                self._send.close()
                return

    def _prepare(self, item) -> tuple:
        """What the writer needs of one message: a request's digest and its bytes as
        received; a push's digest, and its bytes the first time. Hashing is all this
        process does (hashlib releases the GIL above 2 kB); parsing the envelope and cutting
        out a contribution's statistics happen in the writer (the pipe carries the bytes:
        one copy under the GIL, the pickling; the write itself releases it)."""
        kind = item[0]
        if kind == "r":
            _, what, data, outcome = item
            return ("r", hashlib.sha256(data).hexdigest(), data, outcome)
        if kind == "s":
            digest, data = self._push_digest(item[2])
            return ("s", item[1], digest, data)
        return item          # ("f", token)

    def _push_digest(self, data: bytes | pb.SignedEnvelope) -> tuple[str, bytes | None]:
        """The message digest of a push's wire bytes, and the bytes if the writer has not had
        them. A notice is a new object per site, often with the same bytes (a release notice,
        a secure round's keys notice: 45 kB at 1000 sites), so the bytes are compared with
        the last push's (a memcmp, or ``is`` for the spec) before they are hashed again."""
        if not isinstance(data, bytes):         # ``sent`` with an envelope
            data = data.SerializeToString()
        last = self._last_push
        if last is not None and last[0] == data:
            digest = last[1]
        else:
            digest = hashlib.sha256(data).hexdigest()
            self._last_push = (data, digest)
        if digest in self._pushed:
            return digest, None
        # The writer remembers as many as this side, in the same (pipe) order.
        _remember(self._pushed, digest, True, self.PUSH_CACHE)
        return digest, data

    def _watch(self) -> None:
        """The writer's reports: a failure, a flush done, its figures; EOF: it is gone."""
        while True:
            try:
                message = self._status.recv()
            except (EOFError, OSError):
                if self.failed is None and self.cpu_s is None:
                    try:
                        self.process.wait(5)
                    except subprocess.TimeoutExpired:
                        pass
                    self._fail(f"the audit log writer for {self.path} stopped (exit code "
                               f"{self.process.returncode})")
                break
            kind = message[0]
            if kind == "failed":
                self._fail(message[1])
            elif kind == "flushed":
                self._flushes.pop(message[1], threading.Event()).set()
            elif kind == "stats":
                self.cpu_s, self.batches = message[1], message[2]
        for token in list(self._flushes):
            self._flushes.pop(token, threading.Event()).set()

    def _fail(self, why: str) -> None:
        self.failed = why
        log.error("%s. The aggregator refuses every round message from now on (fail closed) "
                  "until it is restarted with a writable audit log", why)


def _remember(cache: OrderedDict, key, value, size: int) -> None:
    cache[key] = value
    if len(cache) > size:
        cache.popitem(last=False)


# -- the writer process ------------------------------------------------------------------------

def _writer_main(path: str, key_path: str, batches: Connection, status: Connection,
                 push_cache: int) -> None:
    """The writer process: open the log (report "ready" or "failed"), then append each batch
    the aggregator sends in one transaction with one signed head, until None or the end of
    the pipe (the aggregator is gone). Reports failures, flushes and, at the end, its CPU."""
    from dpfed.wire.signing import SigningKey

    try:
        writer = AuditLog(path, party=PARTY, signing_key=SigningKey.load(key_path))
    except (AuditError, OSError, ValueError) as exc:
        status.send(("failed", f"cannot open the audit log {path}: {exc}"))
        return
    status.send(("ready", None))
    started = time.process_time()       # the work, without the interpreter's start
    described: OrderedDict = OrderedDict()     # digest -> Record of a pushed envelope
    failed, count = False, 0
    while True:
        try:
            batch = batches.recv()
        except (EOFError, OSError):
            break
        if batch is None:
            break
        records, flushed = [], []
        for item in batch:
            if item[0] == "f":
                flushed.append(item[1])
            elif item[0] == "r":
                records.append(_received_record(*item[1:]))
            else:
                records.append(_pushed_record(described, push_cache, *item[1:]))
        if records and not failed:
            try:
                writer.append_many(records)
                count += 1
            except (AuditError, ValueError) as exc:
                failed = True
                status.send(("failed", str(exc)))
        for token in flushed:
            status.send(("flushed", token))
    writer.close()
    try:
        status.send(("stats", round(time.process_time() - started, 4), count))
        status.close()
    except OSError:     # the aggregator is gone
        pass


def _light(data: bytes) -> pb.SignedEnvelope:
    """The envelope of ``data`` without its signature and its payload's bulk fields (the
    entries never keep them); DecodeError if ``data`` is not an envelope."""
    envelope = pb.SignedEnvelope.FromString(data)
    return pb.SignedEnvelope(payload_type=envelope.payload_type, key_id=envelope.key_id,
                             payload=_cut_bulk(envelope.payload))


def _received_record(digest: str, data: bytes, outcome: str) -> Record:
    try:
        envelope = _light(data)
    except Exception:  # noqa: BLE001 - not an envelope: recorded as such
        return Record(RECEIVED, "malformed", outcome=outcome, message_digest=digest)
    message = _light_payload(envelope.payload)
    if message is None:
        return Record(RECEIVED, "malformed", outcome=outcome, message_digest=digest,
                      signer=limits.clip_text(envelope.key_id, limits.MAX_KEY_ID_CHARS))
    return describe(RECEIVED, envelope, peer=None, message=message, outcome=outcome,
                    wire_digest=digest, release_digest=False)


def _pushed_record(described: OrderedDict, size: int, peer: str, digest: str,
                   data: bytes | None) -> Record:
    record = described.get(digest)
    if record is None:
        if data is None:    # not reached: both sides remember the same digests
            return Record(SENT, "pushed", peer=peer, message_digest=digest, outcome="pushed")
        envelope = _light(data)
        phase = "consent" if envelope.payload_type == "dpfed.v1.RoundSpec" else ""
        record = describe(SENT, envelope, peer="", wire_digest=digest, phase=phase,
                          outcome="pushed")
        _remember(described, digest, record, size)
    return record._replace(peer=peer)


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
        import grpc     # not at the top: the writer process (this module's __main__) needs none
        await context.abort(grpc.StatusCode.UNAVAILABLE,
                            limits.clip_text(f"the aggregator's audit log cannot be written "
                                             f"({trail.failed}): it takes no round message "
                                             f"until it is restarted"))


def audited(trail: AuditTrail | None, what: str, handler, server_streaming: bool,
            serialize):
    """(handler, response serializer): ``handler`` (a gRPC method handler taking the raw
    request bytes) recording what it receives or pushes in ``trail``, and the serializer for
    its replies (``serialize``; None for the push stream, which yields the bytes it recorded);
    ``handler`` and ``serialize`` themselves for calls that are not recorded."""
    if trail is None:
        return handler, serialize
    if server_streaming:
        if what != PUSH_STREAM:
            return handler, serialize

        async def stream(data: bytes, context):
            await _refuse_if_failed(trail, context)
            site = _hello_site(data)
            async for reply in handler(data, context):
                yield trail.push(reply, site)     # the bytes gRPC sends, as hashed
        return stream, None
    if what not in RECEIVED_CALLS:
        return handler, serialize

    async def unary(data: bytes, context):
        await _refuse_if_failed(trail, context)
        try:
            reply = await handler(data, context)
        except Exception:
            trail.received(what, data, f"rejected {_code(context)}")
            raise
        except BaseException:        # asyncio.CancelledError: the client went away
            trail.received(what, data, "cancelled")
            raise
        trail.received(what, data, _outcome(reply))
        return reply
    return unary, serialize


def _main(argv: list[str]) -> int:
    """``python -m aggregator.audit PATH KEY BATCHES_FD STATUS_FD PUSH_CACHE``: the writer
    process AuditTrail starts (not a command for people)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    path, key_path, batches_fd, status_fd, push_cache = argv
    _writer_main(path, key_path, Connection(int(batches_fd), writable=False),
                 Connection(int(status_fd), readable=False), int(push_cache))
    # The log is closed and the last report sent: skip the interpreter's teardown (numpy's
    # and sqlite3's), which is most of a stop's time.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
