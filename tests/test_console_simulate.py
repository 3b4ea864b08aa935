"""`dpfed simulate --console PORT` (issue 13): after the round the federation and the console
keep running and the URL is printed with its access token; a page loads over HTTP; Ctrl-C
(SIGINT) stops every process, the report is printed, the exit code is 0 and the ports are free
again. `dpfed console` (issue 19 item 8): on loopback without token_file it prints a fresh
token once with its URL and every page needs it."""

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
import urllib.error
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


def _status(url, headers=None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _browser():
    """An opener that keeps cookies, like a browser."""
    import http.cookiejar
    return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(
        http.cookiejar.CookieJar()))


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
        match = _lines_until(proc, r"console at (http://127\.0\.0\.1:(\d+)/)\?token=([\w-]+) ",
                             240)
        url, port, token = match.group(1), int(match.group(2)), match.group(3)
        assert _status(url + "rounds") == 401                       # the token is required
        opener = _browser()
        rounds = opener.open(f"{url}rounds?token={token}", timeout=10)
        assert rounds.url == url + "rounds"                         # redirected without it
        rounds = rounds.read().decode()
        assert "DONE" in rounds and 'data-round="r-' in rounds
        sites = opener.open(url + "sites", timeout=10).read().decode()     # the cookie
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
        match = _lines_until(proc, r"dpfed console: (http://127\.0\.0\.1:(\d+)/)\?token=([\w-]+)",
                             60)
        with pytest.raises(urllib.error.HTTPError) as down:
            urllib.request.urlopen(urllib.request.Request(
                match.group(1) + "sites", headers={"Authorization": f"Bearer {match.group(3)}"}),
                timeout=30)
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


def test_console_command_on_loopback_prints_a_fresh_token_once_and_requires_it(tmp_path):
    """Issue 19 item 8: `dpfed console` on loopback without token_file prints its URL with a
    fresh token once (Jupyter style); without the token every page is 401, with it (Bearer,
    or the printed address, which sets a cookie and redirects without it) the pages load."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "dpfed_apps.cli", "console", "--aggregator",
                             "127.0.0.1:9", "--insecure", "--port", "0", "--rpc-timeout", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        match = _lines_until(
            proc, r"dpfed console: (http://127\.0\.0\.1:(\d+)/)\?token=([A-Za-z0-9_-]{43,})\s", 60)
        url, port, token = match.group(1), int(match.group(2)), match.group(3)
        wrong = token[:-1] + ("A" if token[-1] != "A" else "B")
        for path in ("", "rounds", "sites", "healthz", "rounds/new", f"healthz?token={wrong}"):
            assert _status(url + path) == 401, path
        assert _status(url + "healthz", {"Authorization": f"Bearer {wrong}"}) == 401
        start = urllib.request.Request(url + "rounds/start", data=b"csrf=x&preview=p",
                                       headers={"cookie": "dpfed_csrf=x"}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(start, timeout=30)
        assert refused.value.code == 401 and b"?token=" in refused.value.read()
        assert _status(url + "healthz", {"Authorization": f"Bearer {token}"}) == 200
        opener = _browser()
        health = opener.open(f"{url}healthz?token={token}", timeout=30)
        assert health.url == url + "healthz" and health.read() == b"ok\n"
        assert opener.open(url + "healthz", timeout=30).status == 200      # the cookie
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out.count(token) == 0 and err.count(token) == 0     # printed once (read above)
    assert _free(port)
