"""The sites' open round streams (Subscribe) and how a round wakes them.

One identity, one live stream: while a site has a stream, another is refused with
ALREADY_EXISTS. Two processes started from one kit would otherwise both be pushed every
round, each draw fresh noise and debit its own ledger (issue 11, finding 1). A stream's queue
gets the id of a round whenever that round needs something from the site (the servicer then
asks the round manager what to push), and None when the aggregator shuts down.
"""

from __future__ import annotations

import queue
import threading

from aggregator.errors import Rejected


class Subscribers:
    """The open streams, by token. ``lock`` is the round manager's lock: a round changing
    phase and its sites being woken are one step."""

    def __init__(self, lock: threading.RLock):
        self._lock = lock
        self._streams: dict[int, tuple[str, object]] = {}
        self._next = 0
        self._closed = False

    def add(self, site_id: str, updates=None) -> tuple[int, object]:
        """Register a stream of ``site_id``; ``updates`` is anything with a thread-safe
        ``put`` (default a new queue.Queue). Returns (token, updates)."""
        with self._lock:
            if any(s == site_id for s, _ in self._streams.values()):
                raise Rejected("ALREADY_EXISTS",
                               f"site {site_id!r} already has a live round stream at the "
                               f"aggregator: only one process per site identity may be "
                               f"connected (is another site node running with this kit?)")
            token = self._next
            self._next += 1
            q = queue.Queue() if updates is None else updates
            if self._closed:
                q.put(None)
            self._streams[token] = (site_id, q)
            return token, q

    def remove(self, token: int) -> str | None:
        """End a stream; returns its site id (None if unknown)."""
        with self._lock:
            site_id, _ = self._streams.pop(token, (None, None))
            return site_id

    def notify(self, sites, round_id: str) -> None:
        """Wake the streams of ``sites`` about ``round_id``."""
        with self._lock:
            for site_id, q in self._streams.values():
                if site_id in sites:
                    q.put(round_id)

    def close(self) -> None:
        """Shutting down: every stream gets None, and so does any stream added later."""
        with self._lock:
            self._closed = True
            for _, q in self._streams.values():
                q.put(None)
