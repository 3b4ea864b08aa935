"""deploy/README.md works as written: every ```sh block of it, in order, run by bash with real
processes on loopback (the aggregator and three site nodes in the background, as the README
starts them), from a copy of the source folder. Blocks marked ``<!-- skip-test: why -->`` are
not run (the PyPI installs: tests/test_container_recipes.py installs from the checkout).
Blocks marked ``<!-- test: GROUP -->`` are another path through the README, run as written by
their own test: ``bundle`` and ``offline`` (the offline install, tests/test_offline_bundle.py),
``containers-build`` and ``containers`` (the demo in containers,
tests/test_container_federation.py) and ``systemd`` (tests/test_systemd_units.py).

The only edit is the port: 50051 (in the README and in deploy/three-hospitals) becomes a free
port, so the test can run beside anything else. The commands come from the README itself, so
the README cannot drift from what is tested.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "deploy" / "README.md"
BLOCK = re.compile(r"(?:<!-- (skip-test|test: ([\w-]+))[^>]*-->\n)?```sh\n(.*?)```", re.S)
GROUPS = ("bundle", "offline", "containers-build", "containers", "systemd")


def readme_blocks(group: str | None = None) -> list[tuple[bool, str]]:
    """(skipped, text) of every ```sh block of the walk-through (``group`` None: the unmarked
    and the skip-test blocks), or of the blocks marked ``<!-- test: GROUP -->``, in order."""
    blocks = [(m.group(1) == "skip-test", m.group(2), m.group(3))
              for m in BLOCK.finditer(README.read_text())]
    assert {g for _, g, _ in blocks if g} <= set(GROUPS), "a block of an unknown test group"
    return [(skip, text) for skip, g, text in blocks if g == group]


def demo_env(home: Path, bin_dir: Path) -> dict[str, str]:
    """The README's shell: HOME in the test's folder, and on PATH a `dpfed` that is this
    checkout (as `pip install` would make it) and a `python3` that has venv and pip."""
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "dpfed").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m dpfed_apps.cli "$@"\n')
    (bin_dir / "dpfed").chmod(0o755)
    base = getattr(sys, "_base_executable", sys.executable)
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{base}" "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
           "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "LANG": "C.UTF-8"}
    for key in ("NUMBA_CACHE_DIR", "PYTENSOR_FLAGS", "TMPDIR"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_readme_has_the_steps_and_only_the_installs_are_skipped():
    blocks = readme_blocks()
    skipped = [text for skip, text in blocks if skip]
    assert len(skipped) == 1 and all("pip install" in line or not line.strip()
                                     for line in skipped[0].splitlines())
    # The other paths through the README, each run by its own test.
    assert "dpfed bundle --role site" in readme_blocks("bundle")[0][1]
    assert "pip install --no-index" in readme_blocks("offline")[0][1]
    script = "\n".join(text for skip, text in blocks if not skip)
    for command in ("dpfed data export", "dpfed csr --site", "dpfed provision --project",
                    "--csr", "dpfed aggregator serve", "dpfed health", "dpfed site check",
                    "dpfed site serve", "dpfed round start", "dpfed round result",
                    "dpfed site ledger"):
        assert command in script, command
    # Every round.toml key the loader accepts is documented in the README's table.
    from coordinator.roundspec import FIT_KEYS, PUBLIC_KEYS, ROUND_KEYS
    text = README.read_text()
    for key in ROUND_KEYS - {"public", "fit"}:
        assert f"`{key}`" in text, key
    for key in PUBLIC_KEYS | FIT_KEYS:
        assert key in text, key


def _copy_source(dst: Path, port: int) -> None:
    """The parts of the source folder the README uses, with the demo port replaced."""
    shutil.copytree(ROOT / "deploy", dst / "deploy")
    for path in (dst / "deploy").rglob("*"):
        if path.is_file() and path.suffix in (".toml", ".md"):
            path.write_text(path.read_text().replace("50051", str(port)))


@pytest.mark.slow
def test_deploy_readme_runs_as_written(tmp_path):
    port = free_port()
    src, home, bin_dir = tmp_path / "src", tmp_path / "home", tmp_path / "bin"
    for d in (src, home, bin_dir):
        d.mkdir()
    _copy_source(src, port)
    script = "\n".join(text for skip, text in readme_blocks() if not skip).replace("50051", str(port))
    env = demo_env(home, bin_dir)
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=src, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    demo = home / "dpfed-demo"
    try:
        out, _ = proc.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail("the README's commands did not finish in 20 minutes:\n" + out[-4000:] +
                    _logs(demo))
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)     # anything the README's `kill` missed
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, out[-6000:] + _logs(demo)
    # What the README says each step shows.
    assert "SERVING" in out
    assert "ok: nothing was released" in out
    assert "round demo-1: target Drug_1047_IC50" in out, out[-3000:]
    assert "TP53_mut" in out
    assert re.search(r"spent:\s+2\b", out), out[-2000:]
    # The production path: the CA's folder never held a party's private key.
    federation = demo / "federation"
    assert [p.relative_to(federation) for p in federation.rglob("*.key")] == [Path("ca/ca.key")]
    for party in ("hospital-a", "hospital-b", "hospital-c", "coordinator"):
        key = (demo / party / "keys" / f"{party}.key").read_bytes()
        body = b"".join(key.splitlines()[1:-1])
        for f in federation.rglob("*"):
            if f.is_file():
                assert body not in b"".join(f.read_bytes().splitlines()), f
    # The data files are the bundled data's, reproducibly.
    assert (demo / "hospital-a" / "data" / "hospital-a.csv").read_text() == \
        (demo / "exported" / "hospital-a.csv").read_text()


def _logs(demo: Path) -> str:
    return "".join(f"\n--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-30:])
                   for p in sorted(demo.glob("*.log")))
