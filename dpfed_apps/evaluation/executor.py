"""Where the evaluation's tasks run: in process, a local process pool, or a Dask cluster.

Every executor has ``map_unordered(fn, items)``: an iterator of ``fn(item)`` in completion
order (so progress is reported as tasks finish), and is a context manager that releases its
workers. ``fn`` must be a picklable top-level function (``dpfed_apps.evaluation.runner.run_task``).

- ``SerialExecutor``: in this process (tests, debugging).
- ``LocalExecutor`` (default of ``dpfed evaluate``): ``concurrent.futures.ProcessPoolExecutor``
  with one worker per core ("spawn" start method: OpenDP, Numba and BLAS threads do not survive
  ``fork`` reliably). Each worker loads the compiled ADVI kernel once at start.
- ``DaskExecutor``: ``dask.distributed``: a ``LocalCluster`` (processes, or threads with
  ``processes=False``) or an existing scheduler (``address="tcp://host:8786"``), for users who
  outgrow one machine. Needs ``pip install dpfed[evaluate]``.
"""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable, Iterable, Iterator

import multiprocessing

__all__ = ["SerialExecutor", "LocalExecutor", "DaskExecutor", "make_executor", "EXECUTORS"]

EXECUTORS = ("local", "dask", "serial")


def _worker_init() -> None:
    # Import (and load any compiled code of) the posterior fit before the first task, so that
    # task timings and the progress rate are not skewed by it.
    import numpy as np

    from posterior import fit_posterior
    from dpfed.statistics import exact_statistics

    x = np.eye(3)
    fit_posterior(exact_statistics(x, np.ones(3)), draws=10, seed=0)


class SerialExecutor:
    """Runs each item in this process, in order."""

    workers = 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map_unordered(self, fn: Callable, items: Iterable) -> Iterator:
        for item in items:
            yield fn(item)


class LocalExecutor:
    """A pool of ``workers`` processes on this machine (default: one per core)."""

    def __init__(self, workers: int | None = None):
        self.workers = int(workers or os.cpu_count() or 1)
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self):
        self._pool = ProcessPoolExecutor(self.workers,
                                         mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_worker_init)
        return self

    def __exit__(self, *exc):
        if self._pool is not None:
            # On an error or Ctrl-C, drop the queued tasks instead of running them all first.
            self._pool.shutdown(wait=True, cancel_futures=exc[0] is not None)
            self._pool = None
        return False

    def map_unordered(self, fn: Callable, items: Iterable) -> Iterator:
        if self._pool is None:
            raise RuntimeError("use LocalExecutor as a context manager")
        # Keep a bounded number of tasks in flight so a huge grid is not pickled up front.
        items = iter(items)
        in_flight = set()
        limit = 4 * self.workers
        for item in items:
            in_flight.add(self._pool.submit(fn, item))
            if len(in_flight) >= limit:
                break
        while in_flight:
            done, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
            for fut in done:
                yield fut.result()
                nxt = next(items, None)
                if nxt is not None:
                    in_flight.add(self._pool.submit(fn, nxt))


class DaskExecutor:
    """``dask.distributed``: a LocalCluster of ``workers`` single-threaded workers, or the
    scheduler at ``address``. ``processes=False`` runs the workers as threads of this process
    (the Numba kernel and OpenDP release the GIL; useful for tests and small machines)."""

    def __init__(self, workers: int | None = None, *, address: str | None = None,
                 processes: bool = True):
        try:
            import dask.distributed  # noqa: F401
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                "the Dask executor needs dask[distributed]: pip install dpfed[evaluate]",
                name=exc.name) from None
        self.workers = int(workers or os.cpu_count() or 1)
        self.address = address
        self.processes = processes
        self._client = None
        self._cluster = None

    def __enter__(self):
        from dask.distributed import Client, LocalCluster

        if self.address:
            self._client = Client(self.address)
        else:
            self._cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1,
                                         processes=self.processes, dashboard_address=None)
            self._client = Client(self._cluster)
        self._client.register_plugin(_KernelPlugin())
        return self

    def __exit__(self, *exc):
        if self._client is not None:
            self._client.close()
        if self._cluster is not None:
            self._cluster.close()
        self._client = self._cluster = None
        return False

    def map_unordered(self, fn: Callable, items: Iterable) -> Iterator:
        from dask.distributed import as_completed

        if self._client is None:
            raise RuntimeError("use DaskExecutor as a context manager")
        futures = self._client.map(fn, list(items), pure=False)
        for fut in as_completed(futures):
            yield fut.result()
            fut.release()


def _kernel_plugin_base():
    try:
        from dask.distributed import WorkerPlugin
    except ModuleNotFoundError:  # pragma: no cover - only reached without dask
        return object
    return WorkerPlugin


class _KernelPlugin(_kernel_plugin_base()):
    """Loads the ADVI kernel on each Dask worker at start (like ``_worker_init``)."""

    name = "dpfed-advi-kernel"

    def setup(self, worker):
        _worker_init()


def make_executor(kind: str = "local", workers: int | None = None, **options):
    """``"local"`` (process pool), ``"dask"`` (LocalCluster or ``address=``), ``"serial"``."""
    if kind == "local":
        return LocalExecutor(workers)
    if kind == "dask":
        return DaskExecutor(workers, **options)
    if kind == "serial":
        return SerialExecutor()
    raise ValueError(f"executor must be one of {EXECUTORS}, got {kind!r}")
