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


def test_header_only(tmp_path):
    with pytest.raises(DataError, match="no rows"):
        load_round_data(data_config(write(tmp_path, "g1,drug\n")), ["g1"], "drug")


def test_missing_column_is_named(tmp_path):
    with pytest.raises(DataError, match="'g7'") as info:
        load_round_data(data_config(write(tmp_path, CSV)), ["g1", "g7"], "drug")
    assert "g7" in info.value.public_reason


def test_text_in_numeric_column_names_row_and_column(tmp_path):
    text = CSV.replace("5,2.0,3.0", "5,2.0,high")
    with pytest.raises(DataError) as info:
        load_round_data(data_config(write(tmp_path, text)), ["g1", "g2"], "drug")
    msg = str(info.value)
    assert "row 5" in msg and "'g2'" in msg and "high" not in msg   # the value stays out
    # What may be sent to the coordinator names the column but never the value.
    assert "high" not in info.value.public_reason and "g2" in info.value.public_reason


def test_nan_in_feature_is_an_error(tmp_path):
    text = CSV.replace("1,0.5,1.0", "1,NaN,1.0")
    with pytest.raises(DataError, match=r"row 1 .*'g1'.*missing"):
        load_round_data(data_config(write(tmp_path, text)), ["g1", "g2"], "drug")


def test_infinite_value_is_an_error(tmp_path):
    text = CSV.replace("1,0.5,1.0", "1,inf,1.0")
    with pytest.raises(DataError, match="infinite"):
        load_round_data(data_config(write(tmp_path, text)), ["g1", "g2"], "drug")


def test_duplicate_ids(tmp_path):
    text = CSV.replace("5,2.0", "1,2.0")
    with pytest.raises(DataError, match="duplicate id"):
        load_round_data(data_config(write(tmp_path, text), id_column="id"), ["g1"], "drug")


def test_ragged_row(tmp_path):
    with pytest.raises(DataError, match="fields"):
        load_round_data(data_config(write(tmp_path, "g1,drug\n1,2,3\n")), ["g1"], "drug")


def test_describe_shows_shape_not_values(tmp_path):
    info = describe(data_config(write(tmp_path, CSV), id_column="id"))
    assert info["rows"] == 5 and info["columns"] == ["id", "g1", "g2", "drug"]
