"""`dpfed plan` and the forecast for Gaussian and joint rounds (issue 23 part 3): the noise is
the product's own calibration (the site's, for the same round.toml), the per-target noise of a
joint release grows like sqrt(M) in Sxy and not in Sxx, M = 1 is the single-target Gaussian
round, the fit sees the aggregator's per-target view, bad combinations exit 2."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

FEATURES = ["a", "b", "c"]
TARGETS = ["d1", "d2", "d3"]
SMALL = ["--datasets", "2", "--noise-draws", "2"]


def _public_csv(path, rows=24, seed=0):
    """Public rows: 3 features (one binary), 3 responses with about 20 % missing."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3))
    x[:, 2] = (x[:, 2] > 0).astype(float)
    y = x @ rng.normal(size=(3, 3)) + rng.normal(size=(rows, 3)) + [0.0, 5.0, -2.0]
    y[rng.random(y.shape) < 0.2] = np.nan
    y[:3] = x[:3, :1] + [1.0, 2.0, 3.0]            # every target keeps >= 3 public values
    lines = ["id," + ",".join(FEATURES + TARGETS)]
    for i in range(rows):
        cells = [repr(float(v)) for v in x[i]] + ["" if math.isnan(v) else repr(float(v))
                                                   for v in y[i]]
        lines.append(f"r{i}," + ",".join(cells))
    path.write_text("\n".join(lines) + "\n")
    return x, y


def _round_toml(path, targets, **extra):
    conf = {"features": FEATURES, "epsilon": 2.0, "quorum": 1, "deadline_s": 30,
            "mechanism": "gaussian", "delta": 1e-6, **extra}
    lines = [f"targets = {json.dumps(targets)}"]
    for k, v in conf.items():
        lines.append(f"{k} = {json.dumps(v)}")
    lines += ["[public]", 'path = "public.csv"']
    path.write_text("\n".join(lines) + "\n")
    return path


def _plan(capsys, *argv):
    from dpfed_apps.cli import main

    rc = main(["plan", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _plan_json(capsys, *argv):
    rc, out, err = _plan(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


def _site_calibration(tmp_path, targets, **extra):
    """The calibration the SITE computes for the RoundSpec the coordinator builds from the
    same round.toml (site_node.node.joint_calibration)."""
    import tomllib

    from coordinator.roundspec import build_round_spec
    from site_node.node import joint_calibration

    toml = _round_toml(tmp_path / "round.toml", targets, **extra)
    spec = build_round_spec(tomllib.loads(toml.read_text()), base_dir=tmp_path, now_ms=1000)
    return joint_calibration(spec), toml


@pytest.mark.parametrize("targets", [["d1"], TARGETS])
def test_plan_noise_is_the_sites_calibration(tmp_path, capsys, targets):
    """A single-target Gaussian round (a joint round of one target) and a joint one: the
    forecast's per-part noise scales are exactly what the site declares for that spec."""
    _public_csv(tmp_path / "public.csv")
    cal, toml = _site_calibration(tmp_path, targets, epsilon=3.0, delta=1e-5)
    out = _plan_json(capsys, "--config", str(toml), "--n", "300", "--epsilon", "3", *SMALL)
    r = out["per_epsilon"][0]
    assert out["mechanism"] == "gaussian" and out["delta"] == 1e-5
    assert out["targets"] == len(targets)
    for part in ("xtx", "xty", "yty", "n"):
        assert r["noise_scales"][part] == pytest.approx(cal.scales[part], rel=1e-12), part
        assert r["noise_sd"][part] == pytest.approx(cal.scales[part], rel=1e-12), part
    assert r["per_patient"]["gdp_mu"] == pytest.approx(cal.mu, rel=1e-12)
    # And the same round given by flags instead of round.toml.
    if len(targets) == 1:
        flags = _plan_json(capsys, "--public", str(tmp_path / "public.csv"), "--target", "d1",
                           "--features", ",".join(FEATURES), "--mechanism", "gaussian",
                           "--delta", "1e-5", "--n", "300", "--epsilon", "3", *SMALL)
        assert flags["per_epsilon"] == out["per_epsilon"]


def test_joint_noise_grows_like_sqrt_m_in_sxy_not_in_sxx(tmp_path, capsys):
    _public_csv(tmp_path / "public.csv")
    base = ["--public", str(tmp_path / "public.csv"), "--target", "d1", "--features",
            ",".join(FEATURES), "--mechanism", "gaussian", "--delta", "1e-6", "--n", "200",
            "--epsilon", "2", *SMALL]
    sd = {m: _plan_json(capsys, *base, "--targets", str(m))["per_epsilon"][0]["noise_sd"]
          for m in (1, 4, 16)}
    for m in (4, 16):
        assert sd[m]["xty"] / sd[1]["xty"] == pytest.approx(math.sqrt(m), rel=1e-9)
        assert sd[m]["yty"] / sd[1]["yty"] == pytest.approx(math.sqrt(m), rel=1e-9)
        assert sd[m]["xtx"] == pytest.approx(sd[1]["xtx"], rel=1e-12)     # shared Sxx
        assert sd[m]["n"] / sd[1]["n"] == pytest.approx(math.sqrt((1 + m) / 2), rel=1e-9)
    # Laplace (L1): the targets' block grows like M, not sqrt(M).
    lap = ["--public", str(tmp_path / "public.csv"), "--target", "d1", "--features",
           ",".join(FEATURES), "--n", "200", "--epsilon", "2", "--bounds", "1,0.5", *SMALL]
    l1 = {m: _plan_json(capsys, *lap, "--targets", str(m))["per_epsilon"][0]["noise_sd"]
          for m in (1, 4)}
    assert l1[4]["xty"] / l1[1]["xty"] == pytest.approx(4.0, rel=1e-9)
    assert l1[4]["xtx"] == pytest.approx(l1[1]["xtx"], rel=1e-12)


def test_simulated_release_draws_the_calibrated_noise():
    """The forecast's simulated Sxy noise has the calibrated sd (and twice it at 4 x M), and
    the view has the MCAR model's r Sxx with its extra noise terms."""
    from dpfed.joint_noise import JOINT_DEFAULT_SPLIT
    from dpfed_apps.forecast import Mechanism, simulate_release

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3)) * 0.4
    y = rng.normal(size=400) * 0.3
    sds = {}
    for m in (4, 16):
        mech = Mechanism(2.0, 1.0, 0.5, JOINT_DEFAULT_SPLIT, "add_remove", "exact", 1.0,
                         "gaussian", 1e-6, m, 1.0)
        sxx, sxy, syy, n, sc = simulate_release(np.random.default_rng(1), [(x, y)], mech, 2000)
        sds[m] = float(np.std(sxy[:, 0]))
        assert sds[m] == pytest.approx(sc.sd("xty"), rel=0.05)
    assert sds[16] / sds[4] == pytest.approx(2.0, rel=0.07)
    mech = Mechanism(10.0, 1.0, 0.5, JOINT_DEFAULT_SPLIT, "add_remove", "exact", 1.0,
                     "gaussian", 1e-6, 3, 0.5)
    sxx, sxy, syy, n, sc = simulate_release(np.random.default_rng(2), [(x, y)], mech, 200)
    xc = mech.clip_rows(x)
    assert np.mean(n) == pytest.approx(200, abs=15)                 # n_j of the MCAR rows
    assert np.mean(sxx[:, 0, 0]) == pytest.approx(0.5 * (xc.T @ xc)[0, 0], rel=0.1)
    assert all(len(v.xtx) == 3 for v in sc.views)   # release noise x r, subset term, ratio term
    assert sc.xtx_sd() > 0.5 * sc.sd("xtx")


def test_joint_forecast_of_one_target_is_the_single_target_gaussian_one(tmp_path):
    from dpfed_apps.forecast import forecast_round

    rng = np.random.default_rng(3)
    x = (rng.random((10, 4)) < 0.4).astype(float)
    y = rng.normal(size=10)
    kw = dict(x_public=x, y_public=y, n_per_site=[150, 100], epsilons=[1.0, 5.0],
              bounds=(1.0, 0.5), n_datasets=3, n_noise=2, seed=4, mechanism="gaussian",
              delta=1e-6)
    one = forecast_round(**kw)
    joint = forecast_round(**kw, targets=1, response_rate=1.0)
    assert one["per_epsilon"] == joint["per_epsilon"]
    assert one["targets"] == 1 and one["joint_release"] is True
    assert one["gain_per_target"] is False
    # M matters: a release of 50 targets is noisier per target.
    many = forecast_round(**kw, targets=50)
    assert many["per_epsilon"][0]["noise_sd"]["xty"] > joint["per_epsilon"][0]["noise_sd"]["xty"]
    assert many["per_epsilon"][0]["spearman_private_public"] != \
        joint["per_epsilon"][0]["spearman_private_public"]


def test_plan_json_keys_and_response_rate_default(tmp_path, capsys):
    _, y = _public_csv(tmp_path / "public.csv")
    toml = _round_toml(tmp_path / "round.toml", TARGETS, epsilon=10.0)
    out = _plan_json(capsys, "--config", str(toml), "--n", "300", "--epsilon", "2,10", *SMALL)
    for key in ("mechanism", "delta", "targets", "response_rate", "joint_release",
                "gain_per_target", "target", "per_epsilon"):
        assert key in out, key
    assert out["targets"] == 3 and out["target"] == "d1" and out["gain_per_target"] is True
    assert out["response_rate"] == pytest.approx(float(np.isfinite(y).mean()))
    for r in out["per_epsilon"]:
        assert set(r["noise_sd"]) == {"xtx", "xty", "yty", "n"}
        assert r["per_patient"]["delta"] == 1e-6 and r["epsilon_replace_one_equivalent"] is None
    # --response-rate and --target override round.toml; the text says the gain is per target.
    out = _plan_json(capsys, "--config", str(toml), "--n", "300", "--epsilon", "2",
                     "--target", "d3", "--response-rate", "0.5", *SMALL)
    assert out["target"] == "d3" and out["response_rate"] == 0.5
    rc, text, _ = _plan(capsys, "--config", str(toml), "--n", "300", "--epsilon", "10", *SMALL)
    assert rc == 0 and "PER TARGET" in text and "once for all 3 targets" in text
    # Single-target Laplace rounds keep their keys and values.
    out = _plan_json(capsys, "--public", str(tmp_path / "public.csv"), "--target", "d1",
                     "--features", ",".join(FEATURES), "--n", "300", "--bounds", "1,2", *SMALL)
    assert out["mechanism"] == "laplace" and out["joint_release"] is False
    assert out["per_epsilon"][0]["noise_scales"]["law"] == "laplace"


@pytest.mark.parametrize("extra, message", [
    (["--mechanism", "gaussian"], "needs --delta"),
    (["--mechanism", "gaussian", "--delta", "0"], "0 < delta < 1"),
    (["--mechanism", "gaussian", "--delta", "1.5"], "0 < delta < 1"),
    (["--delta", "1e-6"], "--mechanism gaussian only"),
    (["--targets", "5", "--neighbouring", "replace_one"], "add_remove"),
    (["--mechanism", "gaussian", "--delta", "1e-6", "--neighbouring", "replace_one"],
     "add_remove"),
    (["--targets", "0"], "--targets must be >= 1"),
    (["--mechanism", "gaussian", "--delta", "1e-6", "--bounds", "choose"], "choose"),
    (["--targets", "3", "--response-rate", "0"], "--response-rate"),
    (["--response-rate", "0.5"], "joint releases"),
])
def test_plan_refuses_bad_combinations(tmp_path, capsys, extra, message):
    _public_csv(tmp_path / "public.csv")
    rc, out, err = _plan(capsys, "--public", str(tmp_path / "public.csv"), "--target", "d1",
                         "--features", ",".join(FEATURES), "--n", "100", *SMALL, *extra)
    assert rc == 2 and out == ""
    assert message in err, err


def test_plan_help_documents_the_joint_flags(capsys):
    from dpfed_apps.cli import main

    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = capsys.readouterr().out
    for flag in ("--mechanism", "--delta", "--targets", "--response-rate"):
        assert flag in text
    assert "--mechanism gaussian --delta 1e-6" in text and "--targets 262" in text


def test_secure_joint_forecast_uses_the_grid_calibrations_noise(tmp_path, capsys):
    """A secure joint round's sum carries the grid calibration's noise (Skellam at kappa x the
    central variance, one draw for K = T sites), not K central draws nor one central draw."""
    from dpfed.joint_noise import joint_calibration
    from dpfed.secagg.joint_calibration import calibrate_joint

    _public_csv(tmp_path / "public.csv")
    out = _plan_json(capsys, "--public", str(tmp_path / "public.csv"), "--target", "d1",
                     "--features", ",".join(FEATURES), "--mechanism", "gaussian", "--delta",
                     "1e-6", "--targets", "20", "--n", "150", "--sites", "4", "--epsilon", "4",
                     "--aggregation", "secure", *SMALL)
    cal = joint_calibration(3, 20, mechanism="gaussian", epsilon=4.0, delta=1e-6, x_bound=1.0,
                            y_bound=0.5, x_norm_bound=1.0)
    grid = calibrate_joint(cal, n_max=150, n_sites=4, noise_threshold=4).noise_description(4)
    sd = out["per_epsilon"][0]["noise_sd"]
    for part in ("xtx", "xty", "yty", "n"):
        assert sd[part] == pytest.approx(math.sqrt(grid.variance(part)), rel=1e-9), part
        assert 1.0 < sd[part] / cal.scales[part] < 1.2       # kappa > 1, one draw not four
