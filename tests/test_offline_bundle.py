"""`dpfed bundle` and the offline install of deploy/README.md, run as written.

The README's ``bundle`` block makes a site bundle on this machine (pip reaches the package
index, as CI's does); its ``offline`` block installs it into a fresh virtual environment with
every package index unreachable (PIP_INDEX_URL at a closed port of 127.0.0.1, no pip
configuration files, no find-links but the bundle) and runs `dpfed site --help` from it. The
installed environment then has dpfed[site] and nothing of the aggregator's, runs from
site-packages and checks a site kit; a changed wheel is refused by both install lines; and a
bundle asked for with no index reachable fails, saying so, with exit code 5.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpfed import exitcodes
from dpfed_apps.commands import bundle
from tests.test_deploy_readme import demo_env, readme_blocks

ROOT = Path(__file__).resolve().parents[1]
UNREACHABLE_INDEX = "http://127.0.0.1:9/simple"   # the discard port: connection refused


def offline_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with no way to a package index: pip's configuration files ignored (this machine's
    name local mirrors and find-links), PIP_* variables dropped, the index a closed port; and
    no PYTHONPATH to the checkout (the hospital has none: pip would take it as installed)."""
    env = {k: v for k, v in env.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": UNREACHABLE_INDEX,
            "PIP_RETRIES": "0", "PIP_TIMEOUT": "5", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _bash(script: str, env: dict, cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The README's two blocks: the bundle made here, then installed with no index."""
    tmp = tmp_path_factory.mktemp("offline")
    home, bin_dir = tmp / "home", tmp / "bin"
    home.mkdir()
    env = demo_env(home, bin_dir)
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONFIG_FILE",
                "PIP_CERT", "SSL_CERT_FILE", "PIP_DEFAULT_TIMEOUT"):
        if key in os.environ:                 # this machine's way to its package index
            env[key] = os.environ[key]
    (make,), (install,) = readme_blocks("bundle"), readme_blocks("offline")
    made = _bash(make[1], env, ROOT, 1800)
    if made.returncode == exitcodes.UNAVAILABLE and os.environ.get("CI") != "true":
        pytest.skip("no package index reachable to make the bundle:\n" + made.stdout[-800:])
    assert made.returncode == 0, made.stdout[-4000:]
    done = _bash(install[1], offline_env(env), tmp, 900)
    assert done.returncode == 0, done.stdout[-4000:]
    return home, made.stdout, done.stdout


@pytest.mark.slow
def test_readme_bundle_installs_with_no_index_and_runs_the_site_command(installed):
    home, made, out = installed
    folder, venv = home / "dpfed-site-bundle", home / "dpfed-site"
    # The bundle says how to install it, and its files are those its checksums list.
    assert "sha256sum -c SHA256SUMS" in made and "--no-index" in made
    text = (folder / "INSTALL.txt").read_text()
    assert all(line in text.splitlines() for line in bundle.INSTALL_LINES)
    listed = {line.split()[1] for line in (folder / "SHA256SUMS").read_text().splitlines()}
    assert listed == {p.name for p in folder.iterdir()} - {"SHA256SUMS"}
    assert out.count(": OK") == len(listed)
    manifest = json.loads((folder / "bundle.json").read_text())
    assert manifest["role"] == "site" and manifest["requirement"].startswith("dpfed[site]==")
    assert manifest["python_version"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    projects = {w["project"] for w in manifest["wheels"]}
    assert {"dpfed", "numpy", "grpcio", "cryptography", "opendp", "pyarrow"} <= projects
    assert not {"pymc", "pytensor", "scipy", "numba", "arviz"} & projects
    requirements = [line for line in (folder / "requirements.txt").read_text().splitlines()
                    if line and not line.startswith("#")]
    assert len(requirements) == len(manifest["wheels"])
    assert all("==" in r and "--hash=sha256:" in r for r in requirements)
    # `dpfed site --help` ran from the new environment, which holds the bundle and no more.
    assert "What a hospital runs" in out
    python = venv / "bin" / "python"
    clean = {"PATH": "/usr/bin:/bin", "HOME": str(home)}     # no PYTHONPATH to the checkout
    where = subprocess.run([str(python), "-c", "import dpfed; print(dpfed.__file__)"],
                           capture_output=True, text=True, cwd=home, env=clean)
    assert str(venv) in where.stdout and "site-packages" in where.stdout
    frozen = subprocess.run([str(python), "-m", "pip", "freeze", "--all"], capture_output=True,
                            text=True, env=clean).stdout.lower()
    for w in manifest["wheels"]:
        assert f"{w['project']}=={w['version']}" in frozen.replace("_", "-"), w["project"]
    assert "pymc" not in frozen


@pytest.mark.slow
def test_installed_site_checks_its_kit_with_no_checkout(installed, tmp_path):
    home, _, _ = installed
    dpfed = str(home / "dpfed-site" / "bin" / "dpfed")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}

    def run(*args):
        return subprocess.run([dpfed, *args], capture_output=True, text=True, cwd=tmp_path,
                              env=env, timeout=300)

    (tmp_path / "project.toml").write_text(
        'federation = "offline"\nsites = ["hospital-a"]\ncoordinators = ["c"]\n'
        '[aggregator]\naddress = "127.0.0.1:50051"\n')
    assert run("provision", "--project", "project.toml", "--out", "fed").returncode == 0
    kit = tmp_path / "fed" / "sites" / "hospital-a"
    exported = run("data", "export", "--sites", "hospital-a", "--out", str(kit / "data"))
    assert exported.returncode == 0, exported.stderr
    config = kit / "site.toml"
    config.write_text(config.read_text().replace("data/CHANGE-ME.csv", "data/hospital-a.csv"))
    check = run("site", "check", "--config", str(config))
    assert check.returncode == 0, check.stderr
    assert "ok: nothing was released" in check.stdout


@pytest.mark.slow
def test_a_changed_wheel_is_refused_by_both_lines(installed, tmp_path):
    home, _, _ = installed
    folder = tmp_path / "bundle"
    shutil.copytree(home / "dpfed-site-bundle", folder)
    wheel = next(folder.glob("threadpoolctl-*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    check = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=folder,
                           capture_output=True, text=True)
    assert check.returncode != 0 and wheel.name in check.stdout + check.stderr
    # Skipping the check does not help: pip compares each wheel with its pinned hash.
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv",
                    str(tmp_path / "venv")], check=True, timeout=300)
    pip = subprocess.run([str(tmp_path / "venv" / "bin" / "pip"), "install", "--no-index",
                          "--find-links", ".", "-r", "requirements.txt"], cwd=folder,
                         capture_output=True, text=True, timeout=600,
                         env=offline_env({"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}))
    assert pip.returncode != 0
    assert "DO NOT MATCH THE HASHES" in pip.stderr and "threadpoolctl" in pip.stderr


@pytest.mark.slow
def test_no_index_reachable_fails_saying_so(tmp_path):
    env = offline_env({"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    env["PIP_RETRIES"] = "1"                   # one retry: pip then names the failed connection
    out = subprocess.run([sys.executable, "-m", "dpfed_apps.cli", "bundle", "--role", "site",
                          "--out", str(tmp_path / "b")], capture_output=True, text=True,
                         env={**env, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert out.returncode == exitcodes.UNAVAILABLE, out.stderr
    assert "the package index cannot be reached" in out.stderr
    assert "Connection refused" in out.stderr
    assert not (tmp_path / "b").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dpfed-bundle")] == []


def test_bad_arguments_exit_2_and_leave_nothing(tmp_path, capsys):
    from dpfed_apps import cli

    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    for argv, words in [
        (["--role", "site", "--out", str(full)], "not empty"),
        (["--role", "site", "--out", str(full), "--force"], "not a bundle"),
        (["--role", "site", "--out", str(tmp_path / "b"), "--python-version", "3"], "MAJOR.MINOR"),
        (["--role", "site", "--out", str(tmp_path / "b"), "--platform", "linux x86"],
         "platform tag"),
        (["--role", "site", "--out", str(tmp_path / "b"), "--wheel", str(tmp_path / "no.whl")],
         "no such file"),
        (["--role", "site", "--out", str(tmp_path / "b"), "--source", str(tmp_path)],
         "no pyproject.toml"),
    ]:
        assert cli.main(["bundle", *argv]) == exitcodes.USAGE, argv
        assert words in capsys.readouterr().err, argv
    assert (full / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


def test_the_source_folder_is_this_checkout_and_the_copy_skips_builds(tmp_path):
    assert bundle.source_folder() == ROOT
    src = tmp_path / "src"
    (src / "build" / "lib" / "stale").mkdir(parents=True)
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("")
    (src / "pkg" / "build").mkdir()                 # only the top-level build/ is skipped
    (src / "dpfed.egg-info").mkdir()
    (src / "out").mkdir()
    (src / "pyproject.toml").write_text("")
    bundle._copy_source(src.resolve(), tmp_path / "copy", src / "out")
    copied = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*"))
    assert copied == ["pkg", "pkg/build", "pkg/mod.py", "pyproject.toml"]


def test_min_glibc_is_the_newest_of_each_wheels_oldest_tag():
    wheels = ["numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
              "grpcio-1.85.3-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
              "cryptography-50.0.2-cp311-abi3-manylinux_2_34_x86_64.whl",
              "wrapt-2.5.2-cp311-cp311-manylinux1_x86_64.manylinux_2_28_x86_64.whl",
              "pycparser-3.12-py3-none-any.whl"]
    assert bundle.min_glibc(wheels) == (2, 34)
    assert bundle.min_glibc(wheels[1:2]) == (2, 17)
    assert bundle.min_glibc(wheels[3:]) == (2, 5)
    assert bundle.min_glibc(["pycparser-3.12-py3-none-any.whl"]) is None
    assert bundle._wheel_fields("typing_extensions-4.16.0-py3-none-any.whl")[:2] == \
        ("typing-extensions", "4.16.0")


def test_a_manylinux_target_takes_every_older_manylinux_wheel():
    tags = bundle.expand_platforms(["manylinux_2_28_x86_64"])
    assert tags[0] == "manylinux_2_28_x86_64" and tags.count("manylinux_2_17_x86_64") == 1
    assert {"manylinux_2_5_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64",
            "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    assert bundle.expand_platforms(["win_amd64", "manylinux2014_aarch64"]) == \
        ["win_amd64", "manylinux2014_aarch64"]


def _other_python() -> str | None:
    """A CPython of another minor version than this one, with venv (pyenv's, Debian's)."""
    here = sys.version_info[:2]
    for minor in (12, 13, 11, 10):
        if (3, minor) == here:
            continue
        for path in (shutil.which(f"python3.{minor}"),
                     *Path.home().glob(f".pyenv/versions/3.{minor}.*/bin/python3.{minor}")):
            if path and subprocess.run([str(path), "-c", "import venv, ensurepip"],
                                       capture_output=True).returncode == 0:
                return str(path)
    return None


@pytest.mark.slow
def test_a_bundle_for_another_python_and_platform_installs_there(tmp_path):
    other = _other_python()
    if other is None:
        pytest.skip("no CPython of another minor version with venv on this machine")
    version = subprocess.run([other, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()
    out = subprocess.run([sys.executable, "-m", "dpfed_apps.cli", "bundle", "--role",
                          "coordinator", "--python-version", version, "--platform",
                          "manylinux_2_28_x86_64", "--out", str(tmp_path / "b"), "--json"],
                         capture_output=True, text=True, timeout=1800,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode == exitcodes.UNAVAILABLE and os.environ.get("CI") != "true":
        pytest.skip("no package index reachable: " + out.stderr[-500:])
    assert out.returncode == 0, out.stderr[-3000:]
    manifest = json.loads(out.stdout)
    tag = "cp" + version.replace(".", "")
    assert manifest["python_version"] == version
    assert tuple(map(int, manifest["min_glibc"].split("."))) <= (2, 28)
    assert any(tag in w["file"] for w in manifest["wheels"])      # numpy, grpcio: its ABI
    subprocess.run([other, "-m", "venv", str(tmp_path / "venv")], check=True, timeout=300)
    env = offline_env({"PATH": f"{tmp_path / 'venv' / 'bin'}:/usr/bin:/bin",
                       "HOME": str(tmp_path)})
    done = _bash("\n".join(bundle.INSTALL_LINES) + "\ndpfed choose-bounds --n 200 --d 3 "
                 "--epsilon 1 --datasets 2 --noise-draws 2 --json", env, tmp_path / "b", 900)
    assert done.returncode == 0, done.stdout[-3000:]
    assert '"omega_x"' in done.stdout
