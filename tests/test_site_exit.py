"""A stopped site client leaves nothing for the interpreter's shutdown to collect.

Seen in CI (the three-hospital README run): a site logged "site hospital-c stopped" and
never exited. Its main thread waited, while garbage-collecting at interpreter shutdown, in
grpc's ``_MultiThreadedRendezvous.__del__`` for the call's condition lock, which one of
grpc's own threads held when shutdown stopped it. The Subscribe call had survived ``run``
in a reference cycle (the raised call -> its traceback -> ``_subscribe``'s frame -> the
local ``call``), which only the cyclic collector frees, and it may first run at shutdown.
Checked: with the collector off, no Subscribe call of the site is alive after ``run``
returns (it failed before the fix).
"""

from __future__ import annotations

import gc

import grpc

from tests.test_budget_history import Running, wait_connected, write_site


def _rendezvous() -> list:
    # type(), not isinstance(): isinstance() on a dead weak proxy among the objects raises.
    kind = grpc._channel._MultiThreadedRendezvous
    return [o for o in gc.get_objects() if type(o) is kind]


def test_no_subscribe_call_outlives_a_stopped_client(federation, tmp_path):
    config = write_site(federation, tmp_path)
    gc.collect()
    before = {id(o) for o in _rendezvous()}
    gc.disable()
    try:
        site = Running(config)
        wait_connected(federation)
        site.stop()
        assert not site.thread.is_alive() and site.error is None
        left = [o for o in _rendezvous() if id(o) not in before]
    finally:
        gc.enable()
    assert left == []
