"""`dpfed simulate --console PORT` (issue 13): after the round the federation and the console
keep running and the URL is printed; a page loads over HTTP; Ctrl-C (SIGINT) stops every
process, the report is printed, the exit code is 0 and the ports are free again."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("starlette")
ROOT = Path(__file__).resolve().parents[1]


def _free(port: int) -> bool:
    """Nothing listens on the port and a server could bind it (connections the server closed
    may linger in TIME_WAIT: SO_REUSEADDR, as every server sets it)."""
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _lines_until(proc, pattern, timeout_s):
    """stdout lines until one matches ``pattern``; that match."""
    end = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < end:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            match = re.search(pattern, line)
            if match:
                return match
        elif proc.poll() is not None:
            break
    raise AssertionError(f"no line matching {pattern!r} (exit {proc.poll()}): {''.join(seen)}")


def test_simulate_console_serves_until_ctrl_c_then_exits_zero(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpfed_apps.cli", "--log-level", "WARNING", "simulate",
         "--sites", "2", "--aggregation", "independent", "--fit-method", "laplace",
         "--draws", "400", "--workdir", str(tmp_path / "work"), "--timeout", "60",
         "--console", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        match = _lines_until(proc, r"console at (http://127\.0\.0\.1:(\d+)/)", 240)
        url, port = match.group(1), int(match.group(2))
        rounds = urllib.request.urlopen(url + "rounds", timeout=10).read().decode()
        assert "DONE" in rounds and 'data-round="r-' in rounds
        sites = urllib.request.urlopen(url + "sites", timeout=10).read().decode()
        assert sites.count('class="connected') == 2
        aggregator = tomllib.loads((tmp_path / "work" / "aggregator.toml").read_text())["listen"]
        agg_port = int(aggregator.rsplit(":", 1)[1])
        assert not _free(port) and not _free(agg_port)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "spearman" in out.lower() or "Spearman" in out          # the report, after Ctrl-C
    assert "stopping the console and the federation" in err
    assert _free(port) and _free(agg_port)
    assert "Traceback" not in err


def test_console_command_refuses_an_unsafe_bind_and_serves_until_ctrl_c(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p), PYTHONUNBUFFERED="1")
    base = [sys.executable, "-m", "dpfed_apps.cli", "console", "--aggregator", "127.0.0.1:9",
            "--insecure"]
    unsafe = subprocess.run([*base, "--host", "0.0.0.0", "--port", "0"], capture_output=True,
                            text=True, env=env, timeout=60)
    assert unsafe.returncode == 2
    assert "not a loopback address" in unsafe.stderr and "Traceback" not in unsafe.stderr
    config = tmp_path / "coordinator.toml"
    config.write_text('aggregator = "127.0.0.1:9"\ninsecure = true\n[console]\nprot = 1\n')
    typo = subprocess.run([sys.executable, "-m", "dpfed_apps.cli", "console", "--config",
                           str(config)], capture_output=True, text=True, env=env, timeout=60)
    assert typo.returncode == 2 and "unknown key 'console.prot'" in typo.stderr
    proc = subprocess.Popen([*base, "--port", "0", "--rpc-timeout", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        match = _lines_until(proc, r"dpfed console: (http://127\.0\.0\.1:(\d+)/)", 60)
        import urllib.error
        with pytest.raises(urllib.error.HTTPError) as down:
            urllib.request.urlopen(match.group(1) + "sites", timeout=30)
        assert down.value.code == 503 and b"cannot be reached" in down.value.read()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "stopped" in err and "Traceback" not in err
    assert _free(int(match.group(2)))
