"""The round benchmark runs end to end (tiny sizes; the real figures come from
`dpfed bench round --sites 1000 --dim 64`)."""

from __future__ import annotations

import json

from dpfed_apps.cli import main


def test_bench_round_small(capsys):
    assert main(["bench", "round", "--sites", "5", "--dim", "4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sites"] == 5 and result["dim"] == 4 and result["round_s"] > 0


def test_bench_round_reports_cpu_and_load_and_refuses_bad_sizes(capsys):
    assert main(["bench", "round", "--sites", "2", "--dim", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["repeat"] == 1 and result["round_s_min"] == result["round_s"]
    assert len(result["loadavg_1min"]) == 1 and result["client_cpu_s"] >= 0
    assert main(["bench", "round", "--sites", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err


def test_bench_round_over_mutual_tls_with_provisioned_kits(capsys):
    """--tls: a CA and kits from dpfed_apps.ca, one connection and certificate per site;
    the aggregator's certificate-identity check accepts every contribution."""
    assert main(["bench", "round", "--sites", "3", "--dim", "2", "--tls", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tls"] is True and result["sites"] == 3 and result["round_s"] > 0


def test_bench_round_secure_with_dropouts(capsys):
    """--aggregation secure: a secure round with SiteSession-driven sites on real Subscribe
    streams; the dropout refuses after key agreement and the sum is still unmasked."""
    assert main(["bench", "round", "--aggregation", "secure", "--sites", "4", "--dim", "3",
                 "--dropouts", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["aggregation"] == "secure" and result["dropouts"] == 1
    assert list(result["phases_s"]) == ["CONSENT", "KEYS", "RELEASE", "UNMASK", "FITTING"]
    assert result["critical_path_s"] >= result["round_s"] > 0
    assert main(["bench", "round", "--dropouts", "1"]) == 2
    assert main(["bench", "round", "--aggregation", "secure", "--sites", "1"]) == 2


def test_transport_floor_times_one_and_two_signed_messages_per_site():
    """benchmarks/bench_round_floor.py, tiny: the one-message floor (Contribute, Ed25519
    check only) and the two-message floor of a round with a consent phase (SendPhase, then
    Contribute) both run against their own server process and report a time each."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_round_floor.py"),
                          "--sites", "4", "--dim", "2", "--repeat", "1",
                          "--modes", "aio-verify,aio-verify-2phase", "--json"],
                         capture_output=True, text=True, timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    results = {r["mode"]: r for r in json.loads(out.stdout.strip().splitlines()[-1])["results"]}
    assert set(results) == {"aio-verify", "aio-verify-2phase"}
    assert all(r["sites"] == 4 and r["wall_s"] > 0 for r in results.values())


def test_in_process_round_benchmark_runs_a_round_to_done():
    """benchmarks/bench_round_inproc.py, tiny: consents then contributions straight to the
    RoundManager; every contribution accepted, the round DONE, CPU reported."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_round_inproc.py"),
                          "--sites", "5", "--dim", "3", "--repeat", "1", "--json"],
                         capture_output=True, text=True, timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    (run,) = json.loads(out.stdout.strip().splitlines()[-1])["runs"]
    assert run["sites"] == 5 and run["cpu_s"] > 0 and run["wall_s"] >= run["consent_s"] > 0


def test_floor_hand_off_modes_and_the_round_over_floor_ratio():
    """benchmarks/bench_round_floor.py, tiny: the two-message floor whose replies wait for
    another thread (one wake-up each, or one per batch) or for the loop itself all answer
    every call, and beside a real round the script reports the round / 2-message floor ratio
    of each interleaved repeat (issue 21's figure)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    modes = ["aio-verify-2phase", "aio-verify-2phase-handoff", "aio-verify-2phase-batch",
             "aio-verify-2phase-yield", "round"]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_round_floor.py"),
                          "--sites", "3", "--dim", "2", "--repeat", "2",
                          "--modes", ",".join(modes), "--json"],
                         capture_output=True, text=True, timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    results = {r["mode"]: r for r in report["results"]}
    assert set(results) == set(modes)
    assert all(r["sites"] == 3 and r["repeat"] == 2 and r["wall_s"] > 0
               for r in results.values())
    ratios = report["round_over_2phase_floor"]
    assert len(ratios) == 2 and all(r > 0 for r in ratios)


def test_in_process_round_parts_are_timed_and_the_wrappers_removed():
    """bench_round_inproc --parts, tiny: every part of PARTS reports CPU and the calls one
    round makes (one signature check and one decode per contribution, one completion per
    contribution, a signature check per consent), and the timing wrappers are gone after
    the round, so the aggregator's functions are its own again."""
    import aggregator.authentication as authentication
    import aggregator.running_total as running_total
    from benchmarks import bench_round_inproc as inproc

    before = (authentication.verify_signature, authentication.fast_contribution,
              running_total.RunningTotal.__dict__["fold"])
    run = inproc.run_once(4, 3, parts=True)
    assert (authentication.verify_signature, authentication.fast_contribution,
            running_total.RunningTotal.__dict__["fold"]) == before
    parts = run["parts"]
    assert set(parts) == {label for _, _, label in inproc.PARTS}
    assert all(p["cpu_s"] >= 0 for p in parts.values())
    calls = {label.strip(): p["calls"] for label, p in parts.items()}
    assert calls["Ed25519 check, contribution"] == 4
    assert calls["decode a contribution"] == 4
    assert calls["writer: complete_contribution"] == 4
    assert calls["Ed25519 check, consent (signing.verify)"] >= 4
    assert calls["verify_site: limits, Ed25519, decode, fields"] == 8
    assert "parts" not in inproc.run_once(2, 3)
