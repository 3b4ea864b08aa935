"""site_node.data_cache: a node's data file parsed once per content, never a stale row."""

from __future__ import annotations

import os

import numpy as np
import pytest

from site_node.config import DataConfig
from site_node.data import DataError, load_joint_round_data, load_round_data
from site_node.data_cache import DataCache

CSV = "id,g1,g2,drug,other\np1,1,2,3,\np2,4,5,6,7\np3,7,8,,9\n"


def _config(tmp_path, text=CSV, **kw) -> DataConfig:
    path = tmp_path / "site.csv"
    path.write_text(text)
    return DataConfig(path=path, format="csv", id_column="id", **kw)


def _same(a, b) -> None:
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y, equal_nan=True)
    assert a.ids == b.ids and a.rows == b.rows and a.left_out == b.left_out
    assert a.dropped_missing_target == b.dropped_missing_target


def test_the_same_bytes_are_parsed_once_and_give_what_a_fresh_read_gives(tmp_path):
    config = _config(tmp_path)
    cache = DataCache()
    first = cache.load_joint_round_data(config, ["g1", "g2"], ["drug", "other"],
                                        require_ids=True)
    again = cache.load_joint_round_data(config, ["g1", "g2"], ["drug", "other"],
                                        require_ids=True)
    assert again is first and cache.parses == 1
    _same(first, load_joint_round_data(config, ["g1", "g2"], ["drug", "other"],
                                       require_ids=True))
    # Another selection of the same file is its own (the file parsed again), and both kept.
    one = cache.load_round_data(config, ["g2"], "drug")
    assert cache.parses == 2
    _same(one, load_round_data(config, ["g2"], "drug"))
    assert cache.load_round_data(config, ["g2"], "drug") is one
    assert cache.load_joint_round_data(config, ["g1", "g2"], ["drug", "other"],
                                       require_ids=True) is first and cache.parses == 2
    # The arrays handed out cannot be changed by a caller.
    with pytest.raises(ValueError):
        first.x[0, 0] = 99.0


def test_a_changed_file_is_read_again_even_with_the_same_size_and_mtime(tmp_path):
    config = _config(tmp_path)
    cache = DataCache()
    before = cache.load_joint_round_data(config, ["g1"], ["drug"], require_ids=True)
    stat = os.stat(config.path)
    # One digit changed, size and mtime restored: only the content hash tells.
    config.path.write_text(CSV.replace("p2,4,5,6", "p2,9,5,6"))
    os.utime(config.path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(config.path).st_size == stat.st_size
    after = cache.load_joint_round_data(config, ["g1"], ["drug"], require_ids=True)
    assert cache.parses == 2 and before.x[1, 0] == 4.0 and after.x[1, 0] == 9.0
    # A new patient is in the next round's data.
    config.path.write_text(CSV + "p4,1,1,1,1\n")
    assert cache.load_joint_round_data(config, ["g1"], ["drug"],
                                       require_ids=True).ids[-1] == "p4"


def test_errors_are_never_cached(tmp_path):
    config = _config(tmp_path, CSV + "p1,1,1,1,1\n")     # a repeated patient id
    cache = DataCache()
    for _ in range(2):
        with pytest.raises(DataError) as err:
            cache.load_joint_round_data(config, ["g1"], ["drug"], require_ids=True)
        assert "repeated patient ids" in err.value.public_reason
    config.path.write_text(CSV)
    assert cache.load_joint_round_data(config, ["g1"], ["drug"], require_ids=True).n == 3
    config.path.unlink()
    with pytest.raises(DataError):
        cache.load_joint_round_data(config, ["g1"], ["drug"], require_ids=True)


def test_the_size_limit_still_holds(tmp_path):
    config = _config(tmp_path, max_bytes=10)
    with pytest.raises(DataError) as err:
        DataCache().load_round_data(config, ["g1"], "drug")
    assert "size limit" in err.value.public_reason
