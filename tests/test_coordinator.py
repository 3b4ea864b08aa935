"""The coordinator: round.toml -> RoundSpec, and the CLI end to end against a real server."""

from __future__ import annotations

import json
import secrets
import time

import numpy as np
import pytest

from coordinator.roundspec import RoundSpecError, build_round_spec
from dpfed_apps.cli import main
from dpfed.preprocess import Preprocessing
from dpfed.statistics import Statistics, exact_statistics
from dpfed.v1 import dpfed_pb2 as pb

from tests.conftest import random_statistics


def _public_csv(path, rows=20, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3))
    y = x @ [1.0, -0.5, 0.2] + rng.normal(size=rows)
    lines = ["id,a,b,c,y"] + [f"{i},{a},{b},{c},{t}" for i, ((a, b, c), t) in enumerate(zip(x, y))]
    lines.append("99,1,2,3,NA")  # no response: dropped
    path.write_text("\n".join(lines) + "\n")
    return x, y


def _round_toml(**kw):
    conf = {"target": "y", "features": ["a", "b", "c"], "epsilon": 2.0, "x_bound": 0.3,
            "y_bound": 2.0, "quorum": 2, "deadline_s": 30, "public": {"path": "public.csv"},
            "fit": {"method": "laplace", "draws": 100, "seed": 1}}
    conf.update(kw)
    return conf


def test_build_round_spec_from_public_data(tmp_path):
    x, y = _public_csv(tmp_path / "public.csv")
    spec = build_round_spec(_round_toml(round_id="r-7"), base_dir=tmp_path, now_ms=1000)
    # Continuous columns are divided by their public sd (issue 21; binary ones keep 1).
    pre = Preprocessing.from_public_data(x, y, scale_columns=True)
    assert spec.round_id == "r-7" and list(spec.feature_names) == ["a", "b", "c"]
    assert list(spec.preprocessing.x_mean) == list(pre.x_mean)
    np.testing.assert_allclose(spec.preprocessing.x_scale, np.std(x, axis=0, ddof=1))
    assert spec.preprocessing.y_mean == pre.y_mean and spec.preprocessing.normalize_rows
    # Public rows clipped like the private ones: box (0.3, 2.0), then the unit row-norm ball.
    xp, yp = pre.apply(x, y)
    z = np.clip(xp, -0.3, 0.3)
    z = z * np.minimum(1.0, (1 - 1e-12) / np.linalg.norm(z, axis=1))[:, None]
    expected = exact_statistics(z, np.clip(yp, -2.0, 2.0))
    got = Statistics.from_bytes(spec.public_statistics)
    np.testing.assert_allclose(got.xtx, expected.xtx, rtol=1e-12)
    np.testing.assert_allclose(got.xty, expected.xty, rtol=1e-12)
    assert got.yty == pytest.approx(expected.yty) and got.n == expected.n
    assert (spec.x_bound, spec.y_bound, spec.quorum) == (0.3, 2.0, 2)
    assert spec.deadline_unix_ms == 31_000 and spec.fit_method == "laplace"
    # The default relation is add/remove (4 shares, the last for n) with the exact Sxx rule.
    assert list(spec.budget_split) == [0.35, 0.60, 0.03, 0.02]
    assert (spec.neighbouring, spec.xtx_sensitivity) == ("add_remove", "exact")


def test_build_round_spec_errors(tmp_path):
    _public_csv(tmp_path / "public.csv")
    with pytest.raises(RoundSpecError):
        build_round_spec({"features": ["a"], "epsilon": 1.0}, base_dir=tmp_path)
    with pytest.raises(RoundSpecError):
        build_round_spec(_round_toml(features=["a", "zz"]), base_dir=tmp_path)


def _toml_text(conf: dict) -> str:
    out, tables = [], []
    for k, v in conf.items():
        (tables if isinstance(v, dict) else out).append((k, v))
    lines = [f"{k} = {json.dumps(v)}" for k, v in out]
    for name, table in tables:
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def test_cli_round_start_wait_result_and_sites(federation, tmp_path, capsys):
    _public_csv(tmp_path / "public.csv")
    (tmp_path / "round.toml").write_text(_toml_text(_round_toml(round_id="cli-1", quorum=2)))
    (tmp_path / "coordinator.toml").write_text(_toml_text({
        "aggregator": federation.address, "coordinator_id": "coord",
        "signing_key": "coordinator.key", "insecure": True}))
    conf = ["--config", str(tmp_path / "coordinator.toml")]
    assert main(["round", "start", "--spec", str(tmp_path / "round.toml"), *conf]) == 0
    assert "cli-1" in capsys.readouterr().out
    for site in ["site-a", "site-b"]:
        federation.stub.SendPhase(federation.consent(site, "cli-1"))
    federation.stub.Refuse(federation.refusal("site-c", "cli-1", "not this time"))
    for i, site in enumerate(["site-a", "site-b"]):
        federation.stub.Contribute(federation.contribution(site, "cli-1", random_statistics(seed=i)))
    federation.coordinator.wait("cli-1", 120, poll_s=0.05)  # the first fit may compile
    assert main(["round", "status", "cli-1", *conf]) == 0
    assert "DONE" in capsys.readouterr().out
    assert main(["round", "result", "cli-1", *conf]) == 0
    table = capsys.readouterr().out
    assert "95%" in table and "n = 120" in table  # 2 x 50 private + 20 public rows
    assert main(["round", "result", "cli-1", "--json", *conf]) == 0
    assert json.loads(capsys.readouterr().out)["n_public"] == 20
    assert main(["sites", "list", "--json", *conf]) == 0
    assert [s["site_id"] for s in json.loads(capsys.readouterr().out)] == list(federation.SITES)
    # Exit codes: usage error, refused key, unknown round.
    assert main(["round", "start", "--spec", str(tmp_path / "round.toml"),
                 "--aggregator", federation.address, "--insecure"]) == 2
    assert main(["keygen", "--name", "intruder", "--out", str(tmp_path)]) == 0
    assert main(["round", "start", "--spec", str(tmp_path / "round.toml"), "--aggregator",
                 federation.address, "--insecure", "--key", str(tmp_path / "intruder.key"),
                 "--coordinator-id", "coord"]) == 4
    assert main(["round", "status", "nope", *conf]) == 1


def test_cli_round_wait_reports_failure(federation, tmp_path, capsys):
    _public_csv(tmp_path / "public.csv")
    (tmp_path / "round.toml").write_text(_toml_text(_round_toml(round_id="f-1", deadline_s=0.5)))
    code = main(["round", "start", "--spec", str(tmp_path / "round.toml"), "--aggregator",
                 federation.address, "--insecure", "--key", str(tmp_path / "coordinator.key"),
                 "--coordinator-id", "coord", "--wait", "--json"])
    assert code == 3
    status = json.loads(capsys.readouterr().out)
    assert status["state"] == "FAILED" and "site-a" in status["message"]


def test_round_toml_neighbouring_and_xtx_sensitivity(tmp_path):
    _public_csv(tmp_path / "public.csv")
    spec = build_round_spec(_round_toml(neighbouring="replace_one", xtx_sensitivity="paper"),
                            base_dir=tmp_path, now_ms=1000)
    assert (spec.neighbouring, spec.xtx_sensitivity) == ("replace_one", "paper")
    assert list(spec.budget_split) == [0.35, 0.60, 0.05]  # the replace-one default
    for bad in (dict(neighbouring="bounded"), dict(xtx_sensitivity="tight"),
                dict(budget_split=[0.35, 0.60, 0.05]),                       # 3 under add/remove
                dict(neighbouring="replace_one", budget_split=[0.3, 0.6, 0.05, 0.05])):
        with pytest.raises(RoundSpecError):
            build_round_spec(_round_toml(**bad), base_dir=tmp_path, now_ms=1000)


def test_bounds_and_split_chosen_on_public_shaped_data_when_not_given(tmp_path):
    """No x_bound/y_bound in round.toml: chosen by dpfed.bounds.choose_bounds_table on
    auxiliary data shaped like the public rows, with the split it picks."""
    from dpfed.auxiliary import AuxiliarySource
    from dpfed.bounds import choose_bounds_table

    x, y = _public_csv(tmp_path / "public.csv")
    conf = _round_toml(sites=["s1", "s2"], expected_site_n=200)
    del conf["x_bound"], conf["y_bound"]
    spec = build_round_spec(conf, base_dir=tmp_path, now_ms=1000)
    pre = Preprocessing.from_public_data(x, y, scale_columns=True)
    source = AuxiliarySource(x, y, pre, feature_names=["a", "b", "c"])
    table = choose_bounds_table(source, [(400, 2)], [2.0], x_norm_bound=1.0)
    choice = table[(400, 2, 2.0)]
    assert (spec.x_bound, spec.y_bound) == pytest.approx(choice.bounds(*source.scales()))
    assert list(spec.budget_split) == pytest.approx(list(choice.budget_split))


def test_secure_round_bounds_are_chosen_for_one_draw_on_the_total(tmp_path):
    """A secure round's sum carries one noise draw: its bounds come from the table cell of one
    release of all the sites' rows (n K, 1), not K independent releases (n K, K)."""
    from dpfed.auxiliary import AuxiliarySource
    from dpfed.bounds import choose_bounds_table

    x, y = _public_csv(tmp_path / "public.csv")
    conf = _round_toml(sites=["s1", "s2", "s3", "s4"], expected_site_n=50, epsilon=0.5,
                       aggregation="secure", noise_threshold=4)
    del conf["x_bound"], conf["y_bound"]
    spec = build_round_spec(conf, base_dir=tmp_path, now_ms=1000)
    pre = Preprocessing.from_public_data(x, y, scale_columns=True)
    source = AuxiliarySource(x, y, pre, feature_names=["a", "b", "c"])
    table = choose_bounds_table(source, [(200, 1), (200, 4)], [0.5], x_norm_bound=1.0)
    one, four = table[(200, 1, 0.5)], table[(200, 4, 0.5)]
    assert (spec.x_bound, spec.y_bound) == pytest.approx(one.bounds(*source.scales()))
    assert list(spec.budget_split) == pytest.approx(list(one.budget_split))
    assert (one.omega_y, tuple(one.budget_split)) != (four.omega_y, tuple(four.budget_split)) \
        or one.ridge_c != four.ridge_c, "the cells should differ for the test to say anything"
