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



def test_fit_methods_spelled_out_agree_with_posterior():
    """The aggregator and `dpfed simulate` name the fits without importing posterior."""
    import posterior
    from aggregator.aggregate import FIT_METHODS as aggregator_methods
    from dpfed_apps.commands.simulate import FIT_METHODS as simulate_methods

    assert aggregator_methods == posterior.FIT_METHODS == simulate_methods


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
    # The profile covered the fit: the aggregator and the command both imported the fit code.
    assert "posterior.laplace" in aggregator and "aggregator.server" in aggregator
    assert "posterior.laplace" in command
    for name, modules in (("aggregator", aggregator), ("dpfed simulate", command)):
        heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
        assert not heavy, f"{name} imported {heavy[:5]}"
