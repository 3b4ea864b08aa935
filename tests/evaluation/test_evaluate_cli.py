"""dpfed evaluate end to end on a tiny grid (real GDSC data, OpenDP releases, the noise-aware fit)."""

import json
import subprocess
import sys

import pytest


def _run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "dpfed_apps.cli", "evaluate", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.slow
def test_quick_subset_json_and_files(tmp_path):
    out = tmp_path / "res"
    proc = _run("--drug", "1047", "--drug", "1373", "--repeats", "2", "--sizes", "0,100",
                "--sites", "1,3", "--workers", "2", "--out", str(out), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["wall_s"] > 0 and result["errors"] == 0
    cells = {(r["method"], r["epsilon"], r["n_private"], r["sites"]) for r in result["results"]}
    assert ("robust_private", 2.0, 100, 3) in cells and ("nonprivate", None, 100, 1) in cells
    assert len({r["method"] for r in result["results"]}) == 7
    for r in result["results"]:
        assert r["drugs"] == 2 and r["repeats"] == 2
    for name in ("results.csv", "summary.md", "spearman_eps1.png", "spearman_eps2.png"):
        assert (out / name).exists()
    assert "tasks" in proc.stderr and "ETA" in proc.stderr


def test_bad_arguments_exit_2(tmp_path):
    assert _run("--drug", "999999", "--out", str(tmp_path), cwd=tmp_path).returncode == 2
    assert _run("--methods", "magic", "--out", str(tmp_path), cwd=tmp_path).returncode == 2
    assert _run("--repeats", "0", cwd=tmp_path).returncode == 2
    assert _run("--sizes", "a,b", cwd=tmp_path).returncode == 2
    assert _run("--aggregation", "independent,trusted", cwd=tmp_path).returncode == 2


def test_help_has_an_example():
    proc = subprocess.run([sys.executable, "-m", "dpfed_apps.cli", "evaluate", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "dpfed evaluate --quick" in proc.stdout
