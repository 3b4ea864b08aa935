"""dpfed_apps.evaluation.report: summaries, tables, plots and the CSV round trip."""

import math

import numpy as np

from dpfed_apps.evaluation.report import (markdown_table, ratio_table, read_csv, summarise,
                                          write_csv, write_report)


def _rows():
    rows = []
    for drug in (1, 2):
        for rep in (0, 1, 2):
            for n in (0, 100):
                rows.append(dict(drug=drug, repeat=rep, method="nonprivate", epsilon=None,
                                 n_private=n, sites=1, spearman=0.2 + 0.01 * rep + 0.1 * drug,
                                 converged=True, error=None))
                rows.append(dict(drug=drug, repeat=rep, method="robust_private", epsilon=2.0,
                                 n_private=n, sites=1, spearman=0.1 + 0.01 * rep,
                                 converged=rep != 2, error=None))
    rows.append(dict(drug=1, repeat=0, method="adassp", epsilon=2.0, n_private=100, sites=1,
                     spearman=float("nan"), converged=None, error="ValueError: boom"))
    return rows


def test_summary_mean_sd_and_counts():
    summary = {(s["method"], s["n_private"]): s for s in summarise(_rows())}
    s = summary[("nonprivate", 100)]
    assert math.isclose(s["spearman_mean"], np.mean([0.3, 0.31, 0.32, 0.4, 0.41, 0.42]))
    # sd over repeats of the per-repeat mean over drugs: means 0.35, 0.36, 0.37.
    assert math.isclose(s["spearman_sd"], np.std([0.35, 0.36, 0.37], ddof=1))
    assert (s["drugs"], s["repeats"], s["cells"]) == (2, 3, 6)
    assert summary[("robust_private", 100)]["unconverged"] == 2
    bad = summary[("adassp", 100)]
    assert bad["errors"] == 1 and math.isnan(bad["spearman_mean"])


def test_ratio_is_paired_on_the_same_cells():
    (r,) = ratio_table(_rows())
    assert r["n_private"] == 100 and r["epsilon"] == 2.0
    assert math.isclose(r["ratio"], np.mean([0.1, 0.11, 0.12]) / np.mean([0.3, 0.31, 0.32, 0.4, 0.41, 0.42]))
    assert r["published_ratio_n800"] == 0.86


def test_csv_round_trip(tmp_path):
    rows = _rows()
    write_csv(rows, tmp_path / "r.csv")
    back = read_csv(tmp_path / "r.csv")
    assert len(back) == len(rows)
    assert back[0]["epsilon"] is None and back[1]["epsilon"] == 2.0
    assert back[-1]["error"] == "ValueError: boom" and math.isnan(back[-1]["spearman"])
    assert [s["spearman_mean"] for s in summarise(back) if s["method"] != "adassp"] == \
        [s["spearman_mean"] for s in summarise(rows) if s["method"] != "adassp"]


def test_report_files(tmp_path):
    summary = write_report(_rows(), tmp_path, wall_s=1.5, command="dpfed evaluate --quick")
    assert summary
    for name in ("results.csv", "summary.md", "spearman_eps2.png"):
        assert (tmp_path / name).stat().st_size > 0
    text = (tmp_path / "summary.md").read_text()
    assert "robust_private (K=1)" in text and "published" in text and "0.86" in text
    assert (tmp_path / "spearman_eps2.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_markdown_table_has_one_column_per_size():
    table = markdown_table(summarise(_rows()))
    assert table.splitlines()[0] == "| method | eps | 0 | 100 |"


def test_ratio_at_every_size_is_paired_per_size():
    rows = _rows()
    every = ratio_table(rows, all_sizes=True)
    (largest,) = ratio_table(rows)
    assert every[0] == largest
    assert [r["n_private"] for r in every] == sorted({r["n_private"] for r in every}, reverse=True)
