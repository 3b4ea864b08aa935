import numpy as np
import pytest

from dpfed_apps.evaluation.methods import METHODS, Method, PrivacySetting, TrainingData, get_method

NAMES = {"robust_private", "nonprivate", "nonprivate_robust", "private_unclipped",
         "output_perturbation", "functional_mechanism", "adassp"}


def test_registry_lists_exactly_the_seven_methods():
    assert set(METHODS) == NAMES and len(METHODS) == 7
    for name, method in METHODS.items():
        assert method.name == name
        assert isinstance(method, Method)
        assert method.private == (name not in {"nonprivate", "nonprivate_robust"})


def test_get_method_options_and_errors():
    assert get_method("adassp") is METHODS["adassp"]
    assert get_method("robust_private", posterior="plug-in-fixed").posterior == "plug-in-fixed"
    with pytest.raises(ValueError, match="unknown method"):
        get_method("ssp")
    with pytest.raises(ValueError, match="bad options"):
        get_method("adassp", posterior="plug-in-fixed")
    with pytest.raises(ValueError, match="posterior"):
        get_method("nonprivate", posterior="mcmc")
    with pytest.raises(ValueError, match="draws"):
        get_method("nonprivate_robust", draws=0)


@pytest.mark.parametrize("kw", [
    {"epsilon": 0.0}, {"epsilon": float("nan")}, {"x_bound": -1.0}, {"y_bound": True},
    {"budget_split": (0.5, 0.5)}, {"budget_split": (0.3, 0.3, 0.3)}, {"delta": 0.0},
    {"budget_split": (0.35, 0.60, 0.05)},                       # 3 shares under add/remove
    {"budget_split": (0.3, 0.6, 0.05, 0.05), "neighbouring": "replace_one"},
    {"neighbouring": "bounded"}, {"xtx_sensitivity": "tight"},
    {"delta": 1.0}, {"n_sites": 0}, {"n_sites": 1.5}, {"x_range": 0.0}, {"y_range": -2.0},
])
def test_bad_privacy_settings_raise(kw):
    base = {"epsilon": 1.0, "x_bound": 0.5, "y_bound": 1.0}
    with pytest.raises(ValueError):
        PrivacySetting(**{**base, **kw})


def test_bad_training_data_raise():
    x, y = np.zeros((3, 2)), np.zeros(3)
    with pytest.raises(ValueError, match="no training rows"):
        TrainingData(np.zeros((0, 2)), np.zeros(0), np.zeros((0, 2)), np.zeros(0))
    with pytest.raises(ValueError, match="columns"):
        TrainingData(x, y, np.zeros((2, 3)), np.zeros(2))
    with pytest.raises(ValueError, match="shape"):
        TrainingData(x, np.zeros(4), x, y)
    with pytest.raises(ValueError, match="NaN"):
        TrainingData(np.full((3, 2), np.nan), y, x, y)


def test_every_method_fits_public_rows_only(problem):
    data = problem.small(0)
    for name in NAMES:
        bayesian = name in {"robust_private", "nonprivate", "nonprivate_robust",
                            "private_unclipped"}
        method = get_method(name, posterior="plug-in-fixed", draws=50) if bayesian else get_method(name)
        beta = method.fit(data, problem.setting(epsilon=1.0), seed=0)
        assert beta.shape == (5,) and np.all(np.isfinite(beta))


def test_privacy_setting_and_protocol_default_split_follow_the_relation():
    from dpfed_apps.evaluation.protocol import ProtocolConfig
    base = {"epsilon": 1.0, "x_bound": 0.5, "y_bound": 1.0}
    s = PrivacySetting(**base)
    assert (s.neighbouring, s.xtx_sensitivity) == ("add_remove", "exact")
    assert s.budget_split == (0.35, 0.60, 0.03, 0.02)
    ro = PrivacySetting(**base, neighbouring="replace_one", xtx_sensitivity="paper")
    assert ro.budget_split == (0.35, 0.60, 0.05)
    assert ProtocolConfig().budget_split == (0.35, 0.60, 0.03, 0.02)
    assert ProtocolConfig(neighbouring="replace_one").budget_split == (0.35, 0.60, 0.05)
    with pytest.raises(ValueError):
        ProtocolConfig(budget_split=(0.35, 0.60, 0.05))       # 3 shares under add/remove
    with pytest.raises(ValueError):
        ProtocolConfig(neighbouring="bounded")
