"""The aggregator starts and fits without PyMC (issue 21 item 5).

PyMC, PyTensor and ArviZ take seconds to import and only the NUTS fits use them (posterior
imports them then). `dpfed aggregator serve` checks that they are installed without importing
them, and the default fit never does: checked on what the processes actually imported, not on
a timing.
"""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpfed_apps.ca import kit_dir, project_from_dict, provision

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("pymc", "pytensor", "arviz")



def test_the_names_of_the_fits_load_no_fitting_code():
    """The aggregator, `dpfed simulate` and posterior name the fits from dpfed.fit_methods,
    one list, without loading the fit (SciPy, posterior.fit) or PyMC."""
    code = ("import sys; import aggregator.aggregate, dpfed_apps.commands.simulate as s, "
            "posterior; assert aggregator.aggregate.FIT_METHODS is posterior.FIT_METHODS "
            "is s.FIT_METHODS; print(sorted(m for m in ('scipy', 'posterior.fit', 'pymc') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(), cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONPROFILEIMPORTTIME")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


# Runs `dpfed aggregator serve` in-process (cli.main, the command's own code path) and, once
# it serves and its background fit warm-up (aggregator.server.warm_up_fit) has finished,
# prints the heavy modules it imported and stops it with SIGTERM.
PROBE = textwrap.dedent("""
    import json, os, signal, sys, threading
    import aggregator.server as server
    from dpfed_apps import cli

    warmed = threading.Event()
    warm_up = server.warm_up_fit
    def wrapped():
        try:
            warm_up()
        finally:
            warmed.set()
    server.warm_up_fit = wrapped

    def report():
        warmed.wait(300)
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
        print("MODULES " + json.dumps(heavy), flush=True)
        print("WARMED " + json.dumps("posterior.laplace" in sys.modules), flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=report, daemon=True).start()
    sys.exit(cli.main(["aggregator", "serve", "--config", sys.argv[1]]))
""")


@pytest.mark.slow
def test_aggregator_serve_start_imports_no_pymc(tmp_path):
    out = tmp_path / "fed"
    provision(project_from_dict({"federation": "imports", "sites": ["site-a"],
                                 "coordinators": ["coord"],
                                 "aggregator": {"address": "127.0.0.1:50051"}}), out)
    config = kit_dir(out, "aggregator", "aggregator") / "aggregator.toml"
    text = config.read_text()
    config.write_text(re.sub(r'listen = "[^"]*"', 'listen = "127.0.0.1:0"', text))
    proc = subprocess.run([sys.executable, "-c", PROBE.replace("{heavy!r}", repr(HEAVY)),
                           str(config)], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=300)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines()
                 if line.startswith(("MODULES ", "WARMED ")))
    assert "MODULES" in lines, proc.stdout + proc.stderr
    assert lines["MODULES"] == "[]", lines["MODULES"]
    assert lines["WARMED"] == "true"    # the fit's modules were imported: the check saw them
    assert "listening" in proc.stderr and proc.returncode == 0, proc.stderr


def _imported(log: str) -> set[str]:
    """Module names of `python -X importtime` lines (PYTHONPROFILEIMPORTTIME=1)."""
    return {m.group(1) for m in re.finditer(r"^import time:.*\|\s+([\w.]+)\s*$", log, re.M)}


@pytest.mark.slow
def test_simulate_aggregator_process_imports_no_pymc(tmp_path):
    """The whole `dpfed simulate` run, the round's fit (auto) and the baselines included:
    neither the aggregator process nor the command itself imports PyMC or PyTensor."""
    work = tmp_path / "sim"
    proc = subprocess.run(
        [sys.executable, "-m", "dpfed_apps.cli", "--log-level", "INFO", "simulate", "--json",
         "--workdir", str(work)],
        cwd=tmp_path, env=_env(PYTHONPROFILEIMPORTTIME="1"), capture_output=True, text=True,
        timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    aggregator = _imported((work / "logs" / "aggregator.log").read_text())
    command = _imported(proc.stderr)
    # The profile covered the fit: the aggregator and the command both imported the fit code
    # (posterior.targets: the densities, imported by posterior.fit's import statement; -X
    # importtime does not list what importlib.import_module loads itself).
    assert "posterior.targets" in aggregator and "aggregator.server" in aggregator
    assert "posterior.targets" in command
    for name, modules in (("aggregator", aggregator), ("dpfed simulate", command)):
        heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
        assert not heavy, f"{name} imported {heavy[:5]}"
