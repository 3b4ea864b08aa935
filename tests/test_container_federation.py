"""The demo of deploy/README.md in containers, run as written: an aggregator and three site
containers built from offline bundles, and a coordinator round over mutual TLS.

The README's ``containers-build`` block runs once for the module (the images): a Debian base
made by mmdebstrap where no registry is reachable (kept between runs, like a pulled base),
the site and aggregator bundles made by `dpfed bundle`, and `podman build` from them with no
network. Then steps 2-5 of the README (data, keys, the CA) and its ``containers`` blocks run as
written: the aggregator and the sites in containers on the host's network, the image's
HEALTHCHECK, the round, its result, a ledger read from its volume by a new container. The
test then kills the aggregator's and a site's process (SIGKILL): podman starts them again and
they keep their state. The README's last block stops and removes the containers.

Edits to the README's text: the port (50051 becomes a free one, as in test_deploy_readme.py)
and the names of images, containers and volumes (a prefix of this run's, so nothing of a
reader's demo is touched). Where podman, runc or mmdebstrap is missing or cannot run a
container the module is skipped, saying why; under CI (CI=true, where .ci/run installs them)
it fails instead, so CI cannot skip it silently.
"""

from __future__ import annotations

import json
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
CONF = ROOT / "deploy" / "container" / "containers.conf"
BASE = "localhost/debian-py:bookworm"
PREFIX = f"dpfedtest{os.getpid()}-"
NAMES = re.compile(r"\bdpfed-(aggregator|site|hospital-[abc]|\$h)\b")
HOSPITALS = ("hospital-a", "hospital-b", "hospital-c")
TIMINGS: dict[str, float] = {}


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONF)}


def podman(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                          env=podman_env())


def unavailable(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true, and the container federation cannot run: {reason}. .ci/run "
                    "installs podman, runc and mmdebstrap; this test must not be skipped there")
    pytest.skip(reason)


def engine_problem() -> str | None:
    """Why no container can run here, or None."""
    missing = [tool for tool in ("podman", "runc", "mmdebstrap")
               if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists()]
    if missing:
        return (f"{', '.join(missing)} not installed (Debian: apt-get install podman runc "
                "mmdebstrap)")
    if os.geteuid() != 0:
        return ("the README's container path runs as root (rootful podman: it gives the party "
                "folders to the images' uid with chown)")
    info = podman("info", "--format", "{{.Host.OCIRuntime.Name}}")
    if info.returncode != 0:
        return f"podman info failed: {info.stderr.strip()[-500:]}"
    return None


def as_tested(text: str, port: int) -> str:
    """The README's text with this run's port and names."""
    return NAMES.sub(PREFIX + r"dpfed-\1", text).replace("50051", str(port))


def run_script(script: str, env: dict, cwd: Path, timeout: int) -> tuple[int, str]:
    """bash -x with a timestamp on every traced command (for the timings of the report)."""
    script = "PS4='+ [$(date +%s.%N)] '\n" + script     # bash -x as root ignores PS4 from env
    proc = subprocess.run(["bash", "-xeuo", "pipefail", "-c", script], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout


def _cleanup() -> None:
    names = [f"{PREFIX}dpfed-{n}" for n in ("aggregator", *HOSPITALS)]
    podman("rm", "--force", "--time", "5", *names, timeout=120)
    podman("volume", "rm", "--force", *names, timeout=120)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    problem = engine_problem()
    if problem:
        unavailable(problem)
    tmp = tmp_path_factory.mktemp("containers")
    home = tmp / "home"
    home.mkdir()
    env = demo_env(home, tmp / "bin")
    env["CONTAINERS_CONF"] = str(CONF)
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONFIG_FILE",
                "PIP_CERT", "SSL_CERT_FILE", "PIP_DEFAULT_TIMEOUT"):
        if key in os.environ:                  # this machine's way to its package index
            env[key] = os.environ[key]
    return tmp, env


@pytest.fixture(scope="module")
def images(env):
    """The README's containers-build block: base image, bundles, the two images."""
    tmp, env = env
    (block,) = readme_blocks("containers-build")
    started = time.monotonic()
    code, out = run_script(as_tested(block[1], 50051), env, ROOT, 3600)
    TIMINGS["build block"] = time.monotonic() - started
    if code != 0 and podman("image", "exists", BASE).returncode != 0:
        unavailable("no base image could be made (mmdebstrap or podman import failed):\n"
                    + out[-3000:])
    assert code == 0, out[-6000:]
    probe = podman("run", "--rm", "--network", "host", f"{PREFIX}dpfed-site", "--version")
    if probe.returncode != 0:
        unavailable(f"podman cannot run a container here: {probe.stderr.strip()[-800:]}")
    TIMINGS.update(_step_times(out))
    yield out
    podman("rmi", "--force", f"{PREFIX}dpfed-site", f"{PREFIX}dpfed-aggregator", timeout=300)


def _step_times(trace: str) -> dict[str, float]:
    """Seconds of each traced command of a `bash -x` run with run_script's PS4."""
    marks = [(float(m.group(1)), m.group(2)[:60]) for m in
             re.finditer(r"^\++ \[(\d+\.\d+)\] (.*)$", trace, re.M)]
    ends = [at for at, _ in marks[1:]] + [time.time()]
    return {f"{i:02d} {what}": round(end - at, 1)
            for i, ((at, what), end) in enumerate(zip(marks, ends))}


@pytest.fixture(scope="module")
def demo(env, images):
    """Steps 2-5 of the README (processes), then its first containers block."""
    tmp, env = env
    port = free_port()
    src = tmp / "src"
    src.mkdir()
    _copy_source(src, port)
    walk = [text for skip, text in readme_blocks() if not skip]
    setup = walk[:next(i for i, t in enumerate(walk) if "dpfed aggregator serve" in t)]
    run_block, stop_block = readme_blocks("containers")
    script = "\n".join([*setup, run_block[1]]).replace("50051", str(port))
    _cleanup()
    started = time.monotonic()
    try:
        code, out = run_script(as_tested(script, port), env, src, 1800)
    except subprocess.TimeoutExpired as exc:
        _cleanup()
        pytest.fail(f"the README's container blocks did not finish: {exc.output}")
    TIMINGS["steps 2-5 and the containers block"] = time.monotonic() - started
    TIMINGS.update(_step_times(out))
    demo = Path(env["HOME"]) / "dpfed-demo"
    if code != 0:
        logs = _container_logs()
        _cleanup()
        pytest.fail(f"the README's container blocks failed:\n{out[-6000:]}\n{logs}")
    yield demo, port, out, env
    code, stopped = run_script(as_tested(stop_block[1], port), env, demo, 300)
    _cleanup()
    print("\ncontainer federation timings (s):", json.dumps(TIMINGS, indent=1))
    assert code == 0, stopped[-3000:]


def _container_logs() -> str:
    out = []
    for name in ("aggregator", *HOSPITALS):
        logs = podman("logs", "--tail", "30", f"{PREFIX}dpfed-{name}")
        out.append(f"--- {name}\n{logs.stdout}{logs.stderr}")
    return "\n".join(out)


def _dpfed(env, demo, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(["dpfed", *args], cwd=demo, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_images_are_built_from_the_bundles_with_the_local_base(env, images):
    for role in ("site", "aggregator"):
        image = f"{PREFIX}dpfed-{role}"
        inspect = json.loads(podman("image", "inspect", image).stdout)[0]
        config = inspect["Config"]
        assert config["User"] == "dpfed" and "/var/lib/dpfed" in config["Volumes"]
        assert config["Entrypoint"] == ["dpfed"]
        health = podman("image", "inspect", "--format", "{{json .HealthCheck}}", image).stdout
        assert "dpfed" in health and "health" in health, health
        # Only the role's extra: PyMC at the aggregator, never at a hospital.
        has_pymc = podman("run", "--rm", "--network", "none", "--entrypoint", "python3", image,
                          "-c", "import pymc").returncode == 0
        assert has_pymc == (role == "aggregator")
        # No layer keeps the bundle's wheels (the build mounted them for one step).
        files = podman("run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
                       "ls -A /tmp; find / -xdev -name 'dpfed-*.whl' -o -name 'numpy-*.whl' "
                       "2>/dev/null | head -3")
        assert files.returncode == 0 and files.stdout.strip() == "", files.stdout
        # The image holds this run's bundle (a stale cached layer would not).
        sums = podman("run", "--rm", "--network", "none", "--entrypoint", "cat", image,
                      "/opt/dpfed/bundle.SHA256SUMS").stdout
        home = Path(env[1]["HOME"])
        assert sums == (home / "dpfed-bundles" / role / "SHA256SUMS").read_text()
    history = podman("history", "--no-trunc", "--format", "{{.CreatedBy}}",
                     f"{PREFIX}dpfed-site").stdout
    assert "--no-index" in history


def test_readme_round_in_containers_over_mutual_tls(demo):
    demo_dir, _, out, env = demo
    assert "SERVING" in out
    assert "hospital-a: healthy" in out
    assert "round demo-1: target Drug_1047_IC50" in out, out[-3000:]
    assert "TP53_mut" in out
    # The ledger read from the volume by a new container: each hospital spent 2.
    assert re.search(r"spent:\s+2\b", out), out[-2000:]
    for name in ("aggregator", *HOSPITALS):
        container = f"{PREFIX}dpfed-{name}"
        assert podman("exec", container, "id", "-u").stdout.strip() == "10001"
        state = json.loads(podman("inspect", container).stdout)[0]
        assert state["HostConfig"]["ReadonlyRootfs"] is True
        assert state["State"]["Status"] == "running"
        volume = json.loads(podman("volume", "inspect", container).stdout)[0]["Mountpoint"]
        stem = "aggregator" if name == "aggregator" else name
        db = Path(volume) / f"{stem}.sqlite"
        assert db.is_file() and db.stat().st_uid == 10001, sorted(Path(volume).iterdir())
    # Nothing was written into the party folders (mounted read-only).
    assert not list(demo_dir.glob("*/state"))
    assert not list(demo_dir.glob("hospital-*/*.sqlite"))


def _kill_and_wait_restart(container: str) -> None:
    before = json.loads(podman("inspect", container).stdout)[0]
    os.kill(before["State"]["Pid"], signal.SIGKILL)          # a crash, not a podman stop
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = json.loads(podman("inspect", container).stdout)[0]
        if (now["RestartCount"] > before["RestartCount"] and now["State"]["Status"] == "running"
                and now["State"]["Pid"] != before["State"]["Pid"]):
            return
        time.sleep(0.5)
    pytest.fail(f"{container} was not started again after SIGKILL: {now['State']}")


def test_killed_containers_come_back_with_their_state(demo):
    demo_dir, _, _, env = demo
    _kill_and_wait_restart(f"{PREFIX}dpfed-aggregator")
    health = _dpfed(env, demo_dir, "health", "--config", "coordinator/coordinator.toml",
                    "--wait", "120")
    assert health.returncode == 0, health.stderr
    result = _dpfed(env, demo_dir, "round", "result", "demo-1", "--config",
                    "coordinator/coordinator.toml")
    assert result.returncode == 0 and "TP53_mut" in result.stdout, result.stderr
    site = f"{PREFIX}dpfed-hospital-a"
    _kill_and_wait_restart(site)
    ledger = podman("exec", site, "dpfed", "site", "ledger", "--config",
                    "/etc/dpfed/site/site.toml")
    assert ledger.returncode == 0 and re.search(r"spent:\s+2\b", ledger.stdout), ledger.stdout
    # It dials in again: the aggregator lists all three connected.
    deadline = time.monotonic() + 60
    while True:
        sites = _dpfed(env, demo_dir, "sites", "list", "--json", "--config",
                       "coordinator/coordinator.toml")
        if sites.returncode == 0 and all(r.get("connected") for r in json.loads(sites.stdout)):
            break
        assert time.monotonic() < deadline, sites.stdout + sites.stderr
        time.sleep(1)
    assert len(json.loads(sites.stdout)) == 3
