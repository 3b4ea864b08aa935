"""`dpfed simulate` with secure aggregation (the default for K >= 2) and dropouts, as real
processes: the JSON says how the sites were combined, which sites dropped after key
agreement, and each phase's time; the ledgers of the sites agree."""

import contextlib
import io
import json

import pytest

from dpfed_apps import simulation as sim

pytestmark = pytest.mark.slow


def test_simulate_secure_with_a_dropout(tmp_path):
    from dpfed_apps import cli
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["--log-level", "WARNING", "simulate", "--json", "--fit-method",
                         "laplace", "--draws", "300", "--sites", "3", "--dropouts", "1",
                         "--workdir", str(tmp_path), "--timeout", "60"])
    assert code == 0
    result = json.loads(out.getvalue())
    assert result["aggregation"] == "secure" and result["noise_threshold"] == 2
    assert result["dropouts"] == ["site-3"] and result["dropped"] == ["site-3"]
    assert [p["phase"] for p in result["phases"]] == ["CONSENT", "KEYS", "RELEASE", "UNMASK",
                                                      "FITTING"]
    assert all(p["seconds"] > 0 for p in result["phases"])
    assert "2 shares of 1/2 draw = 1 draw" in result["noise"]
    # No site's n is released on its own; the dropped site spent nothing.
    assert all(s["n"] is None for s in result["sites"])
    assert [s["epsilon"] for s in result["sites"]] == [2.0, 2.0, 0.0]
    from site_node.ledger import PrivacyLedger
    layout = sim.FederationLayout(tmp_path)
    for name, spent in (("site-1", 2.0), ("site-2", 2.0), ("site-3", 0.0)):
        with PrivacyLedger(layout.site_db(name)) as ledger:
            assert ledger.spent == pytest.approx(spent)
    report = sim.format_report(result)
    assert "aggregation: secure" in report and "dropped after key agreement: site-3" in report
    assert "keys" in report and "unmask" in report
    # One site cannot drop out of three with t = 2... but two cannot: refused up front.
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["simulate", "--sites", "3", "--dropouts", "2", "--json"]) == 2
