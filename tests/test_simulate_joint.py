"""`dpfed simulate --targets N --aggregation secure` end to end (issue 23): the CLI as its own
process, the aggregator and the sites as theirs, a joint Gaussian round with distributed
Skellam noise on the bundled GDSC data. Checked: exit code 0, every target fitted in --json,
each site's ledger charged exactly one event (one debit, every included patient charged that
event once), and no process of the run left behind (the joint fit's process pool starts from
24 targets: aggregator.joint_fit.POOL_MIN_TARGETS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dpfed.accounting import Skellam

pytestmark = pytest.mark.slow

TARGETS = 24      # the joint fit's process pool is used from 24 targets


def _tagged(tag: str) -> list[int]:
    """Processes whose environment carries ``tag`` (every process the run started inherits
    it, the fit pool's fork server and workers included)."""
    found = []
    needle = tag.encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_simulate_secure_joint_round_end_to_end(tmp_path):
    from aggregator.joint_fit import POOL_MIN_TARGETS
    from dpfed_apps import simulation as sim
    from site_node.ledger import PrivacyLedger

    assert TARGETS >= POOL_MIN_TARGETS
    tag = f"dpfed-test-{uuid.uuid4().hex}"
    work = tmp_path / "work"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "DPFED_TEST_RUN_TAG": tag,
           "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH"))
                                         if p)}
    # Output to files, not pipes: a process left behind would hold a pipe open.
    with open(tmp_path / "out.json", "w") as out, open(tmp_path / "err.txt", "w") as err:
        done = subprocess.run(
            [sys.executable, "-m", "dpfed_apps.cli", "--log-level", "WARNING", "simulate",
             "--targets", str(TARGETS), "--aggregation", "secure", "--mechanism", "gaussian",
             "--delta", "1e-6", "--sites", "3", "--draws", "300", "--timeout", "120",
             "--workdir", str(work), "--json"],
            cwd=tmp_path, env=env, stdout=out, stderr=err, timeout=600)
    errors = (tmp_path / "err.txt").read_text()
    assert done.returncode == 0, errors[-3000:]
    end = time.monotonic() + 10
    while _tagged(tag) and time.monotonic() < end:
        time.sleep(0.1)
    assert _tagged(tag) == [], "processes of the run were left behind"

    report = json.loads((tmp_path / "out.json").read_text())
    assert report["aggregation"] == "secure" and report["mechanism"] == "gaussian"
    assert report["targets"] == TARGETS and report["fitted"] == TARGETS
    assert len(report["per_target"]) == TARGETS
    assert all(t["status"] == "fitted" and t["n"] and t["spearman"] is not None
               for t in report["per_target"])
    assert report["released"] == ["site-1", "site-2", "site-3"] and report["refused"] == []
    assert "3 shares of 1/3 draw" in report["noise"]

    layout = sim.FederationLayout(work)
    for name, rows in zip(["site-1", "site-2", "site-3"], report["sites"]):
        with PrivacyLedger(layout.site_db(name)) as ledger:
            [release] = ledger.releases()
            assert release.round_id == report["round_id"]
            assert ledger.spent == pytest.approx(report["epsilon"])
            histories = ledger.all_patient_histories()
            # Every patient of the site's file was in the release (a fresh budget), and each
            # was charged the round's one Skellam event, once.
            assert len(histories) == rows
            events = {tuple(h) for h in histories.values()}
            assert len(events) == 1
            [[event]] = events
            assert isinstance(event, Skellam)
