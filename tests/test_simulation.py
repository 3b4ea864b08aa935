"""The in-process parts of the simulation: split, public quantities, baselines, files."""

import json
import tomllib

import numpy as np
import pytest

from dpfed_apps import simulation as sim
from dpfed.statistics import Statistics


def test_split_is_disjoint_and_covers_all_rows():
    s = sim.split_rows(846, n_sites=3, n_public=10, n_test=100, seed=0)
    parts = [s.test, s.public, *s.sites]
    allrows = np.concatenate(parts)
    assert len(allrows) == 846 and len(set(allrows.tolist())) == 846
    assert s.test.size == 100 and s.public.size == 10
    assert sum(s.site_sizes) == 736 and max(s.site_sizes) - min(s.site_sizes) <= 1
    assert set(s.training.tolist()) == set(allrows.tolist()) - set(s.test.tolist())


def test_split_is_reproducible_and_seed_dependent():
    a = sim.split_rows(200, n_sites=2, n_public=10, n_test=20, seed=1)
    b = sim.split_rows(200, n_sites=2, n_public=10, n_test=20, seed=1)
    c = sim.split_rows(200, n_sites=2, n_public=10, n_test=20, seed=2)
    assert np.array_equal(a.test, b.test) and np.array_equal(a.sites[1], b.sites[1])
    assert not np.array_equal(a.test, c.test)


def test_split_rejects_too_few_rows():
    with pytest.raises(ValueError):
        sim.split_rows(30, n_sites=3, n_public=10, n_test=19, seed=0)


@pytest.fixture(scope="module")
def nutlin():
    return sim.gdsc_problem(1047)


def test_gdsc_problem_defaults(nutlin):
    assert nutlin.target == "Drug_1047_IC50"
    assert nutlin.dim == 10 and nutlin.x.shape == (nutlin.n, 10)
    assert "Nutlin-3a" in nutlin.label


def test_public_quantities_use_only_public_rows(nutlin):
    split = sim.split_rows(nutlin.n, n_sites=3, n_public=10, n_test=100, seed=0)
    prep = sim.public_preprocessing(nutlin, split)
    assert np.allclose(prep.x_mean, nutlin.x[split.public].mean(axis=0))
    assert prep.y_mean == pytest.approx(nutlin.y[split.public].mean())
    # Changing every private row changes nothing the coordinator computes.
    y2 = nutlin.y.copy()
    for rows in split.sites:
        y2[rows] += 100.0
    other = sim.Problem(nutlin.ids, nutlin.x, y2, nutlin.feature_names, nutlin.target, "")
    assert sim.public_preprocessing(other, split) == prep
    sx, sy = sim.public_sigmas(nutlin.x[split.public], nutlin.y[split.public], prep)
    assert sx == pytest.approx(1 / np.sqrt(10), rel=0.3)
    assert sy == pytest.approx(np.std(nutlin.y[split.public], ddof=1))


def test_public_sigmas_fallbacks():
    from dpfed.preprocess import Preprocessing

    x = np.ones((3, 4))
    prep = Preprocessing.from_public_data(x, np.ones(3))
    assert sim.public_sigmas(x, np.ones(3), prep) == (0.5, 1.0)


def test_baselines_and_scores_on_gdsc(nutlin):
    split = sim.split_rows(nutlin.n, n_sites=3, n_public=10, n_test=100, seed=0)
    prep = sim.public_preprocessing(nutlin, split)
    models = sim.baseline_models(nutlin, split, prep, method="fixed", draws=200, seed=0)
    rho = sim.test_spearman(models["nonprivate"], nutlin, split, prep)
    assert rho > 0.3  # TP53 status alone gives ~0.5 on Nutlin-3a
    # TP53-mutant lines are resistant to Nutlin-3a (an MDM2 inhibitor): positive weight.
    assert models["nonprivate"].beta_mean[nutlin.feature_names.index("TP53_mut")] > 0
    assert np.all(np.isfinite(models["public_only"].beta_mean))


def test_training_statistics_are_exact(nutlin):
    split = sim.split_rows(nutlin.n, n_sites=3, n_public=10, n_test=100, seed=0)
    prep = sim.public_preprocessing(nutlin, split)
    s = sim.training_statistics(nutlin, split.sites[0], prep)
    z, yc = prep.apply(nutlin.x[split.sites[0]], nutlin.y[split.sites[0]])
    assert s.n == split.sites[0].size
    assert np.allclose(s.xtx, z.T @ z) and np.allclose(s.xty, z.T @ yc)


def test_model_from_result_and_feature_table():
    from dpfed.v1 import dpfed_pb2 as pb

    draws = np.array([[1.0, -2.0], [3.0, -4.0]])
    result = pb.RoundResult(round_id="r", summary_json=json.dumps({"beta_mean": [2.0, -3.0]}),
                            beta_draws=draws.astype("<f8").tobytes(), draws=2, dim=2)
    model = sim.model_from_result(result)
    assert np.array_equal(model.beta_draws, draws)
    table = sim.feature_table(model, ["a", "b"])
    assert [r["feature"] for r in table] == ["b", "a"]
    assert table[0]["ci90"][0] < -3.0 < table[0]["ci90"][1]


def test_written_files_follow_the_interfaces(tmp_path, nutlin):
    split = sim.split_rows(nutlin.n, n_sites=2, n_public=10, n_test=100, seed=0)
    layout = sim.FederationLayout(tmp_path)
    names = sim.write_federation(layout, nutlin, split, port=50999, epsilon=2.0)
    assert names == ["site-1", "site-2"]
    site = tomllib.loads(layout.site_config("site-1").read_text())
    assert site["aggregator"] == "127.0.0.1:50999" and "insecure" not in site
    assert site["tls"]["cert"].endswith("site-1.pem")   # mutual TLS, kits from dpfed_apps.ca
    assert site["data"]["id_column"] == "COSMIC_ID"
    assert site["policy"]["max_epsilon_per_round"] == 2.0
    agg = tomllib.loads(layout.aggregator_config.read_text())
    assert [s["site_id"] for s in agg["sites"]] == names
    assert agg["coordinators"][0]["coordinator_id"] == "coordinator"
    assert layout.signing_key("site-1").stat().st_mode & 0o077 == 0
    assert "insecure" not in agg and agg["tls"]["cert"].endswith("aggregator.pem")
    # The site CSV round-trips bit for bit, so the sites' view equals ours.
    back = sim.csv_problem(layout.site_csv("site-2"), id_column="COSMIC_ID",
                           target=nutlin.target)
    rows = split.sites[1]
    assert back.feature_names == nutlin.feature_names
    assert np.array_equal(back.x, nutlin.x[rows]) and np.array_equal(back.y, nutlin.y[rows])
    assert [int(i) for i in back.ids] == nutlin.ids[rows].tolist()
    cfg = sim.round_config(nutlin, epsilon=2.0, x_bound=0.3, y_bound=2.0, quorum=2,
                           public_csv=layout.public_csv, fit_method="laplace", fit_draws=100,
                           fit_seed=0)
    assert tomllib.loads(sim.to_toml(cfg)) == cfg


def test_csv_problem_defaults_and_missing_targets(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("id,a,b,y\n1,0.5,1,2.0\n2,0.1,0,\n3,0.2,1,NA\n4,1,1,-1\n")
    prob = sim.csv_problem(p)
    assert prob.feature_names == ("a", "b") and prob.target == "y" and prob.id_column == "id"
    assert prob.n == 2 and np.array_equal(prob.y, [2.0, -1.0])
    with pytest.raises(ValueError):
        sim.csv_problem(p, feature_names=["zz"])
