"""`dpfed simulate` starts its processes before it reads the data (issue 21 item 5): what that
must not change. Bad data still fails with exit 2 and leaves no process behind; a launched
process runs nothing until it is told to (dpfed_apps.launch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dpfed import exitcodes
from dpfed_apps import cli

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _processes_naming(text: str) -> list[str]:
    """Command lines of running processes that contain ``text``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state not in ("Z", "X"):
            found.append(cmdline)
    return found


def test_launch_runs_nothing_without_go():
    proc = subprocess.run([sys.executable, "-m", "dpfed_apps.launch", "dpfed.exitcodes", "--",
                           "--version"], input="", capture_output=True, text=True,
                          env=_env(), cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stdout == ""


def test_launch_runs_the_command_on_go():
    proc = subprocess.run([sys.executable, "-m", "dpfed_apps.launch", "dpfed.exitcodes", "--",
                           "--version"], input="go\n", capture_output=True, text=True,
                          env=_env(), cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("dpfed ")


def test_bad_data_exits_2_and_stops_every_process(tmp_path, capsys):
    """The aggregator and the sites are already running when the data turns out unusable:
    the command still exits 2 with the data's error, and every process it started is gone."""
    data = tmp_path / "bad.csv"
    data.write_text("id,a,y\n1,0.5,2.0\n2,0.1,1.0\n")       # far too few rows to split
    work = tmp_path / "run"
    code = cli.main(["--log-level", "WARNING", "simulate", "--data", str(data),
                     "--workdir", str(work)])
    err = capsys.readouterr().err
    assert code == exitcodes.USAGE, err
    assert err.startswith("[simulate] starting aggregator")     # they had been started
    assert "dpfed simulate:" in err
    assert (work / "logs" / "aggregator.log").exists()
    assert _processes_naming(str(work)) == []
