"""Real site processes for the crash and kill tests (test_crash_site, test_fail_closed,
test_secure_round_kill): starting ``dpfed site serve`` with or without a crash point, and
stopping what a test started the way systemd would (SIGTERM, then SIGKILL after 10 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def site_process(config_path, crash_at: str | None = None) -> subprocess.Popen:
    """``dpfed site serve --config config_path`` at log level INFO, stderr piped (the tests
    read it when the process did not end as expected). ``crash_at``: the process kills
    itself at that point (``DPFED_TEST_CRASH_AT``); None: a crash point inherited from this
    process's environment is dropped."""
    env = {k: v for k, v in os.environ.items() if k != "DPFED_TEST_CRASH_AT"}
    if crash_at:
        env["DPFED_TEST_CRASH_AT"] = crash_at
    return subprocess.Popen([sys.executable, "-m", "dpfed_apps.cli", "--log-level", "INFO", "site",
                             "serve", "--config", str(config_path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def stop_processes(procs) -> None:
    """SIGTERM each process still running and wait up to 10 s for it; SIGKILL one that did
    not stop, and wait for it, so no zombie is left."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
