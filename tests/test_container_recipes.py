"""Each role installed from this checkout into a fresh virtual environment, as
deploy/container/Containerfile.{site,aggregator} install it (dpfed[<role>], the role the recipe
checks its bundle is for) and the coordinator does (`pip install dpfed`), then the role's smoke
commands with that environment's `dpfed`. The images themselves are built from offline bundles
and run by tests/test_container_federation.py.

The site environment must not get the aggregator's PyMC (a hospital installs no fitting code),
and both must serve --help, check a config and run the image's HEALTHCHECK command's parser.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTAINER = ROOT / "deploy" / "container"


def _install_line(role: str) -> str:
    if role == "coordinator":        # deploy/README.md: `pip install dpfed`, no extra, no image
        return str(ROOT)
    text = (CONTAINER / f"Containerfile.{role}").read_text()
    match = re.search(r'b\["role"\] == "(\w+)"', text)
    assert match and match.group(1) == role
    assert "pip install --no-index --find-links . -r requirements.txt" in text
    return f"{ROOT}[{role}]"


@pytest.fixture(scope="module", params=["site", "aggregator", "coordinator"])
def venv(request, tmp_path_factory):
    role = request.param
    target = tmp_path_factory.mktemp(f"venv-{role}")
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    pip = subprocess.run([str(target / "bin" / "pip"), "install", "-q", _install_line(role)],
                         capture_output=True, text=True, timeout=1800, env=env)
    if pip.returncode != 0 and ("No matching distribution" in pip.stderr or
                                "Could not find a version" in pip.stderr):
        pytest.skip(f"no package index reachable for the {role} extra: {pip.stderr[-500:]}")
    assert pip.returncode == 0, pip.stderr[-3000:]
    # The build copies the source to /src and deletes it: the venv must not need the checkout.
    yield role, target
    shutil.rmtree(target, ignore_errors=True)


def _run(venv_dir: Path, *args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv_dir / "bin" / "dpfed"), *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd, env={"PATH": "/usr/bin:/bin",
                                                               "HOME": str(venv_dir)})


@pytest.mark.slow
def test_role_installs_and_its_smoke_commands_run(venv, tmp_path):
    role, target = venv
    python = str(target / "bin" / "python")
    # Only the role's extra: PyMC at the aggregator, never at a hospital.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(target)}     # no PYTHONPATH to the checkout
    has_pymc = subprocess.run([python, "-c", "import pymc"], capture_output=True,
                              cwd=tmp_path, env=env).returncode == 0
    assert has_pymc == (role == "aggregator")
    has_opendp = subprocess.run([python, "-c", "import opendp"], capture_output=True,
                                cwd=tmp_path, env=env).returncode == 0
    assert has_opendp == (role == "site")
    if role == "coordinator":
        # The core install starts rounds and chooses the bounds (round.toml without x_bound).
        assert subprocess.run([str(target / "bin" / "dpfed"), "data", "export", "--sites",
                               "a,b,c", "--out", str(tmp_path)], env=env,
                              capture_output=True).returncode == 0
        shutil.copy(ROOT / "deploy/three-hospitals/coordinator/round.toml", tmp_path)
        built = subprocess.run([python, "-c", (
            "import sys, tomllib; from coordinator.roundspec import build_round_spec\n"
            "s = build_round_spec(tomllib.load(open('round.toml', 'rb')), base_dir='.')\n"
            "assert s.x_bound > 0 and s.y_bound > 0\n"
            "assert not {'pymc', 'opendp', 'scipy'} & set(sys.modules)\n")],
            cwd=tmp_path, env=env, capture_output=True, text=True)
        assert built.returncode == 0, built.stderr
        assert _run(target, "round", "start", "--help").returncode == 0
        return
    # The installed package is used, not the checkout.
    where = subprocess.run([python, "-c", "import dpfed; print(dpfed.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=env).stdout
    assert str(target) in where
    assert _run(target, role, "serve", "--help").returncode == 0
    assert _run(target, "health", "--help").returncode == 0
    # A federation made with this environment's own dpfed, checked by the role's command.
    project = tmp_path / "project.toml"
    project.write_text('federation = "smoke"\nsites = ["hospital-a"]\ncoordinators = ["c"]\n'
                       '[aggregator]\naddress = "127.0.0.1:50051"\n')
    assert _run(target, "provision", "--project", str(project), "--out",
                str(tmp_path / "fed")).returncode == 0
    if role == "site":
        kit = tmp_path / "fed" / "sites" / "hospital-a"
        assert _run(target, "data", "export", "--sites", "hospital-a", "--out",
                    str(kit / "data")).returncode == 0
        config = kit / "site.toml"
        config.write_text(config.read_text().replace("data/CHANGE-ME.csv", "data/hospital-a.csv"))
        check = _run(target, "site", "check", "--config", str(config))
        assert check.returncode == 0, check.stderr
        assert "ok: nothing was released" in check.stdout
        # The image's HEALTHCHECK: no aggregator is running, so it reports it unreachable (5).
        assert _run(target, "health", "--config", str(config)).returncode == 5
    else:
        # The aggregator starts with the kit's config (TLS, CRL) and its HEALTHCHECK passes.
        kit = tmp_path / "fed" / "aggregator"
        config = kit / "aggregator.toml"
        config.write_text(config.read_text().replace('"0.0.0.0:50051"', '"127.0.0.1:0"'))
        proc = subprocess.Popen([str(target / "bin" / "dpfed"), "aggregator", "serve",
                                 "--config", str(config)], stderr=subprocess.PIPE, text=True,
                                env={"PATH": "/usr/bin:/bin", "HOME": str(target)})
        try:
            seen = ""
            while "listening on port" not in seen and proc.poll() is None:
                seen += proc.stderr.readline()
            port = re.search(r"listening on port (\d+)", seen)
            assert port, seen
            health = _run(target, "health", "--address", f"127.0.0.1:{port.group(1)}", "--tcp")
            assert health.returncode == 0, health.stderr
        finally:
            proc.terminate()
            proc.wait(60)
