"""What each install imports, checked in a fresh interpreter so other tests' imports cannot
hide a regression (the import-linter contracts of tests/test_architecture.py check the code;
these check what actually runs).

- A hospital installs only dpfed[site]: the site node never imports the aggregator or the
  fitting stack (the posterior package, PyMC, PyTensor, ArviZ, Numba, SciPy).
- The aggregator's fit (the posterior package) loads PyMC, PyTensor and ArviZ only for the
  NUTS and ADVI fits: importing it, its default Laplace fit and the aggregator's server
  load none of them.
- A coordinator installs the core alone (numpy, grpcio, protobuf, cryptography): every core
  module imports, and `dpfed choose-bounds` runs, with OpenDP, PyMC, SciPy & co. unimportable.
"""

from __future__ import annotations

import json
import subprocess
import sys

SITE_MODULES = ["site_node", "site_node.config", "site_node.data", "site_node.policy",
                "site_node.ledger", "site_node.node", "site_node.client", "site_node.release",
                "site_node.secure", "site_node.messages", "site_node.rows",
                "dpfed_apps.commands.site", "dpfed_apps.cli"]
FITTING = ("aggregator", "posterior", "pymc", "pytensor", "arviz", "numba", "scipy")
NOT_CORE = ("opendp", "pyarrow", "threadpoolctl", "pymc", "pytensor", "arviz", "numba", "scipy",
            "matplotlib", "dask", "site_node", "aggregator", "posterior")

# A sys.meta_path finder that makes the given top-level packages unimportable, as if they were
# not installed (ModuleNotFoundError), and records every attempt.
BLOCKER = """
import sys
BLOCKED = set({blocked!r})
attempts = []
class Blocker:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            attempts.append(name)
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None
sys.meta_path.insert(0, Blocker)
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


def test_site_node_does_not_import_aggregator_or_pymc():
    code = (
        "import sys, importlib\n"
        f"for m in {SITE_MODULES!r}: importlib.import_module(m)\n"
        "from dpfed_apps.cli import build_parser; build_parser().parse_args(['site', 'check', '--config', 'x'])\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FITTING!r})\n"
        "print(','.join(bad))\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"site node imported: {out.stdout.strip()}"


def test_posterior_and_its_default_fit_load_no_pymc():
    """``import posterior``, the default fit (Laplace + importance sampling) of exact and of
    noisy statistics, and the aggregator's server module load neither PyMC nor PyTensor nor
    ArviZ (seconds of import and compile time, and memory, a round that fits with Laplace
    never needs)."""
    code = (
        "import sys\n"
        "import numpy as np\n"
        "import posterior\n"
        "from dpfed.noise import NoiseDescription\n"
        "from dpfed.statistics import exact_statistics\n"
        "rng = np.random.default_rng(0)\n"
        "x = rng.normal(size=(200, 3))\n"
        "exact = exact_statistics(x, x @ np.array([0.5, -0.2, 0.1]) + rng.normal(size=200))\n"
        "noisy = exact.with_noise(NoiseDescription.single('laplace', xtx=1.0, xty=1.0,\n"
        "                                                  yty=1.0, n=1.0))\n"
        "for stats in (exact, noisy):\n"
        "    post = posterior.fit_posterior(stats, seed=0, draws=200)\n"
        "    assert post.method == 'laplace', post.diagnostics\n"
        "import aggregator.server\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pymc', 'pytensor', 'arviz')))\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"loaded: {out.stdout.strip()}"


def test_running_aggregator_does_not_import_the_certificate_authority():
    code = (
        "import sys, importlib, pkgutil, aggregator\n"
        "for info in pkgutil.walk_packages(aggregator.__path__, 'aggregator.'):\n"
        "    importlib.import_module(info.name)\n"
        "from dpfed_apps.commands import aggregator as command\n"
        "print(sorted(m for m in sys.modules if m.startswith('dpfed_apps.ca')))\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_core_and_choose_bounds_run_on_a_coordinator_install():
    code = BLOCKER.format(blocked=NOT_CORE) + (
        "import importlib, pkgutil, dpfed, coordinator\n"
        "for pkg in (dpfed, coordinator):\n"
        "    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "from dpfed_apps.cli import main\n"
        "rc = main(['--log-level', 'ERROR', 'choose-bounds', '--n', '200', '--d', '3',\n"
        "           '--epsilon', '1', '--datasets', '2', '--noise-draws', '2', '--json'])\n"
        "print('RESULT', rc, sorted(attempts))\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    result = [line for line in out.stdout.splitlines() if line.startswith("RESULT")][0]
    assert result == "RESULT 0 []", f"{result}\n{out.stderr}"
    chosen = json.loads(out.stdout.splitlines()[0])
    assert chosen["omega_x"] > 0 and chosen["omega_y"] > 0

