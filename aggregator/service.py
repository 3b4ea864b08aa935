"""The gRPC servicer: a thin adapter from dpfed.v1.Aggregator calls to RoundManager methods.

Every refusal becomes a gRPC status with a clear message and a log line; no logic lives here.

It runs on grpc.aio's asyncio server (aggregator.server): an open Subscribe stream is a
coroutine waiting on a queue, not a thread, so thousands of connected sites cost memory, not
threads. The RoundManager stays plain synchronous code. Contribute, the hot path of a round,
is checked on the event loop and committed by the store's writer thread (``Contribute``
below); every other call's manager method (which may wait on a disk commit or the manager's
lock) runs on a thread pool so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from concurrent.futures import Executor

import grpc
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
from dpfed.wire.limits import clip_text

from aggregator import identity
from aggregator.audit import audited
from aggregator.rounds import Rejected, RoundManager

log = logging.getLogger(__name__)


def _peer(context) -> str:
    try:
        return context.peer()
    except Exception:  # noqa: BLE001 - only for log lines
        return "?"


class LoopQueue:
    """What RoundManager.subscribe needs of a subscriber's queue (``put``), for a coroutine
    on ``loop``: ``put`` may be called from any thread and wakes the waiting ``get``."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()

    def put(self, item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:   # the loop is closed: the server is gone, nobody is waiting
            pass

    async def get(self):
        return await self._queue.get()


class AggregatorServicer(pb_grpc.AggregatorServicer):
    def __init__(self, manager: RoundManager, executor: Executor, *,
                 max_streams: int | None = None, require_identity: bool = False):
        self.manager = manager
        self.executor = executor
        # Mutual TLS: every signed request is bound to the certificate's identity.
        self.require_identity = require_identity
        # Past this many open Subscribe streams new ones get RESOURCE_EXHAUSTED (the site
        # reconnects with backoff): a stream is cheap, but gRPC counts it against
        # maximum_concurrent_rpcs, so uncapped streams could starve Contribute of slots.
        self.max_streams = max_streams
        self._open_streams = 0

    async def _call(self, what: str, context, fn, *args):
        """``fn(*args)`` on the executor; a Rejected becomes the call's gRPC status."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        except Rejected as exc:
            await self._reject(what, context, exc)

    async def _durable(self, what: str, context, reply, thing: str):
        """The reply of a message the store's writer commits (``reply``, a concurrent
        Future): a Rejected it holds becomes the call's status, a store failure UNAVAILABLE.
        shield: a client that gives up must not cancel the commit's future; the message is
        stored and counted either way, and a resend is answered as a duplicate."""
        try:
            return await asyncio.shield(asyncio.wrap_future(reply))
        except Rejected as exc:
            return await self._reject(what, context, exc)
        except Exception as exc:  # noqa: BLE001 - the store failed: say so, keep serving
            log.error("%s from %s: %s not stored: %s: %s", what, _peer(context), thing,
                      type(exc).__name__, exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                clip_text(f"the aggregator could not store the {thing} "
                                          f"({type(exc).__name__}: {exc}); retry"))

    async def _reject(self, what: str, context, exc: Rejected) -> None:
        # Messages may quote the request; gRPC drops a status whose message exceeds its
        # metadata limit (8 kB soft), so the caller would get a bare transport error.
        message = clip_text(exc.message)
        log.warning("%s from %s rejected: %s: %s", what, _peer(context), exc.code, message)
        await context.abort(getattr(grpc.StatusCode, exc.code), message)

    async def _identity(self, what: str, context) -> identity.PeerIdentity | None:
        try:
            peer = identity.peer_identity(context, getattr(self, "revocation", None))
        except identity.NoPeerIdentity as exc:
            peer, problem = None, str(exc)
        else:
            problem = "no client certificate" if peer is None and self.require_identity else ""
        if problem:
            log.warning("%s from %s rejected: UNAUTHENTICATED: %s", what, _peer(context), problem)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, problem)
        return peer

    async def StartRound(self, request, context):
        peer = await self._identity("StartRound", context)
        return await self._call("StartRound", context, self.manager.start_round, request, peer)

    async def _reader(self, what: str, context) -> identity.PeerIdentity | None:
        """Aborts with PERMISSION_DENIED unless the peer may call read-only ``what``; returns
        the peer, whose view is then limited to the sites that trust it (aggregator.budget)."""
        peer = await self._identity(what, context)
        problem = identity.read_denied(peer, what)
        if problem:
            log.warning("%s from %s rejected: PERMISSION_DENIED: %s", what, _peer(context), problem)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, problem)
        return peer

    async def GetRound(self, request, context):
        peer = await self._reader("GetRound", context)
        return await self._call("GetRound", context, self.manager.status, request.round_id, peer)

    async def GetResult(self, request, context):
        peer = await self._reader("GetResult", context)
        return await self._call("GetResult", context, self.manager.result, request.round_id, peer)

    async def ListSites(self, request, context):
        peer = await self._reader("ListSites", context)
        return await self._call("ListSites", context, self.manager.list_sites, peer)

    async def ListRounds(self, request, context):
        await self._reader("ListRounds", context)
        return await self._call("ListRounds", context, self.manager.list_rounds, request.limit,
                                request.before)

    async def GetSiteSpending(self, request, context):
        peer = await self._reader("GetSiteSpending", context)
        return await self._call("GetSiteSpending", context, self.manager.site_spending,
                                request.site_id, peer)

    async def GetSiteHistory(self, request, context):
        peer = await self._identity("GetSiteHistory", context)
        return await self._call("GetSiteHistory", context, self.manager.site_history, request,
                                peer)

    async def Contribute(self, request, context):
        # The hot path of a round, kept on the event loop: the checks (the signature check
        # releases the GIL) run here, the disk commit on the store's writer thread, which
        # also counts the contribution once durable; a thread hop per call would cost more
        # than the checks (docs/benchmarks.md, "Round latency").
        peer = await self._identity("Contribute", context)
        try:
            reply = self.manager.contribute_later(request, peer)
        except Rejected as exc:
            return await self._reject("Contribute", context, exc)
        return await self._durable("Contribute", context, reply, "contribution")

    async def SendPhase(self, request, context):
        # A consent is checked on the event loop and committed by the store's writer thread,
        # as Contribute is (RoundManager.consent_later); a secure step's message, which may
        # block, goes to the executor.
        peer = await self._identity("SendPhase", context)
        try:
            message, live = self.manager.phase_message(request, peer)
            reply = (self.manager.consent_later(message, request, live)
                     if message.phase == "consent" else None)
        except Rejected as exc:
            return await self._reject("SendPhase", context, exc)
        if reply is None:
            return await self._call("SendPhase", context, self.manager.secure_phase, message,
                                    request, live)
        return await self._durable("SendPhase", context, reply, "consent")

    async def Refuse(self, request, context):
        peer = await self._identity("Refuse", context)
        return await self._call("Refuse", context, self.manager.refuse, request, peer)

    async def Subscribe(self, request, context):
        if self.max_streams is not None and self._open_streams >= self.max_streams:
            log.warning("Subscribe from %s shed: %d streams already open", _peer(context),
                        self.max_streams)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"the aggregator has {self.max_streams} round streams open, its "
                                f"limit; retry later")
        self._open_streams += 1   # only the event loop's thread touches it
        try:
            async for envelope in self._subscribe(request, context):
                yield envelope
        finally:
            self._open_streams -= 1

    async def _subscribe(self, request, context):
        peer = await self._identity("Subscribe", context)
        site_id = await self._call("Subscribe", context, self.manager.hello, request, peer)
        updates = LoopQueue(asyncio.get_running_loop())
        try:
            token, _ = self.manager.subscribe(site_id, updates)
        except Rejected as exc:   # this identity already has a live stream
            await self._reject("Subscribe", context, exc)
            return
        try:
            sent: set[tuple[str, bytes]] = set()
            # Subscribed before listing, so a round started in between is not missed; `sent`
            # drops a second push of the same message (the spec for consent, the notice of a
            # phase or secure step: one notice per step, so keyed by its digest). A client
            # that goes away cancels this coroutine where it waits, and the finally below
            # unsubscribes.
            backlog = self.manager.pending_rounds(site_id)
            while True:
                round_id = backlog.pop(0) if backlog else await updates.get()
                if round_id is None:  # server shutting down
                    return
                envelope = self.manager.message_for_site(round_id, site_id)
                key = None if envelope is None else (
                    round_id, hashlib.sha256(envelope.payload).digest())
                if key is not None and key not in sent:
                    sent.add(key)
                    log.info("round %s: %s sent to site %s", round_id,
                             "notice" if envelope.payload_type.endswith("PhaseNotice")
                             else "spec", site_id)
                    yield envelope
        finally:
            self.manager.unsubscribe(token)


SERVICE = pb.DESCRIPTOR.services_by_name["Aggregator"]


def _parsing(what: str, method, request_class, server_streaming: bool):
    """``method`` taking the raw request bytes: bytes that are not a ``request_class`` get
    INVALID_ARGUMENT with a message saying so (grpc.aio would answer UNKNOWN and log a
    traceback if its own deserializer failed)."""
    async def parse(data: bytes, context):
        try:
            return request_class.FromString(data)
        except DecodeError:
            message = f"the request is not a valid {request_class.DESCRIPTOR.full_name} message"
            log.warning("%s from %s rejected: INVALID_ARGUMENT: %s", what, _peer(context), message)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)

    if server_streaming:
        async def stream(data: bytes, context):
            async for reply in method(await parse(data, context), context):
                yield reply
        return stream

    async def unary(data: bytes, context):
        return await method(await parse(data, context), context)
    return unary


def add_to_server(servicer: AggregatorServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer`` for every RPC of dpfed.v1.Aggregator, requests parsed by
    ``_parsing`` (the generated ``add_AggregatorServicer_to_server`` would let gRPC parse)."""
    handlers = {}
    for m in SERVICE.methods:
        request_class = GetMessageClass(m.input_type)
        fn = _parsing(m.name, getattr(servicer, m.name), request_class, m.server_streaming)
        serialize = GetMessageClass(m.output_type).SerializeToString
        # The audit log (aggregator.audit): round messages received and pushed, by digest
        # (a recorded push is serialised by the hook, which yields the bytes it hashed).
        fn, serialize = audited(getattr(servicer, "audit", None), m.name, fn,
                                m.server_streaming, serialize)
        make = (grpc.unary_stream_rpc_method_handler if m.server_streaming
                else grpc.unary_unary_rpc_method_handler)
        handlers[m.name] = make(fn, request_deserializer=None, response_serializer=serialize)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE.full_name,
                                                                          handlers)])
