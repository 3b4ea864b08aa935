"""deploy/systemd's units under a real systemd: the README's ``systemd`` block, run as written in
a Debian 12 machine booted by `systemd-nspawn -b` (a tree made by mmdebstrap with systemd).

Steps 2-5 of deploy/README.md make the party folders on the host; the bundles are made with the
`dpfed bundle` lines of the README's containers-build block; they, the party folders and
deploy/systemd/ are put in the machine's /root as the README says. In the machine the block
installs both roles from their bundles with no index, creates the user with systemd-sysusers,
installs the party folders under /etc/dpfed and enables both units. The machine shares the
host's network: hospital-b and -c run as processes on the host, the coordinator starts the
README's round from the host over mutual TLS. Then each service's process is killed with
SIGKILL: systemd starts it again (Restart=on-failure) and its state directory still holds the
ledger and the round's result.

Skipped, saying why, where systemd-nspawn or mmdebstrap is missing or systemd cannot boot;
under CI (CI=true, where .ci/run installs them) it fails instead.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.test_deploy_readme import _copy_source, demo_env, free_port, readme_blocks

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = "systemd,systemd-sysv,dbus,python3,python3-venv,ca-certificates"
MACHINE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def unavailable(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true, and systemd cannot be booted for the units: {reason}. .ci/run "
                    "installs systemd-container and mmdebstrap; this test must not be skipped")
    pytest.skip(reason)


def _leader(nspawn: subprocess.Popen, timeout: float = 60) -> int:
    """The pid (on the host) of the machine's init: systemd-nspawn's child."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and nspawn.poll() is None:
        children = Path(f"/proc/{nspawn.pid}/task/{nspawn.pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.2)
    raise RuntimeError("systemd-nspawn started no machine")


class Machine:
    def __init__(self, tree: Path, name: str, log: Path):
        self.tree, self.log = tree, log
        self.nspawn = subprocess.Popen(
            ["systemd-nspawn", "--quiet", "-D", str(tree), "-b", "-M", name, "--register=no",
             "--keep-unit", "--console=read-only"],
            stdin=subprocess.DEVNULL, stdout=log.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True)
        self.pid = _leader(self.nspawn)

    def run(self, *argv: str, timeout: float = 300, user: str | None = None
            ) -> subprocess.CompletedProcess:
        """A command in the machine (all its namespaces), as root or ``user``."""
        prefix = ["runuser", "-u", user, "--"] if user else []
        return subprocess.run(["nsenter", "-t", str(self.pid), "-a", "env", "-i",
                               f"PATH={MACHINE_PATH}", "HOME=/root", "LANG=C.UTF-8",
                               *prefix, *argv],
                              capture_output=True, text=True, timeout=timeout)

    def show(self, unit: str, prop: str) -> str:
        return self.run("systemctl", "show", "-p", prop, "--value", unit).stdout.strip()

    def stop(self) -> None:
        if self.nspawn.poll() is None:
            self.nspawn.send_signal(signal.SIGTERM)       # nspawn halts the machine
            try:
                self.nspawn.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.nspawn.pid, signal.SIGKILL)
                self.nspawn.wait(30)


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    missing = [t for t in ("systemd-nspawn", "mmdebstrap", "nsenter") if shutil.which(t) is None]
    if missing:
        unavailable(f"{', '.join(missing)} not installed (Debian: apt-get install "
                    "systemd-container mmdebstrap)")
    if os.geteuid() != 0:
        unavailable("systemd-nspawn boots a machine as root only")
    tmp = tmp_path_factory.mktemp("systemd")
    tree = tmp / "machine"
    made = subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", f"--include={PACKAGES}",
                           "bookworm", str(tree)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=1800)
    if made.returncode != 0:
        unavailable(f"mmdebstrap could not make a Debian tree: {made.stderr[-1500:]}")

    # Steps 2-5 of the README on the host (party folders, keys, the CA) ...
    port = free_port()
    src, home = tmp / "src", tmp / "home"
    src.mkdir()
    home.mkdir()
    _copy_source(src, port)
    env = demo_env(home, tmp / "bin")
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONFIG_FILE",
                "PIP_CERT", "SSL_CERT_FILE", "PIP_DEFAULT_TIMEOUT"):
        if key in os.environ:                  # this machine's way to its package index
            env[key] = os.environ[key]
    walk = [text for skip, text in readme_blocks() if not skip]
    setup = walk[:next(i for i, t in enumerate(walk) if "dpfed aggregator serve" in t)]
    # ... and the bundles, with the README's `dpfed bundle` lines.
    (build,) = readme_blocks("containers-build")
    bundles = [line for line in build[1].splitlines() if line.startswith("dpfed bundle ")]
    assert len(bundles) == 2
    script = "\n".join([*setup, "cd -", *bundles]).replace("50051", str(port))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=src, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    demo = home / "dpfed-demo"
    # Into the machine's /root, as the README's block expects them.
    shutil.copytree(home / "dpfed-bundles", tree / "root" / "dpfed-bundles")
    shutil.copytree(demo, tree / "root" / "dpfed-demo")
    shutil.copytree(ROOT / "deploy" / "systemd", tree / "root" / "systemd")

    m = Machine(tree, f"dpfedtest{os.getpid()}", tmp / "console.log")
    sites: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 180
        while True:     # until systemd answers on its bus, then until it has booted
            booted = m.run("systemctl", "is-system-running", "--wait", timeout=180)
            if "Failed to connect to bus" not in booted.stderr or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if booted.stdout.strip() not in ("running", "degraded"):
            unavailable(f"systemd did not boot in systemd-nspawn: {booted.stdout} "
                        f"{booted.stderr}\n{m.log.read_text()[-2000:]}")
        yield m, demo, env, port, sites
    finally:
        for proc in sites:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        m.stop()
        shutil.rmtree(tree, ignore_errors=True)


@pytest.fixture(scope="module")
def round_done(machine):
    """The README's systemd block in the machine, then the README's round (step 8)."""
    m, demo, env, port, sites = machine
    (block,) = readme_blocks("systemd")
    started = time.monotonic()
    installed = m.run("bash", "-euo", "pipefail", "-c", block[1], timeout=1800)
    install_s = time.monotonic() - started
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:] + \
        m.run("journalctl", "--no-pager", "-n", "60").stdout
    health = subprocess.run(["dpfed", "health", "--config", "coordinator/coordinator.toml",
                             "--wait", "120"], cwd=demo, env=env, capture_output=True, text=True)
    assert health.returncode == 0, health.stderr + _journal(m)
    for h in ("hospital-b", "hospital-c"):
        sites.append(subprocess.Popen(["dpfed", "site", "serve", "--config", f"{h}/site.toml"],
                                      cwd=demo, env=env, stdout=(demo / f"{h}.log").open("w"),
                                      stderr=subprocess.STDOUT))
    started = time.monotonic()
    rnd = subprocess.run(["dpfed", "round", "start", "--spec", "coordinator/round.toml",
                          "--config", "coordinator/coordinator.toml", "--wait"], cwd=demo,
                         env=env, capture_output=True, text=True, timeout=1200)
    assert rnd.returncode == 0, rnd.stdout[-2000:] + rnd.stderr[-2000:] + _journal(m)
    print(f"\nsystemd: README block (install, units) {install_s:.0f} s, round "
          f"{time.monotonic() - started:.0f} s")
    return installed.stdout, rnd.stdout


def _journal(m: Machine) -> str:
    return "\n" + m.run("journalctl", "--no-pager", "-n", "80", "-u", "dpfed-site",
                        "-u", "dpfed-aggregator").stdout


def _result(demo, env) -> subprocess.CompletedProcess:
    return subprocess.run(["dpfed", "round", "result", "demo-1", "--config",
                           "coordinator/coordinator.toml"], cwd=demo, env=env,
                          capture_output=True, text=True, timeout=300)


def _ledger(m: Machine) -> str:
    out = m.run("/opt/dpfed/venv/bin/dpfed", "site", "ledger", "--config",
                "/etc/dpfed/site/site.toml", user="dpfed")
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_readme_units_run_the_site_and_the_aggregator_in_a_round(machine, round_done):
    m, demo, env, _, _ = machine
    installed, _ = round_done
    assert installed.split() == ["active", "active"]
    for unit in ("dpfed-site", "dpfed-aggregator"):
        assert m.show(unit, "User") == "dpfed" and m.show(unit, "UnitFileState") == "enabled"
        # Its process runs as dpfed, not root.
        pid = m.show(unit, "MainPID")
        assert m.run("stat", "-c", "%U", f"/proc/{pid}").stdout.strip() == "dpfed", unit
    result = _result(demo, env)
    assert result.returncode == 0 and "round demo-1: target Drug_1047_IC50" in result.stdout
    assert "TP53_mut" in result.stdout
    assert re.search(r"spent:\s+2\b", _ledger(m))
    # The state is in the units' state directories, owned by dpfed; nothing under /etc.
    for path in ("var/lib/dpfed-site/hospital-a.sqlite",
                 "var/lib/dpfed-aggregator/aggregator.sqlite"):
        assert (m.tree / path).is_file(), path
    assert not list((m.tree / "etc" / "dpfed").rglob("*.sqlite"))


def _kill_and_wait_restart(m: Machine, unit: str) -> None:
    before = int(m.show(unit, "NRestarts"))
    pid = m.show(unit, "MainPID")
    assert m.run("bash", "-c", f"kill -KILL {pid}").returncode == 0   # a crash, not a stop
    deadline = time.monotonic() + 60                              # RestartSec=5
    while time.monotonic() < deadline:
        if int(m.show(unit, "NRestarts")) > before and m.show(unit, "ActiveState") == "active" \
                and m.show(unit, "MainPID") not in ("0", pid):
            return
        time.sleep(0.5)
    pytest.fail(f"systemd did not start {unit} again after SIGKILL:{_journal(m)}")


def test_killed_services_restart_and_keep_their_state(machine, round_done):
    m, demo, env, _, _ = machine
    _kill_and_wait_restart(m, "dpfed-aggregator")
    health = subprocess.run(["dpfed", "health", "--config", "coordinator/coordinator.toml",
                             "--wait", "120"], cwd=demo, env=env, capture_output=True, text=True)
    assert health.returncode == 0, health.stderr
    result = _result(demo, env)
    assert result.returncode == 0 and "TP53_mut" in result.stdout, result.stderr
    _kill_and_wait_restart(m, "dpfed-site")
    assert re.search(r"spent:\s+2\b", _ledger(m))
    journal = m.run("journalctl", "--no-pager", "-u", "dpfed-site").stdout
    assert "Main process exited, code=killed, status=9/KILL" in journal
    assert "Scheduled restart job" in journal
    # A stop and a start (an upgrade, a reboot) keep the state directory too.
    assert m.run("systemctl", "restart", "dpfed-site", "dpfed-aggregator").returncode == 0
    assert re.search(r"spent:\s+2\b", _ledger(m))
    health = subprocess.run(["dpfed", "health", "--config", "coordinator/coordinator.toml",
                             "--wait", "120"], cwd=demo, env=env, capture_output=True, text=True)
    assert health.returncode == 0 and _result(demo, env).returncode == 0
