"""The exact running sum of a round's releases (aggregator.aggregate's RunningTotal; the
joint round's twin subclasses it: aggregator.joint_round.JointRunningTotal)."""

from __future__ import annotations

import threading

import numpy as np

from dpfed.statistics import Statistics, StatisticsError, decode_header, encoded_values

from aggregator.exact_sum import ExactSum, ExactSumError


class RunningTotal:
    """The exact sum of statistics of one dimension, updated one contribution at a time (the
    round manager adds each accepted release as it arrives, so closing a round costs only the
    last few). n is summed as an integer.

    Releases are folded into the exact sum in blocks of ``BLOCK`` (ExactSum.add_rows): about
    half the cost of adding them one by one, and the sum is the same either way.

    Thread-safe, and built so the round manager's lock is never held while a block is folded
    in: ``add_encoded`` only queues the release (under the manager's lock, so the total and
    the accepted set change together), and ``fold`` does the arithmetic afterwards, outside
    it. A fold takes milliseconds when the GIL is contended (its numpy steps release and
    re-take it), and under the manager's lock every other contribution waited for it.
    ``copy`` and ``total`` wait for a fold in progress, so they always see every release
    queued before them."""

    BLOCK = 16
    #: What a malformed release or an overflowing sum raises (subclasses name their own).
    error: type = StatisticsError

    def __init__(self, dim: int, size: int | None = None):
        self.dim = int(dim)
        self.size = self.dim * (self.dim + 1) // 2 + self.dim + 1 if size is None else int(size)
        self._values = ExactSum(self.size)
        self._pending: list[np.ndarray] = []
        self.n = 0
        # Lock order: _folding, then _queue. add_encoded takes only _queue, so it never waits
        # for a fold's arithmetic, which runs holding _folding alone.
        self._folding = threading.Lock()     # guards _values
        self._queue = threading.Lock()       # guards _pending and n

    def _decode(self, data: bytes) -> tuple[np.ndarray, int]:
        """(values, n) of one encoding, checked like ``encoded_n``: header, dimension."""
        d, n = decode_header(data)
        if d != self.dim:
            raise StatisticsError(f"statistics have dimension {d}, the sum has {self.dim}")
        return encoded_values(data), n

    def _result(self, values: np.ndarray, n: int, noise):
        return Statistics.from_upper(self.dim, n, values, noise)

    def _empty(self) -> "RunningTotal":
        return RunningTotal(self.dim)

    def add_encoded(self, data: bytes) -> None:
        """Queue one encoding (``_decode``; finite values) for the next ``fold``."""
        values, n = self._decode(data)
        if not np.isfinite(values).all():
            raise self.error("statistics contain NaN or infinite values")
        with self._queue:
            self._pending.append(values)
            self.n += n

    def fold(self, minimum: int = BLOCK) -> None:
        """Add the queued releases to the exact sum if at least ``minimum`` are waiting and
        no other thread is folding (that one, a later fold or ``total`` takes them: nobody
        on the request path waits for another's arithmetic)."""
        if not self._folding.acquire(blocking=False):
            return
        try:
            with self._queue:
                if not self._pending or len(self._pending) < minimum:
                    return
                rows, self._pending = self._pending, []
            self._values.add_rows(np.stack(rows))   # checked finite when queued
        finally:
            self._folding.release()

    def add_rows(self, rows: np.ndarray, n: int) -> None:
        """Add many vectors (``Statistics.upper_values``, or a subclass's layout) at once,
        with their total n."""
        rows = np.asarray(rows, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != self.size:
            raise self.error(f"rows must have {self.size} entries")
        with self._folding:
            try:
                self._values.add_rows(rows)
            except ExactSumError as exc:
                raise self.error(str(exc)) from None
            with self._queue:
                self.n += int(n)

    def copy(self) -> "RunningTotal":
        twin = self._empty()
        with self._folding, self._queue:
            twin._values, twin._pending, twin.n = self._values.copy(), list(self._pending), self.n
        return twin

    @property
    def count(self) -> int:
        with self._folding, self._queue:
            return self._values.count + len(self._pending)

    def total(self, noise=None) -> Statistics:
        """The correctly rounded sum of everything added so far, carrying ``noise`` (the
        dpfed.noise description of the sum; None = unknown, the caller knows what was added)."""
        with self._folding:
            with self._queue:
                rows, self._pending, n = self._pending, [], self.n
            try:
                if rows:
                    self._values.add_rows(np.stack(rows))
                values = self._values.result()
            except ExactSumError as exc:
                raise self.error(str(exc)) from None
        return self._result(values, n, noise)
