"""dpfed.secagg is a core layer: numpy, cryptography, the standard library and dpfed core
modules only; no transport, no roles, no seeded generators for secrets or noise."""

import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dpfed" / "secagg"


def test_importing_the_package_pulls_in_no_transport_roles_or_scipy():
    code = ("import sys, dpfed.secagg, dpfed.secagg.simulate, dpfed.secagg.dlaplace, "
            "dpfed.secagg.fixedpoint, dpfed.secagg.graph\n"
            "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parents[1]).stdout.split()
    roots = {m.split(".")[0] for m in out}
    assert not roots & {"grpc", "google", "scipy", "site_node", "aggregator", "coordinator",
                        "opendp", "pymc"}
    assert not any(m.startswith("dpfed.") and m.split(".")[1] not in
                   ("secagg", "noise", "statistics") for m in out)


def test_no_seeded_or_non_cryptographic_randomness():
    for path in PACKAGE.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"np\.random|default_rng|import random\b|from random\b", text), path
