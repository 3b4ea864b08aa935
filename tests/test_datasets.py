"""The bundled GDSC tables load from the package and the default feature rule is public."""

import numpy as np
import pytest
from scipy.stats import spearmanr

from dpfed import datasets


def test_bundled_files_are_package_resources():
    from importlib import resources

    folder = resources.files(datasets.GDSC_PACKAGE)
    for name in (datasets.IC50_FILE, datasets.FEATURES_FILE, datasets.CELL_LINES_FILE,
                 datasets.DRUG_DECODE_FILE, "LICENSE-gdsctools.txt", "PROVENANCE.md"):
        assert folder.joinpath(name).is_file(), name


def test_tables_have_the_documented_shape():
    responses = datasets.load_responses()
    features = datasets.load_genomic_features()
    assert responses.ln_ic50.shape == (988, 265)
    assert features.values.shape[0] == 988
    assert set(np.unique(features.values)) <= {0.0, 1.0}
    assert 0.15 < np.mean(np.isnan(responses.ln_ic50)) < 0.21  # "about 18 % missing"
    assert sum(n.endswith("_mut") for n in features.names) > 100


def test_drug_response_drops_missing_values():
    ids, y = datasets.drug_response(1047)
    assert np.all(np.isfinite(y)) and len(ids) == len(y) > 400
    assert len(set(ids.tolist())) == len(ids)


def test_unknown_drug_and_feature_are_key_errors():
    with pytest.raises(KeyError):
        datasets.drug_response(123456)
    with pytest.raises(KeyError):
        datasets.feature_matrix(["NOPE_mut"], datasets.load_genomic_features().line_ids[:3])
    with pytest.raises(KeyError):
        datasets.feature_matrix(["tissue=moon"], datasets.load_genomic_features().line_ids[:3])


def test_drug_names():
    assert datasets.drug_name(1047) == "Nutlin-3a"
    assert datasets.drug_name(1) is None
    assert datasets.target_column(1047) == "Drug_1047_IC50"


def test_default_rule_is_five_mutations_and_five_tissues():
    names = datasets.default_feature_names()
    assert len(names) == 10
    assert all(n.endswith("_mut") for n in names[:5])
    assert all(n.startswith("tissue=") for n in names[5:])
    assert names[0] == "TP53_mut"  # the most frequently mutated gene in cancer lines
    assert datasets.default_feature_names() == names  # deterministic


def test_default_rule_reads_no_drug_response(monkeypatch):
    def forbidden():
        raise AssertionError("the public feature rule must not read drug responses")

    monkeypatch.setattr(datasets, "load_responses", forbidden)
    monkeypatch.setattr(datasets, "drug_response", lambda *a, **k: forbidden())
    assert len(datasets.default_features().names) == 10


def test_feature_matrix_columns_follow_names():
    fs = datasets.default_features()
    ids = datasets.load_genomic_features().line_ids[:50]
    x = fs.matrix(ids)
    assert x.shape == (50, 10)
    tissues = np.array(datasets.load_genomic_features().tissues[:50])
    assert np.array_equal(x[:, 5], (tissues == fs.names[5].split("=", 1)[1]).astype(float))
    # Each line has exactly one tissue: at most one tissue indicator is on.
    assert np.all(x[:, 5:].sum(axis=1) <= 1)


def test_known_signal_tp53_vs_nutlin():
    _, x, y = datasets.drug_dataset(1047, ["TP53_mut"])
    rho = spearmanr(x[:, 0], y).statistic
    assert 0.45 < rho < 0.55  # data README: +0.50


def test_known_signal_braf_vs_dabrafenib():
    _, x, y = datasets.drug_dataset(1373, ["BRAF_mut"])
    assert spearmanr(x[:, 0], y).statistic < -0.3  # data README: -0.37
