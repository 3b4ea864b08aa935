"""A hospital installs only dpfed[site]: the site node must never import the aggregator or
PyMC. Checked in a fresh interpreter so other tests' imports cannot hide a regression."""

from __future__ import annotations

import subprocess
import sys

SITE_MODULES = ["site_node", "site_node.config", "site_node.data", "site_node.policy",
                "site_node.ledger", "site_node.node", "site_node.client", "site_node.release",
                "dpfed_apps.commands.site", "dpfed_apps.cli"]


def test_site_node_does_not_import_aggregator_or_pymc():
    code = (
        "import sys, importlib\n"
        f"for m in {SITE_MODULES!r}: importlib.import_module(m)\n"
        "from dpfed_apps.cli import build_parser; build_parser().parse_args(['site', 'check', '--config', 'x'])\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('aggregator', 'pymc', 'pytensor', 'arviz'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"site node imported: {out.stdout.strip()}"
