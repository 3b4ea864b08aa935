"""site.toml parsing: relative paths, defaults, and errors that name the file and the key."""

from __future__ import annotations

import pytest

from site_node.config import ConfigError, load_config

BASE = """
site_id = "hospital-a"
aggregator = "127.0.0.1:50051"
state_db = "state.sqlite"
signing_key = "keys/site.key"
insecure = true

[data]
path = "data/a.parquet"

[policy]
trusted_coordinators = ["keys/coord.pub"]
max_epsilon_per_round = 2.0
total_epsilon = 10.0
"""


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys/site.key").write_text("x")
    (tmp_path / "keys/coord.pub").write_text("x")
    return tmp_path


def write(folder, text):
    p = folder / "site.toml"
    p.write_text(text)
    return p


def test_valid_config_resolves_paths_against_config_folder(folder, monkeypatch):
    monkeypatch.chdir("/")
    cfg = load_config(write(folder, BASE))
    assert cfg.state_db == folder / "state.sqlite"
    assert cfg.data.path == folder / "data/a.parquet"
    assert cfg.data.format == "parquet"
    assert cfg.policy.trusted_coordinators == (folder / "keys/coord.pub",)
    assert cfg.policy.min_n == 20 and cfg.policy.allowed_targets == ("*",)
    assert cfg.tls is None


@pytest.mark.parametrize("old,new,key", [
    ('site_id = "hospital-a"\n', "", "'site_id' is missing"),
    ("max_epsilon_per_round = 2.0", "max_epsilon_per_round = -1", "'policy.max_epsilon_per_round'"),
    ("max_epsilon_per_round = 2.0", 'max_epsilon_per_round = "2"', "'policy.max_epsilon_per_round'"),
    ("total_epsilon = 10.0", "total_epsilon = 1.0", "exceeds"),
    ('"keys/coord.pub"', '"keys/missing.pub"', "'policy.trusted_coordinators'"),
    ('"keys/site.key"', '"keys/none.key"', "'signing_key'"),
    ("insecure = true", "", "[tls]"),
    ('path = "data/a.parquet"', 'path = "data/a.xlsx"', "data.format"),
    ('aggregator = "127.0.0.1:50051"', 'aggregator = "localhost"', "'aggregator'"),
])
def test_errors_name_file_and_key(folder, old, new, key):
    assert old in BASE
    path = write(folder, BASE.replace(old, new))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and key in str(info.value)


def test_missing_file_and_bad_toml(folder):
    with pytest.raises(ConfigError, match="not found"):
        load_config(folder / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(folder, "site_id = "))


def test_column_mapping_and_explicit_format(folder):
    text = BASE.replace('path = "data/a.parquet"',
                        'path = "data/a.txt"\nformat = "tsv"\n[data.columns]\nTP53 = "tp53_status"')
    cfg = load_config(write(folder, text))
    assert cfg.data.format == "tsv"
    assert cfg.data.column_for("TP53") == "tp53_status" and cfg.data.column_for("g") == "g"
