"""Fault injection for the crash and shutdown tests: the only test hooks in production code.

Both hooks are inert unless their environment variable is set; never set them in production.
Every use in production code is a call into this module, so ``grep dpfed.faults`` (or
``crash_point``, ``hold_interceptors``) lists every place a test can stop or kill a process.

``DPFED_TEST_CRASH_AT=<name>`` (``crash_point``): the process SIGKILLs itself when it reaches
the crash point called ``name``. The points (tests/test_crash_site.py, test_fail_closed.py):

- ``after_consent``: site_node.client, the site's consent was taken (nothing drawn or debited);
- ``after_debit``: site_node.client, the release is debited and stored, not yet sent;
- ``after_send``: site_node.client, the aggregator answered, the acknowledgement is not yet
  recorded.

They prove that a crash at these points loses no epsilon accounting and that the stored bytes
are resent.

``DPFED_TEST_HOLD_CONTRIBUTE=<directory>`` (``hold_interceptors``, tests/test_shutdown.py): the
aggregator's server holds the first Contribute call before the servicer sees it, after creating
``<directory>/arrived``, until ``<directory>/release`` exists (60 s at most). It puts a call
deterministically "in flight" when SIGTERM arrives.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from pathlib import Path

import grpc

__all__ = ["CRASH_ENV", "HOLD_ENV", "crash_point", "HoldFirstCall", "hold_interceptors"]

log = logging.getLogger(__name__)

CRASH_ENV = "DPFED_TEST_CRASH_AT"
HOLD_ENV = "DPFED_TEST_HOLD_CONTRIBUTE"


def crash_point(name: str) -> None:
    """SIGKILL this process if ``DPFED_TEST_CRASH_AT`` is ``name``; otherwise nothing."""
    if os.environ.get(CRASH_ENV) == name:
        log.critical("%s=%s: killing this process (test hook)", CRASH_ENV, name)
        os.kill(os.getpid(), signal.SIGKILL)


class HoldFirstCall(grpc.aio.ServerInterceptor):
    """A grpc.aio server interceptor that holds the first call of ``method`` (a full method
    name, ``/package.Service/Method``) until ``release()`` is called or, with a ``directory``,
    until ``directory/release`` exists; it creates ``directory/arrived`` when the call comes."""

    def __init__(self, method: str, directory: str | Path | None = None):
        self.method = method
        self.directory = Path(directory) if directory else None
        self.arrived, self._release = threading.Event(), threading.Event()
        self._taken = threading.Lock()

    def release(self) -> None:
        self._release.set()

    async def _wait(self) -> None:
        self.arrived.set()
        if self.directory:
            (self.directory / "arrived").touch()
        end = time.monotonic() + 60  # never hold a call forever, even if the test died
        while not self._release.is_set() and time.monotonic() < end:
            if self.directory and (self.directory / "release").exists():
                return
            await asyncio.sleep(0.01)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler_call_details.method != self.method or handler is None:
            return handler
        inner = handler.unary_unary

        async def held(request, context):
            if self._taken.acquire(blocking=False):  # the first call only
                log.critical("%s: holding the first %s (test hook)", HOLD_ENV, self.method)
                await self._wait()
            return await inner(request, context)
        return grpc.unary_unary_rpc_method_handler(
            held, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


def hold_interceptors(method: str) -> list:
    """``[HoldFirstCall(method, $DPFED_TEST_HOLD_CONTRIBUTE)]`` if that variable is set, else []."""
    directory = os.environ.get(HOLD_ENV)
    return [HoldFirstCall(method, directory)] if directory else []
