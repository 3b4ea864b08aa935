"""dpfed bundle: every wheel one role needs, with checksums, for an install with no network."""

from __future__ import annotations

import sys

from dpfed import exitcodes
from dpfed_apps.commands import add_command

ROLES = {"site": ("site",), "aggregator": ("aggregator",), "coordinator": ()}

EPILOG = """\
For hospitals (and aggregators) whose machines reach no package index: on a machine that
reaches PyPI (or a mirror, --index-url), `dpfed bundle` builds dpfed's wheel from its source
folder and gathers, with pip, the wheels of every dependency of the role's extra for the
target Python and platform. Carry the folder over; there, the two lines of its INSTALL.txt
check every file and install exactly those wheels, asking no index:

  sha256sum -c SHA256SUMS
  pip install --no-index --find-links . -r requirements.txt

(run in the folder, with the target virtual environment active). requirements.txt pins every
wheel by version and SHA-256 hash, so pip installs nothing else and refuses a changed file.
The folder is also the build context of the images in deploy/container (deploy/README.md).

The target is this interpreter and machine unless --python-version or --platform say
otherwise; then pip takes wheels only (a package published only as source cannot be built
for another platform) and the folder is for that target alone.

examples:
  dpfed bundle --role site --out bundle-site
      bundle-site/*.whl           dpfed's wheel and its dependencies' (dpfed[site]: no PyMC)
      bundle-site/requirements.txt  the exact set, pinned, with hashes
      bundle-site/SHA256SUMS      checksums of every file (sha256sum -c)
      bundle-site/INSTALL.txt     the two-line install, the target, the sizes
      bundle-site/bundle.json     the same as data (role, target, every wheel and its hash)
  dpfed bundle --role aggregator --out bundle-aggregator --python-version 3.12 \\
      --platform manylinux_2_28_x86_64
      for a CPython 3.12 machine with glibc 2.28 or newer (RHEL 8 and later)
  dpfed bundle --role coordinator --extra console --out bundle-coordinator --json

exit codes: 0 ok, 1 pip failed (e.g. no wheel for the target), 2 bad arguments or --out
            not empty, 5 the package index cannot be reached
"""

# pip's words when it could not reach the index (urllib3, socket and DNS errors).
NETWORK_ERRORS = ("NewConnectionError", "Failed to establish a new connection",
                  "Temporary failure in name resolution", "Name or service not known",
                  "Network is unreachable", "No route to host", "Connection refused",
                  "ConnectTimeoutError", "Connection to", "timed out", "Max retries exceeded",
                  "ProxyError", "ConnectionResetError", "RemoteDisconnected",
                  "Could not fetch URL")
MANYLINUX_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
# Never copied from the source folder to build dpfed's wheel: VCS, environments, earlier
# builds (a stale build/lib would put deleted modules into the wheel), caches, results.
SKIP_TOP = {".git", ".venv", "venv", "build", "dist", "results", "node_modules", ".tox"}
SKIP_ANY = ("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache", ".hypothesis", "*.whl",
            "*.sqlite", "*.db")


class BundleError(Exception):
    """A bundle could not be made; ``code`` is the exit code."""

    def __init__(self, message: str, code: int = exitcodes.ERROR):
        super().__init__(message)
        self.code = code


def source_folder():
    """The dpfed source folder this dpfed runs from (a checkout or an editable install), or
    None when it runs from an installed wheel."""
    from pathlib import Path
    import tomllib

    import dpfed_apps
    root = Path(dpfed_apps.__file__).resolve().parents[1]
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None
    return root if project.get("name") == "dpfed" else None


def _pip(args: list[str], what: str) -> str:
    """Run ``python -m pip ARGS`` (this interpreter's pip); its output, or BundleError."""
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode == 0:
        return proc.stdout
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if "No module named pip" in proc.stdout:
        raise BundleError(f"{sys.executable} has no pip: a bundle is gathered with pip")
    network = [line for line in lines if any(w in line for w in NETWORK_ERRORS)]
    if network:
        import re
        reason = re.search(r"\[Errno -?\d+\] [^'\")]+|Failed to resolve '[^']+'|timed out",
                           network[-1])
        raise BundleError(
            f"{what}: the package index cannot be reached "
            f"({reason.group(0) if reason else network[-1].strip()[:300]}).\n"
            "A bundle is made where PyPI or a mirror (--index-url) can be reached; carry the "
            "folder to the offline machine", exitcodes.UNAVAILABLE)
    missing = [line for line in lines if "No matching distribution found" in line]
    tail = "\n".join("  " + line for line in lines[-15:])
    if missing:
        raise BundleError(f"{what}: {missing[-1].split('ERROR: ', 1)[-1].strip()} for the "
                          f"target (pip's last lines below). For another Python or platform "
                          f"only wheels can be taken: is there one?\n{tail}")
    raise BundleError(f"{what}: pip failed (exit {proc.returncode}):\n{tail}")


def _copy_source(src, dst, out) -> None:
    import fnmatch
    import shutil
    from pathlib import Path

    out = Path(out).resolve()

    def ignore(folder, names):
        skip = {n for n in names if any(fnmatch.fnmatch(n, p) for p in SKIP_ANY)}
        if Path(folder).resolve() == src:
            skip |= SKIP_TOP & set(names)
        return skip | {n for n in names if (Path(folder) / n).resolve() == out}

    shutil.copytree(src, dst, ignore=ignore, symlinks=True)


def _wheel_fields(name: str) -> tuple[str, str, list[str]]:
    """(project, version, platform tags) of a wheel's file name (PEP 427)."""
    parts = name[:-len(".whl")].split("-")
    project, version, platforms = parts[0], parts[1], parts[-1].split(".")
    return project.lower().replace("_", "-").replace(".", "-"), version, platforms


def min_glibc(wheels: list[str]) -> tuple[int, int] | None:
    """The oldest glibc every wheel runs on: each wheel needs the least of its manylinux tags,
    the folder the most of those. None if no wheel is tied to glibc."""
    import re

    need = None
    for name in wheels:
        versions = []
        for tag in _wheel_fields(name)[2]:
            match = re.match(r"manylinux_(\d+)_(\d+)_", tag)
            legacy = tag.split("_", 1)[0]
            if match:
                versions.append((int(match.group(1)), int(match.group(2))))
            elif legacy in MANYLINUX_LEGACY:
                versions.append(MANYLINUX_LEGACY[legacy])
        if versions:
            need = max(need or (0, 0), min(versions))
    return need


def _sha256(path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _provided_extras(wheel) -> set[str]:
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    return {line.split(":", 1)[1].strip() for line in text.splitlines()
            if line.startswith("Provides-Extra:")}


def expand_platforms(platforms) -> list[str]:
    """The wheel platform tags a target of ``platforms`` accepts: a manylinux_2_Y tag means a
    glibc 2.Y machine, which also runs every older manylinux wheel (pip expands only the legacy
    manylinux2014/2010 names by itself)."""
    import re

    legacy = {v: k for k, v in MANYLINUX_LEGACY.items()}
    out: list[str] = []
    for tag in platforms:
        match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", tag)
        expanded = [tag]
        if match:
            minor, arch = int(match.group(1)), match.group(2)
            expanded = [f"manylinux_2_{m}_{arch}" for m in range(minor, 4, -1)]
            expanded += [f"{legacy[(2, m)]}_{arch}" for m in range(minor, 4, -1)
                         if (2, m) in legacy]
        out += [t for t in expanded if t not in out]
    return out


def host_platform() -> str:
    import platform
    import sysconfig

    libc, version = platform.libc_ver()
    plat = sysconfig.get_platform()
    return f"{plat} (this machine: {libc} {version})" if libc else f"{plat} (this machine)"


def make_bundle(role: str, out, *, extras=(), python_version=None, platforms=(), source=None,
                wheel=None, index_url=None, force=False, log=print) -> dict:
    """Build the bundle of ``role`` into ``out``; its manifest (bundle.json) as a dict.
    Raises BundleError. The folder appears complete or not at all (built beside it, renamed)."""
    import datetime
    import json
    import os
    import shutil
    import tempfile
    import time
    from pathlib import Path

    from dpfed import __version__

    started = time.monotonic()
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    python_version = python_version or here
    cross = bool(platforms) or python_version != here
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not force:
            raise BundleError(f"{out} exists and is not empty (--force replaces a bundle)",
                              exitcodes.USAGE)
        if not (out / "bundle.json").is_file():
            raise BundleError(f"{out} is not a bundle (no bundle.json): not replacing it",
                              exitcodes.USAGE)
    if wheel is None:
        source = Path(source).resolve() if source else source_folder()
        if source is None:
            raise BundleError("this dpfed runs from an installed wheel, not a source folder: "
                              "give --source DIR (a dpfed checkout) or --wheel FILE",
                              exitcodes.USAGE)
        if not (source / "pyproject.toml").is_file():
            raise BundleError(f"{source} has no pyproject.toml: not a dpfed source folder",
                              exitcodes.USAGE)
    elif not Path(wheel).is_file():
        raise BundleError(f"--wheel {wheel}: no such file", exitcodes.USAGE)
    out.parent.mkdir(parents=True, exist_ok=True)
    index = ["--index-url", index_url] if index_url else []
    work = Path(tempfile.mkdtemp(prefix=".dpfed-bundle-", dir=out.parent))
    try:
        stage = work / "bundle"
        stage.mkdir()
        if wheel is None:
            log(f"building dpfed's wheel from {source}")
            _copy_source(source, work / "src", out)
            _pip(["wheel", "--no-deps", "--quiet", *index, "--wheel-dir", str(work / "dist"),
                  str(work / "src")], "building dpfed's wheel")
            wheel = next((work / "dist").glob("dpfed-*.whl"))
        wheel = Path(wheel).resolve()
        project, version, _ = _wheel_fields(wheel.name)
        if project != "dpfed":
            raise BundleError(f"{wheel.name} is not a dpfed wheel", exitcodes.USAGE)
        wanted = sorted({*ROLES[role], *extras})
        unknown = set(wanted) - _provided_extras(wheel)
        if unknown:
            raise BundleError(f"dpfed {version} has no extra {', '.join(sorted(unknown))} "
                              f"(it has: {', '.join(sorted(_provided_extras(wheel)))})",
                              exitcodes.USAGE)
        spec = f"dpfed[{','.join(wanted)}]" if wanted else "dpfed"
        target = (f"CPython {python_version} on "
                  f"{', '.join(platforms) if platforms else host_platform()}")
        log(f"gathering the wheels of {spec}=={version} for {target}")
        requirement = f"{wheel}[{','.join(wanted)}]" if wanted else str(wheel)
        if cross:
            # Another target: wheels only (pip cannot build a source package for it).
            plat = [a for p in expand_platforms(platforms) for a in ("--platform", p)]
            _pip(["download", "--quiet", *index, "--only-binary=:all:", "--implementation", "cp",
                  "--python-version", python_version, *plat, "--dest", str(stage), requirement],
                 f"gathering the wheels of {spec}")
        else:
            # This machine: pip takes the wheels it would install here and builds a wheel of
            # any dependency published only as source.
            _pip(["wheel", "--quiet", *index, "--wheel-dir", str(stage), requirement],
                 f"gathering the wheels of {spec}")
        wheels = sorted(p.name for p in stage.glob("*.whl"))
        if not any(_wheel_fields(w)[0] == "dpfed" for w in wheels):
            shutil.copy2(wheel, stage / wheel.name)
            wheels = sorted(p.name for p in stage.glob("*.whl"))
        files = [{"file": w, "project": _wheel_fields(w)[0], "version": _wheel_fields(w)[1],
                  "sha256": _sha256(stage / w), "bytes": (stage / w).stat().st_size}
                 for w in wheels]
        seen: dict[str, str] = {}
        for f in files:
            if seen.setdefault(f["project"], f["file"]) != f["file"]:
                raise BundleError(f"two wheels of {f['project']}: {seen[f['project']]} and "
                                  f"{f['file']}")
        glibc = min_glibc(wheels)
        manifest = {
            "format": 1, "role": role, "requirement": f"{spec}=={version}",
            "dpfed_version": version, "extras": wanted, "python_version": python_version,
            "implementation": "cp",
            "platforms": list(platforms) or None, "platform": (", ".join(platforms) if platforms
                                                              else host_platform()),
            "min_glibc": ".".join(map(str, glibc)) if glibc else None,
            "made": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "made_with": f"dpfed bundle (pip, Python {here})",
            "bytes": sum(f["bytes"] for f in files), "wheels": files,
        }
        _write_requirements(stage / "requirements.txt", manifest)
        if not cross:
            # The folder installs on its own here: resolve it with no index, as the target will.
            _pip(["install", "--dry-run", "--ignore-installed", "--quiet", "--no-index",
                  "--find-links", str(stage), "-r", str(stage / "requirements.txt")],
                 "checking that the bundle installs with no index")
        (stage / "bundle.json").write_text(json.dumps(manifest, indent=2) + "\n")
        (stage / "INSTALL.txt").write_text(install_text(manifest))
        sums = [f"{_sha256(stage / name)}  {name}" for name in
                [*wheels, "requirements.txt", "bundle.json", "INSTALL.txt"]]
        (stage / "SHA256SUMS").write_text("\n".join(sums) + "\n")
        for path in stage.iterdir():
            path.chmod(0o644)
        stage.chmod(0o755)
        if out.exists():
            shutil.rmtree(out) if any(out.iterdir()) else out.rmdir()
        os.replace(stage, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    manifest["seconds"] = round(time.monotonic() - started, 1)
    return manifest


def _write_requirements(path, manifest) -> None:
    lines = [f"# The exact wheels of this bundle ({manifest['requirement']}, CPython "
             f"{manifest['python_version']}, {manifest['platform']}),",
             "# pinned with their SHA-256: pip installs these and nothing else, and refuses a "
             "changed file.",
             "#   pip install --no-index --find-links . -r requirements.txt"]
    for f in manifest["wheels"]:
        name = manifest["requirement"].split("==")[0] if f["project"] == "dpfed" else f["project"]
        lines.append(f"{name}=={f['version']} --hash=sha256:{f['sha256']}")
    path.write_text("\n".join(lines) + "\n")


INSTALL_LINES = ("sha256sum -c SHA256SUMS",
                 "pip install --no-index --find-links . -r requirements.txt")


def install_text(manifest: dict) -> str:
    mb = manifest["bytes"] / 1e6
    command = "round" if manifest["role"] == "coordinator" else manifest["role"]
    glibc = (f"; needs glibc {manifest['min_glibc']} or newer" if manifest["min_glibc"] else "")
    return (
        f"dpfed {manifest['dpfed_version']}, offline bundle of the {manifest['role']} "
        f"({manifest['requirement']})\n"
        f"for CPython {manifest['python_version']} on {manifest['platform']}{glibc}\n"
        f"{len(manifest['wheels'])} wheels, {mb:.1f} MB, made {manifest['made']}\n\n"
        f"Install with no network: in this folder, with the virtual environment to install into\n"
        f"active (python{manifest['python_version']} -m venv /opt/dpfed/venv && "
        f". /opt/dpfed/venv/bin/activate):\n\n"
        f"{INSTALL_LINES[0]}\n{INSTALL_LINES[1]}\n\n"
        f"The first line checks every file; the second installs exactly the wheels of\n"
        f"requirements.txt (pinned, with their hashes) and asks no package index.\n"
        f"Then: dpfed --version; dpfed {command} --help\n")


def run(args) -> int:
    import json

    platforms = tuple(args.platform or ())
    if args.python_version and not _is_version(args.python_version):
        print(f"dpfed bundle: --python-version {args.python_version}: give MAJOR.MINOR, "
              "e.g. 3.11", file=sys.stderr)
        return exitcodes.USAGE
    for p in platforms:
        if not p or not all(c.isalnum() or c == "_" for c in p):
            print(f"dpfed bundle: --platform {p!r}: give a wheel platform tag such as "
                  "manylinux_2_28_x86_64", file=sys.stderr)
            return exitcodes.USAGE

    def log(message):
        print(f"dpfed bundle: {message}", file=sys.stderr)

    try:
        manifest = make_bundle(args.role, args.out, extras=args.extra or (),
                               python_version=args.python_version, platforms=platforms,
                               source=args.source, wheel=args.wheel, index_url=args.index_url,
                               force=args.force, log=log)
    except BundleError as exc:
        print(f"dpfed bundle: {exc}", file=sys.stderr)
        return exc.code
    if args.json:
        print(json.dumps({"out": str(args.out), **manifest}, indent=2))
        return exitcodes.OK
    print(f"{args.out}: {manifest['requirement']} for CPython {manifest['python_version']} on "
          f"{manifest['platform']}")
    print(f"  {len(manifest['wheels'])} wheels, {manifest['bytes'] / 1e6:.1f} MB in "
          f"{manifest['seconds']} s; requirements.txt (pinned, hashed), SHA256SUMS, "
          "INSTALL.txt, bundle.json")
    print(f"install with no network (in {args.out}, with the target virtual environment active):")
    for line in INSTALL_LINES:
        print(f"  {line}")
    return exitcodes.OK


def _is_version(text: str) -> bool:
    major, _, minor = text.partition(".")
    return major == "3" and minor.isdigit()


def register(subparsers) -> None:
    p = add_command(subparsers, "bundle", __doc__,
                    help="the wheels of a role, with checksums, for an offline install",
                    epilog=EPILOG)
    p.add_argument("--role", required=True, choices=sorted(ROLES),
                   help="site: dpfed[site]; aggregator: dpfed[aggregator]; coordinator: dpfed")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the bundle's folder: new or empty (--force replaces a bundle)")
    p.add_argument("--extra", action="append", metavar="NAME",
                   help="another extra of dpfed to add, e.g. console (repeat for more)")
    p.add_argument("--python-version", metavar="X.Y",
                   help="the target's Python (default: this interpreter's)")
    p.add_argument("--platform", action="append", metavar="TAG",
                   help="the target's wheel platform tag, e.g. manylinux_2_28_x86_64 (repeat "
                        "for more; default: this machine's)")
    p.add_argument("--source", metavar="DIR",
                   help="the dpfed source folder to build dpfed's wheel from (default: the one "
                        "this dpfed runs from)")
    p.add_argument("--wheel", metavar="FILE", help="a built dpfed wheel to bundle instead")
    p.add_argument("--index-url", metavar="URL",
                   help="the package index (default: pip's configuration, normally PyPI)")
    p.add_argument("--force", action="store_true", help="replace the bundle in --out")
    p.add_argument("--json", action="store_true", help="print the manifest as one JSON object")
    p.set_defaults(func=run)
