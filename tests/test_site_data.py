"""The site's data loader: happy paths (CSV, TSV, Parquet, column mapping) and clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from site_node.config import DataConfig
from site_node.data import DataError, describe, load_round_data

CSV = """id,g1,g2,drug
1,0.5,1.0,2.0
2,-0.5,0.0,NA
3,1.5,2.0,
4,0.25,-1.0,nan
5,2.0,3.0,-1.5
"""


def data_config(path: Path, fmt: str | None = None, **kw) -> DataConfig:
    return DataConfig(path=path, format=fmt or path.suffix.lstrip("."), **kw)


def write(tmp_path, text, name="d.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_csv_selects_columns_and_drops_missing_targets(tmp_path):
    data = load_round_data(data_config(write(tmp_path, CSV), id_column="id"), ["g2", "g1"], "drug")
    np.testing.assert_array_equal(data.x, [[1.0, 0.5], [3.0, 2.0]])
    np.testing.assert_array_equal(data.y, [2.0, -1.5])
    assert data.n == 2 and data.dropped_missing_target == 3


def test_tsv_happy_path(tmp_path):
    p = write(tmp_path, CSV.replace(",", "\t"), "d.tsv")
    data = load_round_data(data_config(p), ["g1", "g2"], "drug")
    np.testing.assert_array_equal(data.y, [2.0, -1.5])


def test_parquet_happy_path(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "g1": [0.5, 1.0, 2.0], "g2": [1, 2, 3],
                             "drug": [1.0, None, float("nan")]}), p)
    data = load_round_data(data_config(p, id_column="id"), ["g1", "g2"], "drug")
    np.testing.assert_array_equal(data.x, [[0.5, 1.0]])
    np.testing.assert_array_equal(data.y, [1.0])


def test_column_mapping(tmp_path):
    cfg = data_config(write(tmp_path, CSV), columns={"TP53": "g1", "IC50": "drug"})
    data = load_round_data(cfg, ["TP53"], "IC50")
    np.testing.assert_array_equal(data.x[:, 0], [0.5, 2.0])


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_round_data(data_config(tmp_path / "nope.csv"), ["g1"], "drug")


def test_empty_file(tmp_path):
    with pytest.raises(DataError, match="empty"):
        load_round_data(data_config(write(tmp_path, "")), ["g1"], "drug")
    with pytest.raises(DataError, match="empty"):
        load_round_data(data_config(write(tmp_path, "\n\n")), ["g1"], "drug")


def test_header_only_gives_zero_rows_not_an_error(tmp_path):
    """No rows is not a refusal (it would say n = 0 for free): the round gets zero rows."""
    data = load_round_data(data_config(write(tmp_path, "g1,drug\n")), ["g1"], "drug")
    assert data.n == 0 and data.x.shape == (0, 1) and data.left_out == 0


def test_missing_column_is_named(tmp_path):
    with pytest.raises(DataError, match="'g7'") as info:
        load_round_data(data_config(write(tmp_path, CSV)), ["g1", "g7"], "drug")
    assert "g7" in info.value.public_reason
    # The public reason names the spec's column, not the site's file column.
    cfg = data_config(write(tmp_path, CSV), columns={"TP53": "secret_col"})
    with pytest.raises(DataError) as info:
        load_round_data(cfg, ["TP53"], "drug")
    assert "TP53" in info.value.public_reason and "secret_col" not in info.value.public_reason


# A row with a problem is left out, one row at a time, and counted (issue 19): whether a
# round is answered never depends on what a row holds.
@pytest.mark.parametrize("old,new", [
    ("5,2.0,3.0", "5,2.0,high"),     # text in a numeric column
    ("1,0.5,1.0", "1,NaN,1.0"),      # a missing feature
    ("1,0.5,1.0", "1,-nan,1.0"),     # a NaN the missing markers do not cover
    ("1,0.5,1.0", "1,inf,1.0"),      # infinite
    ("1,0.5,1.0", "1,1e999,1.0"),    # overflows to inf
    ("1,0.5,1.0", "1,0.5"),          # a line with too few fields
    ("1,0.5,1.0", '1,"0.5,1.0'),     # an unbalanced quote: that line only
])
def test_a_bad_row_is_left_out_and_counted(tmp_path, old, new):
    text = CSV.replace(old, new)
    data = load_round_data(data_config(write(tmp_path, text), id_column="id"), ["g1", "g2"],
                           "drug")
    good = load_round_data(data_config(write(tmp_path, CSV, "good.csv"), id_column="id"),
                           ["g1", "g2"], "drug")
    assert data.left_out >= 1 and data.n == good.n - 1
    assert np.isfinite(data.x).all() and np.isfinite(data.y).all()
    # The other used rows are exactly those of the good file.
    assert {tuple(r) for r in data.x} < {tuple(r) for r in good.x}


def test_every_row_of_a_repeated_id_is_left_out(tmp_path):
    """Both rows of id 1 go (which one is right cannot be told): adding or removing one row
    then changes the used rows by at most one row."""
    data = load_round_data(data_config(write(tmp_path, CSV.replace("5,2.0", "1,2.0")),
                                       id_column="id"), ["g1", "g2"], "drug")
    assert data.n == 0 and data.left_out == 2


def test_bytes_that_are_not_utf8_leave_out_their_row_only(tmp_path):
    p = tmp_path / "d.csv"
    p.write_bytes(b"id,g1,drug\n1,0.5,2.0\n2,\xff\xfe,1.0\n3,1.5,-1.0\n")
    data = load_round_data(data_config(p), ["g1"], "drug")
    np.testing.assert_array_equal(data.y, [2.0, -1.0])
    assert data.left_out == 1


def test_id_problems_are_errors_for_the_local_check_only(tmp_path):
    """`dpfed site check` (describe) still tells the operator about repeated ids."""
    with pytest.raises(DataError, match="duplicate id"):
        describe(data_config(write(tmp_path, CSV.replace("5,2.0", "1,2.0")), id_column="id"))


def test_describe_shows_shape_not_values(tmp_path):
    info = describe(data_config(write(tmp_path, CSV), id_column="id"))
    assert info["rows"] == 5 and info["columns"] == ["id", "g1", "g2", "drug"]


def test_a_line_without_quotes_is_split_as_the_csv_module_splits_it():
    """site_node.data._parse_line splits a line with no quote, CR or NUL on the delimiter
    (its fast path): the csv module gives the same fields for every such line."""
    import csv
    import random

    from site_node.data import _parse_line
    rng = random.Random(3)
    alphabet = ["a", "1", ".", ",", "\t", " ", "", "-", "\u00e9", "\u2028", "'", "\\", "\x0b"]
    for delimiter in (",", "\t"):
        for _ in range(500):
            line = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
            assert _parse_line(line, delimiter) == next(csv.reader([line],
                                                                   delimiter=delimiter), [])
    # Lines with a quote, CR or NUL take the csv module's path (None: it cannot parse).
    assert _parse_line('a,"b,c",d', ",") == ["a", "b,c", "d"]
    assert _parse_line('a,"b', ",") == next(csv.reader(['a,"b']))
    assert _parse_line("a\rb,c", ",") is None
