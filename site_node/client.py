"""The site's only network code: it dials OUT to the aggregator and never listens.

A hospital opens no inbound port. The site keeps one server-streaming call open
(Aggregator.Subscribe, opened with a signed SiteHello) and the aggregator pushes down it what
each round's current phase needs from the site (docs/protocol.md): the signed round spec in
the consent phase, answered by ``SiteNode.consent`` with a signed consent (SendPhase) or a
refusal (Refuse), and a release notice in the release phase, answered by
``SiteNode.handle_notice`` with a release (Contribute) or a refusal.

Failure handling:
* a broken stream (aggregator restarting, network down: UNAVAILABLE, or any other error) is
  re-opened with exponential backoff and jitter, forever, until stopped;
* Contribute/Refuse get a deadline each and are retried in place, with exponential backoff
  and jitter, only on UNAVAILABLE (the server was not reached). DEADLINE_EXCEEDED and
  RESOURCE_EXHAUSTED (the aggregator shedding load) are not answers either: the release stays
  unacknowledged and the connection loop reconnects after its own backoff and resends it.
  Every other code is an answer (the request was judged) and is never retried;
* a release is marked acknowledged only when the aggregator says accepted or duplicate, and
  marked rejected (with the status and message) when it answers with an error status. On
  every (re)connect, stored-but-unacknowledged releases are resent first, as the *stored
  statistics bytes*, re-signed with a fresh timestamp and nonce when the stored envelope is
  older than a minute (``SiteNode.fresh_envelope``: never fresh noise), so a release delayed
  by an outage is not refused as stale. The aggregator answers a release it already holds
  (byte-identical, or re-signed over the same statistics) as a duplicate. A release the
  aggregator judged and refused (e.g. the round closed) is marked rejected (with the reason,
  visible in ``dpfed site ledger``) and not resent again; the budget stays debited: the noise
  was drawn and may have left the site.

The audit log (dpfed.audit, docs/audit.md) is written here, at the wire: every pushed
message as received, before the node sees it, and every answer as sent, right before the call
that sends it (a resend, or a re-signed release, is one more entry with its own digest), so
each entry's message digest is that of the bytes that crossed the wire, the digest the
aggregator records. A release is in the ledger before its entry is written; if the audit
log cannot be written the client stops (fail closed, AuditError ends ``run``): nothing more is
answered or sent, and a stored release is resent, with its entry, after a restart.

The client is the transport only: it asks the node it is given (``SiteNode``, or anything
with the methods of ``AnsweringNode``) for every answer and imports nothing of site_node above
the shared vocabulary (site_node.messages) and the ledger's errors. ``site_node.node`` builds
on it (``SiteNode.run``), never the other way.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Protocol

import grpc

from dpfed import faults
from dpfed.audit import RECEIVED, SENT, AuditError, AuditLog, describe
from dpfed.transport import client_channel
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
from dpfed.wire.canonical import digest, parse_canonical
from site_node.ledger import LedgerMismatch
from site_node.messages import CONTRIBUTION, PHASE_MESSAGE, PHASE_NOTICE, REFUSAL, ROUND_SPEC

if TYPE_CHECKING:
    from site_node.config import SiteConfig
    from site_node.ledger import PrivacyLedger, StoredRelease

log = logging.getLogger(__name__)

# Codes that mean "no answer": the release stays unacknowledged and is resent later.
# CANCELLED is never an aggregator's verdict: it is what a client sees when the server's
# HTTP/2 connection goes away under load (GOAWAY, benchmarks/bench_load.py).
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED})
# Of those, the one retried in place: the call did not reach the server. A call that timed out
# or was shed may still be running there; it is resent only after a reconnect backoff.
RETRY_IN_PLACE = frozenset({grpc.StatusCode.UNAVAILABLE})


class AnsweringNode(Protocol):
    """What the client needs of its site (site_node.node.SiteNode is one): the config it
    dials with, the ledger it marks releases in, and the node's signed answers."""

    config: SiteConfig
    ledger: PrivacyLedger
    audit: AuditLog | None

    def hello(self) -> pb.SignedEnvelope:
        """The signed SiteHello that opens the round stream and asks for the history."""

    def check_history(self, history: pb.SiteHistory) -> None:
        """Raises LedgerMismatch when the aggregator's record disagrees with the ledger."""

    def consent(self, envelope: pb.SignedEnvelope) -> pb.SignedEnvelope:
        """The answer to a pushed RoundSpec: a consent PhaseMessage or a Refusal."""

    def handle_notice(self, envelope: pb.SignedEnvelope) -> pb.SignedEnvelope | None:
        """The answer to a pushed PhaseNotice, or None (nothing to send)."""

    def refusal(self, round_id: str, spec_digest: str, reason: str) -> pb.SignedEnvelope:
        """A signed Refusal (the client's answer when the node raised)."""

    def fresh_envelope(self, release: StoredRelease) -> pb.SignedEnvelope:
        """A stored release's envelope, re-signed if old (same statistics bytes)."""


class Backoff:
    """Exponential backoff with jitter: attempt k waits uniform(0.5, 1) * min(cap, base * 2^k).
    The jitter keeps many sites from reconnecting in lock step after an aggregator restart."""

    def __init__(self, base_s: float = 0.5, cap_s: float = 60.0, rng: random.Random | None = None):
        self.base_s, self.cap_s = base_s, cap_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        delay = min(self.cap_s, self.base_s * (2 ** self.attempt))
        self.attempt = min(self.attempt + 1, 32)
        return delay * self._rng.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.attempt = 0


class SiteClient:
    """Keeps a site node connected to its aggregator; ``run`` blocks until ``stop()``."""

    def __init__(self, node: AnsweringNode, *, rpc_timeout_s: float = 30.0,
                 max_attempts: int = 6, reconnect: Backoff | None = None,
                 retry_base_s: float = 0.5, retry_cap_s: float = 30.0):
        self.node = node
        self.rpc_timeout_s = rpc_timeout_s
        self.max_attempts = max_attempts
        self.reconnect = reconnect or Backoff()
        self.retry_base_s, self.retry_cap_s = retry_base_s, retry_cap_s
        self._stop = threading.Event()
        self._call = None
        self._call_lock = threading.Lock()
        self.rounds_handled = 0
        # How the audit log names the peer (one aggregator).
        self.peer = f"aggregator@{node.config.server_name or node.config.aggregator}"

    # -- lifecycle -------------------------------------------------------------------------
    def stop(self) -> None:
        """End ``run``: the round stream is cancelled at once; a Contribute/Refuse already in
        flight gets its answer (or its deadline) and the acknowledgement is recorded, so the
        ledger is consistent on exit (tests/test_shutdown.py). No retry starts after this."""
        if not self._stop.is_set():
            log.info("site %s stopping: round stream closed, a call in flight is finished",
                     self.node.config.site_id)
        self._stop.set()
        with self._call_lock:
            if self._call is not None:
                self._call.cancel()

    def run(self, stop: threading.Event | None = None) -> None:
        if stop is not None:
            threading.Thread(target=lambda: (stop.wait(), self.stop()), daemon=True).start()
        config = self.node.config
        log.info("site %s dialling aggregator %s (no inbound port is opened)", config.site_id,
                 config.aggregator)
        while not self._stop.is_set():
            channel = client_channel(config.aggregator, config.tls, server_name=config.server_name)
            try:
                stub = pb_grpc.AggregatorStub(channel)
                self.check_history(stub)   # LedgerMismatch ends run(): nothing is served
                self.resend_pending(stub)
                self._subscribe(stub)
                if not self._stop.is_set():
                    log.warning("aggregator closed the round stream; reconnecting")
            except grpc.RpcError as exc:
                # A streaming call raises itself: its traceback's frames (grpc's and ours) hold
                # the call, a cycle that only the cyclic collector frees, possibly at
                # interpreter shutdown, where grpc's __del__ can wait forever for a lock held
                # by one of its stopped threads (a site that never exited;
                # tests/test_site_exit.py). Drop the traceback: the call is freed here.
                exc.__traceback__ = None
                if self._stop.is_set():
                    break
                code = exc.code() if hasattr(exc, "code") else None
                if code == grpc.StatusCode.ALREADY_EXISTS:
                    # One identity, one live stream (aggregator.rounds.RoundManager.subscribe):
                    # another process with this site's kit is connected. Keep trying, with
                    # backoff: the identity is free again when that stream ends.
                    log.error("the aggregator refused this site's round stream: %s. Another "
                              "site node with the identity %r is connected; only one may run. "
                              "Retrying with backoff", _details(exc), config.site_id)
                else:
                    level = logging.WARNING if code in RETRYABLE else logging.ERROR
                    log.log(level, "connection to aggregator lost (%s: %s); reconnecting",
                            code.name if code else "error", _details(exc))
            finally:
                channel.close()
            if self._stop.is_set():
                break
            delay = self.reconnect.next_delay()
            log.info("reconnecting in %.1f s", delay)
            self._stop.wait(delay)
        log.info("site %s stopped", config.site_id)

    # -- the aggregator's record of this site ---------------------------------------------
    def check_history(self, stub) -> None:
        """Before serving: the aggregator's record of this site's spending against the ledger
        (SiteNode.check_history). A mismatch raises LedgerMismatch, which ends ``run``: the
        site serves nothing until the operator restores the ledger or acknowledges the reset.
        An aggregator without the RPC (UNIMPLEMENTED, older dpfed) is logged and skipped."""
        try:
            history = stub.GetSiteHistory(self.node.hello(), timeout=self.rpc_timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.warning("the aggregator keeps no budget history (older dpfed): the ledger "
                            "is not cross-checked")
                return
            raise
        try:
            self.node.check_history(history)
        except LedgerMismatch:
            self._stop.set()
            raise

    # -- the round stream --------------------------------------------------------------------
    def _subscribe(self, stub) -> None:
        call = stub.Subscribe(self.node.hello())
        with self._call_lock:
            self._call = call
        if self._stop.is_set():
            call.cancel()
        opened = time.monotonic()
        try:
            for envelope in call:
                self.reconnect.reset()  # the stream works: start backoff from the bottom again
                self.handle(stub, envelope)
        finally:
            with self._call_lock:
                self._call = None
            # A stream that stayed up a while was a working connection, not a failed attempt.
            if time.monotonic() - opened > 30:
                self.reconnect.reset()

    def handle(self, stub, pushed: pb.SignedEnvelope) -> None:
        """Answer one pushed message (a spec asking for consent, or a release notice) and
        send the answer."""
        notice = pushed.payload_type == PHASE_NOTICE
        received = self.audit(RECEIVED, pushed,
                              phase="consent" if pushed.payload_type == ROUND_SPEC else "")
        try:
            if notice:
                answer = self.node.handle_notice(pushed)
            elif pushed.payload_type == ROUND_SPEC:
                answer = self.node.consent(pushed)
            else:
                log.warning("ignored a pushed %r message", pushed.payload_type[:64])
                return
        except Exception:  # noqa: BLE001 - a bug or a disk error must not kill the node
            log.exception("internal error while handling a round; refusing it")
            spec_envelope = _notice_spec(pushed) if notice else pushed
            answer = self.node.refusal(_spec_round_id(spec_envelope),
                                       digest(spec_envelope.payload),
                                       "internal error at the site (see site log)")
        if answer is None:
            return
        self.rounds_handled += 1
        phase = received.phase if received is not None else ""
        if answer.payload_type == CONTRIBUTION:
            faults.crash_point("after_debit")   # test hook (dpfed.faults)
            self.send_contribution(stub, answer)
        elif answer.payload_type == REFUSAL:
            self.send_refusal(stub, answer, phase=phase)
        elif answer.payload_type == PHASE_MESSAGE:
            self.send_phase(stub, answer)
        else:  # pragma: no cover - the node only returns these
            raise TypeError(f"unexpected answer type {answer.payload_type}")

    # -- the audit log -------------------------------------------------------------------------
    def audit(self, direction: str, envelope: pb.SignedEnvelope, *, message=None,
              phase: str = ""):
        """Append ``envelope`` to the node's audit log; return its Record (None without a
        log). AuditError: the client stops (fail closed) and the error ends ``run``."""
        audit = getattr(self.node, "audit", None)
        if audit is None:
            return None
        record = describe(direction, envelope, peer=self.peer, message=message, phase=phase)
        try:
            audit.append(record)
        except AuditError as exc:
            log.error("%s. The site stops answering (fail closed): nothing more is sent until "
                      "the audit log can be written again (disk space, permissions) and the "
                      "site is restarted; stored releases are resent then", exc)
            self._stop.set()
            raise
        return record

    # -- sending -------------------------------------------------------------------------------
    def resend_pending(self, stub) -> None:
        """Resend stored releases the aggregator has not acknowledged (the stored bytes)."""
        for release in self.node.ledger.unacknowledged():
            log.info("resending stored release for round %s (not yet acknowledged)", release.round_id)
            self.send_contribution(stub, self.node.fresh_envelope(release))

    def send_contribution(self, stub, envelope: pb.SignedEnvelope) -> bool:
        contribution = parse_canonical(envelope.payload, CONTRIBUTION)
        round_id = contribution.round_id
        self.audit(SENT, envelope, message=contribution)
        self.node.ledger.mark_sent(round_id)
        try:
            reply = self._with_retries(stub.Contribute, envelope, f"Contribute({round_id})")
        except grpc.RpcError as exc:
            if exc.code() in RETRYABLE:
                raise  # transport trouble: stays unacknowledged, resent after reconnecting
            # The aggregator answered "no" (round closed, stale timestamp, ...). Resending the
            # same bytes on every reconnect would get the same answer; if the aggregator pushes
            # the round again, handle_round returns these stored bytes and they are sent again.
            message = f"{exc.code().name}: {_details(exc)}"
            self.node.ledger.mark_rejected(round_id, message)
            log.warning("aggregator rejected the release for round %s: %s (the epsilon stays "
                        "debited)", round_id, message)
            return False
        faults.crash_point("after_send")    # test hook (dpfed.faults)
        if reply.accepted or reply.duplicate:
            self.node.ledger.mark_acknowledged(round_id)
            log.info("aggregator acknowledged round %s%s", round_id,
                     " (duplicate of one it already had)" if reply.duplicate else "")
            return True
        self.node.ledger.mark_rejected(round_id, reply.message)
        log.warning("aggregator rejected the release for round %s: %s (not resent; the "
                    "epsilon stays debited)", round_id, reply.message)
        return False

    def send_phase(self, stub, envelope: pb.SignedEnvelope) -> None:
        """Send a consent (PhaseMessage). Not stored: if the aggregator does not get it, it
        pushes the spec again after a reconnect while the consent phase lasts, and a round
        past its consent phase simply goes on without this site (nothing was spent)."""
        message = parse_canonical(envelope.payload, PHASE_MESSAGE)
        self.audit(SENT, envelope, message=message)
        try:
            self._with_retries(stub.SendPhase, envelope, f"SendPhase({message.round_id})")
        except grpc.RpcError as exc:
            if exc.code() in RETRYABLE:
                raise
            log.warning("aggregator did not take the %s for round %s: %s (nothing was spent)",
                        message.phase, message.round_id, _details(exc))
            return
        log.info("sent %s for round %s", message.phase, message.round_id)
        faults.crash_point(f"after_{message.phase}")   # after_consent, after_advertise, ... (dpfed.faults)

    def send_refusal(self, stub, envelope: pb.SignedEnvelope, *, phase: str = "") -> None:
        refusal = parse_canonical(envelope.payload, REFUSAL)
        self.audit(SENT, envelope, message=refusal, phase=phase)
        try:
            self._with_retries(stub.Refuse, envelope, f"Refuse({refusal.round_id})")
        except grpc.RpcError as exc:
            if exc.code() in RETRYABLE:
                raise
            # A refusal the aggregator will not take (e.g. a round it does not know, because
            # the spec was forged) is not worth a reconnect.
            log.warning("aggregator did not take the refusal for round %s: %s",
                        refusal.round_id or "?", _details(exc))

    def _with_retries(self, method, request, what: str):
        backoff = Backoff(self.retry_base_s, self.retry_cap_s)
        for attempt in range(1, self.max_attempts + 1):
            try:
                return method(request, timeout=self.rpc_timeout_s)
            except grpc.RpcError as exc:
                if (exc.code() not in RETRY_IN_PLACE or attempt == self.max_attempts
                        or self._stop.is_set()):
                    raise
                delay = backoff.next_delay()
                log.warning("%s failed (%s), attempt %d/%d; retrying in %.1f s", what,
                            exc.code().name, attempt, self.max_attempts, delay)
                if self._stop.wait(delay):
                    raise  # stopping: no new attempt; the release stays unacknowledged
        raise AssertionError("unreachable")


def _notice_spec(envelope: pb.SignedEnvelope) -> pb.SignedEnvelope:
    """The spec envelope a release notice carries (an empty envelope if it has none)."""
    try:
        return pb.SignedEnvelope.FromString(
            parse_canonical(envelope.payload, PHASE_NOTICE).spec_envelope)
    except Exception:  # noqa: BLE001 - only a label for the refusal
        return pb.SignedEnvelope()


def _spec_round_id(envelope: pb.SignedEnvelope) -> str:
    try:
        return parse_canonical(envelope.payload, "dpfed.v1.RoundSpec").round_id
    except Exception:  # noqa: BLE001 - only a label for the refusal
        return ""


def _details(exc: grpc.RpcError) -> str:
    try:
        return exc.details() or ""
    except Exception:  # noqa: BLE001 - some RpcErrors carry no details
        return str(exc)
