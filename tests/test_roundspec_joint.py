"""round.toml -> a joint RoundSpec (coordinator.joint_spec): per-target public centre and
scale, the standardised public statistics, the mechanism keys, and every refusal; the
aggregator's checks of a joint spec (aggregator.joint_round via aggregate.validate_spec)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aggregator.aggregate import validate_spec
from coordinator.joint_spec import DEFAULT_Y_BOUND
from coordinator.roundspec import RoundSpecError, build_round_spec
from dpfed.joint_noise import JOINT_DEFAULT_SPLIT
from dpfed.joint_statistics import PublicTargets, public_targets
from dpfed.preprocess import Preprocessing
from dpfed.v1 import dpfed_pb2 as pb

FEATURES = ["a", "b", "c"]
TARGETS = ["d1", "d2", "d3"]


def _public_csv(path, rows=30, seed=0, only_one=None):
    """Public rows with 3 responses, some missing; ``only_one``: that target has one value."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3))
    y = x @ rng.normal(size=(3, 3)) * [1.0, 10.0, 0.1] + rng.normal(size=(rows, 3)) + [0, 50, -3]
    y[rng.random(y.shape) < 0.2] = np.nan
    if only_one is not None:
        j = TARGETS.index(only_one)
        y[1:, j] = np.nan
    lines = ["id,a,b,c," + ",".join(TARGETS)]
    for i in range(rows):
        cells = [repr(float(v)) for v in x[i]] + ["NA" if math.isnan(v) else repr(float(v))
                                                   for v in y[i]]
        lines.append(f"{i}," + ",".join(cells))
    lines.append("99,1,,3,1,2,3")   # a missing feature: the row is left out
    path.write_text("\n".join(lines) + "\n")
    return x, y


def _toml(**kw):
    conf = {"targets": TARGETS, "features": FEATURES, "epsilon": 2.0, "quorum": 2,
            "deadline_s": 30, "public": {"path": "public.csv"}, "mechanism": "gaussian",
            "delta": 1e-6, "fit": {"draws": 100, "seed": 1}}
    conf.update(kw)
    return conf


def test_joint_spec_from_public_rows(tmp_path):
    x, y = _public_csv(tmp_path / "public.csv")
    spec = build_round_spec(_toml(round_id="j-1"), base_dir=tmp_path, now_ms=1000)
    assert spec.target == "" and [t.name for t in spec.targets] == TARGETS
    assert (spec.mechanism, spec.delta, spec.neighbouring) == ("gaussian", 1e-6, "add_remove")
    assert list(spec.budget_split) == list(JOINT_DEFAULT_SPLIT)
    # Each target's centre and scale: the public values present (mean, sd).
    for j, t in enumerate(spec.targets):
        v = y[:, j][~np.isnan(y[:, j])]
        assert t.y_mean == pytest.approx(v.mean()) and t.y_scale == pytest.approx(v.std(ddof=1))
    # Documented default bounds: rows normalised -> x_bound 1, y_bound in public sds.
    assert (spec.x_bound, spec.y_bound) == (1.0, DEFAULT_Y_BOUND)
    # Public statistics: the standardised public rows, clipped like a release, per target.
    pre = Preprocessing.from_public_data(x, np.zeros(len(x)), scale_columns=True)
    z = (y - [t.y_mean for t in spec.targets]) / [t.y_scale for t in spec.targets]
    expected = public_targets(pre.transform_x(x), z, 1.0, DEFAULT_Y_BOUND, 1.0)
    got = PublicTargets.from_bytes(spec.public_statistics)
    assert len(got) == 3
    for j in range(3):
        assert got[j] == expected[j] and got[j].n == int((~np.isnan(y[:, j])).sum())
    assert list(spec.preprocessing.x_mean) == pytest.approx(list(pre.x_mean))
    spec.coordinator_id = "coord"
    assert validate_spec(spec, ["s1", "s2"]) == []


def test_joint_spec_laplace_and_given_bounds(tmp_path):
    _public_csv(tmp_path / "public.csv")
    conf = _toml(mechanism="laplace", x_bound=0.7, y_bound=2.0,
                 budget_split=[0.25, 0.65, 0.05, 0.05])
    del conf["delta"]
    spec = build_round_spec(conf, base_dir=tmp_path)
    assert (spec.mechanism, spec.delta, spec.x_bound, spec.y_bound) == ("laplace", 0.0, 0.7, 2.0)
    assert list(spec.budget_split) == [0.25, 0.65, 0.05, 0.05]
    assert validate_spec(spec, ["s1", "s2"]) == []


@pytest.mark.parametrize("change, words", [
    ({"target": "d1"}, "either target"),
    ({"delta": None}, "needs delta"),
    ({"delta": 1.5}, "0 < delta < 1"),
    ({"mechanism": "exponential"}, "mechanism must be"),
    ({"neighbouring": "replace_one"}, "add_remove"),
    ({"xtx_sensitivity": "paper"}, "exact Sxx"),
    ({"targets": ["d1", "d1"]}, "listed twice"),
    ({"targets": []}, "non-empty list"),
    ({"targets": ["d1", "nope"]}, "missing column(s) nope"),
    ({"budget_split": [0.5, 0.5]}, "4 shares"),
    ({"public": {}}, "needs public rows"),
    ({"public": {"path": "public.csv", "normalize_rows": False}}, "needs x_bound"),
    ({"y_bound": -1.0}, "y_bound must be"),
])
def test_joint_spec_errors(tmp_path, change, words):
    _public_csv(tmp_path / "public.csv")
    conf = _toml(**{k: v for k, v in change.items() if v is not None})
    for k, v in change.items():
        if v is None:
            del conf[k]
    with pytest.raises(RoundSpecError) as info:
        build_round_spec(conf, base_dir=tmp_path)
    assert words in str(info.value)


def test_a_target_with_fewer_than_two_public_values_is_refused(tmp_path):
    _public_csv(tmp_path / "public.csv", only_one="d2")
    with pytest.raises(RoundSpecError, match=r"fewer than 2 public values.*d2"):
        build_round_spec(_toml(), base_dir=tmp_path)


def test_mechanism_keys_on_a_single_target_round(tmp_path):
    conf = {"target": "y", "features": ["a"], "epsilon": 1.0, "x_bound": 1.0, "y_bound": 1.0,
            "mechanism": "gaussian", "delta": 1e-6}
    with pytest.raises(RoundSpecError, match="needs a joint round"):
        build_round_spec(conf, base_dir=tmp_path)
    conf.update(mechanism="laplace")
    with pytest.raises(RoundSpecError, match="delta is only for"):
        build_round_spec(conf, base_dir=tmp_path)


def _joint_spec(**kw) -> pb.RoundSpec:
    fields = dict(round_id="j", coordinator_id="coord", target="",
                  feature_names=FEATURES, epsilon=1.0, x_bound=1.0, y_bound=0.5,
                  budget_split=list(JOINT_DEFAULT_SPLIT), quorum=1, deadline_unix_ms=10**13,
                  mechanism="gaussian", delta=1e-6,
                  targets=[pb.TargetSpec(name=t, y_mean=0.0, y_scale=1.0) for t in TARGETS])
    fields.update(kw)
    return pb.RoundSpec(**fields)


@pytest.mark.parametrize("change, words", [
    ({"targets": [pb.TargetSpec(name="d1", y_scale=1.0)] * 2}, "not unique"),
    ({"targets": [pb.TargetSpec(name="", y_scale=1.0)]}, "empty"),
    ({"targets": [pb.TargetSpec(name="d1", y_scale=0.0)]}, "y_scale must be finite and > 0"),
    ({"targets": [pb.TargetSpec(name="d1", y_scale=math.inf)]}, "y_scale"),
    ({"targets": [pb.TargetSpec(name="d1", y_mean=math.nan, y_scale=1.0)]}, "y_mean"),
    ({"delta": 0.0}, "0 < delta < 1"),
    ({"mechanism": "laplace"}, "delta must be 0"),
    ({"mechanism": "staircase"}, "mechanism must be one of"),
    ({"target": "d1"}, "target must be empty"),
    ({"neighbouring": "replace_one", "budget_split": [0.4, 0.5, 0.1]}, "add_remove"),
    ({"xtx_sensitivity": "paper"}, "xtx_sensitivity must be exact"),
    ({"budget_split": [0.5, 0.5]}, "budget_split"),
])
def test_aggregator_refuses_bad_joint_specs(change, words):
    problems = validate_spec(_joint_spec(**change), [])
    assert any(words in p for p in problems), problems


def test_aggregator_checks_the_public_targets_of_a_joint_spec():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(20, 3)), rng.normal(size=(20, 3))
    good = public_targets(x, y, 1.0, 0.5).to_bytes()
    assert validate_spec(_joint_spec(public_statistics=good), ["s1"]) == []
    two = public_targets(x, y[:, :2], 1.0, 0.5).to_bytes()
    assert any("hold 2 targets" in p for p in validate_spec(_joint_spec(public_statistics=two), []))
    wrong_d = public_targets(x[:, :2], y, 1.0, 0.5).to_bytes()
    assert any("dimension 2" in p
               for p in validate_spec(_joint_spec(public_statistics=wrong_d), []))
    assert any("do not decode" in p
               for p in validate_spec(_joint_spec(public_statistics=b"junk"), []))


def test_single_target_rounds_keep_the_laplace_mechanism():
    spec = _joint_spec(targets=[], target="y", mechanism="gaussian", delta=1e-6)
    problems = validate_spec(spec, [])
    assert any("needs a joint round" in p for p in problems), problems
    assert any("delta is for gaussian joint rounds only" in p for p in problems)
