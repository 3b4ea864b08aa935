"""Hostile input at the site: the data loader over random and broken files, and
SiteNode.handle_round over mutated (but validly signed) round specs. The loader either returns
finite arrays or raises DataError; handle_round always answers with a Contribution or a Refusal
that fits the wire limits, and the ledger is debited exactly once per Contribution."""

from __future__ import annotations

import os
import random
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz import mutate_payload, resign
from dpfed.wire import limits
from dpfed.wire.canonical import canonical_bytes, parse_canonical
from site_node import data as site_data
from site_node.config import DataConfig, load_config
from site_node.data import DataError, load_round_data
from site_node.node import SiteNode
from tests.test_site_node import make_spec, write_site

FEATURES, TARGET = ["g1", "g2", "g3"], "drug"
_cells = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.sampled_from(["", "NA", "nan", "-nan", "+NaN", "inf", "1e999", "abc",
                                    " 1.5 ", "0x10", "1_000", "\u00a0", "1,5", '"2"', "∞"]),
                   st.text(max_size=8))
_rows = st.lists(st.lists(_cells, min_size=4, max_size=5), max_size=30)
_headers = st.sampled_from([["g1", "g2", "g3", "drug"], ["g1", "g2", "drug", "g3", "x"],
                            ["g1", "g2", "g3"], ["g1", "g1", "g3", "drug"], ["\ufeffg1", "g2", "g3", "drug"]])


def _load(path, **kw):
    return load_round_data(DataConfig(path=path, format="csv", **kw), FEATURES, TARGET)


def _check_result(path, **kw):
    try:
        data = _load(path, **kw)
    except DataError as exc:
        assert exc.public_reason and len(exc.public_reason) <= limits.MAX_REASON_CHARS
        return "refused"
    assert np.isfinite(data.x).all() and np.isfinite(data.y).all()
    assert data.x.shape == (data.n, 3)
    return "loaded"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=_headers, rows=_rows)
def test_csv_with_hostile_cells_loads_finite_or_is_refused(tmp_path, header, rows):
    import csv
    path = tmp_path / "d.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([header, *rows])
    _check_result(path)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=3000))
def test_binary_garbage_is_refused_not_crashed(tmp_path, blob):
    path = tmp_path / "g.csv"
    path.write_bytes(b"g1,g2,g3,drug\n" + blob)
    _check_result(path)


@pytest.mark.parametrize("content", [
    b"", b"\n\n\n", b"g1,g2,g3\n1,2,3\n",
    "g1,g2,g3,drug\n1,2,3,4\n".encode("utf-16"), b"\x89PNG\r\n\x1a\n" + bytes(range(256))])
def test_broken_files_get_a_data_error(tmp_path, content):
    """Faults of the file as a whole (no header, a column missing, not text): DataError."""
    path = tmp_path / "b.csv"
    path.write_bytes(content)
    with pytest.raises(DataError):
        _load(path)


@pytest.mark.parametrize("content", [
    b"g1,g2,g3,drug\n", b"g1,g2,g3,drug\n1,2,3\n",
    "g1,g2,g3,drug\n1,2,3,\u00e9\n".encode("latin-1"), b"g1,g2,g3,drug\n1,2,\x00,4\n",
    b"g1,g2,g3,drug\n1,2,3,-nan\n", b"g1,g2,g3,drug\n1,abc,3,4\n",
    b"g1,g2,g3,drug\n" + b"9" * 200_000 + b",1,1,1\n"])
def test_broken_rows_are_left_out_not_refused(tmp_path, content):
    """A problem of one row (issue 19): that row is left out, the rest of the file loads."""
    path = tmp_path / "b.csv"
    path.write_bytes(content + b"1,2,3,4\n")
    data = _load(path)
    assert data.n == 1 and data.left_out == content.count(b"\n") - 1


def test_file_over_max_bytes_is_refused_before_reading(tmp_path, monkeypatch):
    path = tmp_path / "huge.csv"
    with path.open("wb") as fh:          # 200 MB, sparse: created instantly
        fh.write(b"g1,g2,g3,drug\n")
        fh.truncate(200 * 1024 * 1024)
    monkeypatch.setattr(site_data, "_read_text",
                        lambda *a: pytest.fail("the file was read despite its size"))
    with pytest.raises(DataError) as err:
        _load(path, max_bytes=100 * 1024 * 1024)
    assert "size limit" in err.value.public_reason


def test_a_directory_or_missing_file_is_refused(tmp_path):
    with pytest.raises(DataError):
        _load(tmp_path)
    with pytest.raises(DataError):
        _load(tmp_path / "nope.csv")


def test_handle_round_survives_mutated_specs_and_debits_once_per_release(tmp_path):
    config_path, coordinator, _ = write_site(tmp_path)
    node = SiteNode(load_config(config_path))
    rng = random.Random(3)
    released, tried = 0, 0
    for i in range(250):
        spec = make_spec(f"round-{i}", deadline_unix_ms=int(time.time() * 1000) + 600_000)
        payload = canonical_bytes(spec)
        if rng.random() < 0.9:
            payload = mutate_payload(payload, rng, dim=3)
        envelope = resign(coordinator, "dpfed.v1.RoundSpec", payload)
        spent = node.ledger.spent
        answer = node.handle_round(envelope)
        tried += 1
        assert answer.payload_type in ("dpfed.v1.Contribution", "dpfed.v1.Refusal")
        msg = parse_canonical(answer.payload, answer.payload_type)
        if answer.payload_type == "dpfed.v1.Refusal":
            limits.check_refusal(msg) if msg.round_id else None
            assert len(msg.reason) <= limits.MAX_REASON_CHARS
            assert node.ledger.spent == spent          # a refusal debits nothing
        else:
            limits.check_contribution(msg)
            released += 1
            assert node.ledger.spent == pytest.approx(spent + msg.epsilon_spent)
    print(f"\n[fuzz] handle_round: {tried} mutated specs, {released} released")
    assert node.ledger.spent == pytest.approx(sum(r.epsilon for r in node.ledger.releases()))
    assert len(node.ledger.releases()) == released


@pytest.mark.parametrize("cell", ["PATIENT-SECRET-42", "-nan", "1e999", "98765.4321x"])
def test_a_bad_cell_leaves_its_row_out_and_no_reason_names_it(tmp_path, cell):
    """Issue 19: a bad cell no longer refuses the round (a refusal would answer a question
    about one row for free): the row is left out and the round released; the only refusal
    possible is the paid-for noisy-n min_n one, a fixed text."""
    rows = ["id,g1,g2,g3,drug"] + [f"{i},0.1,0.2,0.3,1.0" for i in range(40)]
    rows[18] = f"17,0.1,{cell},0.3,1.0"
    config_path, coordinator, _ = write_site(tmp_path, data_text="\n".join(rows) + "\n")
    node = SiteNode(load_config(config_path))
    answer = node.handle_round(coordinator.sign(make_spec(epsilon=2.0)))
    assert answer.payload_type in ("dpfed.v1.Contribution", "dpfed.v1.Refusal")
    if answer.payload_type == "dpfed.v1.Refusal":
        from site_node.policy import NOISY_MIN_N_REASON
        msg = parse_canonical(answer.payload, "dpfed.v1.Refusal")
        assert msg.reason == NOISY_MIN_N_REASON and msg.epsilon_spent == 2.0
    assert node.ledger.spent == 2.0


def test_small_site_refusal_does_not_reveal_its_n(tmp_path):
    # Replace-one (n public by assumption, so the site checks its exact n before any noise):
    # the refusal names the rule, not the count. (Under add/remove the check uses the noisy
    # n: tests/test_site_node.py.)
    config_path, coordinator, _ = write_site(tmp_path, n=13)
    config_path.write_text(config_path.read_text().replace(
        "min_n = 20", "min_n = 20\nallow_replace_one = true"))
    node = SiteNode(load_config(config_path))
    spec = make_spec(neighbouring="replace_one", budget_split=[0.35, 0.60, 0.05])
    answer = node.handle_round(coordinator.sign(spec))
    reason = parse_canonical(answer.payload, "dpfed.v1.Refusal").reason
    assert "min_n" in reason and "13" not in reason
