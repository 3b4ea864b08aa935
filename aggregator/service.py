"""The gRPC servicer: a thin adapter from dpfed.v1.Aggregator calls to RoundManager methods.

Every refusal becomes a gRPC status with a clear message and a log line; no logic lives here.
"""

from __future__ import annotations

import logging
import queue
import threading

import grpc

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
from dpfed.wire.limits import clip_text

from aggregator import identity
from aggregator.rounds import Rejected, RoundManager

log = logging.getLogger(__name__)

# How often an idle Subscribe stream looks at whether the client or the server went away.
_STREAM_POLL_S = 1.0


def _peer(context) -> str:
    try:
        return context.peer()
    except Exception:  # noqa: BLE001 - only for log lines
        return "?"


class AggregatorServicer(pb_grpc.AggregatorServicer):
    def __init__(self, manager: RoundManager, *, max_streams: int | None = None,
                 require_identity: bool = False):
        self.manager = manager
        # Mutual TLS: every signed request is bound to the certificate's identity.
        self.require_identity = require_identity
        # Each open Subscribe stream holds a server thread for its lifetime; past this many,
        # new streams get RESOURCE_EXHAUSTED (the site reconnects with backoff) so the
        # remaining threads stay free for unary calls and health checks.
        self._streams = threading.BoundedSemaphore(max_streams) if max_streams else None
        self.max_streams = max_streams

    def _call(self, what: str, context, fn, *args):
        try:
            return fn(*args)
        except Rejected as exc:
            # Messages may quote the request; gRPC drops a status whose message exceeds its
            # metadata limit (8 kB soft), so the caller would get a bare transport error.
            message = clip_text(exc.message)
            log.warning("%s from %s rejected: %s: %s", what, _peer(context), exc.code, message)
            context.abort(getattr(grpc.StatusCode, exc.code), message)

    def _identity(self, what: str, context) -> identity.PeerIdentity | None:
        try:
            peer = identity.peer_identity(context)
        except identity.NoPeerIdentity as exc:
            peer, problem = None, str(exc)
        else:
            problem = "no client certificate" if peer is None and self.require_identity else ""
        if problem:
            log.warning("%s from %s rejected: UNAUTHENTICATED: %s", what, _peer(context), problem)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, problem)
        return peer

    def StartRound(self, request, context):
        return self._call("StartRound", context, self.manager.start_round, request,
                          self._identity("StartRound", context))

    def _reader(self, what: str, context) -> None:
        """Aborts with PERMISSION_DENIED unless the peer may call read-only ``what``."""
        problem = identity.read_denied(self._identity(what, context), what)
        if problem:
            log.warning("%s from %s rejected: PERMISSION_DENIED: %s", what, _peer(context), problem)
            context.abort(grpc.StatusCode.PERMISSION_DENIED, problem)

    def GetRound(self, request, context):
        self._reader("GetRound", context)
        return self._call("GetRound", context, self.manager.status, request.round_id)

    def GetResult(self, request, context):
        self._reader("GetResult", context)
        return self._call("GetResult", context, self.manager.result, request.round_id)

    def ListSites(self, request, context):
        self._reader("ListSites", context)
        return self.manager.list_sites()

    def Contribute(self, request, context):
        return self._call("Contribute", context, self.manager.contribute, request,
                          self._identity("Contribute", context))

    def Refuse(self, request, context):
        return self._call("Refuse", context, self.manager.refuse, request,
                          self._identity("Refuse", context))

    def Subscribe(self, request, context):
        if self._streams is not None and not self._streams.acquire(blocking=False):
            log.warning("Subscribe from %s shed: %d streams already open", _peer(context),
                        self.max_streams)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"the aggregator has {self.max_streams} round streams open, its "
                          f"limit; retry later")
        try:
            yield from self._subscribe(request, context)
        finally:
            if self._streams is not None:
                self._streams.release()

    def _subscribe(self, request, context):
        site_id = self._call("Subscribe", context, self.manager.hello, request,
                             self._identity("Subscribe", context))
        token, updates = self.manager.subscribe(site_id)
        try:
            sent: set[str] = set()
            # Subscribed before listing, so a round started in between is not missed; `sent`
            # drops the second notice of it.
            backlog = self.manager.pending_rounds(site_id)
            while context.is_active():
                if backlog:
                    round_id = backlog.pop(0)
                else:
                    try:
                        round_id = updates.get(timeout=_STREAM_POLL_S)
                    except queue.Empty:
                        continue
                    if round_id is None:  # server shutting down
                        return
                if round_id in sent:
                    continue
                envelope = self.manager.spec_for_site(round_id, site_id)
                if envelope is not None:
                    sent.add(round_id)
                    log.info("round %s: spec sent to site %s", round_id, site_id)
                    yield envelope
        finally:
            self.manager.unsubscribe(token)
