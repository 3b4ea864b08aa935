"""Data with gaps (issue 22): a row with a missing or non-numeric value in one of a round's
columns is left out of that round, on its own. `dpfed site check` counts the rows left out by
reason and column and names the columns no round can use; `dpfed simulate --data` on a file
with gaps gives those rows to the sites and reports, per site, what they left out; and the
count never travels: with the noise fixed, a site's release with rows with gaps is byte for
byte the release without them.

The gap file is the bundled GDSC v17 data for Nutlin-3a (1047) over all 988 lines: 142 have
no measured response (a real gap), and a few cells are blanked ("NA"), set to text
("pending") or to "inf"; a constant column, an all-missing column and a text column ride
along."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import parse_canonical
from site_node.config import DataConfig, load_config
from site_node.data import (MALFORMED, MISSING, MISSING_ID, NOT_A_NUMBER, NOT_FINITE,
                            REPEATED_ID, audit_rows, cell_problem, load_round_data, read_table,
                            round_audit)
from site_node.gaps import file_audit
from tests.test_site_node import make_spec, write_site

DRUG = 1047
TARGET = "Drug_1047_IC50"
# Rows of the measured lines (in file order) whose cells are spoilt, and how.
NA_ROWS, TEXT_ROWS, INF_ROWS = 3, 2, 1


def gdsc_gap_file(path: Path) -> dict:
    """Write the gap file; return what it holds (ids, features, the expected counts)."""
    from dpfed import datasets

    table = datasets.load_responses()
    known = {int(i) for i in datasets.load_genomic_features().line_ids}
    keep = np.array([int(i) in known for i in table.line_ids])
    ids, y = table.line_ids[keep], table.column(DRUG)[keep]
    names = datasets.default_feature_names()
    x = datasets.feature_matrix(names, ids)
    measured = np.flatnonzero(np.isfinite(y))
    spoilt = {int(r): (0, "NA") for r in measured[:NA_ROWS]}
    spoilt |= {int(r): (1, "pending") for r in measured[NA_ROWS:NA_ROWS + TEXT_ROWS]}
    spoilt |= {int(r): (2, "inf") for r in measured[NA_ROWS + TEXT_ROWS:
                                                    NA_ROWS + TEXT_ROWS + INF_ROWS]}
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["COSMIC_ID", *names, "batch", "notes", "histology", TARGET])
        for r in range(len(ids)):
            cells = [f"{v:g}" for v in x[r]]
            if r in spoilt:
                j, text = spoilt[r]
                cells[j] = text
            w.writerow([int(ids[r]), *cells, "1", "", "carcinoma",
                        repr(float(y[r])) if np.isfinite(y[r]) else ""])
    return {"ids": [str(int(i)) for i in ids], "features": list(names),
            "rows": len(ids), "missing_target": int((~np.isfinite(y)).sum())}


@pytest.fixture(scope="module")
def gaps(tmp_path_factory):
    path = tmp_path_factory.mktemp("gaps") / "gaps.csv"
    info = gdsc_gap_file(path)
    return path, info


def _site_with(tmp_path: Path, data_path: Path) -> Path:
    config, _, _ = write_site(tmp_path, data_text=data_path.read_text())
    config.write_text(config.read_text().replace('id_column = "id"', 'id_column = "COSMIC_ID"'))
    return config


def _check(args, capsys) -> tuple[int, str, str]:
    from dpfed_apps.cli import main
    code = main(["site", "check", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _no_values(text: str, info: dict) -> None:
    """No patient id and no cell text of the gap file in ``text`` (counts and names only)."""
    for word in ("pending", "carcinoma"):
        assert word not in text
    leaked = [i for i in info["ids"] if i in text]
    assert not leaked, f"patient ids in the output: {leaked[:5]}"


# ---- the row rules, one cell and one row at a time ----------------------------------------

@pytest.mark.parametrize("value,reason", [
    ("1.5", None), (" 2 ", None), (0, None), (True, None), (1e300, None),
    ("", MISSING), ("  ", MISSING), ("NA", MISSING), ("n/a", MISSING), ("NaN", MISSING),
    ("null", MISSING), (None, MISSING), (float("nan"), MISSING),
    ("pending", NOT_A_NUMBER), ("1,5", NOT_A_NUMBER), ("\ufffd", NOT_A_NUMBER),
    (b"1", NOT_A_NUMBER),
    ("inf", NOT_FINITE), ("-Infinity", NOT_FINITE), ("1e999", NOT_FINITE),
    ("-nan", NOT_FINITE), (float("inf"), NOT_FINITE),
])
def test_cell_problem_names_the_reason(value, reason):
    assert cell_problem(value) == reason


def test_audit_counts_every_reason_by_column(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("id,g1,g2,drug\n"
                 "1,0.5,1.0,2.0\n"       # used
                 "2,,1.0,1.0\n"          # missing g1
                 "3,0.5,abc,\n"          # text in g2 and a missing target: counted under both
                 "4,inf,1.0,1.0\n"       # not finite
                 "5,0.5\n"               # malformed
                 ",0.5,1.0,1.0\n"        # missing id
                 "7,0.5,1.0,1.0\n"       # repeated id (both rows)
                 "7,0.1,1.0,1.0\n"
                 "9,0.5,1.0,-1.0\n")     # used
    audit = audit_rows(read_table(p, "csv"), ["g1", "g2", "drug"], id_column="id",
                       target_column="drug")
    assert audit.rows == 9 and audit.used == (0, 8) and audit.left_out == 7
    assert audit.missing_target == 1
    assert audit.by_reason == {MISSING: 2, NOT_A_NUMBER: 1, NOT_FINITE: 1, MALFORMED: 1,
                               MISSING_ID: 1, REPEATED_ID: 2}
    assert audit.by_column == {"id": {MISSING_ID: 1, REPEATED_ID: 2},
                               "g1": {MISSING: 1, NOT_FINITE: 1},
                               "g2": {NOT_A_NUMBER: 1}, "drug": {MISSING: 1}}


def test_the_audit_is_the_round_s_own_rule(tmp_path):
    """Random files with every kind of gap: the rows the audit calls usable are exactly the
    rows a round uses, and its counts are the round's (dropped_missing_target, left_out)."""
    rng = np.random.default_rng(7)
    tokens = ["", "NA", "nan", "-nan", "inf", "x", "1e999", " ", "null"]
    for k in range(40):
        lines = ["id,a,b,y"]
        for i in range(int(rng.integers(0, 30))):
            cells = [str(int(rng.integers(0, 25))) if rng.random() > 0.05 else ""]
            cells += [tokens[int(rng.integers(len(tokens)))] if rng.random() < 0.15
                      else f"{rng.normal():.3f}" for _ in range(3)]
            if rng.random() < 0.05:
                cells = cells[:2]
            lines.append(",".join(cells))
        p = tmp_path / f"r{k}.csv"
        p.write_text("\n".join(lines) + "\n")
        config = DataConfig(path=p, format="csv", id_column="id")
        data = load_round_data(config, ["a", "b"], "y")
        audit = round_audit(read_table(p, "csv"), ["a", "b"], "y", config)
        assert audit.used == data.rows
        assert audit.missing_target == data.dropped_missing_target
        assert audit.left_out == data.left_out + data.dropped_missing_target
        assert sum(audit.by_reason.values()) >= audit.left_out


# ---- dpfed site check ----------------------------------------------------------------------

def test_site_check_counts_rows_left_out_and_names_unusable_columns(tmp_path, gaps, capsys):
    path, info = gaps
    config = _site_with(tmp_path, path)
    features = info["features"]
    spoilt = NA_ROWS + TEXT_ROWS + INF_ROWS
    left = info["missing_target"] + spoilt

    # A round's columns: named (the command line names them), counted by reason and column.
    code, out, err = _check(["--config", str(config), "--json", "--target", TARGET,
                             "--features", ",".join(features)], capsys)
    assert code == 0, err
    report = json.loads(out)
    data = report["data"]
    assert report["ok"] and data["rows"] == info["rows"] == 988
    assert info["missing_target"] == 142                 # the real gap of the bundled data
    assert data["left_out_rows"] == left and data["usable_rows"] == 988 - left
    reasons = {e["reason"]: e for e in data["left_out"]}
    assert reasons[MISSING]["rows"] == 142 + NA_ROWS
    assert reasons[MISSING]["columns"] == {features[0]: NA_ROWS, TARGET: 142}
    assert reasons[NOT_A_NUMBER]["columns"] == {features[1]: TEXT_ROWS}
    assert reasons[NOT_FINITE]["columns"] == {features[2]: INF_ROWS}
    assert set(reasons) == {MISSING, NOT_A_NUMBER, NOT_FINITE}
    assert data["round"] == {"target": TARGET, "features": features}
    assert data["unusable_columns"] == [] and not data["unnamed_columns"]
    _no_values(out + err, info)

    # The same as people read it.
    code, out, err = _check(["--config", str(config), "--target", TARGET,
                             "--features", ",".join(features)], capsys)
    assert code == 0 and "ok: nothing was released" in out
    assert f"rows a round with target '{TARGET}' and 10 feature(s): {988 - left} of 988 " \
           f"usable, {left} left out" in out
    words = " ".join(out.split())
    assert f"missing value {142 + NA_ROWS} row(s) ({features[0]} {NA_ROWS}, {TARGET} 142)" \
        in words
    assert f"not a number {TEXT_ROWS} row(s) ({features[1]} {TEXT_ROWS})" in words
    assert "never sent" in out
    _no_values(out + err, info)

    # No round given: every usable column; the unusable ones are named by position (a header
    # cell is not printed unless site.toml or the command line names it) ...
    code, out, err = _check(["--config", str(config), "--json"], capsys)
    data = json.loads(out)["data"]
    assert code == 0 and data["round"] is None
    assert data["unusable_columns"] == [{"column": "column 12", "why": "constant"},
                                        {"column": "column 13", "why": "all missing"},
                                        {"column": "column 14", "why": "no number"}]
    assert data["columns_used"] == 12 and data["left_out_rows"] == left   # batch is used
    assert data["unnamed_columns"]
    _no_values(out + err, info)
    # ... and by name with --column-names (or when the round names them).
    code, out, err = _check(["--config", str(config), "--column-names"], capsys)
    assert code == 0
    assert "unusable columns: batch (constant), notes (all missing), histology (no number)" in out
    code, out, err = _check(["--config", str(config), "--target", TARGET, "--features",
                             "batch,notes," + features[0]], capsys)
    assert code == 0 and "unusable columns: batch (constant), notes (all missing)" in out
    assert "0 of 988 usable, 988 left out" in out       # notes is missing in every row
    # --target alone: every other usable column is a feature (by position, not by name).
    code, out, err = _check(["--config", str(config), "--json", "--target", TARGET], capsys)
    data = json.loads(out)["data"]
    assert data["round"]["features"] == [f"column {j}" for j in range(2, 13)]
    # A column the file does not have is a problem (exit 2), as a round would refuse it.
    code, out, err = _check(["--config", str(config), "--target", "Drug_1_IC50"], capsys)
    assert code == 2 and "missing column" in err
    code, out, err = _check(["--config", str(config), "--features", "a"], capsys)
    assert code == 2 and "--features needs --target" in err


def test_site_check_on_a_file_without_gaps_says_none_left_out(tmp_path, capsys):
    config, _, _ = write_site(tmp_path)
    code, out, err = _check(["--config", str(config), "--target", "drug"], capsys)
    assert code == 0, err
    assert "rows a round with target 'drug' and 3 feature(s): 200 of 200 usable, 0 left out" \
        in out
    assert "unusable" not in out and "never sent" not in out


# ---- the count never travels ---------------------------------------------------------------

GAP_ROWS = ["g-1,,0.5,0.5,1.0", "g-2,NA,0.5,0.5,1.0", "g-3,0.1,pending,0.5,1.0",
            "g-4,0.1,0.5,inf,1.0", "g-5,0.1,0.5,0.5,"]


def _zero_noise(monkeypatch):
    """Every noise draw of an independent release returns its input: the release is then a
    function of the used rows alone."""
    import site_node.release as release
    monkeypatch.setattr(release, "add_laplace_noise",
                        lambda values, sensitivity, epsilon, **kw:
                        (np.asarray(values, dtype=np.float64).copy(), epsilon))
    monkeypatch.setattr(release, "add_count_noise", lambda counts, epsilon:
                        ([int(c) for c in counts], epsilon))


def _answer(folder: Path, data_text: str, spec: pb.RoundSpec, policy: str = ""):
    from site_node.node import SiteNode
    folder.mkdir()
    config, coordinator, _ = write_site(folder, data_text=data_text, policy=policy)
    node = SiteNode(load_config(config))
    try:
        envelope = node.handle_round(coordinator.sign(spec))
    finally:
        node.ledger.close()
    message = parse_canonical(envelope.payload, envelope.payload_type)
    message.ClearField("timestamp_unix_ms")
    message.ClearField("nonce")
    return envelope.payload_type, message.SerializeToString(deterministic=True)


def test_a_release_carries_no_count_of_rows_left_out(tmp_path, monkeypatch, caplog):
    """The same site with and without 5 rows with gaps (the used rows are the same): with the
    noise fixed, the Contribution is byte for byte the same, so no field of it counts the
    rows left out; so are a data refusal and a min_n refusal. The site's own log has the count."""
    _zero_noise(monkeypatch)
    rng = np.random.default_rng(3)
    rows = ["id,g1,g2,g3,drug"] + [
        f"{i},{a:.4f},{b:.4f},{c:.4f},{a + b - c + rng.normal() * 0.1:.4f}"
        for i, (a, b, c) in enumerate(rng.normal(size=(60, 3)) * 0.3)]
    clean = "\n".join(rows) + "\n"
    gappy = "\n".join(rows[:20] + GAP_ROWS + rows[20:]) + "\n"
    spec = make_spec("gaps-1", epsilon=1.0)
    caplog.set_level(logging.INFO)
    answers = {name: _answer(tmp_path / name, text, spec)
               for name, text in (("clean", clean), ("gappy", gappy))}
    assert answers["clean"][0] == "dpfed.v1.Contribution"
    assert answers["clean"] == answers["gappy"]
    log = "\n".join(r.getMessage() for r in caplog.records)
    assert "left out 1 row(s) with a missing drug, 4 malformed row(s)" in log   # local only
    # A refusal for a column the file lacks, and the min_n refusal: the same reason.
    missing = make_spec("gaps-2", feature_names=["g1", "g9"],
                        preprocessing=pb.Preprocessing(x_mean=[0.0, 0.0]))
    big = "max_epsilon_per_round = 2.0\ntotal_epsilon = 5.0\nmin_n = 1000\n"
    for label, spec_, policy in (("missing", missing, ""), ("min_n", spec, big)):
        refusals = [_answer(tmp_path / f"{label}-{name}", text, spec_, policy)
                    for name, text in (("clean", clean), ("gappy", gappy))]
        assert refusals[0][0] == "dpfed.v1.Refusal" and refusals[0] == refusals[1], label


# ---- dpfed simulate --data on a file with gaps --------------------------------------------

def test_csv_problem_keeps_rows_with_gaps_for_the_sites(tmp_path, gaps):
    from dpfed_apps import simulation as sim
    from dpfed_apps.simulation.problem import split_incomplete
    path, info = gaps
    spoilt = NA_ROWS + TEXT_ROWS + INF_ROWS
    problem = sim.csv_problem(path, feature_names=info["features"], keep_incomplete=True)
    assert problem.n == 988 - 142 - spoilt and len(problem.incomplete) == 142 + spoilt
    assert np.isfinite(problem.x).all() and np.isfinite(problem.y).all()
    assert all(len(r) == len(info["features"]) + 2 for r in problem.incomplete)
    # Every feature by default: the all-missing and text columns would leave out every row.
    with pytest.raises(ValueError, match="notes, histology"):
        sim.csv_problem(path, keep_incomplete=True)
    # The sites' files hold their rows with gaps; the split of the complete rows is the same
    # with or without them.
    split = sim.split_rows(problem.n, n_sites=3, n_public=10, n_test=100, seed=0)
    shares = split_incomplete(len(problem.incomplete), 3, seed=0)
    assert sorted(np.concatenate(shares).tolist()) == list(range(len(problem.incomplete)))
    layout = sim.FederationLayout(tmp_path / "fed")
    names = sim.write_federation(layout, problem, split, port=50999, epsilon=2.0,
                                 incomplete=shares)
    from dpfed_apps.simulation.run import site_left_out
    total = 0
    for name, rows, share in zip(names, split.sites, shares):
        gaps_ = site_left_out(layout, name, problem)
        assert gaps_["rows"] == share.size and gaps_["usable_rows"] == rows.size
        assert gaps_["rows_in_file"] == rows.size + share.size
        total += gaps_["rows"]
        data = load_round_data(load_config(layout.site_config(name)).data,
                               info["features"], TARGET)
        assert data.n == rows.size
    assert total == 142 + spoilt


@pytest.mark.slow
def test_simulate_on_a_file_with_gaps_reports_what_each_site_left_out(tmp_path, gaps):
    from dpfed_apps import cli
    from dpfed_apps import simulation as sim
    path, info = gaps
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["--log-level", "INFO", "simulate", "--json", "--data", str(path),
                         "--features", ",".join(info["features"]), "--fit-method", "laplace",
                         "--draws", "300", "--sites", "3", "--workdir", str(tmp_path / "run"),
                         "--timeout", "120"])
    assert code == 0
    result = json.loads(out.getvalue())
    sites = result["sites"]
    spoilt = NA_ROWS + TEXT_ROWS + INF_ROWS
    assert sum(s["left_out"]["rows"] for s in sites) == 142 + spoilt
    by_reason: dict = {}
    for s in sites:
        assert s["left_out"]["usable_rows"] == s["n_planned"]
        for e in s["left_out"]["reasons"]:
            for column, k in e["columns"].items():
                by_reason[(e["reason"], column)] = by_reason.get((e["reason"], column), 0) + k
    f = info["features"]
    assert by_reason == {(MISSING, TARGET): 142, (MISSING, f[0]): NA_ROWS,
                         (NOT_A_NUMBER, f[1]): TEXT_ROWS, (NOT_FINITE, f[2]): INF_ROWS}
    report = sim.format_report(result)
    assert "rows left out by the sites' row-wise rules" in report
    for s in sites:
        assert f"{s['site_id']:<9} {s['left_out']['rows']} of " \
               f"{s['left_out']['rows_in_file']} rows left out" in report
    # The counts are in each site's own log, and nowhere in the aggregator's.
    logs = sim.FederationLayout(tmp_path / "run").logs
    for s in sites:
        assert f"row(s) with a missing {TARGET}" in (logs / f"{s['site_id']}.log").read_text()
    aggregator_log = (logs / "aggregator.log").read_text()
    assert "malformed row" not in aggregator_log and "missing value" not in aggregator_log
