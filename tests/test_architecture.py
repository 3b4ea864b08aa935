"""One way through the code (docs/architecture.md): the import-linter contracts of
pyproject.toml hold, and they do fail when the code breaks them.

Contracts: applications (dpfed_apps, evaluation) over the roles (site_node | aggregator |
coordinator, independent of each other) over the fit (posterior) over the core (dpfed); the
core and the coordinator import nothing beyond the core dependencies; the site never imports
the fitting stack (posterior included); the aggregator never imports the certificate
authority (dpfed_apps.ca); the console is a gRPC client of the aggregator only (no aggregator
or site code, no sqlite3, no fitting stack, no posterior).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dpfed", "dpfed_apps", "site_node", "aggregator", "coordinator", "evaluation",
            "posterior")
CONTRACT_NAMES = {
    "layers": "Applications over roles over the core; roles independent of each other",
    "core-deps": "The core and the coordinator need only the core dependencies",
    "site-no-fitting": "A site install never imports the fitting stack",
    "aggregator-no-ca": "The running aggregator never imports the certificate-authority tooling",
    "console-is-a-client": "The console talks to the aggregator only over gRPC as the coordinator",
}


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` over the packages in ``root`` with ``root``'s pyproject.toml, in a fresh
    interpreter whose import path starts at ``root`` (the packages analysed are root's)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p))
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_import_contracts_hold():
    run = _lint_imports(ROOT)
    out = _flat(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    for name in CONTRACT_NAMES.values():
        assert name in out
    assert "5 kept, 0 broken" in out


def test_import_contracts_fail_on_a_violation(tmp_path):
    """A copy of the tree with one forbidden import per contract: lint-imports exits non-zero
    and reports each contract broken, naming the offending import."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.csv.gz", "*.csv"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    violations = {
        "dpfed/statistics.py": "import site_node.release  # core -> role",
        "site_node/release.py": "import scipy.stats  # site -> fitting stack",
        "aggregator/identity.py": "import dpfed_apps.ca  # running aggregator -> CA tooling",
        "coordinator/client.py": "import aggregator.store  # role -> role",
        "dpfed_apps/console/data.py": "import sqlite3  # console -> the aggregator's database",
        # The fit is a layer of its own, below the roles: the core, a site install, the
        # console and (through its fitting stack) the coordinator never import it.
        "dpfed/noise.py": "import posterior.fit  # core -> the fit",
        "coordinator/roundspec.py": "import posterior  # coordinator -> the fit -> SciPy",
        "site_node/config.py": "import posterior  # site -> the fit",
        "dpfed_apps/console/plot.py": "import posterior.quality  # console -> the fit",
    }
    for path, line in violations.items():
        with open(tmp_path / path, "a", encoding="utf-8") as fh:
            fh.write(f"\n{line}\n")
    run = _lint_imports(tmp_path)
    out = _flat(run.stdout)
    assert run.returncode != 0, out
    for name in CONTRACT_NAMES.values():
        assert f"{name}" in out
    assert "0 kept, 5 broken" in out, out
    assert "dpfed.statistics -> site_node.release" in out
    assert "site_node.release -> scipy" in out
    assert "aggregator.identity -> dpfed_apps.ca" in out
    assert "coordinator.client -> aggregator.store" in out
    assert "dpfed_apps.console.data -> sqlite3" in out
    assert "dpfed.noise -> posterior.fit" in out
    assert "coordinator.roundspec -> posterior" in out
    assert "site_node.config -> posterior" in out
    assert "dpfed_apps.console.plot -> posterior.quality" in out
