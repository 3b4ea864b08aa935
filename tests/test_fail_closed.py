"""Issue 11, "fail closed": each finding reproduced, with real processes where it matters.

1. two site processes with one identity: only one round stream is accepted, one release;
3. no data value (cell, patient id, header made of data) in any refusal, error or log line;
4. unknown config keys are errors naming the nearest valid key; the id column is never a
   feature; `dpfed site check` prints the effective policy;
6. a value whose row norm overflows is an error naming the row, nothing released;
7. quorum defaults to every invited site.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aggregator.config import config_from_dict
from aggregator.server import AggregatorServer
from coordinator.client import Coordinator
from dpfed.v1 import dpfed_pb2 as pb
from site_node.ledger import PrivacyLedger
from tests.test_site_node import make_spec, write_site

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DPFED_TEST_CRASH_AT"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _dpfed(*args: str) -> list[str]:
    return [sys.executable, "-m", "dpfed.cli", "--log-level", "DEBUG", *args]


def _serve(config_path: Path, log_path: Path) -> subprocess.Popen:
    log = log_path.open("wb")
    return subprocess.Popen(_dpfed("site", "serve", "--config", str(config_path)),
                            env=_env(), stdout=log, stderr=subprocess.STDOUT)


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _until(check, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _aggregator(tmp_path: Path, site_dir: str = "site"):
    agg = AggregatorServer(config_from_dict({
        "listen": "127.0.0.1:0", "state_db": "agg.sqlite", "insecure": True, "skip_fit": True,
        "grace_s": 0.2,
        "sites": [{"site_id": "hospital-a", "public_key": f"{site_dir}/keys/site.pub"}],
        "coordinators": [{"coordinator_id": "coordinator",
                          "public_key": f"{site_dir}/keys/coord.pub"}]}, tmp_path))
    return agg, agg.start()


def _point_at(config_path: Path, port: int) -> None:
    text = config_path.read_text().replace('aggregator = "127.0.0.1:1"',
                                           f'aggregator = "127.0.0.1:{port}"')
    config_path.write_text(text)


def _connected(agg) -> bool:
    return any(r.connected_streams for r in agg.manager.registry.snapshot())


# ---- finding 1: one identity, one live stream ----------------------------------------------

@pytest.mark.slow
def test_two_processes_of_one_kit_get_one_stream_and_release_once(tmp_path, caplog):
    """Two `dpfed site serve` processes from one kit (same site.toml, keys and data; each its
    own copy of the state folder). Before the fix both subscribed, both got the round and
    released twice (two ledgers debited)."""
    caplog.set_level(logging.INFO)
    (tmp_path / "site").mkdir()
    config_a, coordinator_key, _ = write_site(tmp_path / "site")
    agg, port = _aggregator(tmp_path)
    _point_at(config_a, port)
    shutil.copytree(tmp_path / "site", tmp_path / "copy")   # the same kit, a second machine
    config_b = tmp_path / "copy/site.toml"
    coordinator = Coordinator(f"127.0.0.1:{port}", coordinator_key, "coordinator")
    logs = {"site": tmp_path / "a.log", "copy": tmp_path / "b.log"}
    procs = {}
    try:
        procs["site"] = _serve(config_a, logs["site"])
        _until(lambda: _connected(agg), 20, "the first process to subscribe")
        procs["copy"] = _serve(config_b, logs["copy"])
        refused = lambda: "refused this site's round stream" in logs["copy"].read_text()  # noqa: E731
        # Either the fix refused the copy, or (the bug) it holds a second stream.
        _until(lambda: refused() or agg.manager.registry.snapshot()[0].connected_streams > 1,
               20, "the second process to try to subscribe")

        coordinator.start_round(make_spec("dup-1", epsilon=1.0, quorum=1,
                                          deadline_unix_ms=int(time.time() * 1000) + 60_000))
        status = coordinator.wait("dup-1", 30, poll_s=0.1)
        assert status.state == pb.RoundStatus.DONE, status.message
        time.sleep(1.0)   # a second release, if any, would have come by now

        def releases(folder):
            path = tmp_path / folder / "state/ledger.sqlite"
            if not path.exists():
                return []
            with PrivacyLedger(path) as ledger:
                return [r.round_id for r in ledger.releases()]
        # Exactly one release in total across both ledgers (before the fix: one in each).
        assert sorted(releases("site") + releases("copy")) == ["dup-1"]
        assert releases("site") == ["dup-1"]          # the one with the stream answered
        assert len(agg.store.contributions("dup-1")) == 1

        # The operator sees why: the aggregator's log, and the site's, which keeps retrying.
        assert refused() and procs["copy"].poll() is None
        [record] = agg.manager.registry.snapshot()
        assert record.connected_streams == 1
        assert any("Subscribe" in r.message and "ALREADY_EXISTS" in r.message
                   and "already has a live round stream" in r.message for r in caplog.records)

        # When the first stream dies, the identity is free again: the copy gets in.
        procs["site"].send_signal(signal.SIGTERM)
        assert procs["site"].wait(15) == 0
        _until(lambda: any("unsubscribed" in r.message for r in caplog.records), 15,
               "the aggregator to see the first stream end")
        _until(lambda: _subscribed_after_refusal(caplog)
               and agg.manager.registry.snapshot()[0].connected_streams == 1, 60,
               "the copy to subscribe")
        coordinator.start_round(make_spec("dup-2", epsilon=1.0, quorum=1,
                                          deadline_unix_ms=int(time.time() * 1000) + 60_000))
        assert coordinator.wait("dup-2", 30, poll_s=0.1).state == pb.RoundStatus.DONE
        assert releases("copy") == ["dup-2"] and releases("site") == ["dup-1"]
    finally:
        _stop(procs.values())
        coordinator.close()
        agg.stop(0)


def _subscribed_after_refusal(caplog) -> bool:
    """A 'subscribed' line after the last 'unsubscribed' one (the copy's stream is live)."""
    lines = [r.message for r in caplog.records]
    last_gone = max((i for i, m in enumerate(lines) if "unsubscribed" in m), default=-1)
    return any("subscribed" in m and "unsubscribed" not in m for m in lines[last_gone + 1:])


def test_manager_refuses_a_second_stream_until_the_first_ends(federation):
    manager = federation.manager
    token, _ = manager.subscribe("site-a")
    from aggregator.rounds import Rejected
    with pytest.raises(Rejected) as err:
        manager.subscribe("site-a")
    assert err.value.code == "ALREADY_EXISTS" and "already has a live round stream" in \
        err.value.message
    other, _ = manager.subscribe("site-b")        # another identity is not affected
    manager.unsubscribe(token)
    again, _ = manager.subscribe("site-a")        # free again
    manager.unsubscribe(again)
    manager.unsubscribe(other)
